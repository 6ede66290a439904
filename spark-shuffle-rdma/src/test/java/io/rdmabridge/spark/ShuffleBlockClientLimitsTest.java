package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.SimpleChannelInboundHandler;
import io.netty.channel.embedded.EmbeddedChannel;
import io.rdmabridge.spark.ShuffleBlockPipelineTest.Collector;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BiConsumer;
import java.util.function.BooleanSupplier;
import java.util.function.Consumer;
import java.util.function.Supplier;
import java.util.stream.IntStream;
import org.apache.spark.SparkConf;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Hostile block servers against the fetch client, on the real wire: a server on {@link BlockTransport} that speaks
 * the block protocol only as far as the test says. Every fetch must end in a callback, promptly, naming the cause;
 * the client must not wait for bytes it would refuse. Waits are liveness bounds, well under the fetch timeout where
 * the point is that the client did not wait for it.
 */
class ShuffleBlockClientLimitsTest {
    private static final long LONG_FETCH_TIMEOUT_MILLIS = 60_000;
    /** A reducer's limits with Spark's default settings. */
    private static final RdmaShuffleConf DEFAULTS = new RdmaShuffleConf(new SparkConf(false));

    private BlockTransport transport;
    private final RdmaShuffleMetrics metrics = new RdmaShuffleMetrics();

    @BeforeEach
    void setUp() throws Exception {
        transport = BlockTransport.open(BlockTransport.SOFT, 1, RdmaShuffleConf.DEFAULT_SEND_QUEUE_DEPTH,
                RdmaShuffleConf.DEFAULT_RECV_QUEUE_DEPTH, "test-rdma-shuffle-client-limits");
    }

    @AfterEach
    void tearDown() throws InterruptedException {
        transport.close();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!transport.provider().resourceUsage().isZero() && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        assertTrue(transport.provider().resourceUsage().isZero());
    }

    @Test
    void shouldFailAFetchWhenTheServerNeverSendsItsChallenge() throws Exception {
        try (FakeServer server = new FakeServer(ch -> { }, (ch, frame) -> { });
             ShuffleBlockClient client = client(300)) {
            Throwable cause = fetchFailure(client, server);
            assertTrue(cause.getMessage().contains("no CHALLENGE from shuffle block server") && cause.getMessage()
                    .contains("within 300 ms (spark.shuffle.rdma.fetchTimeout)"), cause.getMessage());
            server.awaitClosedByClient();
        }
    }

    @Test
    void shouldRefuseAHugeFrameBeforeTheChallengeAtItsHeader() throws Exception {
        // Announces a 1 GiB "challenge" and sends a little of it: the client must not wait for the rest.
        try (FakeServer server = new FakeServer(ch -> ch.writeAndFlush(ch.alloc().buffer().writeInt(1 << 30)
                .writeByte(BlockFrame.CHALLENGE).writeZero(100)), (ch, frame) -> { });
             ShuffleBlockClient client = client(LONG_FETCH_TIMEOUT_MILLIS)) {
            Throwable cause = fetchFailure(client, server);
            assertTrue(cause.getMessage().contains("type=1 length=1073741824")
                    && cause.getMessage().contains("before its CHALLENGE"), cause.getMessage());
            server.awaitClosedByClient();
        }
    }

    @Test
    void shouldRefuseABlockForARequestNeverMadeAtItsHeader() throws Exception {
        // Answers the fetch with the header of a 1 MiB block for another request id, and never sends its bytes.
        try (FakeServer server = new FakeServer(FakeServer::challenge, FakeServer.provingWithoutSecret((ch, frame) -> {
            if (frame.type == BlockFrame.FETCH) {
                ch.writeAndFlush(BlockFrame.blockHeader(ch.alloc(), frame.requestId + 1000, 1 << 20));
            }
        })); ShuffleBlockClient client = client(LONG_FETCH_TIMEOUT_MILLIS)) {
            Throwable cause = fetchFailure(client, server);
            assertTrue(cause.getMessage().contains("requestId=1000 from") && cause.getMessage()
                    .contains("(expected: one of the 1 outstanding fetches)"), cause.getMessage());
            server.awaitClosedByClient();
        }
    }

    @Test
    void shouldRefuseABlockLargerThanSparkFetchesIntoMemoryAtItsHeader() throws Exception {
        // Answers the fetch with the header of a block a few bytes over the cap, and a little of it: the client must
        // not wait for the rest, which it would hold.
        long maxLength = DEFAULTS.maxFetchedBlockLength("b_0_10");
        long blockLength = maxLength + 5;
        try (FakeServer server = new FakeServer(FakeServer::challenge, FakeServer.provingWithoutSecret((ch, frame) -> {
            if (frame.type == BlockFrame.FETCH) {
                ch.write(BlockFrame.blockHeader(ch.alloc(), frame.requestId, blockLength));
                ch.writeAndFlush(ch.alloc().buffer().writeZero(100));
            }
        })); ShuffleBlockClient client = client(LONG_FETCH_TIMEOUT_MILLIS)) {
            assertEquals(200L << 20, maxLength, "Spark's spark.network.maxRemoteBlockSizeFetchToMem");
            Throwable cause = fetchFailure(client, server);
            assertTrue(cause.getMessage().contains("BLOCK length=" + (blockLength + 9) + " from") && cause.getMessage()
                    .contains("b_0_10 of " + blockLength + " bytes (expected: at most " + maxLength + ", "),
                    cause.getMessage());
            server.awaitClosedByClient();
        }
    }

    /**
     * A batch of reduce partitions sums their map outputs' reports, each of which may understate its block by up to
     * spark.shuffle.accurateBlockThreshold: each partition after the first may add that much.
     */
    @Test
    void shouldTakeABatchOfPartitionsUpToAThresholdMoreForEachPartitionAfterTheFirst() throws Exception {
        // Spark's keys lowered: one block takes at most 64 KiB, a batch of three 64 + 2 x 16 KiB.
        RdmaShuffleConf conf = new RdmaShuffleConf(new SparkConf(false)
                .set(RdmaShuffleConf.MAX_REMOTE_BLOCK_SIZE_FETCH_TO_MEM, "64k")
                .set(RdmaShuffleConf.ACCURATE_BLOCK_THRESHOLD, "16k"));
        int size = 80 * 1024;
        try (FakeServer server = new FakeServer(FakeServer::challenge, FakeServer.provingWithoutSecret((ch, frame) -> {
            if (frame.type == BlockFrame.FETCH) {
                ch.write(BlockFrame.blockHeader(ch.alloc(), frame.requestId, size));
                ch.writeAndFlush(ch.alloc().buffer().writeZero(size));
            }
        })); ShuffleBlockClient client = new ShuffleBlockClient(transport, new PeerAuthenticator(null), 5_000,
                LONG_FETCH_TIMEOUT_MILLIS, conf::maxFetchedBlockLength, conf.maxFetchedBytesPerConnection, metrics)) {
            Collector c = new Collector(2);
            client.fetch("1", server.address(), new String[] {"shuffle_0_1_0_3", "shuffle_0_2_0"}, c);
            assertTrue(c.done.await(5, TimeUnit.SECONDS), "both fetches got their callbacks within 5 s");
            byte[] batch = c.received.get("shuffle_0_1_0_3");
            assertEquals(size, batch == null ? -1 : batch.length, () -> "failures: " + c.failures);
            String why = c.failures.get("shuffle_0_2_0").getMessage();
            assertTrue(why.contains("shuffle_0_2_0 of " + size + " bytes (expected: at most 65536, "), why);
            c.buffers.values().forEach(FetchedBlockBuffer::release);
        }
    }

    @Test
    void shouldDecodeTheHeaderOfTheLargestBlockAFrameCarries() {
        EmbeddedChannel ch = new EmbeddedChannel(BlockFrame.newFrameDecoder((length, type, requestId) -> { }));
        // Netty's decoder counts the length field in its bound: the whole frame must fit in Integer.MAX_VALUE.
        ch.writeInbound(BlockFrame.blockHeader(ch.alloc(), 1, BlockFrame.MAX_BLOCK_LENGTH));
        ch.checkException();
        assertTrue(ch.isActive());
        assertFalse(ch.finish(), "nothing decoded before the block's bytes");
    }

    @Test
    void shouldRefuseAFailureMessageBeyondTheCap() throws Exception {
        int length = BlockFrame.TYPE_LENGTH + BlockFrame.REQUEST_ID_LENGTH + BlockFrame.MAX_FAILURE_MESSAGE_LENGTH + 1;
        try (FakeServer server = new FakeServer(FakeServer::challenge, FakeServer.provingWithoutSecret((ch, frame) -> {
            if (frame.type == BlockFrame.FETCH) {
                ch.writeAndFlush(ch.alloc().buffer().writeInt(length).writeByte(BlockFrame.FAILURE)
                        .writeLong(frame.requestId).writeZero(BlockFrame.MAX_FAILURE_MESSAGE_LENGTH + 1));
            }
        })); ShuffleBlockClient client = client(LONG_FETCH_TIMEOUT_MILLIS)) {
            Throwable cause = fetchFailure(client, server);
            String message = cause.getMessage();
            assertTrue(message.contains("FAILURE length=" + length),
                    message.substring(0, Math.min(300, message.length())) + "... (" + message.length() + " chars)");
            server.awaitClosedByClient();
        }
    }

    /**
     * A server's FAILURE message reaches the reducer's exception, which Spark logs and shows: a newline or an escape in
     * it would forge a log line or drive a terminal, so control characters arrive as {@code ?}. They used to arrive as
     * sent.
     */
    @Test
    void shouldReplaceTheControlCharactersOfAFailureMessage() throws Exception {
        try (FakeServer server = new FakeServer(FakeServer::challenge, FakeServer.provingWithoutSecret((ch, frame) -> {
            if (frame.type == BlockFrame.FETCH) {
                ch.writeAndFlush(BlockFrame.failure(ch.alloc(), frame.requestId,
                        "no such block\n26/11/29 17:00:00 ERROR forged\u001b[2J\u0000\u0085\u2028\u202e\u00e9"));
            }
        })); ShuffleBlockClient client = client(LONG_FETCH_TIMEOUT_MILLIS)) {
            Throwable cause = fetchFailure(client, server);
            assertEquals("shuffle block server of executor 1 at " + server.address() + ": no such block?26/11/29 "
                    + "17:00:00 ERROR forged?[2J????\u00e9", cause.getMessage());
        }
    }

    @Test
    void shouldTakeAFailureMessageTheServerCutToTheCap() throws Exception {
        // Two-byte characters after an odd one: the cut falls inside a character and must back off before it.
        String message = "x" + "\u00e9".repeat(BlockFrame.MAX_FAILURE_MESSAGE_LENGTH);
        try (FakeServer server = new FakeServer(FakeServer::challenge, FakeServer.provingWithoutSecret((ch, frame) -> {
            if (frame.type == BlockFrame.FETCH) {
                ch.writeAndFlush(BlockFrame.failure(ch.alloc(), frame.requestId, message));
            }
        })); ShuffleBlockClient client = client(LONG_FETCH_TIMEOUT_MILLIS)) {
            Throwable cause = fetchFailure(client, server);
            String expected = "x" + "\u00e9".repeat(BlockFrame.MAX_FAILURE_MESSAGE_LENGTH / 2 - 1);
            assertEquals("shuffle block server of executor 1 at " + server.address() + ": " + expected,
                    cause.getMessage());
            assertEquals(1, server.closed.getCount(), "a failed block leaves the connection open");
        }
    }

    /**
     * Asks for authentication, takes the answer and sends a block instead of its proof: what a process on a dead
     * executor's port that knows nothing of the secret could do. The block is refused, and the fetch was never sent:
     * fetches wait for the proof, so a server that is not the one meant never learns which blocks a reducer wants.
     */
    @Test
    void shouldRefuseABlockBeforeTheServersProofAndSendItNoFetch() throws Exception {
        AtomicBoolean fetched = new AtomicBoolean();
        try (FakeServer server = new FakeServer(ch -> ch.writeAndFlush(BlockFrame.challenge(ch.alloc(), true,
                PeerAuthenticator.newNonce())), (ch, frame) -> {
            if (frame.type == BlockFrame.RESPONSE) {
                ch.write(BlockFrame.blockHeader(ch.alloc(), 0, 10));
                ch.writeAndFlush(ch.alloc().buffer().writeZero(10));
            } else if (frame.type == BlockFrame.FETCH) {
                fetched.set(true);
            }
        }); ShuffleBlockClient client = client("right", LONG_FETCH_TIMEOUT_MILLIS)) {
            Throwable cause = fetchFailure(client, server);
            assertTrue(cause.getMessage().contains("type=4 length=19 from") && cause.getMessage()
                    .contains("before its PROOF"), cause.getMessage());
            server.awaitClosedByClient();
            assertFalse(fetched.get(), "a fetch went to a server that had not proven itself");
        }
    }

    @Test
    void shouldRefuseAServerThatCannotProveItHoldsTheSecret() throws Exception {
        // A block server of another application (its secret is "other") proves what it can, then sends the block.
        byte[] serverNonce = PeerAuthenticator.newNonce();
        try (FakeServer server = new FakeServer(ch -> ch.writeAndFlush(BlockFrame.challenge(ch.alloc(), true,
                serverNonce)), (ch, frame) -> {
            if (frame.type == BlockFrame.RESPONSE) {
                byte[] clientNonce = Arrays.copyOfRange(frame.body, BlockFrame.MAC_LENGTH, frame.body.length);
                ch.writeAndFlush(BlockFrame.proof(ch.alloc(),
                        new PeerAuthenticator("other").serverProof("1", serverNonce, clientNonce)));
            } else if (frame.type == BlockFrame.FETCH) {
                ch.write(BlockFrame.blockHeader(ch.alloc(), frame.requestId, 10));
                ch.writeAndFlush(ch.alloc().buffer().writeZero(10));
            }
        }); ShuffleBlockClient client = client("right", LONG_FETCH_TIMEOUT_MILLIS)) {
            Throwable cause = fetchFailure(client, server);
            assertTrue(cause.getMessage().contains("failed to prove it holds this application's secret"),
                    cause.getMessage());
            assertEquals(1, metrics.authFailures.getCount());
            server.awaitClosedByClient();
        }
    }

    @Test
    void shouldRefuseAServerThatAsksForNoAuthenticationWhenThisExecutorHoldsASecret() throws Exception {
        try (FakeServer server = new FakeServer(FakeServer::challenge, (ch, frame) -> { });
             ShuffleBlockClient client = client("right", LONG_FETCH_TIMEOUT_MILLIS)) {
            Throwable cause = fetchFailure(client, server);
            assertTrue(cause.getMessage().contains("does not require authentication but this executor does"),
                    cause.getMessage());
            server.awaitClosedByClient();
        }
    }

    /**
     * Sends a block's body one byte per SEND, each written once the last has gone, so that each arrives as a buffer of
     * its own. Netty's composite cumulator kept every one until the block was complete, most in a registered block of
     * 256 bytes (the channel copies out of its receive buffers while the application holds most of them): 64 KiB of
     * block took some 16 MiB of registered memory, a 200 MiB one about 50 GiB.
     */
    @Test
    void shouldHoldAboutTheBlocksBytesWhenItsBodyArrivesOneBytePerSend() throws Exception {
        int size = 64 * 1024;
        byte[] body = blockBytes("b_0_10", size);
        try (FakeServer server = new FakeServer(FakeServer::challenge, FakeServer.provingWithoutSecret((ch, frame) -> {
            if (frame.type == BlockFrame.FETCH) {
                ch.writeAndFlush(BlockFrame.blockHeader(ch.alloc(), frame.requestId, size))
                        .addListener(f -> sendOneByOne(ch, body, 0));
            }
        })); ShuffleBlockClient client = client(LONG_FETCH_TIMEOUT_MILLIS)) {
            long registeredBefore = transport.provider().resourceUsage().registeredBytes();
            long copiedBefore = transport.copiedOnReceiveBytes();
            Collector c = new Collector(1);
            client.fetch("1", server.address(), new String[] {"b_0_10"}, c);
            assertTrue(c.done.await(60, TimeUnit.SECONDS), "the fetch got its callback within 60 s");
            assertArrayEquals(body, c.received.get("b_0_10"), () -> "failures: " + c.failures);
            // The channel copies a SEND out of its receive buffer, into a registered block of its own, only while the
            // application holds most receive buffers: the cumulation held one per byte.
            long copied = transport.copiedOnReceiveBytes() - copiedBefore;
            assertTrue(copied < size / 16, copied + " bytes copied out of receive buffers, each into a registered "
                    + "block (expected: almost none: each byte merged into the cumulation and its buffer released)");
            // Slabs stay registered a while once free: this is the most taken at once, both sides' queue pairs (32
            // receive buffers of 64 KiB each) and the allocator's size classes (a slab each) included.
            long registered = transport.provider().resourceUsage().registeredBytes() - registeredBefore;
            assertTrue(registered < size * 256L, registered + " bytes of registered memory taken for a block of "
                    + size + " bytes (expected: less than a block of 256 bytes per byte)");
            c.buffers.values().forEach(FetchedBlockBuffer::release);
        }
    }

    /** Writes {@code body} from {@code index} on, one byte per write, each once the one before it has gone. */
    private static void sendOneByOne(Channel ch, byte[] body, int index) {
        if (index < body.length && ch.isActive()) {
            ch.writeAndFlush(ch.alloc().buffer(1).writeByte(body[index])).addListener(f -> {
                if (f.isSuccess()) {
                    // Through the loop's queue: a copied write completes at once, and a listener of a done future
                    // runs inline, which would recurse once per byte.
                    ch.eventLoop().execute(() -> sendOneByOne(ch, body, index + 1));
                }
            });
        }
    }

    /**
     * Answers each small fetch with a 256 KiB block, as a hostile server can: past its budget (1 MiB here) the client
     * stops reading, so the transport's credits hold the server back and what the client holds stays within the
     * budget and a block, until Spark releases blocks. The pause outlasts the fetch timeout, which must not take it
     * for the server's silence. Before, the client took every block the server sent, as fast as it sent them.
     */
    @Test
    void shouldStopReadingPastTheBudgetUntilSparkReleasesBlocks() throws Exception {
        int size = 256 * 1024;
        int blocks = 40;
        long budget = 1 << 20;
        long fetchTimeoutMillis = 1_000;
        RdmaShuffleConf conf = new RdmaShuffleConf(new SparkConf(false)
                .set(RdmaShuffleConf.MAX_FETCHED_BYTES_PER_CONNECTION, Long.toString(budget)));
        AtomicInteger sent = new AtomicInteger();
        try (FakeServer server = new FakeServer(FakeServer::challenge, FakeServer.provingWithoutSecret((ch, frame) -> {
            if (frame.type == BlockFrame.FETCH) {
                String blockId = new String(frame.body, 2, frame.body.length - 2, StandardCharsets.UTF_8);
                ch.write(BlockFrame.blockHeader(ch.alloc(), frame.requestId, size));
                ch.writeAndFlush(ch.alloc().buffer(size).writeBytes(blockBytes(blockId, size))).addListener(f -> {
                    if (f.isSuccess()) {
                        sent.incrementAndGet();
                    }
                });
            }
        })); ShuffleBlockClient client = new ShuffleBlockClient(transport, new PeerAuthenticator(null), 5_000,
                fetchTimeoutMillis, conf::maxFetchedBlockLength, conf.maxFetchedBytesPerConnection, metrics)) {
            Collector c = new Collector(blocks);
            String[] blockIds = IntStream.range(0, blocks).mapToObj(i -> "b_0_" + i).toArray(String[]::new);
            client.fetch("1", server.address(), blockIds, c);
            waitFor(() -> c.received.size() * (long) size > budget, () -> c.received.size() + " blocks received");
            Thread.sleep(2 * fetchTimeoutMillis + 500);
            int held = c.received.size();
            assertTrue(held * (long) size <= budget + size, held + " blocks of " + size + " bytes held (expected: at "
                    + "most the budget of " + budget + " bytes and one block)");
            int sentWhilePaused = sent.get();
            assertTrue(sentWhilePaused < blocks, "the server sent all " + blocks + " blocks while the client held "
                    + held);
            assertEquals(Map.of(), c.failures, "no fetch failed while the client did not read");
            Thread.sleep(200);
            assertEquals(sentWhilePaused, sent.get(), "the server's writes stopped completing");
            // Spark consumes and releases blocks: the client reads on, a budget at a time.
            while (c.done.getCount() > 0) {
                assertEquals(Map.of(), c.failures);
                releaseAll(c);
                Thread.sleep(10);
            }
            for (String blockId : blockIds) {
                assertArrayEquals(blockBytes(blockId, size), c.received.get(blockId), blockId);
            }
            releaseAll(c);
            assertEquals(Map.of(), c.failures);
        }
    }

    private static void releaseAll(Collector c) {
        for (String blockId : c.buffers.keySet()) {
            FetchedBlockBuffer buffer = c.buffers.remove(blockId);
            if (buffer != null) {
                buffer.release();
            }
        }
    }

    /** A block's bytes, the same for the same id. */
    private static byte[] blockBytes(String blockId, int size) {
        byte[] bytes = new byte[size];
        new Random(blockId.hashCode()).nextBytes(bytes);
        return bytes;
    }

    private static void waitFor(BooleanSupplier condition, Supplier<String> message) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!condition.getAsBoolean() && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        assertTrue(condition.getAsBoolean(), message);
    }

    private ShuffleBlockClient client(long fetchTimeoutMillis) {
        return client(null, fetchTimeoutMillis);
    }

    private ShuffleBlockClient client(String secret, long fetchTimeoutMillis) {
        return new ShuffleBlockClient(transport, new PeerAuthenticator(secret), 5_000, fetchTimeoutMillis,
                DEFAULTS::maxFetchedBlockLength, DEFAULTS.maxFetchedBytesPerConnection, metrics);
    }

    /** Fetches one block, which must fail within a few seconds; returns why. */
    private static Throwable fetchFailure(ShuffleBlockClient client, FakeServer server) throws InterruptedException {
        Collector c = new Collector(1);
        client.fetch("1", server.address(), new String[] {"b_0_10"}, c);
        assertTrue(c.done.await(5, TimeUnit.SECONDS), "the fetch got its callback within 5 s");
        assertEquals(Map.of(), c.received);
        return c.failures.get("b_0_10");
    }

    /** A frame from the client: its type, a FETCH's request id, and what follows (a RESPONSE's MAC and nonce). */
    private record Frame(byte type, long requestId, byte[] body) {
    }

    /** A block server that does what the test says on connect and on each frame from the client. */
    private final class FakeServer implements AutoCloseable {
        private final Channel channel;
        final CountDownLatch closed = new CountDownLatch(1);

        FakeServer(Consumer<Channel> onConnect, BiConsumer<Channel, Frame> onFrame) {
            channel = transport.newServerBootstrap().childHandler(new ChannelInitializer<>() {
                @Override
                protected void initChannel(Channel ch) {
                    ch.pipeline().addLast(BlockFrame.newFrameDecoder(BlockFrame.MAX_REQUEST_FRAME_LENGTH),
                            new SimpleChannelInboundHandler<ByteBuf>() {
                                @Override
                                public void channelActive(ChannelHandlerContext ctx) {
                                    onConnect.accept(ctx.channel());
                                }

                                @Override
                                protected void channelRead0(ChannelHandlerContext ctx, ByteBuf frame) {
                                    byte type = frame.readByte();
                                    long requestId = type == BlockFrame.FETCH ? frame.readLong() : 0;
                                    byte[] body = new byte[frame.readableBytes()];
                                    frame.readBytes(body);
                                    onFrame.accept(ctx.channel(), new Frame(type, requestId, body));
                                }

                                @Override
                                public void channelInactive(ChannelHandlerContext ctx) {
                                    closed.countDown();
                                }
                            });
                }
            }).bind("127.0.0.1", 0).syncUninterruptibly().channel();
        }

        /** Sends a challenge that asks for no authentication. */
        static void challenge(Channel ch) {
            ch.writeAndFlush(BlockFrame.challenge(ch.alloc(), false, new byte[BlockFrame.NONCE_LENGTH]));
        }

        /** Answers a RESPONSE with the PROOF of a server without a secret, then does as {@code then} says. */
        static BiConsumer<Channel, Frame> provingWithoutSecret(BiConsumer<Channel, Frame> then) {
            return (ch, frame) -> {
                if (frame.type == BlockFrame.RESPONSE) {
                    ch.writeAndFlush(BlockFrame.proof(ch.alloc(), new byte[BlockFrame.MAC_LENGTH]));
                }
                then.accept(ch, frame);
            };
        }

        InetSocketAddress address() {
            return new InetSocketAddress("127.0.0.1", ((InetSocketAddress) channel.localAddress()).getPort());
        }

        void awaitClosedByClient() throws InterruptedException {
            assertTrue(closed.await(5, TimeUnit.SECONDS), "the client closed the connection");
        }

        @Override
        public void close() {
            channel.close().syncUninterruptibly();
        }
    }
}
