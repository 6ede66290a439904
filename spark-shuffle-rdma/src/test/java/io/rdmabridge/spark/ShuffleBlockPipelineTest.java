package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.rdmabridge.netty.RdmaChannelOption;
import io.netty.util.concurrent.Promise;
import java.io.File;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.spark.network.buffer.FileSegmentManagedBuffer;
import org.apache.spark.network.buffer.ManagedBuffer;
import org.apache.spark.network.buffer.NettyManagedBuffer;
import org.apache.spark.network.shuffle.BlockFetchingListener;
import org.apache.spark.network.util.MapConfigProvider;
import org.apache.spark.network.util.TransportConf;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The block server and client in one JVM, over {@link BlockTransport}: RdmaSocketChannel on the soft provider. */
class ShuffleBlockPipelineTest {
    private static final TransportConf TRANSPORT_CONF = new TransportConf("shuffle", MapConfigProvider.EMPTY);
    private static final String EXECUTOR = "1";

    @TempDir
    File dir;
    private File data;
    private byte[] bytes;
    private BlockTransport transport;
    private final RdmaShuffleMetrics serverMetrics = new RdmaShuffleMetrics();
    private final RdmaShuffleMetrics clientMetrics = new RdmaShuffleMetrics();

    @BeforeEach
    void setUp() throws Exception {
        bytes = new byte[1 << 20];
        new Random(42).nextBytes(bytes);
        data = new File(dir, "shuffle_0_0_0.data");
        Files.write(data.toPath(), bytes);
        transport = BlockTransport.open(BlockTransport.SOFT, 1, RdmaShuffleConf.DEFAULT_SEND_QUEUE_DEPTH,
                RdmaShuffleConf.DEFAULT_RECV_QUEUE_DEPTH, "test-rdma-shuffle");
    }

    @AfterEach
    void tearDown() throws InterruptedException {
        transport.close();
        // Queue pairs, completion queues and registered memory of every connection go back to the provider.
        waitFor(() -> transport.provider().resourceUsage().isZero());
    }

    /** Block "b_OFFSET_LENGTH" is that segment of the data file; anything else does not exist. */
    private ManagedBuffer open(String blockId) {
        String[] f = blockId.split("_");
        if (f.length != 3 || !f[0].equals("b")) {
            throw new IllegalArgumentException("no such block: " + blockId);
        }
        return new FileSegmentManagedBuffer(TRANSPORT_CONF, data, Long.parseLong(f[1]), Long.parseLong(f[2]));
    }

    private ShuffleBlockServer server(String secret, long cap) {
        return new ShuffleBlockServer(transport, EXECUTOR, "127.0.0.1", 0, this::open, new PeerAuthenticator(secret),
                conf(cap), serverMetrics);
    }

    private ShuffleBlockServer server(BlockSource source) {
        return new ShuffleBlockServer(transport, EXECUTOR, "127.0.0.1", 0, source, new PeerAuthenticator(null),
                conf(1 << 20), serverMetrics);
    }

    private static RdmaShuffleConf conf(long pinnedMemoryCap) {
        return new RdmaShuffleConf(new org.apache.spark.SparkConf(false)
                .set(RdmaShuffleConf.PINNED_MEMORY_CAP, Long.toString(pinnedMemoryCap))
                .set(RdmaShuffleConf.PINNED_MEMORY_PER_CONNECTION, Long.toString(pinnedMemoryCap)));
    }

    private ShuffleBlockClient client(String secret) {
        RdmaShuffleConf conf = new RdmaShuffleConf(new org.apache.spark.SparkConf(false));
        return new ShuffleBlockClient(transport, new PeerAuthenticator(secret), 5_000, 10_000,
                conf::maxFetchedBlockLength, conf.maxFetchedBytesPerConnection, clientMetrics);
    }

    @Test
    void shouldFetchFileSegmentsByteForByteAndReleaseTheirBuffers() throws Exception {
        try (ShuffleBlockServer server = server(null, 1 << 20); ShuffleBlockClient client = client(null)) {
            Collector c = new Collector(3);
            client.fetch(EXECUTOR, address(server), new String[] {"b_0_1000", "b_1000_300000", "b_500000_0"}, c);
            c.await();
            assertEquals(Map.of(), c.failures);
            assertArrayEquals(slice(0, 1000), c.received.get("b_0_1000"));
            assertArrayEquals(slice(1000, 300000), c.received.get("b_1000_300000"));
            assertArrayEquals(new byte[0], c.received.get("b_500000_0"));
            assertEquals(301000, clientMetrics.bytesFetched.getCount());
            assertEquals(3, clientMetrics.blocksFetched.getCount());
            c.buffers.values().forEach(b -> assertTrue(b.refCnt() > 0, "alive while Spark holds it"));
            c.buffers.values().forEach(FetchedBlockBuffer::release);
            // Spark's release is the last one: the receive buffers go back to the transport.
            waitFor(() -> c.buffers.values().stream().allMatch(b -> b.refCnt() == 0));
            waitFor(() -> serverMetrics.bytesServed.getCount() == 301000);
        }
    }

    @Test
    void shouldCountCopiesOnlyForBlocksOutsideRegisteredMemory() throws Exception {
        serverMetrics.watchCopies(transport::copiedOnSendBytes, transport::copiedOnReceiveBytes);
        try (ShuffleBlockServer server = server(null, 1 << 20); ShuffleBlockClient client = client(null)) {
            Collector c = new Collector(1);
            client.fetch(EXECUTOR, address(server), new String[] {"b_0_300000"}, c);
            c.await();
            assertArrayEquals(slice(0, 300000), c.received.get("b_0_300000"));
            c.buffers.values().forEach(FetchedBlockBuffer::release);
            waitFor(() -> serverMetrics.bytesServed.getCount() == 300000);
            // A file segment leaves as mapped, registered chunks and lands in registered memory: no CPU copy.
            assertEquals(0, transport.copiedOnSendBytes());
            assertEquals(0, transport.copiedOnReceiveBytes());
            assertTrue(serverMetrics.snapshot().contains("bytesCopiedOnSend=0"), serverMetrics.snapshot());
        }
        // A block in a heap buffer has to be copied into registered memory once, and is counted.
        try (ShuffleBlockServer server = new ShuffleBlockServer(transport, EXECUTOR, "127.0.0.1", 0,
                id -> new org.apache.spark.network.buffer.NioManagedBuffer(java.nio.ByteBuffer.wrap(bytes, 0, 5000)),
                new PeerAuthenticator(null), conf(1 << 20), serverMetrics); ShuffleBlockClient client = client(null)) {
            Collector c = new Collector(1);
            client.fetch(EXECUTOR, address(server), new String[] {"heap"}, c);
            c.await();
            assertArrayEquals(slice(0, 5000), c.received.get("heap"));
            c.buffers.values().forEach(FetchedBlockBuffer::release);
            waitFor(() -> transport.copiedOnSendBytes() == 5000);
            assertTrue(serverMetrics.snapshot().contains("bytesCopiedOnSend=5000"), serverMetrics.snapshot());
        }
    }

    /** The server owns each block its source opens, and releases it once the block's bytes are sent. */
    @Test
    void shouldReleaseABlockOnceItIsSent() throws Exception {
        ByteBuf buf = Unpooled.directBuffer(4096).writeBytes(bytes, 0, 4096);
        try (ShuffleBlockServer server = server(id -> new NettyManagedBuffer(buf));
             ShuffleBlockClient client = client(null)) {
            Collector c = new Collector(1);
            client.fetch(EXECUTOR, address(server), new String[] {"direct"}, c);
            c.await();
            assertArrayEquals(slice(0, 4096), c.received.get("direct"));
            c.buffers.values().forEach(FetchedBlockBuffer::release);
            waitFor(() -> buf.refCnt() == 0, () -> "refCnt of the served block: " + buf.refCnt());
        }
    }

    /** A block too large for a frame fails, and is released all the same. */
    @Test
    void shouldReleaseABlockTooLargeToSend() throws Exception {
        ByteBuf buf = Unpooled.directBuffer(16).writeZero(16);
        try (ShuffleBlockServer server = server(id -> new NettyManagedBuffer(buf) {
            @Override
            public long size() {
                return BlockFrame.MAX_BLOCK_LENGTH + 1;
            }
        }); ShuffleBlockClient client = client(null)) {
            Collector c = new Collector(1);
            client.fetch(EXECUTOR, address(server), new String[] {"huge"}, c);
            c.await();
            String why = c.failures.get("huge").getMessage();
            assertTrue(why.contains("cannot serve huge: " + (BlockFrame.MAX_BLOCK_LENGTH + 1) + " bytes"), why);
            waitFor(() -> buf.refCnt() == 0, () -> "refCnt of the refused block: " + buf.refCnt());
        }
    }

    @Test
    void shouldReleaseABlockThatCannotBeRead() throws Exception {
        ByteBuf buf = Unpooled.directBuffer(16).writeZero(16);
        try (ShuffleBlockServer server = server(id -> new NettyManagedBuffer(buf) {
            @Override
            public java.nio.ByteBuffer nioByteBuffer() throws java.io.IOException {
                throw new java.io.IOException("unreadable");
            }
        }); ShuffleBlockClient client = client(null)) {
            Collector c = new Collector(1);
            client.fetch(EXECUTOR, address(server), new String[] {"bad"}, c);
            c.await();
            String why = c.failures.get("bad").getMessage();
            assertTrue(why.contains("cannot serve bad: java.io.IOException: unreadable"), why);
            waitFor(() -> buf.refCnt() == 0, () -> "refCnt of the unreadable block: " + buf.refCnt());
        }
    }

    @Test
    void shouldFetchManyLargeBlocksOnOneConnection() throws Exception {
        int blocks = 48;
        int size = 700_000;
        try (ShuffleBlockServer server = server(null, 4 << 20); ShuffleBlockClient client = client(null)) {
            String[] ids = new String[blocks];
            for (int i = 0; i < blocks; i++) {
                ids[i] = "b_" + (i * 7000) + "_" + size;
            }
            Collector c = new Collector(blocks);
            client.fetch(EXECUTOR, address(server), ids, c);
            c.await();
            assertEquals(Map.of(), c.failures);
            for (int i = 0; i < blocks; i++) {
                assertArrayEquals(slice(i * 7000, size), c.received.get(ids[i]), ids[i]);
            }
            c.buffers.values().forEach(FetchedBlockBuffer::release);
        }
    }

    @Test
    void shouldFetchOverConnectionsWithTheConfiguredQueueDepths() throws Exception {
        transport.close();
        // The smallest send queue the channel takes and two receive credits: the pipeline must still drain.
        transport = BlockTransport.open(BlockTransport.SOFT, 1, 8, 2, "test-rdma-shuffle-shallow");
        int blocks = 24;
        int size = 200_000;
        try (ShuffleBlockServer server = server(null, 1 << 20); ShuffleBlockClient client = client(null)) {
            Channel probe = transport.newBootstrap().handler(new ChannelInboundHandlerAdapter())
                    .connect(address(server)).sync().channel();
            assertEquals(8, probe.config().getOption(RdmaChannelOption.SEND_QUEUE_DEPTH));
            assertEquals(2, probe.config().getOption(RdmaChannelOption.RECEIVE_QUEUE_DEPTH));
            probe.close().sync();

            String[] ids = new String[blocks];
            for (int i = 0; i < blocks; i++) {
                ids[i] = i % 2 == 0 ? "b_" + (i * 9000) + "_" + size : "b_" + i + "_" + (100 + i);
            }
            Collector c = new Collector(blocks);
            client.fetch(EXECUTOR, address(server), ids, c);
            c.await();
            assertEquals(Map.of(), c.failures);
            for (int i = 0; i < blocks; i++) {
                int offset = i % 2 == 0 ? i * 9000 : i;
                assertArrayEquals(slice(offset, i % 2 == 0 ? size : 100 + i), c.received.get(ids[i]), ids[i]);
            }
            c.buffers.values().forEach(FetchedBlockBuffer::release);
        }
    }

    @Test
    void shouldFailOneBlockWithTheServersCauseAndServeTheOthers() throws Exception {
        try (ShuffleBlockServer server = server(null, 1 << 20); ShuffleBlockClient client = client(null)) {
            Collector c = new Collector(2);
            client.fetch(EXECUTOR, address(server), new String[] {"missing", "b_0_10"}, c);
            c.await();
            assertTrue(c.failures.get("missing").getMessage().contains("no such block: missing"),
                    c.failures.get("missing").getMessage());
            // Spark's retries take IOExceptions for transient: a block the server cannot serve must not be one.
            assertFalse(c.failures.get("missing") instanceof java.io.IOException, c.failures.get("missing").toString());
            assertArrayEquals(slice(0, 10), c.received.get("b_0_10"));
            c.buffers.values().forEach(FetchedBlockBuffer::release);
        }
    }

    @Test
    void shouldRefuseAPeerWithTheWrongSecret() throws Exception {
        try (ShuffleBlockServer server = server("right", 1 << 20); ShuffleBlockClient client = client("wrong")) {
            Collector c = new Collector(1);
            client.fetch(EXECUTOR, address(server), new String[] {"b_0_10"}, c);
            c.await();
            assertTrue(c.failures.get("b_0_10").getMessage().contains("authentication failed"),
                    c.failures.get("b_0_10").getMessage());
            assertEquals(Map.of(), c.received);
            assertEquals(1, serverMetrics.authFailures.getCount());
            assertEquals(0, serverMetrics.blocksServed.getCount());
        }
    }

    /**
     * An answer made for another executor's server does not pass, even with the right secret: a process that lured a
     * reducer meaning executor 2 cannot relay that reducer's answer to executor 1's server.
     */
    @Test
    void shouldRefuseAnAnswerMadeForAnotherExecutorsServer() throws Exception {
        try (ShuffleBlockServer server = server("right", 1 << 20); ShuffleBlockClient client = client("right")) {
            Collector c = new Collector(1);
            client.fetch("2", address(server), new String[] {"b_0_10"}, c);
            c.await();
            String why = c.failures.get("b_0_10").getMessage();
            assertTrue(why.contains("authentication failed") && why.contains("executor " + EXECUTOR + "'s"), why);
            assertEquals(Map.of(), c.received);
            assertEquals(1, serverMetrics.authFailures.getCount());
            assertEquals(0, serverMetrics.blocksServed.getCount());
        }
    }

    @Test
    void shouldServeAPeerWithTheRightSecret() throws Exception {
        try (ShuffleBlockServer server = server("right", 1 << 20); ShuffleBlockClient client = client("right")) {
            Collector c = new Collector(1);
            client.fetch(EXECUTOR, address(server), new String[] {"b_7_70"}, c);
            c.await();
            assertArrayEquals(slice(7, 70), c.received.get("b_7_70"));
            c.buffers.values().forEach(FetchedBlockBuffer::release);
        }
    }

    @Test
    void shouldKeepBytesInFlightUnderThePinnedMemoryCap() throws Exception {
        int blocks = 64;
        int size = 64 * 1024;
        try (ShuffleBlockServer server = server(null, 2 * size); ShuffleBlockClient client = client(null)) {
            String[] ids = new String[blocks];
            for (int i = 0; i < blocks; i++) {
                ids[i] = "b_" + (i * 1000) + "_" + size;
            }
            Collector c = new Collector(blocks);
            client.fetch(EXECUTOR, address(server), ids, c);
            c.await();
            assertEquals(blocks, c.received.size());
            assertArrayEquals(slice(63000, size), c.received.get(ids[63]));
            assertTrue(server.peakInFlightBytes() > 0 && server.peakInFlightBytes() <= 2L * size,
                    "peak in flight: " + server.peakInFlightBytes());
            c.buffers.values().forEach(FetchedBlockBuffer::release);
        }
    }

    @Test
    void shouldCloseAConnectionThatSendsAMalformedFrame() throws Exception {
        try (ShuffleBlockServer server = server(null, 1 << 20)) {
            ByteBuf received = Unpooled.buffer();
            Promise<Void> closed = transport.group().next().newPromise();
            Channel raw = transport.newBootstrap()
                    .handler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public void channelRead(ChannelHandlerContext ctx, Object msg) {
                            ByteBuf buf = (ByteBuf) msg;
                            received.writeBytes(buf);
                            buf.release();
                        }

                        @Override
                        public void channelInactive(ChannelHandlerContext ctx) {
                            closed.trySuccess(null);
                        }
                    }).connect(address(server)).sync().channel();
            ByteBuf out = raw.alloc().buffer();
            out.writeInt(BlockFrame.RESPONSE_FRAME_LENGTH).writeByte(BlockFrame.RESPONSE).writeZero(64);
            // FETCH whose block id length claims more bytes than the frame holds.
            out.writeInt(1 + 8 + 2 + 3).writeByte(BlockFrame.FETCH).writeLong(1).writeShort(200).writeZero(3);
            raw.writeAndFlush(out).sync();
            assertTrue(closed.await(20, TimeUnit.SECONDS), "the server closed the connection");

            received.skipBytes(BlockFrame.LENGTH_FIELD_LENGTH + BlockFrame.CHALLENGE_FRAME_LENGTH);
            assertEquals(BlockFrame.PROOF_FRAME_LENGTH, received.readInt());
            assertEquals(BlockFrame.PROOF, received.readByte());
            received.skipBytes(BlockFrame.MAC_LENGTH);
            int length = received.readInt();
            assertEquals(BlockFrame.FAILURE, received.readByte());
            assertEquals(BlockFrame.CONNECTION_REQUEST_ID, received.readLong());
            String message = received.readCharSequence(length - 9, StandardCharsets.UTF_8).toString();
            assertTrue(message.contains("blockIdLength=200"), message);
            assertEquals(0, received.readableBytes(), "nothing after the failure");
            received.release();
        }
    }

    private static InetSocketAddress address(ShuffleBlockServer server) {
        return new InetSocketAddress("127.0.0.1", server.localAddress().getPort());
    }

    private byte[] slice(int offset, int length) {
        byte[] out = new byte[length];
        System.arraycopy(bytes, offset, out, 0, length);
        return out;
    }

    private static void waitFor(java.util.function.BooleanSupplier condition) throws InterruptedException {
        waitFor(condition, () -> "");
    }

    private static void waitFor(java.util.function.BooleanSupplier condition,
                                java.util.function.Supplier<String> message) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!condition.getAsBoolean() && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        assertTrue(condition.getAsBoolean(), message);
    }

    /** Keeps what Spark's fetch iterator would: the bytes (read through the stream view) and a retained buffer. */
    static final class Collector implements BlockFetchingListener {
        final Map<String, byte[]> received = new ConcurrentHashMap<>();
        final Map<String, FetchedBlockBuffer> buffers = new ConcurrentHashMap<>();
        final Map<String, Throwable> failures = new ConcurrentHashMap<>();
        final CountDownLatch done;

        Collector(int blocks) {
            done = new CountDownLatch(blocks);
        }

        @Override
        public void onBlockFetchSuccess(String blockId, ManagedBuffer data) {
            try (InputStream in = data.createInputStream()) {
                received.put(blockId, in.readAllBytes());
                data.retain();
                buffers.put(blockId, (FetchedBlockBuffer) data);
            } catch (java.io.IOException e) {
                failures.put(blockId, e);
            }
            done.countDown();
        }

        @Override
        public void onBlockFetchFailure(String blockId, Throwable exception) {
            failures.put(blockId, exception);
            done.countDown();
        }

        void await() throws InterruptedException {
            assertTrue(done.await(20, TimeUnit.SECONDS), "every block got its callback");
        }
    }
}
