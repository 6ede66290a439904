package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelFutureListener;
import io.netty.channel.ChannelOutboundBuffer;
import io.netty.channel.ChannelPromise;
import io.netty.channel.DefaultFileRegion;
import io.netty.channel.EventLoop;
import io.netty.channel.FileRegion;
import io.netty.channel.IoEvent;
import io.netty.channel.IoRegistration;
import io.netty.channel.socket.ServerSocketChannel;
import io.netty.channel.socket.SocketChannel;
import io.rdmabridge.connection.RdmaConnection;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaCmId;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.channels.ClosedChannelException;
import java.util.concurrent.RejectedExecutionException;

/**
 * A {@link SocketChannel} over an RDMA reliable-connected queue pair.
 * <pre>
 * new Bootstrap().group(group).channel(RdmaSocketChannel.class)
 * </pre>
 *
 * <h2>Local address</h2>
 * {@code bind(localAddress)} before connecting, or {@code connect(remote, local)}, binds the channel's
 * connection-manager id ({@code rdma_bind_addr}), so the connection leaves from that address as a bound NIO client's
 * does; {@link #localAddress()} reports it from the bind on. A bind that fails (the address is in use or not of this
 * host) fails with a {@link java.net.BindException} carrying the provider's error; the channel stays open and
 * unbound.
 *
 * <h2>Writes</h2>
 * Completion-based, like Netty's io_uring transport: flushed buffers are posted as eager SENDs (small ones gathered
 * into one frame) or advertised for rendezvous. Buffers in registered memory (the channel's default
 * {@link RdmaByteBufAllocator}) go out by reference, without a copy; any other buffer is copied once into registered
 * memory and counted in {@link RdmaChannelMetrics#copiedBytes()}. A buffer stays in the
 * {@link ChannelOutboundBuffer} until it is delivered: its completion arrived, or a frame from the peer counts it
 * received (for a rendezvous, the peer's acknowledgement); then its bytes are removed and its promise completes, and,
 * delivered before its completion, it stays referenced by the channel until the completion. A copied buffer is
 * removed (its promise completes, the buffer is released) as soon as its copy is posted, as a socket's write completes
 * once the kernel has the bytes, unless a peer's reset may already be known (the queue pair is broken, or the
 * connection-manager events of the loop its id lives on, the listener's for an accepted channel, are not all read);
 * {@code -Drdmabridge.channel.completeCopiesOnPost=false} makes copied
 * buffers wait for delivery too. So, as on every Netty transport, a write's promise completes before any answer to it
 * is read, even where the completion comes after the answer, and a write after the peer's reset has arrived fails.
 * Each flush posts at most {@code WRITE_SPIN_COUNT} work requests before it yields to the other channels of the loop.
 *
 * <h2>Reads</h2>
 * Eager frames are handed up as the receive buffers they landed in; releasing them reposts the receive and returns a
 * credit. With {@code autoRead=false} and no read pending, nothing is reposted, so the peer runs out of credits and
 * stops: back-pressure reaches the sender's {@code isWritable()}. One read hands up at most the
 * {@link RecvByteBufAllocator.Handle#guess() guess()} of the channel's {@link RecvByteBufAllocator} in bytes, as a
 * stream socket does; the default {@link RdmaRecvByteBufAllocator} guesses {@link RdmaChannelOption#MAX_MESSAGE_SIZE},
 * so each message goes up whole. A smaller guess (Netty's {@code AdaptiveRecvByteBufAllocator}, say) makes the
 * reads hand up slices of the received buffer, still without a copy; it is reposted once every slice is released.
 *
 * <h2>Closing</h2>
 * A graceful close sends end of stream after everything posted (as TCP's FIN) and destroys the queue pair once that
 * has completed (bounded linger); the peer sees {@code ChannelInputShutdownEvent} with {@code ALLOW_HALF_CLOSURE},
 * otherwise a clean close. {@code SO_LINGER=0} closes abortively: a disconnect without end of stream, which the peer,
 * like a peer whose process died, reports as an {@link IOException} "connection reset by peer" before
 * {@code channelInactive}. An accepted channel closed while its handshake is still ending (its peer may count itself
 * connected already) closes gracefully once established, within the same linger bound. {@code shutdownOutput()} sends
 * end of stream once every posted write has completed; a write issued after it fails at once with
 * {@link ClosedChannelException}, as NIO's does. A write that fails while earlier writes are still posted on a healthy
 * queue pair closes the channel (the queue pair first), whatever the error and {@code AUTO_CLOSE}: where NIO's channel
 * would shut its output down and free the flushed buffers, the device and the peer's READs may still be using them.
 * A channel closed while deregistered, which no loop polls, cannot see its writes complete: it closes at once, as with
 * {@code SO_LINGER=0}. It cannot be registered again: that is refused, and Netty then closes it, on the loop it was
 * first registered with, which {@link #eventLoop()} goes on returning.
 *
 * <h2>Threading</h2>
 * One event-loop thread owns the queue pair, its completion queue and all state here; other threads only read the
 * volatile state flags and addresses, and a released received buffer hops its repost to that thread. The hot paths
 * (write, completion, receive) allocate nothing per message and take no locks. For an accepted channel the
 * connection-manager id belongs to the listener's loop: operations on it hop there, and its events hop back.
 */
public final class RdmaSocketChannel extends AbstractRdmaChannel implements SocketChannel {
    static final int STATE_OPEN = 0;
    static final int STATE_CONNECTING = 1;
    static final int STATE_ACTIVE = 2;
    static final int STATE_CLOSED = 3;

    private final RdmaChannelConfig config;
    private final RdmaChannelMetrics metrics = new RdmaChannelMetrics();
    /** One of the {@code STATE_} values: written on the loop by the set-up and the close, read anywhere. */
    volatile int state;
    /** The loop's device, memory and allocator, once registered. */
    volatile RdmaDomain domain;
    /** The connection once the queue pair is connected; {@link RdmaChannelSetup} sets it. */
    RdmaConnection connection;
    // End of the SEND_COMPLETION_POLL_NANOS window of this channel's last write (event loop only).
    private long sendPollDeadline;
    /** The peer's address, as asked for and then as connected; {@link RdmaChannelSetup} sets it. */
    volatile InetSocketAddress remote;

    // The channel's concerns; this class keeps Netty's Channel surface, the unsafe and the poll that drives them.
    final RdmaChannelSetup setup;
    final RdmaChannelInbound inbound;
    final RdmaChannelOutbound outbound;
    final RdmaChannelClosing closing;

    /** Creates an unconnected channel (the {@code Bootstrap.channel(RdmaSocketChannel.class)} way). */
    public RdmaSocketChannel() {
        super(null);
        config = new RdmaChannelConfig(this);
        setup = new RdmaChannelSetup(this, null, null);
        inbound = new RdmaChannelInbound(this);
        outbound = new RdmaChannelOutbound(this);
        closing = new RdmaChannelClosing(this);
    }

    /** An accepted channel: the connect request is not yet answered; accepting happens once registered. */
    RdmaSocketChannel(RdmaServerSocketChannel parent, RdmaCmId id, RdmaIoHandler idOwner) {
        super(parent);
        config = new RdmaChannelConfig(this);
        setup = new RdmaChannelSetup(this, id, idOwner);
        inbound = new RdmaChannelInbound(this);
        outbound = new RdmaChannelOutbound(this);
        closing = new RdmaChannelClosing(this);
        state = STATE_CONNECTING;
        local = id.localAddress();
        remote = id.remoteAddress();
    }

    @Override
    public ServerSocketChannel parent() {
        return (ServerSocketChannel) super.parent();
    }

    @Override
    public RdmaChannelConfig config() {
        return config;
    }

    /** This channel's counters. */
    public RdmaChannelMetrics metrics() {
        return metrics;
    }

    /** The counters of all channels of this channel's event loop; {@code null} before registration. */
    public RdmaChannelMetrics eventLoopMetrics() {
        RdmaIoHandler h = handler;
        return h == null ? null : h.metrics();
    }

    RdmaByteBufAllocator registeredAllocator() {
        RdmaDomain d = domain;
        return d == null ? null : d.allocator;
    }

    /** The queue pair, once connected (tests inject faults on it). */
    QueuePair queuePair() {
        return setup.queuePair();
    }

    /** Receive buffers handed up and not yet released (tests); call on the event loop. */
    int heldReceiveBuffers() {
        return setup.heldReceiveBuffers();
    }

    @Override
    public boolean isOpen() {
        return state != STATE_CLOSED;
    }

    @Override
    public boolean isActive() {
        return state == STATE_ACTIVE;
    }

    @Override
    public boolean isInputShutdown() {
        return inbound.isInputShutdown() || !isActive() && state != STATE_OPEN && state != STATE_CONNECTING;
    }

    @Override
    public boolean isOutputShutdown() {
        return closing.isOutputShutdown() || !isActive() && state != STATE_OPEN && state != STATE_CONNECTING;
    }

    @Override
    public boolean isShutdown() {
        return isInputShutdown() && isOutputShutdown() || !isActive() && state == STATE_CLOSED;
    }

    @Override
    public InetSocketAddress remoteAddress() {
        return (InetSocketAddress) super.remoteAddress();
    }

    @Override
    protected SocketAddress remoteAddress0() {
        return remote;
    }

    @Override
    protected AbstractUnsafe newUnsafe() {
        return new RdmaSocketUnsafe();
    }

    @Override
    void registered(ChannelPromise promise) {
        // The registered allocator must be there for handlerAdded; an accepted channel accepts once its handlers
        // (and the options they set) are in.
        domain = handler.domain();
        promise.setSuccess();
        setup.registered();
    }

    @Override
    protected void doBind(SocketAddress localAddress) throws Exception {
        setup.bind(localAddress);
    }

    @Override
    protected void doDisconnect() throws Exception {
        doClose();
    }

    @Override
    protected Object filterOutboundMessage(Object msg) throws ClosedChannelException {
        if (closing.isOutputShutdownPending()) {
            // shutdownOutput() waits for posted work; what is written after it fails now, as NIO's does.
            throw new ClosedChannelException();
        }
        if (msg instanceof ByteBuf || msg instanceof FileRegion) {
            return msg;
        }
        throw new UnsupportedOperationException("unsupported message type: " + msg.getClass().getSimpleName()
                + " (expected: ByteBuf or FileRegion)");
    }

    @Override
    protected void doDeregister() {
        super.doDeregister();
        closing.deregistered();
    }

    @Override
    protected void doBeginRead() {
        inbound.beginRead();
    }

    /** {@code autoRead} was turned off (any thread). */
    void clearReadPending() {
        inbound.clearReadPending();
    }

    @Override
    protected void doWrite(ChannelOutboundBuffer in) throws Exception {
        try {
            outbound.write(in);
        } catch (Throwable t) {
            RdmaConnection c = connection;
            if (c != null && c.operationsInFlight() > 0 && !(t instanceof IOException && config().isAutoClose())) {
                // Netty answers this by shutting the output down, which frees every flushed buffer at once, while
                // posted work requests may still read them and the peer may still READ an advertised rendezvous (an
                // rkey works from any queue pair of the domain): the device would send, and a peer read, memory the
                // pool has handed to someone else.
                if (c.isLost() || closing.isPeerGone()) {
                    // The queue pair moves no more bytes: only the advertised regions must go first. The output is
                    // shut down and the channel stays open, as AUTO_CLOSE=false asks.
                    c.withdrawExposures();
                } else {
                    // The queue pair may still read them: close first, so that it is gone before anything is freed.
                    ClosedChannelException closeCause = new ClosedChannelException();
                    closeCause.initCause(t);
                    closeNow(unsafe().voidPromise(), t, closeCause);
                }
            }
            throw t;
        }
    }

    @Override
    public ChannelFuture shutdownOutput() {
        return shutdownOutput(newPromise());
    }

    @Override
    public ChannelFuture shutdownOutput(ChannelPromise promise) {
        EventLoop loop = eventLoop();
        if (loop.inEventLoop()) {
            closing.shutdownOutput(promise);
        } else {
            loop.execute(() -> closing.shutdownOutput(promise));
        }
        return promise;
    }

    @Override
    protected void doShutdownOutput() throws Exception {
        closing.doShutdownOutput();
    }

    @Override
    public ChannelFuture shutdownInput() {
        return shutdownInput(newPromise());
    }

    @Override
    public ChannelFuture shutdownInput(ChannelPromise promise) {
        EventLoop loop = eventLoop();
        if (loop.inEventLoop()) {
            closing.shutdownInput(promise);
        } else {
            loop.execute(() -> closing.shutdownInput(promise));
        }
        return promise;
    }

    @Override
    public ChannelFuture shutdown() {
        return shutdown(newPromise());
    }

    @Override
    public ChannelFuture shutdown(ChannelPromise promise) {
        ChannelFuture output = shutdownOutput();
        output.addListener((ChannelFutureListener) f -> {
            ChannelFuture input = shutdownInput();
            input.addListener((ChannelFutureListener) f2 -> {
                Throwable cause = f.cause() != null ? f.cause() : f2.cause();
                if (cause != null) {
                    promise.setFailure(cause);
                } else {
                    promise.setSuccess();
                }
            });
        });
        return promise;
    }

    @Override
    protected void doClose() throws Exception {
        closing.doClose();
    }

    // ---------------------------------------------------------------------------------------------- for the parts

    /** A write posted work: the loop polls, rather than sleeps, while it awaits its completion (event loop). */
    void sendPosted() {
        long window = config.sendCompletionPollNanos();
        if (window > 0) {
            long deadline = System.nanoTime() + window;
            sendPollDeadline = deadline;
            handler.sendPollUntil(deadline);
        }
    }

    /**
     * Its {@link RdmaChannelOption#BUSY_POLL_BUDGET_NANOS} changed: the loop, which polls as long as the largest budget
     * of its channels and took it at registration, takes it again. Before registration there is nothing to do: the
     * registration takes it.
     */
    void busyPollBudgetChanged() {
        if (isRegistered()) {
            Runnable update = () -> {
                RdmaIoHandler h = handler;
                if (h != null) {
                    h.updateBusyPoll();
                }
            };
            if (eventLoop().inEventLoop()) {
                update.run();
            } else {
                try {
                    eventLoop().execute(update);
                } catch (RejectedExecutionException e) {
                    // The loop has shut down: it polls no more, whatever the budget.
                }
            }
        }
    }

    /**
     * Polls the connection and hands what it reports to the parts: the handshake's end to the set-up, received
     * messages to the inbound path, completions and credits to the outbound path, a failure, a lost peer and
     * delayed closes to the closing.
     */
    int pollConnection() {
        RdmaConnection c = connection;
        if (c == null || c.isDestroyed()) {
            return 0;
        }
        int events = c.poll(handler.completions(), 4);
        if (state == STATE_CONNECTING) {
            if (!c.isReady()) {
                if (setup.handshakeFailed(c)) {
                    return 1;
                }
                return events != 0 ? 1 : 0;
            }
            // Frames that came right behind the peer's HELLO (even its end of stream or a disconnect) are handled
            // below, as on any later poll.
            setup.activate();
        }
        outbound.accountFlowControl(c);
        if ((events & RdmaConnection.EVENT_FAILED) != 0 && c.failure() != null) {
            closing.connectionFailed(c.failure());
            return 1;
        }
        if (state == STATE_CLOSED) {
            return events != 0 ? 1 : 0;
        }
        if ((events & RdmaConnection.EVENT_INBOUND) != 0 || inbound.isReadAwaitingSendQueue()) {
            if (inbound.isReadPending()) {
                inbound.readNow();
            } else {
                inbound.arrivedWithoutRead(c);
            }
        }
        if ((events & (RdmaConnection.EVENT_SENT | RdmaConnection.EVENT_CREDITS)) != 0) {
            outbound.writeMore();
        }
        if (c.isLost() || closing.isPeerGone()) {
            closing.peerGone();
            if (!inbound.isReadPending()) {
                inbound.endOfStreamIfNext(c);
            }
            if (state == STATE_CLOSED) {
                return 1;
            }
            if (!inbound.hasInbound(c) || inbound.isInputShutdown()) {
                closing.closeAfterPeerGone();
            } else if (inbound.isReadPending()) {
                inbound.readNow();
            }
        }
        closing.checkDelayed();
        return events != 0 ? 1 : 0;
    }

    /** Flushes now (the write path posts more once completions or credits made room). */
    void flushNow() {
        ((RdmaSocketUnsafe) unsafe()).flushNow();
    }

    /** Closes at once, past the unsafe's graceful-close decision (which the closing makes). */
    void closeNow(ChannelPromise promise, Throwable cause, ClosedChannelException closeCause) {
        ((RdmaSocketUnsafe) unsafe()).closeNow(promise, cause, closeCause);
    }

    /** Netty's output shutdown, once the closing has let posted work complete. */
    void shutdownOutputNow(ChannelPromise promise) {
        ((AbstractUnsafe) unsafe()).shutdownOutput(promise);
    }

    /** Netty's annotation of a connect failure with the address, for the set-up. */
    Throwable annotateConnectException(Throwable cause, SocketAddress remoteAddress) {
        return ((RdmaSocketUnsafe) unsafe()).annotate(cause, remoteAddress);
    }

    /** Netty's check of a file region against its file, for the write path. */
    void checkFileRegion(DefaultFileRegion region, long position) throws IOException {
        validateFileRegion(region, position);
    }

    private final class RdmaSocketUnsafe extends AbstractRdmaUnsafe {

        @Override
        public void connect(SocketAddress remoteAddress, SocketAddress localAddress, ChannelPromise promise) {
            if (promise.isDone() || !ensureOpen(promise)) {
                return;
            }
            setup.connect(remoteAddress, localAddress, promise);
        }

        @Override
        protected void close(ChannelPromise promise, Throwable cause, ClosedChannelException closeCause) {
            closing.close(promise, cause, closeCause);
        }

        void closeNow(ChannelPromise promise, Throwable cause, ClosedChannelException closeCause) {
            super.close(promise, cause, closeCause);
        }

        void flushNow() {
            flush0();
        }

        Throwable annotate(Throwable cause, SocketAddress remoteAddress) {
            return annotateConnectException(cause, remoteAddress);
        }

        @Override
        public void handle(IoRegistration registration, IoEvent event) {
            RdmaCmIoEvent e = (RdmaCmIoEvent) event;
            // Registered or not (deregister() leaves the channel with its first loop), that loop owns the channel.
            EventLoop loop = firstLoop();
            if (loop == null) {
                // Accepted, not registered yet (waiting in the listener's backlog): its pipeline cannot run here.
                setup.eventBeforeRegistration(e);
                return;
            }
            if (!loop.inEventLoop()) {
                setup.handOver(loop, e);
                return;
            }
            setup.connectEvent(e);
        }

        @Override
        public int poll(RdmaIoHandler h) {
            return pollConnection();
        }

        @Override
        public void arm() {
            setup.arm();
        }

        @Override
        public void destroyNow() {
            if (state != STATE_CLOSED) {
                state = STATE_CLOSED;
                setup.handshakeEnded();
                closing.releaseResources();
            }
        }

        @Override
        public long busyPollBudgetNanos() {
            return config.busyPollBudgetNanos();
        }

        @Override
        public long sendCompletionPollDeadline(long now) {
            RdmaConnection c = connection;
            long deadline = sendPollDeadline;
            return c != null && deadline - now > 0 && !c.isSendQueueIdle() ? deadline : now;
        }

        @Override
        void abort() {
            // Without end of stream: the peer sees a reset, never a clean end of a stream that lost bytes.
            closing.forceClose();
        }
    }
}
