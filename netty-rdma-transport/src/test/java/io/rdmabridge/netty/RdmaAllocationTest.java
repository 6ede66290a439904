package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.util.ResourceLeakDetector;
import io.netty.util.concurrent.Promise;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RdmaProviders;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.lang.management.ManagementFactory;
import java.net.InetSocketAddress;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Hot paths allocate nothing per message: bytes allocated by the one event-loop thread that runs the client, the
 * server, both queue pairs and the soft device under them, over {@value #ROUND_TRIPS} echo round trips of allocator
 * buffers after warm-up. No timing: the JVM's per-thread allocation counter is read on the loop thread before the
 * first write and after the last echo.
 *
 * <p>A round trip allocates nothing: allocator buffers (and their registered blocks) are recycled, received eager
 * buffers are one object per receive slot, writes and completions use preallocated rings. Measured: a few hundred
 * bytes in all over the {@value #ROUND_TRIPS} round trips (Netty's task queue and recycler refills, not per
 * message). The bound, {@value #MAX_BYTES_PER_ROUND_TRIP} bytes per round trip on average, is a quarter of the
 * smallest object the JVM allocates (16 bytes), so one object per message anywhere on the loop fails the test.
 * Leak detection is switched off for the measurement: its trace records allocate by design.
 */
class RdmaAllocationTest {
    private static final int ROUND_TRIPS = 10_000;
    private static final int MAX_BYTES_PER_ROUND_TRIP = 4;

    private final RdmaProvider provider = RdmaProviders.byName("soft");
    private final com.sun.management.ThreadMXBean threads =
            (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
    private EventLoopGroup group;
    private ResourceLeakDetector.Level leakLevel;

    @BeforeEach
    void setUp() {
        // Paranoid leak tracking (as Surefire runs these tests) records a trace per buffer; measure without it.
        leakLevel = ResourceLeakDetector.getLevel();
        ResourceLeakDetector.setLevel(ResourceLeakDetector.Level.DISABLED);
        // One loop: client, server child and both queue pairs share the thread that is measured.
        group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
    }

    @AfterEach
    void tearDown() throws Exception {
        ResourceLeakDetector.setLevel(leakLevel);
        group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        assertTrue(provider.resourceUsage().isZero(), "leaked: " + provider.resourceUsage());
    }

    /** 64 B goes inline, 4 KiB eager by reference, 256 KiB by rendezvous (received into allocator buffers too). */
    @ParameterizedTest
    @ValueSource(ints = {64, 4096, 256 * 1024})
    @Timeout(120)
    void echoRoundTripsAllocateNothingOnTheEventLoop(int size) throws Exception {
        Channel server = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                .childHandler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public void channelRead(ChannelHandlerContext ctx, Object msg) {
                        ctx.write(msg, ctx.voidPromise());
                    }

                    @Override
                    public void channelReadComplete(ChannelHandlerContext ctx) {
                        ctx.flush();
                    }
                }).bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();
        PingPong pingPong = new PingPong(size);
        Channel client = new Bootstrap().group(group).channel(RdmaSocketChannel.class).handler(pingPong)
                .connect(server.localAddress()).sync().channel();

        // Warm-up: JIT, slabs, recycler pools and the memory-region map reach their steady state.
        pingPong.run(client, ROUND_TRIPS).get(60, TimeUnit.SECONDS);
        Promise<Long> measured = pingPong.run(client, ROUND_TRIPS);
        long allocated = measured.get(60, TimeUnit.SECONDS);
        double perRoundTrip = (double) allocated / ROUND_TRIPS;
        System.out.println("size " + size + ": " + allocated + " bytes allocated by the event loop over " + ROUND_TRIPS
                + " round trips (" + perRoundTrip + " per round trip)");
        assertTrue(perRoundTrip <= MAX_BYTES_PER_ROUND_TRIP, "event loop allocated " + allocated + " bytes over "
                + ROUND_TRIPS + " round trips of " + size + " bytes (" + perRoundTrip + " per round trip, expected: <= "
                + MAX_BYTES_PER_ROUND_TRIP + ")");
        RdmaSocketChannel rdmaClient = (RdmaSocketChannel) client;
        assertEquals(0, rdmaClient.metrics().copiedBytes(), "allocator buffers were copied");
        RdmaChannelMetrics m = rdmaClient.metrics();
        long sent = 2L * ROUND_TRIPS * size;
        assertEquals(sent, m.receivedBytes());
        assertEquals(sent, size >= rdmaClient.config().rendezvousThreshold() ? m.rendezvousBytes()
                : m.inlineBytes() + m.eagerBytes(), "bytes went another path than the size picks");
        client.close().sync();
        server.close().sync();
    }

    /** Sends one allocator buffer, waits for its echo, repeats; counts allocation on the loop thread. */
    private final class PingPong extends ChannelInboundHandlerAdapter {
        private final int size;
        private Promise<Long> done;
        private int remaining;
        private int received;
        private long roundTrips;
        private long before;

        PingPong(int size) {
            this.size = size;
        }

        /** Starts {@code n} round trips on the loop; the promise carries the loop's allocated bytes. */
        Promise<Long> run(Channel ch, int n) {
            Promise<Long> p = ch.eventLoop().newPromise();
            ch.eventLoop().execute(() -> {
                done = p;
                remaining = n;
                roundTrips = 0;
                before = threads.getCurrentThreadAllocatedBytes();
                send(ch);
            });
            return p;
        }

        private void send(Channel ch) {
            remaining--;
            ByteBuf buf = ch.alloc().directBuffer(size);
            buf.setLong(0, roundTrips);
            buf.writerIndex(size);
            ch.writeAndFlush(buf, ch.voidPromise());
        }

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ByteBuf buf = (ByteBuf) msg;
            if (received == 0 && buf.getLong(buf.readerIndex()) != roundTrips) {
                done.tryFailure(new AssertionError("echo of round trip " + roundTrips + " carried "
                        + buf.getLong(buf.readerIndex())));
            }
            received += buf.readableBytes();
            buf.release();
            if (received < size) {
                return;
            }
            received = 0;
            roundTrips++;
            if (remaining > 0) {
                send(ctx.channel());
            } else {
                long after = threads.getCurrentThreadAllocatedBytes();
                done.trySuccess(after - before);
            }
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            if (done != null) {
                done.tryFailure(cause);
            }
        }
    }
}
