package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.WriteBufferWaterMark;
import io.rdmabridge.connection.RdmaConnection;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.ResourceUsage;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.zip.CRC32;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Two JVMs on the provider under test ({@link DeviceUnderTest}: the soft provider's TCP path over loopback by
 * default, DiSNI at the RDMA interface's address with {@code -Pdisni}): this one sends a seeded random mix of message
 * sizes (1 B to 8 MiB) to an echo server in a child JVM ({@link RdmaEchoPeerMain}) and checks the echoed stream byte
 * for byte (length and CRC-32), and flushes that mix copied bytes with more registered buffers than a frame has gather
 * entries; then the child is killed with SIGKILL mid-transfer, and this side must see
 * {@code channelInactive} promptly and give back every verbs resource. {@code -Drdmabridge.test.echo.mib} sets the
 * echoed size (default 1024; the rxe profile's 64 suits its slow guest); time limits grow with
 * {@code rdmabridge.test.slowdown}.
 */
// Runs on a real device too: the rxe stage selects the device tag (rxe/steps).
@Tag("device")
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class RdmaCrossProcessEchoTest {
    private static final long ECHO_BYTES = Long.getLong("rdmabridge.test.echo.mib", 1024) << 20;
    /** Echoed before the peer is killed: well into the transfer. */
    private static final long KILL_AFTER_BYTES = ECHO_BYTES / 16;
    private static final int MAX_MESSAGE_BITS = 23; // 8 MiB
    private static final int SOURCE_SIZE = 16 << 20;
    private static final long WINDOW = 48 << 20;
    private static final long SEED = 0x5eed_ec40L;
    private static final long DEATH_NOTICED_MILLIS = DeviceUnderTest.scaled(Duration.ofMillis(3000)).toMillis();

    private static Process peer;
    private static int peerPort;
    private static byte[] source;

    private final RdmaProvider provider = DeviceUnderTest.provider();
    private EventLoopGroup group;

    @BeforeAll
    static void startPeer() throws Exception {
        String java = System.getProperty("java.home") + File.separator + "bin" + File.separator + "java";
        List<String> command = new ArrayList<>(List.of(java, "-Xmx64m", "-XX:MaxDirectMemorySize=256m",
                "-Dio.netty.leakDetection.level=disabled"));
        command.addAll(DeviceUnderTest.childJvmOptions());
        command.addAll(List.of("-cp", System.getProperty("java.class.path"), RdmaEchoPeerMain.class.getName()));
        peer = new ProcessBuilder(command).redirectErrorStream(true).start();
        BufferedReader out = new BufferedReader(new InputStreamReader(peer.getInputStream(), StandardCharsets.UTF_8));
        String line;
        while ((line = out.readLine()) != null) {
            if (line.startsWith("PORT ")) {
                peerPort = Integer.parseInt(line.substring(5).trim());
                break;
            }
        }
        assertTrue(peerPort > 0, "the echo peer printed no port (last line: " + line + ")");
        // Keep draining its output (stack traces of a failure), so the child never blocks on a full pipe.
        Thread drain = new Thread(() -> {
            try {
                String l;
                while ((l = out.readLine()) != null) {
                    System.err.println("[echo peer] " + l);
                }
            } catch (Exception ignored) {
                // The peer is gone.
            }
        }, "echo-peer-output");
        drain.setDaemon(true);
        drain.start();
        source = new byte[SOURCE_SIZE];
        new SplittableRandom(SEED).nextBytes(source);
    }

    @AfterAll
    static void killPeer() throws InterruptedException {
        if (peer != null) {
            peer.destroyForcibly();
            peer.waitFor(10, TimeUnit.SECONDS);
        }
    }

    @BeforeEach
    void setUp() {
        group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
    }

    @AfterEach
    void tearDown() throws Exception {
        group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        // DiSNI's completion queues are destroyed by their event threads shortly after the channels closed them.
        assertTrue(provider.resourceUsage().awaitZero(DeviceUnderTest.scaled(Duration.ofSeconds(5))),
                "leaked: " + provider.resourceUsage());
    }

    /**
     * Netty's write order across processes: the peer's answer was read before the request's write promise
     * completed in 10-20 % of round trips on the soft provider's TCP path (its receive is raised before the
     * sender's acknowledgement comes back) until the promise followed the peer's count of frames received.
     */
    @Test
    @Order(1)
    void shouldCompleteEveryWritePromiseBeforeItsEchoIsRead() {
        assertTimeoutPreemptively(DeviceUnderTest.scaled(Duration.ofSeconds(60)), () -> {
            // An eager frame and a rendezvous (at the default threshold, 256 KiB).
            for (int size : new int[] {64, 256 << 10}) {
                WriteOrderClient client = new WriteOrderClient(size, size < 1024 ? 2000 : 200);
                Channel ch = new Bootstrap().group(group).channel(RdmaSocketChannel.class).handler(client)
                        .connect(new InetSocketAddress(DeviceUnderTest.address(), peerPort)).sync().channel();
                assertEquals(0, client.result.get(DeviceUnderTest.scaled(Duration.ofSeconds(50)).toSeconds(),
                        TimeUnit.SECONDS), "round trips of " + size + " B whose echo was read before the"
                        + " request's write promise completed");
                ch.close().sync();
            }
        });
    }

    @Test
    @Order(2)
    void shouldEchoMixedMessagesAcrossProcesses() {
        assertTimeoutPreemptively(DeviceUnderTest.scaled(Duration.ofSeconds(120)), this::echoMixedMessages);
    }

    private void echoMixedMessages() throws Exception {
        long start = System.nanoTime();
        EchoClient client = new EchoClient(ECHO_BYTES);
        Channel ch = connect(client);
        long received = client.done.get(DeviceUnderTest.scaled(Duration.ofSeconds(100)).toSeconds(),
                TimeUnit.SECONDS);
        assertEquals(ECHO_BYTES, received);
        assertEquals(client.sentCrc.getValue(), client.receivedCrc.getValue(), "CRC-32 of the echoed stream");
        // The seeded mix averages well under 1 MiB a message (2,680 messages in 1 GiB, 180 in 64 MiB).
        assertTrue(client.messages > ECHO_BYTES >> 20, "messages sent: " + client.messages);
        assertTrue(client.smallest <= 16 && client.largest > 4 << 20,
                "message sizes from " + client.smallest + " to " + client.largest + " (expected: 1 B to 8 MiB)");
        assertEquals(0, ((RdmaSocketChannel) ch).metrics().copiedBytes(), "allocator buffers were copied");
        System.out.printf("cross-process echo over %s at %s: %d bytes in %d messages (%d B to %d B) echoed in"
                + " %d ms, CRC-32 %08x both ways%n", provider.name(), ch.remoteAddress(), received,
                client.messages, client.smallest, client.largest,
                TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start), client.receivedCrc.getValue());
        ch.close().sync();
    }

    /**
     * Flushes of heap bytes, then registered buffers up to and past the frame's gather entries (4 on DiSNI, 32 on the
     * soft provider), then heap bytes again: the second copy must not be appended to the first once references came
     * between (it used to fail the write and shut the output). The echo must match byte for byte.
     */
    @Test
    @Order(3)
    void shouldEchoFlushesThatCopyAfterRegisteredBuffersFillTheFrame() {
        assertTimeoutPreemptively(DeviceUnderTest.scaled(Duration.ofSeconds(60)), () -> {
            ByteArrayOutputStream echoed = new ByteArrayOutputStream();
            Channel ch = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public void channelRead(ChannelHandlerContext ctx, Object msg) {
                            ByteBuf buf = (ByteBuf) msg;
                            byte[] b = new byte[buf.readableBytes()];
                            buf.readBytes(b).release();
                            synchronized (echoed) {
                                echoed.writeBytes(b);
                            }
                        }
                    }).connect(new InetSocketAddress(DeviceUnderTest.address(), peerPort)).sync().channel();
            ByteArrayOutputStream sent = new ByteArrayOutputStream();
            ByteBuf registered = ch.alloc().directBuffer(100).writeBytes(source, 0, 100);
            for (int heapLength : new int[] {10, 1000}) {
                for (int buffers = 1; buffers <= RdmaConnection.MAX_SGE + 1; buffers++) {
                    ch.write(Unpooled.wrappedBuffer(source, 100, heapLength));
                    sent.write(source, 100, heapLength);
                    for (int i = 0; i < buffers; i++) {
                        ch.write(registered.retainedDuplicate());
                        sent.write(source, 0, 100);
                    }
                    ch.writeAndFlush(Unpooled.wrappedBuffer(source, 2000, heapLength)).sync();
                    sent.write(source, 2000, heapLength);
                }
            }
            registered.release();
            byte[] want = sent.toByteArray();
            byte[] got;
            do {
                Thread.sleep(5);
                synchronized (echoed) {
                    got = echoed.toByteArray();
                }
            } while (got.length < want.length && ch.isActive());
            assertArrayEquals(want, got);
            ch.close().sync();
        });
    }

    @Test
    @Order(4)
    void shouldNoticeAKilledPeerMidTransferAndReleaseEverything() {
        assertTimeoutPreemptively(DeviceUnderTest.scaled(Duration.ofSeconds(60)), this::killPeerMidTransfer);
    }

    private void killPeerMidTransfer() throws Exception {
        EchoClient client = new EchoClient(Long.MAX_VALUE);
        connect(client);
        long deadline = System.nanoTime() + DeviceUnderTest.scaled(Duration.ofSeconds(30)).toNanos();
        while (client.received < KILL_AFTER_BYTES && System.nanoTime() < deadline && !client.done.isDone()) {
            Thread.sleep(5);
        }
        assertTrue(client.received >= KILL_AFTER_BYTES, "echoed before the kill: " + client.received + " bytes");

        long killed = System.nanoTime();
        peer.destroyForcibly();
        assertTrue(client.inactive.await(DeviceUnderTest.scaled(Duration.ofSeconds(10)).toMillis(),
                TimeUnit.MILLISECONDS), "channelInactive never came");
        long millis = TimeUnit.NANOSECONDS.toMillis(client.inactiveAt - killed);
        assertTrue(millis < DEATH_NOTICED_MILLIS, "channelInactive " + millis + " ms after SIGKILL (expected: < "
                + DEATH_NOTICED_MILLIS + " ms)");
        System.out.printf("killed peer noticed %d ms after SIGKILL, %d bytes echoed before%n", millis,
                client.received);
        assertTrue(peer.waitFor(10, TimeUnit.SECONDS));

        // The queue pair and its completion queue are gone with the channel; registered memory is pooled by the
        // group and goes when the group does (tearDown asserts that every count is back to zero).
        ResourceUsage usage = provider.resourceUsage();
        long until = System.nanoTime() + DeviceUnderTest.scaled(Duration.ofSeconds(2)).toNanos();
        while ((usage.queuePairs() != 0 || usage.completionQueues() != 0) && System.nanoTime() < until) {
            Thread.sleep(5);
        }
        assertEquals(0, usage.queuePairs(), "queue pairs left: " + usage);
        assertEquals(0, usage.completionQueues(), "completion queues left: " + usage);
        group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        assertEquals(0, usage.registeredBytes(), "registered bytes left: " + usage);
        assertTrue(usage.isZero(), "leaked: " + usage);
    }

    private Channel connect(EchoClient client) throws InterruptedException {
        return new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                .option(ChannelOption.WRITE_BUFFER_WATER_MARK, new WriteBufferWaterMark(16 << 20, 32 << 20))
                .handler(client).connect(new InetSocketAddress(DeviceUnderTest.address(), peerPort))
                .sync().channel();
    }

    /**
     * Writes seeded random messages (sizes log-uniform in [1 B, 8 MiB], bytes from a random source block) while at
     * most {@link #WINDOW} bytes are unechoed, and checksums both directions. Runs on the event loop.
     */
    private static final class EchoClient extends ChannelInboundHandlerAdapter {
        final long limit;
        final SplittableRandom random = new SplittableRandom(SEED);
        final CRC32 sentCrc = new CRC32();
        final CRC32 receivedCrc = new CRC32();
        final CompletableFuture<Long> done = new CompletableFuture<>();
        final CountDownLatch inactive = new CountDownLatch(1);
        volatile long inactiveAt;
        volatile long received;
        long sent;
        long messages;
        int smallest = Integer.MAX_VALUE;
        int largest;

        EchoClient(long limit) {
            this.limit = limit;
        }

        @Override
        public void channelActive(ChannelHandlerContext ctx) {
            pump(ctx);
        }

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ByteBuf buf = (ByteBuf) msg;
            try {
                ByteBuffer nio = buf.nioBuffer();
                receivedCrc.update(nio);
                received += buf.readableBytes();
            } finally {
                buf.release();
            }
            if (received == limit) {
                done.complete(received);
            } else if (received > sent) {
                done.completeExceptionally(new AssertionError("echoed " + received + " bytes, sent " + sent));
            }
        }

        @Override
        public void channelReadComplete(ChannelHandlerContext ctx) {
            pump(ctx);
        }

        @Override
        public void channelWritabilityChanged(ChannelHandlerContext ctx) {
            pump(ctx);
        }

        private void pump(ChannelHandlerContext ctx) {
            boolean wrote = false;
            while (sent < limit && sent - received < WINDOW && ctx.channel().isWritable()) {
                int size = 1 + random.nextInt(1 << random.nextInt(MAX_MESSAGE_BITS + 1));
                size = (int) Math.min(size, limit - sent);
                int offset = random.nextInt(SOURCE_SIZE - size + 1);
                ByteBuf buf = ctx.alloc().directBuffer(size).writeBytes(source, offset, size);
                sentCrc.update(source, offset, size);
                sent += size;
                messages++;
                smallest = Math.min(smallest, size);
                largest = Math.max(largest, size);
                ctx.write(buf, ctx.voidPromise());
                wrote = true;
            }
            if (wrote) {
                ctx.flush();
            }
        }

        @Override
        public void channelInactive(ChannelHandlerContext ctx) {
            inactiveAt = System.nanoTime();
            inactive.countDown();
            done.completeExceptionally(new AssertionError("connection closed after echoing " + received + " of "
                    + sent + " bytes"));
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            // A killed peer surfaces as an error completion first; the channel then closes itself.
            done.completeExceptionally(cause);
        }
    }
}
