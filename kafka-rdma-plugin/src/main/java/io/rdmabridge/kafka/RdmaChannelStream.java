package io.rdmabridge.kafka;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelOption;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.socket.ChannelInputShutdownEvent;
import io.rdmabridge.netty.RdmaSocketChannel;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

/**
 * An {@link RdmaStream} over one {@link RdmaSocketChannel}: the connection core underneath owns credits, eager and
 * rendezvous transfers and half-close; this class only adapts Netty's push model to the pull model of a non-blocking
 * {@link java.nio.channels.SocketChannel}.
 *
 * <p>Receiving: the channel's received buffers (registered receive slots, or the registered target of a rendezvous
 * READ) wait in a fixed ring until {@link #read} copies them into Kafka's buffer (the one copy on the follower) and
 * releases them, which reposts the receive and returns the credit. When the ring holds {@code highBuffers} buffers or
 * {@value #HIGH_BYTES} bytes, {@code autoRead} goes off, so the peer runs out of credits and stops; it comes back on
 * once {@link #read} has drained the ring to a quarter of that. The ring never overflows: with {@code autoRead} off
 * the channel delivers at most the message in hand.
 *
 * <p>Sending: {@link #write} takes at most {@value #MAX_WRITE} bytes while the channel is writable, copies them into a
 * buffer of the channel's registered allocator (the one copy on the leader, also for a mapped file segment from
 * {@code FileChannel.transferTo}) and writes it; the core sends it from there without another copy (rendezvous for
 * large writes). Writability is Netty's write-buffer water mark, so at most one write beyond the high mark is queued.
 *
 * <p>Closing: as a socket's {@code close()} still delivers what its send buffer holds, {@link #close} lets the bytes
 * {@link #write} took reach the peer before the end of stream; a peer that does not take them within
 * {@value #CLOSE_LINGER_MILLIS} ms gets a reset ({@code SO_LINGER=0}) instead, never a cut stream that ends cleanly.
 *
 * <p>Threading: {@link #read}, {@link #write}, {@link #shutdownOutput} and {@link #close} are called by one thread at
 * a time (the owner); the handler methods run on the channel's event loop; the ring is single-producer (event loop),
 * single-consumer (owner). The readiness listener runs on the event loop.
 */
final class RdmaChannelStream extends ChannelInboundHandlerAdapter implements RdmaStream {
    /** Largest piece one {@link #write} call takes: one registered pooled block, sent by rendezvous. */
    static final int MAX_WRITE = 256 * 1024;
    /** Received bytes held before {@code autoRead} goes off. */
    static final long HIGH_BYTES = 1024 * 1024;
    /** How long a close waits for the peer to take what {@link #write} accepted before it resets the connection. */
    static final long CLOSE_LINGER_MILLIS = 5000;

    private static final Runnable NO_LISTENER = () -> { };

    private final RdmaSocketChannel channel;
    private final String providerName;
    private final ByteBuf[] ring;
    private final int mask;
    private final int highBuffers;
    private final AtomicLong queuedBytes = new AtomicLong();
    private final AtomicBoolean paused = new AtomicBoolean();
    private final AtomicBoolean closed = new AtomicBoolean();
    private final Runnable resume = this::resumeReading;
    private volatile long head;
    private volatile long tail;
    private volatile Runnable listener = NO_LISTENER;
    private volatile boolean endOfStream;
    private volatile Throwable failure;
    private volatile long copiedReceived;
    private volatile long copiedSent;

    /**
     * @param highBuffers received buffers held before reading pauses; keep it below three quarters of the receive
     *                    queue depth, beyond which the channel copies received bytes to keep credits flowing
     */
    RdmaChannelStream(RdmaSocketChannel channel, String providerName, int highBuffers) {
        this.channel = channel;
        this.providerName = providerName;
        this.highBuffers = Math.max(1, highBuffers);
        // Room for the high mark plus the one message in hand when reading pauses, rounded up to a power of two.
        int capacity = Integer.highestOneBit(this.highBuffers + 1) << 1;
        ring = new ByteBuf[capacity];
        mask = capacity - 1;
    }

    RdmaSocketChannel channel() {
        return channel;
    }

    // ---- owner's side ----------------------------------------------------------------------------------------------

    @Override
    public int read(ByteBuffer dst) throws IOException {
        int total = 0;
        long h = head;
        while (dst.hasRemaining() && h != tail) {
            ByteBuf buf = ring[(int) (h & mask)];
            int n = Math.min(buf.readableBytes(), dst.remaining());
            int limit = dst.limit();
            dst.limit(dst.position() + n);
            buf.readBytes(dst);
            dst.limit(limit);
            total += n;
            if (!buf.isReadable()) {
                ring[(int) (h & mask)] = null;
                buf.release();
                head = ++h;
            }
        }
        if (total > 0) {
            copiedReceived += total;
            queuedBytes.addAndGet(-total);
            if (paused.get() && belowLowMark()) {
                resumeFromOwner();
            }
            return total;
        }
        Throwable f = failure;
        if (f != null) {
            throw new IOException("RDMA stream " + describe() + " failed: " + f, f);
        }
        return endOfStream ? -1 : 0;
    }

    @Override
    public int write(ByteBuffer src) throws IOException {
        Throwable f = failure;
        if (f != null) {
            throw new IOException("RDMA stream " + describe() + " failed: " + f, f);
        }
        if (closed.get() || !channel.isActive()) {
            throw new ClosedChannelException();
        }
        if (!src.hasRemaining() || !channel.isWritable()) {
            return 0;
        }
        int n = Math.min(src.remaining(), MAX_WRITE);
        ByteBuf buf = channel.alloc().directBuffer(n, n);
        int limit = src.limit();
        src.limit(src.position() + n);
        try {
            buf.writeBytes(src);
        } catch (InternalError e) {
            // A fault reading the source: a memory-mapped log segment truncated while the leader sends it (transferTo
            // maps it). Part of the response may be gone already, so the connection must close: an IOException
            // makes Kafka's selector close it at once, where an Error would leave it half-sent until a timeout.
            buf.release();
            throw new IOException("RDMA stream " + describe() + ": reading the bytes to send faulted (" + e.getMessage()
                    + "); a memory-mapped log segment truncated while it was sent does this. The connection closes and"
                    + " the follower fetches again", e);
        } catch (RuntimeException | Error e) {
            // The copy failed: the buffer is still ours to give back.
            buf.release();
            throw e;
        } finally {
            src.limit(limit);
        }
        copiedSent += n;
        channel.writeAndFlush(buf, channel.voidPromise());
        return n;
    }

    @Override
    public boolean isReadable() {
        return head != tail || endOfStream || failure != null;
    }

    @Override
    public boolean isWritable() {
        return channel.isWritable() || failure != null || !channel.isActive();
    }

    @Override
    public void readinessListener(Runnable listener) {
        this.listener = listener == null ? NO_LISTENER : listener;
        // Bytes may have arrived before anyone listened.
        if (isReadable()) {
            this.listener.run();
        }
    }

    @Override
    public long copiedBytesReceived() {
        return copiedReceived + channel.metrics().receivedCopiedBytes();
    }

    @Override
    public long copiedBytesSent() {
        return copiedSent + channel.metrics().copiedBytes();
    }

    @Override
    public void shutdownOutput() throws IOException {
        try {
            channel.shutdownOutput().sync();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while shutting down the output of " + describe(), e);
        }
    }

    @Override
    public void close() {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        try {
            channel.eventLoop().execute(this::closeOnLoop);
        } catch (RejectedExecutionException e) {
            // The group is shutting down: nothing more will be delivered either way.
            releaseQueued();
            channel.close();
        }
    }

    /** {@link #close}'s work, on the event loop: after the last delivery, and after the writes before it. */
    private void closeOnLoop() {
        // The owner reads no more; reading on drops what arrives, so the peer's credits keep flowing.
        releaseQueued();
        channel.config().setAutoRead(true);
        if (!channel.isActive()) {
            channel.close();
            return;
        }
        ScheduledFuture<?> linger = channel.eventLoop().schedule(() -> {
            channel.config().setOption(ChannelOption.SO_LINGER, 0);
            channel.close();
        }, CLOSE_LINGER_MILLIS, TimeUnit.MILLISECONDS);
        // An empty write completes once every write before it has: then the end of stream follows them.
        channel.writeAndFlush(Unpooled.EMPTY_BUFFER).addListener(f -> {
            if (linger.cancel(false)) {
                channel.close();
            }
        });
    }

    @Override
    public void whenClosed(Runnable action) {
        // Netty completes the close future after doClose, which destroys the queue pair and frees its memory. A
        // listener added to a completed future would run on the event loop, which may have stopped by then.
        if (channel.closeFuture().isDone()) {
            action.run();
        } else {
            channel.closeFuture().addListener(f -> action.run());
        }
    }

    @Override
    public String describe() {
        return providerName + " " + channel.localAddress() + " -> " + channel.remoteAddress();
    }

    private boolean belowLowMark() {
        return tail - head <= highBuffers / 4 && queuedBytes.get() <= HIGH_BYTES / 4;
    }

    private void resumeFromOwner() {
        if (paused.compareAndSet(true, false)) {
            try {
                channel.eventLoop().execute(resume);
            } catch (RejectedExecutionException e) {
                // The group is shutting down: no more reads anyway.
            }
        }
    }

    private void resumeReading() {
        if (!closed.get()) {
            channel.config().setAutoRead(true);
        }
    }

    // ---- event loop's side ---------------------------------------------------------------------------------------

    /** Takes a buffer that arrived before this stream was attached (after the token). Event loop only. */
    void offer(ByteBuf buf) {
        enqueue(buf);
        listener.run();
    }

    private void enqueue(ByteBuf buf) {
        if (closed.get()) {
            buf.release();
            return;
        }
        long t = tail;
        if (t - head > mask) {
            // Cannot happen while autoRead pauses as documented; fail loudly rather than grow.
            buf.release();
            fail(new IOException("RDMA stream receive ring full with " + ring.length + " buffers (expected: reading "
                    + "pauses at " + highBuffers + ")"));
            return;
        }
        ring[(int) (t & mask)] = buf;
        queuedBytes.addAndGet(buf.readableBytes());
        tail = t + 1;
        if (t + 1 - head >= highBuffers || queuedBytes.get() >= HIGH_BYTES) {
            channel.config().setAutoRead(false);
            paused.set(true);
            // The owner may have drained the ring before it could see the pause: resume ourselves then.
            if (belowLowMark() && paused.compareAndSet(true, false)) {
                channel.config().setAutoRead(true);
            }
        }
    }

    private void releaseQueued() {
        long h = head;
        while (h != tail) {
            ByteBuf buf = ring[(int) (h & mask)];
            ring[(int) (h & mask)] = null;
            buf.release();
            h++;
        }
        head = h;
        queuedBytes.set(0);
    }

    private void fail(Throwable cause) {
        if (failure == null) {
            failure = cause;
        }
        listener.run();
        channel.close();
    }

    @Override
    public void channelRead(ChannelHandlerContext ctx, Object msg) {
        ByteBuf buf = (ByteBuf) msg;
        if (!buf.isReadable()) {
            buf.release();
            return;
        }
        enqueue(buf);
    }

    @Override
    public void channelReadComplete(ChannelHandlerContext ctx) {
        listener.run();
    }

    @Override
    public void channelWritabilityChanged(ChannelHandlerContext ctx) {
        listener.run();
    }

    @Override
    public void userEventTriggered(ChannelHandlerContext ctx, Object evt) {
        if (evt instanceof ChannelInputShutdownEvent) {
            endOfStream = true;
            listener.run();
        }
        ctx.fireUserEventTriggered(evt);
    }

    @Override
    public void channelInactive(ChannelHandlerContext ctx) {
        endOfStream = true;
        if (closed.get()) {
            releaseQueued();
        }
        listener.run();
    }

    @Override
    public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
        fail(cause);
    }

    @Override
    public String toString() {
        return "RdmaChannelStream[" + describe() + "]";
    }
}
