package io.rdmabridge.benchmarks;

import io.netty.bootstrap.Bootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import io.netty.channel.DefaultFileRegion;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.WriteBufferWaterMark;
import io.netty.util.concurrent.Promise;
import io.rdmabridge.netty.RdmaChannelMetrics;
import io.rdmabridge.netty.RdmaSocketChannel;

import java.io.File;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.io.UncheckedIOException;
import java.net.SocketAddress;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

/**
 * The client end of one benchmark connection to a {@link PerfServer}: either a ping-pong ({@link #roundTrip()}) or a
 * stream of fixed-size messages acknowledged per batch ({@link #streamBatch()}). Messages are written from the event
 * loop while the channel is writable, so back-pressure is the transport's own.
 *
 * <p>Threading: {@link #roundTrip()}, {@link #streamBatch()}, {@link #drain()} and {@link #close()} are called by one
 * application thread (the benchmark thread); the handler runs on the channel's event loop and hands progress over
 * through a volatile counter plus an unpark.
 */
public final class PerfClient implements AutoCloseable {
    /** Writes pause above 16 MiB in flight and resume below 4 MiB, so that 4 MiB messages still pipeline. */
    private static final WriteBufferWaterMark WATER_MARK = new WriteBufferWaterMark(4 << 20, 16 << 20);
    private static final long TIMEOUT_NANOS = TimeUnit.SECONDS.toNanos(60);
    private static final int SPINS = 200;

    private final Channel channel;
    private final int mode;
    private final int size;
    private final int messagesPerBatch;
    private final Payload payloadKind;
    private final ByteBuf payload;
    private final File file;
    private final Runnable addBatch = this::addBatch;
    private final Runnable ping = this::ping;

    // Event-loop state.
    private long remaining;

    // Hand-over to the application thread.
    private volatile long progress;
    private volatile Thread waiter;
    private volatile Throwable failure;

    // Event-loop-driven ping-pong (roundTripsOnEventLoop).
    private long[] loopRoundTrips;
    private int loopIndex;
    private long loopStart;
    private long loopTarget;
    private Promise<long[]> loopDone;

    // Application-thread state.
    private long expected;
    private long batches;

    private PerfClient(Channel channel, int mode, int size, int messagesPerBatch, Payload payloadKind)
            throws IOException {
        this.channel = channel;
        this.mode = mode;
        this.size = size;
        this.messagesPerBatch = messagesPerBatch;
        this.payloadKind = payloadKind;
        byte[] bytes = new byte[size];
        ThreadLocalRandom.current().nextBytes(bytes);
        switch (payloadKind) {
            case ALLOCATOR:
                payload = channel.alloc().directBuffer(size).writeBytes(bytes);
                file = null;
                break;
            case HEAP:
                payload = Unpooled.wrappedBuffer(bytes);
                file = null;
                break;
            case FILE:
                payload = null;
                file = File.createTempFile("rdma-perf-", ".bin");
                file.deleteOnExit();
                try (RandomAccessFile raf = new RandomAccessFile(file, "rw")) {
                    raf.write(bytes);
                }
                break;
            default:
                throw new AssertionError(payloadKind);
        }
    }

    /** Connects in echo mode: each {@link #roundTrip()} sends {@code size} bytes and waits for them to come back. */
    public static PerfClient echo(Transport transport, EventLoopGroup group, SocketAddress server, int size)
            throws Exception {
        return connect(transport, group, server, PerfHeader.MODE_ECHO, size, 1, Payload.ALLOCATOR);
    }

    /**
     * Connects in sink mode: each {@link #streamBatch()} sends {@code messagesPerBatch} messages of {@code size}
     * bytes, which the server acknowledges with one byte.
     */
    public static PerfClient sink(Transport transport, EventLoopGroup group, SocketAddress server, int size,
                                  int messagesPerBatch, Payload payload) throws Exception {
        return connect(transport, group, server, PerfHeader.MODE_SINK, size, messagesPerBatch, payload);
    }

    private static PerfClient connect(Transport transport, EventLoopGroup group, SocketAddress server, int mode,
                                      int size, int messagesPerBatch, Payload payload) throws Exception {
        if (size <= 0) {
            throw new IllegalArgumentException("size: " + size + " (expected: > 0)");
        }
        if (messagesPerBatch <= 0) {
            throw new IllegalArgumentException("messagesPerBatch: " + messagesPerBatch + " (expected: > 0)");
        }
        PerfClient[] self = new PerfClient[1];
        Bootstrap b = new Bootstrap().group(group).channel(transport.channelClass())
                .option(ChannelOption.WRITE_BUFFER_WATER_MARK, WATER_MARK)
                .handler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public void channelRead(ChannelHandlerContext ctx, Object msg) {
                        self[0].onRead((ByteBuf) msg);
                    }

                    @Override
                    public void channelWritabilityChanged(ChannelHandlerContext ctx) {
                        if (ctx.channel().isWritable()) {
                            self[0].pump();
                        }
                    }

                    @Override
                    public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
                        self[0].fail(cause);
                        ctx.close();
                    }

                    @Override
                    public void channelInactive(ChannelHandlerContext ctx) {
                        self[0].fail(new IllegalStateException("benchmark connection closed by the server"));
                    }
                });
        if (transport == Transport.EPOLL || transport == Transport.NIO) {
            b.option(ChannelOption.TCP_NODELAY, true);
        } else if (transport == Transport.RDMA) {
            RdmaTuning.apply(b);
        }
        Channel ch = b.connect(server).sync().channel();
        try {
            PerfClient client = new PerfClient(ch, mode, size, messagesPerBatch, payload);
            self[0] = client;
            long ackUnit = mode == PerfHeader.MODE_SINK ? (long) size * messagesPerBatch : 0;
            ch.writeAndFlush(PerfHeader.write(ch.alloc().directBuffer(PerfHeader.LENGTH), mode, ackUnit)).sync();
            return client;
        } catch (Exception | Error e) {
            ch.close();
            throw e;
        }
    }

    public Channel channel() {
        return channel;
    }

    public int size() {
        return size;
    }

    public int messagesPerBatch() {
        return messagesPerBatch;
    }

    /** Sends one message and waits for its echo. Echo mode only. */
    public void roundTrip() {
        if (mode != PerfHeader.MODE_ECHO) {
            throw new IllegalStateException("roundTrip() on a sink connection (expected: PerfClient.echo)");
        }
        expected += size;
        channel.eventLoop().execute(ping);
        await(expected);
    }

    /**
     * Runs {@code n} round trips driven by the event loop itself (each echo triggers the next ping), so the times
     * are the transport's own, without the hand-off to an application thread. Echo mode only.
     *
     * @return the round-trip times in nanoseconds, in the order measured
     */
    public long[] roundTripsOnEventLoop(int n) throws Exception {
        if (mode != PerfHeader.MODE_ECHO) {
            throw new IllegalStateException("roundTripsOnEventLoop() on a sink connection (expected: PerfClient.echo)");
        }
        if (n <= 0) {
            throw new IllegalArgumentException("n: " + n + " (expected: > 0)");
        }
        Promise<long[]> done = channel.eventLoop().newPromise();
        channel.eventLoop().execute(() -> {
            loopRoundTrips = new long[n];
            loopIndex = 0;
            loopDone = done;
            loopPing();
        });
        long[] result = done.get(TIMEOUT_NANOS, TimeUnit.NANOSECONDS);
        expected += (long) n * size;
        return result;
    }

    /**
     * Sends one more batch and waits for the acknowledgement of the batch before it, so that one batch is always in
     * flight behind the one being written. Sink mode only; {@link #drain()} waits for the last one.
     */
    public void streamBatch() {
        if (mode != PerfHeader.MODE_SINK) {
            throw new IllegalStateException("streamBatch() on an echo connection (expected: PerfClient.sink)");
        }
        batches++;
        channel.eventLoop().execute(addBatch);
        await(batches - 1);
    }

    /** Waits until every batch sent so far is acknowledged. */
    public void drain() {
        await(batches);
    }

    /** Bytes the RDMA channel copied with the CPU before sending (0 for other transports). */
    public long copiedBytes() {
        return metrics() == null ? 0 : metrics().copiedBytes();
    }

    /** This connection's RDMA counters, or {@code null} for other transports. */
    public RdmaChannelMetrics metrics() {
        return channel instanceof RdmaSocketChannel ? ((RdmaSocketChannel) channel).metrics() : null;
    }

    @Override
    public void close() {
        channel.close().syncUninterruptibly();
        if (payload != null) {
            // Released on the loop after the channel has failed its pending writes.
            channel.eventLoop().submit(() -> payload.release()).syncUninterruptibly();
        }
        if (file != null && !file.delete()) {
            file.deleteOnExit();
        }
    }

    private void await(long target) {
        long deadline = 0;
        int spins = 0;
        while (progress < target) {
            Throwable cause = failure;
            if (cause != null) {
                throw new IllegalStateException("benchmark connection failed: " + cause, cause);
            }
            if (spins < SPINS) {
                spins++;
                Thread.onSpinWait();
                continue;
            }
            if (deadline == 0) {
                deadline = System.nanoTime() + TIMEOUT_NANOS;
            }
            waiter = Thread.currentThread();
            if (progress < target) {
                LockSupport.parkNanos(this, TimeUnit.MILLISECONDS.toNanos(10));
            }
            if (System.nanoTime() - deadline > 0) {
                waiter = null;
                throw new IllegalStateException("no progress for 60 s (at " + progress + ", waiting for " + target
                        + "): the server stopped answering");
            }
        }
        waiter = null;
    }

    // Event loop from here on.

    private void ping() {
        channel.writeAndFlush(payload.retainedDuplicate(), channel.voidPromise());
    }

    private void loopPing() {
        loopTarget = progress + size;
        loopStart = System.nanoTime();
        ping();
    }

    private void addBatch() {
        remaining += messagesPerBatch;
        pump();
    }

    private void pump() {
        if (remaining == 0) {
            return;
        }
        while (remaining > 0 && channel.isWritable()) {
            channel.write(nextMessage(), channel.voidPromise());
            remaining--;
        }
        channel.flush();
    }

    private Object nextMessage() {
        if (payloadKind != Payload.FILE) {
            return payload.retainedDuplicate();
        }
        DefaultFileRegion region = new DefaultFileRegion(file, 0, size);
        try {
            // RdmaSocketChannel validates a lazily opened region before opening it (netty-requests.md, bench 1).
            region.open();
        } catch (IOException e) {
            region.release();
            throw new UncheckedIOException(e);
        }
        return region;
    }

    private void onRead(ByteBuf msg) {
        int n = msg.readableBytes();
        msg.release();
        // Echo mode counts bytes, sink mode counts one-byte acknowledgements: either way, bytes.
        progress += n;
        if (loopDone != null && progress >= loopTarget) {
            loopRoundTrips[loopIndex++] = System.nanoTime() - loopStart;
            if (loopIndex < loopRoundTrips.length) {
                loopPing();
            } else {
                Promise<long[]> done = loopDone;
                loopDone = null;
                done.setSuccess(loopRoundTrips);
            }
        }
        Thread w = waiter;
        if (w != null) {
            LockSupport.unpark(w);
        }
    }

    private void fail(Throwable cause) {
        if (failure == null) {
            failure = cause;
        }
        if (loopDone != null) {
            loopDone.tryFailure(cause);
            loopDone = null;
        }
        Thread w = waiter;
        if (w != null) {
            LockSupport.unpark(w);
        }
    }
}
