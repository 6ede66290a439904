package io.rdmabridge.netty;

import io.netty.channel.ChannelFutureListener;
import io.netty.channel.ChannelPromise;
import io.rdmabridge.connection.RdmaConnection;
import io.rdmabridge.verbs.RdmaException;

import java.io.IOException;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.NotYetConnectedException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

/**
 * Close and shutdown of an {@link RdmaSocketChannel}: the graceful close (end of stream after everything posted,
 * the queue pair destroyed once that has completed, within a bounded linger), the abortive one ({@code SO_LINGER=0}:
 * a bare disconnect), an accepted channel closed while its handshake is still ending, {@code shutdownOutput()} and
 * {@code shutdownInput()}, a peer that went away (with or without end of stream) and a failed connection. Posted
 * buffers must outlive their work requests, so a close or an output shutdown that finds work in flight waits for it
 * here; once the channel is closed this releases every part's resources, in the order the queue pair needs.
 *
 * <p>Threading: the channel's event loop; the flags the channel reports from other threads are volatile.
 *
 * <p>It does not read or post writes (the inbound path drops input after {@code shutdownInput()}; a channel without
 * {@code AUTO_CLOSE} whose peer is gone lets the outbound path fail its writes), and it leaves connecting to
 * {@link RdmaChannelSetup}.
 */
final class RdmaChannelClosing {
    private static final long CLOSE_LINGER_MILLIS = 2000;

    private final RdmaSocketChannel channel;
    private boolean peerGone;
    private volatile boolean outputShutdown;
    // Close and shutdownOutput wait for posted work to complete (its memory must outlive the work request).
    private boolean closeRequested;
    private ChannelPromise delayedClosePromise;
    private Throwable delayedCloseCause;
    private ClosedChannelException delayedCloseClosedCause;
    private ChannelPromise delayedShutdownPromise;
    private ScheduledFuture<?> lingerFuture;

    RdmaChannelClosing(RdmaSocketChannel channel) {
        this.channel = channel;
    }

    /** Whether the queue pair was disconnected by the peer (or found lost). */
    boolean isPeerGone() {
        return peerGone;
    }

    /** The queue pair was disconnected by the peer (or found lost). */
    void peerGone() {
        peerGone = true;
    }

    /** Whether the output is shut down (end of stream is, or will be, sent after what was posted). */
    boolean isOutputShutdown() {
        return outputShutdown;
    }

    /** Whether a close was asked for: nothing more is posted. */
    boolean isCloseRequested() {
        return closeRequested;
    }

    /** Whether {@code shutdownOutput()} waits for posted work: what is written meanwhile fails. */
    boolean isOutputShutdownPending() {
        return delayedShutdownPromise != null;
    }

    /** The connection failed (a work request failed, or no memory for a rendezvous): tell the pipeline, close. */
    void connectionFailed(RdmaException cause) {
        if (channel.state == RdmaSocketChannel.STATE_CLOSED) {
            return;
        }
        channel.pipeline().fireExceptionCaught(cause);
        forceClose();
    }

    /** The peer disconnected and nothing it sent is left to hand up: close, as a reset unless it ended cleanly. */
    void closeAfterPeerGone() {
        if (channel.state == RdmaSocketChannel.STATE_CLOSED) {
            return;
        }
        RdmaConnection c = channel.connection;
        if (!channel.config().isAutoClose()) {
            // As a write to a reset TCP socket: the writes fail and, with AUTO_CLOSE off, Netty shuts the output
            // down (ChannelOutputShutdownEvent) before the channel closes.
            channel.outbound.writeMore();
        }
        if (!closeRequested && c != null && c.failure() == null && !c.isEndOfStreamReceived()) {
            // No end of stream before the disconnect: the peer closed abortively (SO_LINGER=0) or died. TCP calls
            // that a reset, and so do we.
            channel.pipeline().fireExceptionCaught(new IOException("connection reset by peer " + channel.remote
                    + ": it disconnected without shutting its output down (an abortive close with SO_LINGER=0, or"
                    + " the peer died)"));
        }
        forceClose();
    }

    /** Closes now, without waiting for posted work, completing a delayed close's promise. */
    void forceClose() {
        closeRequested = true;
        if (delayedClosePromise != null) {
            ChannelPromise p = delayedClosePromise;
            delayedClosePromise = null;
            channel.closeNow(p, delayedCloseCause, delayedCloseClosedCause);
        } else {
            channel.unsafe().close(channel.voidPromise());
        }
    }

    /** Whether a graceful close may destroy the queue pair: every operation and the end of stream completed. */
    private static boolean drained(RdmaConnection c) {
        return c.operationsInFlight() == 0 && c.isSendQueueIdle() && (!c.isOutputShutdown() || c.isEndOfStreamSent());
    }

    /** After a poll: an output shutdown or a close that waited for posted work goes on once that work is done. */
    void checkDelayed() {
        RdmaConnection c = channel.connection;
        boolean lost = c == null || c.isLost();
        if (delayedShutdownPromise != null && (lost || c.operationsInFlight() == 0)) {
            ChannelPromise p = delayedShutdownPromise;
            delayedShutdownPromise = null;
            channel.shutdownOutputNow(p);
        }
        if (delayedClosePromise != null && (lost || drained(c))) {
            ChannelPromise p = delayedClosePromise;
            delayedClosePromise = null;
            channel.closeNow(p, delayedCloseCause, delayedCloseClosedCause);
        }
    }

    /** {@code shutdownOutput(promise)}, on the loop: at once, or once posted work has completed. */
    void shutdownOutput(ChannelPromise promise) {
        RdmaConnection c = channel.connection;
        if (c != null && c.operationsInFlight() > 0 && !c.isLost()) {
            // Posted buffers must outlive their work requests; Netty fails (and frees) the outbound buffer.
            if (delayedShutdownPromise == null) {
                delayedShutdownPromise = promise;
            } else {
                // As Netty's channels: the output is already being shut down.
                promise.setFailure(new ClosedChannelException());
            }
            return;
        }
        channel.shutdownOutputNow(promise);
    }

    /** {@code doShutdownOutput}: end of stream after what was posted. */
    void doShutdownOutput() throws Exception {
        int state = channel.state;
        if (state != RdmaSocketChannel.STATE_ACTIVE) {
            throw state == RdmaSocketChannel.STATE_CLOSED ? new ClosedChannelException()
                    : new NotYetConnectedException();
        }
        outputShutdown = true;
        channel.connection.shutdownOutput();
    }

    /** {@code shutdownInput(promise)}, on the loop. */
    void shutdownInput(ChannelPromise promise) {
        if (!channel.isOpen()) {
            promise.setFailure(new ClosedChannelException());
            return;
        }
        if (!channel.isActive()) {
            promise.setFailure(new NotYetConnectedException());
            return;
        }
        channel.inbound.shutdownInput();
        promise.setSuccess();
    }

    /**
     * The unsafe's close: gracefully (end of stream, then the queue pair destroyed once everything posted has
     * completed), abortively with {@code SO_LINGER=0}, or at once when there is nothing to wait for.
     */
    void close(ChannelPromise promise, Throwable cause, ClosedChannelException closeCause) {
        RdmaConnection c = channel.connection;
        int state = channel.state;
        RdmaChannelConfig config = channel.config();
        // A deregistered channel is polled by no loop: it would never see its posted work complete, and its linger
        // timer dies with a loop that shuts down first. Nothing here is worth waiting for then.
        boolean polled = channel.isRegistered() && !channel.handler.isShuttingDown();
        if (c != null && state == RdmaSocketChannel.STATE_ACTIVE && !c.isLost() && polled) {
            if (!closeRequested) {
                closeRequested = true;
                if (config.getSoLinger() == 0) {
                    // Abortive: no end of stream; the peer sees the bare disconnect as a reset.
                    channel.setup.disconnect();
                } else {
                    // Graceful: end of stream after everything posted so far, as TCP's FIN.
                    c.shutdownOutput();
                }
            }
            if (drained(c)) {
                closeAll(promise, cause, closeCause);
                return;
            }
            // Posted buffers must outlive their work requests: close once they complete (bounded linger).
            delayClose(promise, cause, closeCause);
            return;
        }
        if ((c == null || !c.isReady()) && channel.setup.isAcceptIssued() && state == RdmaSocketChannel.STATE_CONNECTING
                && !closeRequested && config.getSoLinger() != 0 && polled) {
            // The connect request is answered and the peer may already count itself connected: a disconnect
            // now would reach it as a reset. Close gracefully once established (bounded linger), as TCP's FIN
            // after its kernel completed the handshake.
            delayClose(promise, cause, closeCause);
            return;
        }
        closeAll(promise, cause, closeCause);
    }

    private void delayClose(ChannelPromise promise, Throwable cause, ClosedChannelException closeCause) {
        if (delayedClosePromise == null) {
            delayedClosePromise = promise;
            delayedCloseCause = cause;
            delayedCloseClosedCause = closeCause;
            lingerFuture = channel.eventLoop().schedule(() -> {
                lingerFuture = null;
                forceClose();
            }, CLOSE_LINGER_MILLIS, TimeUnit.MILLISECONDS);
        } else if (!promise.isVoid()) {
            channel.closeFuture().addListener((ChannelFutureListener) f -> promise.setSuccess());
        }
    }

    /** Closes now, completing a delayed close's promise too. */
    private void closeAll(ChannelPromise promise, Throwable cause, ClosedChannelException closeCause) {
        ChannelPromise delayed = delayedClosePromise;
        if (delayed != null) {
            delayedClosePromise = null;
            channel.closeNow(delayed, delayedCloseCause, delayedCloseClosedCause);
        }
        channel.closeNow(promise, cause, closeCause);
    }

    /**
     * The channel left its loop: a close that waits for posted work to complete goes on now, as no loop polls for
     * those completions any more (and the linger timer would die with a loop that shuts down first).
     */
    void deregistered() {
        if (delayedClosePromise != null) {
            forceClose();
        }
    }

    /** The channel became active: a close that waited for an accepted channel's handshake goes on now. */
    void activated() {
        if (delayedClosePromise != null && !closeRequested) {
            // Closed while the handshake was ending: now the graceful close can send end of stream.
            ChannelPromise p = delayedClosePromise;
            delayedClosePromise = null;
            cancelLinger();
            close(p, delayedCloseCause, delayedCloseClosedCause);
        }
    }

    private void cancelLinger() {
        if (lingerFuture != null) {
            lingerFuture.cancel(false);
            lingerFuture = null;
        }
    }

    /** {@code doClose}: the channel is closed; its resources go unless they already went. */
    void doClose() {
        int previous = channel.state;
        channel.state = RdmaSocketChannel.STATE_CLOSED;
        closeRequested = true;
        cancelLinger();
        if (delayedShutdownPromise != null) {
            // The writes it waited for never completed (a peer that does not read them, say): it never will.
            ChannelPromise p = delayedShutdownPromise;
            delayedShutdownPromise = null;
            ClosedChannelException closed = new ClosedChannelException();
            closed.initCause(new IOException("the channel closed before the writes that shutdownOutput() waited for "
                    + "had completed (the peer had not read them), so no end of stream followed them; to shut the "
                    + "output down first, await the shutdown's future before closing"));
            p.tryFailure(closed);
        }
        channel.setup.closed();
        if (previous != RdmaSocketChannel.STATE_CLOSED) {
            releaseResources();
        }
    }

    /**
     * Destroys the queue pair, then frees what its work requests used, then the completion queue and id; the
     * receive slab follows when its buffers come back.
     */
    void releaseResources() {
        channel.setup.destroyQueuePair();
        channel.inbound.releaseBuffers();
        channel.outbound.releaseOperations();
        channel.setup.destroyCompletionQueueAndId();
    }
}
