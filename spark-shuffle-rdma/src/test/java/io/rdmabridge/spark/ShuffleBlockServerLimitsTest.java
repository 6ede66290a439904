package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.ChannelOutboundHandlerAdapter;
import io.netty.channel.ChannelPromise;
import io.netty.channel.FileRegion;
import io.netty.channel.SimpleChannelInboundHandler;
import io.netty.channel.embedded.EmbeddedChannel;
import io.netty.util.ReferenceCountUtil;
import io.rdmabridge.netty.RdmaChannelOption;
import io.rdmabridge.spark.ShuffleBlockPipelineTest.Collector;
import io.rdmabridge.verbs.ResourceUsage;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.nio.channels.Channels;
import java.nio.channels.ClosedChannelException;
import java.nio.file.Files;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.function.Supplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.core.LogEvent;
import org.apache.logging.log4j.core.Logger;
import org.apache.logging.log4j.core.appender.AbstractAppender;
import org.apache.logging.log4j.core.config.Property;
import org.apache.spark.SparkConf;
import org.apache.spark.network.buffer.FileSegmentManagedBuffer;
import org.apache.spark.network.buffer.ManagedBuffer;
import org.apache.spark.network.buffer.NettyManagedBuffer;
import org.apache.spark.network.util.MapConfigProvider;
import org.apache.spark.network.util.TransportConf;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Hostile and greedy peers against the block server's limits (issue 11, item 8), on the real wire: raw
 * {@code RdmaSocketChannel} clients that speak the block protocol only as far as they choose, beside a good
 * {@link ShuffleBlockClient} that must keep getting correct blocks. Timeouts are set short through the configuration
 * keys; every wait in here is a liveness bound, never a speed assertion.
 */
class ShuffleBlockServerLimitsTest {
    private static final TransportConf TRANSPORT_CONF = new TransportConf("shuffle", MapConfigProvider.EMPTY);
    private static final String EXECUTOR = "1";
    private static final String NO_TIMEOUT = "1h";
    /**
     * Blocks and missing ones ("missing_N" fails to open), pipelined: ending with two failures in a row, whose
     * answers complete one inside the other when writes complete at once.
     */
    private static final String[] PIPELINED = {"missing_0", "b_0_1000", "b_5000_3000", "missing_3", "b_9000_10",
        "missing_5", "missing_6"};

    @TempDir
    File dir;
    private File data;
    private byte[] bytes;
    private BlockTransport transport;
    private final RdmaShuffleMetrics serverMetrics = new RdmaShuffleMetrics();
    private final RdmaShuffleMetrics clientMetrics = new RdmaShuffleMetrics();
    private final List<RawPeer> peers = new ArrayList<>();
    /** Where the next server takes its blocks from. */
    private BlockSource source = this::open;
    private CapturedWarnings warnings;

    @BeforeEach
    void setUp() throws Exception {
        bytes = new byte[4 << 20];
        new Random(7).nextBytes(bytes);
        data = new File(dir, "shuffle_0_0_0.data");
        Files.write(data.toPath(), bytes);
        transport = BlockTransport.open(BlockTransport.SOFT, 1, RdmaShuffleConf.DEFAULT_SEND_QUEUE_DEPTH,
                RdmaShuffleConf.DEFAULT_RECV_QUEUE_DEPTH, "test-rdma-shuffle-limits");
        warnings = new CapturedWarnings();
    }

    @AfterEach
    void tearDown() throws InterruptedException {
        warnings.close();
        peers.forEach(RawPeer::close);
        transport.close();
        waitFor(() -> transport.provider().resourceUsage().isZero());
    }

    @Test
    void shouldBindTheNextPortWhenTheConfiguredOneIsTakenAsSparksOwnServicesDo() throws Exception {
        try (ShuffleBlockServer first = server("right")) {
            int taken = first.localAddress().getPort();
            try (ShuffleBlockServer second = server("right", taken, RdmaShuffleConf.PORT, Integer.toString(taken));
                 ShuffleBlockClient client = client("right")) {
                int port = second.localAddress().getPort();
                // Spark's sequence, wrapping from 65535 to 1024.
                java.util.Set<Integer> next = new java.util.HashSet<>();
                for (int i = 1; i <= 16; i++) {
                    next.add((taken + i - 1024) % (65536 - 1024) + 1024);
                }
                assertTrue(next.contains(port), () -> "bound " + port + " (expected: one of the 16 ports after "
                        + taken + ", spark.port.maxRetries' default: " + next + ")");
                assertFetches(client, second, "b_0_1000");
            }
            IllegalStateException refused = assertThrows(IllegalStateException.class, () -> server("right", taken,
                    RdmaShuffleConf.PORT, Integer.toString(taken), RdmaShuffleConf.PORT_MAX_RETRIES, "0"));
            assertTrue(refused.getMessage().contains("(spark.shuffle.rdma.port=" + taken
                    + ", spark.port.maxRetries=0)"), refused::getMessage);
            assertTrue(refused.getMessage().endsWith("choose a free port, raise spark.port.maxRetries, or set "
                    + "spark.shuffle.rdma.port=0 to pick a free one"), refused::getMessage);
        }
    }

    @Test
    void shouldCloseConnectionsThatDoNotAuthenticateInTime() throws Exception {
        try (ShuffleBlockServer server = server("right", RdmaShuffleConf.AUTH_TIMEOUT, "200ms")) {
            Baseline baseline = new Baseline();
            List<RawPeer> silent = new ArrayList<>();
            for (int i = 0; i < 5; i++) {
                silent.add(peer(server));
            }
            try (ShuffleBlockClient client = client("right")) {
                assertFetches(client, server, "b_0_1000", "b_5000_70000");
            }
            for (RawPeer p : silent) {
                p.awaitClosed();
                assertEquals(BlockFrame.CHALLENGE, p.next().type);
                Frame failure = p.next();
                assertEquals(BlockFrame.FAILURE, failure.type);
                assertEquals(BlockFrame.CONNECTION_REQUEST_ID, failure.requestId);
                assertTrue(failure.text().contains("spark.shuffle.rdma.authTimeout"), failure.text());
            }
            assertEquals(5, serverMetrics.connectionsTimedOut.getCount());
            // Five closes, one line: the rest are counted in the next line logged, not printed.
            assertEquals(1, warnings.containing("spark.shuffle.rdma.authTimeout").size(), warnings.lines.toString());
            baseline.awaitReturn(server);
        }
    }

    @Test
    void shouldCloseIdleConnectionsButNotOnesWithRequestsOutstanding() throws Exception {
        try (ShuffleBlockServer server = server(null, RdmaShuffleConf.IDLE_TIMEOUT, "200ms",
                RdmaShuffleConf.WRITE_TIMEOUT, NO_TIMEOUT)) {
            Baseline baseline = new Baseline();
            RawPeer idle = authenticatedPeer(server);
            // Asks for more than its credits let through and reads nothing: busy, not idle.
            RawPeer waiting = authenticatedPeer(server);
            waiting.ch.config().setAutoRead(false);
            for (int i = 0; i < 64; i++) {
                waiting.fetch(i, "b_" + i * 60_000 + "_60000");
            }
            waiting.ch.flush();
            idle.awaitClosed();
            Frame failure = idle.next();
            assertEquals(BlockFrame.FAILURE, failure.type);
            assertTrue(failure.text().contains("spark.shuffle.rdma.idleTimeout"), failure.text());
            // Twice the idle timeout after the idle one went, the busy one is still served.
            Thread.sleep(400);
            assertTrue(waiting.ch.isActive(), "a connection with requests outstanding is not idle");
            waiting.ch.config().setAutoRead(true);
            for (int i = 0; i < 64; i++) {
                Frame block = waiting.next();
                assertEquals(BlockFrame.BLOCK, block.type);
                assertArrayEquals(slice((int) block.requestId * 60_000, 60_000), block.body);
            }
            try (ShuffleBlockClient client = client(null)) {
                assertFetches(client, server, "b_10_100");
            }
            waiting.close();
            baseline.awaitReturn(server);
        }
    }

    /**
     * Anyone who reaches the port can connect and hold a place until its challenge times out, then connect again: one
     * address may hold half of {@code maxConnections}, so that one host cannot keep every reducer out (they would
     * fetch through Spark's own transport). There used to be no share: one address took every place.
     */
    @Test
    void shouldKeepHalfTheConnectionsForAddressesOtherThanOneHoldingItsShare() throws Exception {
        try (ShuffleBlockServer server = server(null, RdmaShuffleConf.MAX_CONNECTIONS, "4")) {
            Baseline baseline = new Baseline();
            RawPeer first = peer(server, "127.0.0.2");
            RawPeer second = peer(server, "127.0.0.2");
            assertEquals(BlockFrame.CHALLENGE, first.next().type);
            assertEquals(BlockFrame.CHALLENGE, second.next().type);
            RawPeer third = peer(server, "127.0.0.2");
            third.awaitClosed();
            Frame failure = third.next();
            assertEquals(BlockFrame.FAILURE, failure.type, "no challenge for a connection over its address's share");
            assertEquals("too many connections from 127.0.0.2: 2 open (one address may hold 2 of "
                    + "spark.shuffle.rdma.maxConnections=4; raise it if that host runs this many executors, or allow "
                    + "only the application's hosts to reach the port)", failure.text());
            assertEquals(2, server.openConnections(), "the refused connection holds no place");
            try (ShuffleBlockClient client = client(null)) {
                assertFetches(client, server, "b_0_4096");
            }
            first.close();
            second.close();
            baseline.awaitReturn(server);
        }
    }

    @Test
    void shouldRefuseConnectionsBeyondTheCapWithRateLimitedWarnings() throws Exception {
        try (ShuffleBlockServer server = server(null, RdmaShuffleConf.MAX_CONNECTIONS, "2",
                RdmaShuffleConf.WARN_INTERVAL, "300ms")) {
            Baseline baseline = new Baseline();
            // From two addresses: one address may hold only half of the places.
            RawPeer first = authenticatedPeer(server, "127.0.0.1");
            RawPeer second = authenticatedPeer(server, "127.0.0.2");
            List<RawPeer> refused = new ArrayList<>();
            for (int i = 0; i < 10; i++) {
                refused.add(peer(server, "127.0.0.3"));
            }
            for (RawPeer p : refused) {
                p.awaitClosed();
                Frame failure = p.next();
                assertEquals(BlockFrame.FAILURE, failure.type, "no challenge for a refused connection");
                assertEquals("too many connections: 2 open (spark.shuffle.rdma.maxConnections; raise it if this many "
                        + "reducers are expected)", failure.text());
            }
            assertEquals(10, serverMetrics.connectionsRefused.getCount());
            assertTrue(first.ch.isActive() && second.ch.isActive(), "the connections within the cap stay");
            // One more refusal after the interval: its line carries the count of those left out before it.
            Thread.sleep(400);
            RawPeer late = peer(server);
            late.awaitClosed();
            List<String> lines = warnings.containing("refusing connection");
            assertTrue(lines.size() >= 2 && lines.size() < 11, lines.toString());
            assertEquals(11, lines.stream().mapToLong(ShuffleBlockServerLimitsTest::linesStoodFor).sum(),
                    lines.toString());

            first.close();
            waitFor(() -> server.openConnections() == 1);
            try (ShuffleBlockClient client = client(null)) {
                assertFetches(client, server, "b_0_4096");
            }
            second.close();
            baseline.awaitReturn(server);
        }
    }

    @Test
    void shouldStopReadingAPeerThatPipelinesTooManyRequestsAndLoseNone() throws Exception {
        int requests = 300;
        try (ShuffleBlockServer server = server(null, RdmaShuffleConf.MAX_REQUESTS_PER_CONNECTION, "8")) {
            Baseline baseline = new Baseline();
            RawPeer greedy = authenticatedPeer(server);
            greedy.ch.config().setAutoRead(false);
            for (int i = 0; i < requests; i++) {
                greedy.fetch(i, "b_" + i + "_1000");
            }
            greedy.ch.flush();
            try (ShuffleBlockClient client = client(null)) {
                String[] ids = new String[20];
                for (int i = 0; i < ids.length; i++) {
                    ids[i] = "b_" + i * 50_000 + "_50000";
                }
                assertFetches(client, server, ids);
            }
            assertTrue(server.peakOutstandingRequests() <= 8, "peak: " + server.peakOutstandingRequests());
            // Paused, never refused: once it reads, every request it sent is answered.
            greedy.ch.config().setAutoRead(true);
            for (int i = 0; i < requests; i++) {
                Frame block = greedy.next();
                assertEquals(BlockFrame.BLOCK, block.type);
                assertArrayEquals(slice((int) block.requestId, 1000), block.body);
            }
            assertTrue(server.peakOutstandingRequests() <= 8, "peak: " + server.peakOutstandingRequests());
            greedy.close();
            baseline.awaitReturn(server);
        }
    }

    @Test
    void shouldTakeOneLargeMessageOfRequestsOnlyAsFastAsItServesThem() throws Exception {
        // Thousands of requests in one message, offered for the server to READ whole (the sender's rendezvous
        // threshold lowered): the server takes it in small parts and stops taking them while it is paused, rather than
        // holding the whole message in registered memory; and it still answers every request, in order.
        int requests = 3000;
        try (ShuffleBlockServer server = server(null, RdmaShuffleConf.MAX_REQUESTS_PER_CONNECTION, "8")) {
            Baseline baseline = new Baseline();
            RawPeer greedy = authenticatedPeer(server);
            greedy.ch.config().setAutoRead(false);
            int part = BlockTransport.SERVER_MAX_MESSAGE_SIZE;
            greedy.ch.config().setOption(RdmaChannelOption.RENDEZVOUS_THRESHOLD, part);
            // Sized at once: a buffer grown step by step would leave a pooled slab of registered memory per size.
            ByteBuf batch = greedy.ch.alloc().directBuffer(requests * (BlockFrame.LENGTH_FIELD_LENGTH
                    + BlockFrame.TYPE_LENGTH + BlockFrame.REQUEST_ID_LENGTH + 2 + ("b_" + requests + "_10").length()));
            for (int i = 0; i < requests; i++) {
                ByteBuf fetch = BlockFrame.fetch(greedy.ch.alloc(), i, "b_" + i + "_10");
                batch.writeBytes(fetch);
                fetch.release();
            }
            assertTrue(batch.readableBytes() > 16 * part, batch.readableBytes() + " bytes");
            ChannelFuture write = greedy.ch.writeAndFlush(batch);
            assertFalse(write.await(1, TimeUnit.SECONDS), "the server took the whole message while it was paused");
            greedy.ch.config().setAutoRead(true);
            for (int i = 0; i < requests; i++) {
                Frame block = greedy.next();
                assertEquals(BlockFrame.BLOCK, block.type, block.toString());
                assertEquals(i, block.requestId);
                assertArrayEquals(slice(i, 10), block.body);
            }
            assertTrue(write.await(10, TimeUnit.SECONDS) && write.isSuccess(), String.valueOf(write.cause()));
            assertTrue(server.peakOutstandingRequests() <= 8, "peak: " + server.peakOutstandingRequests());
            greedy.close();
            baseline.awaitReturn(server);
        }
    }

    /** Block ids of the longest length allowed are served, or failed, each on its own, the connection kept. */
    @Test
    void shouldAnswerFetchesOfTheLongestBlockIdsOneByOne() throws Exception {
        try (ShuffleBlockServer server = server(null)) {
            Baseline baseline = new Baseline();
            RawPeer peer = authenticatedPeer(server);
            // Zeros pad the block id to 256 characters; the other id names no block.
            String served = "b_0_" + "0".repeat(BlockFrame.MAX_BLOCK_ID_LENGTH - 8) + "1000";
            String missing = "missing_" + "x".repeat(BlockFrame.MAX_BLOCK_ID_LENGTH - 8);
            assertEquals(BlockFrame.MAX_BLOCK_ID_LENGTH, served.length());
            peer.fetch(1, served);
            peer.fetch(2, missing);
            peer.ch.flush();
            Map<Long, Frame> responses = new java.util.HashMap<>();
            for (int i = 0; i < 2; i++) {
                Frame f = peer.next();
                assertTrue(f.requestId == 1 || f.requestId == 2, f.toString());
                responses.put(f.requestId, f);
            }
            assertEquals(BlockFrame.BLOCK, responses.get(1L).type, responses.toString());
            assertArrayEquals(slice(0, 1000), responses.get(1L).body);
            assertEquals(BlockFrame.FAILURE, responses.get(2L).type, responses.toString());
            assertTrue(responses.get(2L).text().startsWith("cannot serve " + missing), responses.get(2L).text());
            assertTrue(peer.ch.isActive(), "the connection stays open");
            peer.close();
            baseline.awaitReturn(server);
        }
    }

    @Test
    void shouldAnswerEachPipelinedRequestOnceThroughPausesAndFailures() throws Exception {
        try (ShuffleBlockServer server = server(null, RdmaShuffleConf.MAX_REQUESTS_PER_CONNECTION, "1")) {
            Baseline baseline = new Baseline();
            RawPeer peer = authenticatedPeer(server);
            // All requests in one message, so that they arrive in one read.
            peer.ch.writeAndFlush(pipelinedFetches(peer.ch, false));
            List<Frame> responses = new ArrayList<>();
            for (int i = 0; i < PIPELINED.length; i++) {
                responses.add(peer.next());
            }
            assertAnsweredOnceInOrder(responses);
            assertNull(peer.frames.poll(300, TimeUnit.MILLISECONDS), "nothing after the last response");
            assertTrue(peer.ch.isActive(), "the connection stays open");
            peer.close();
            baseline.awaitReturn(server);
        }
    }

    @Test
    void shouldAnswerEachPipelinedRequestOnceWhereSmallWritesCompleteAtOnce() throws Exception {
        // A socket completes a small write within its flush, and so does the RDMA channel a write it copied (memory
        // registration refused): a failure then completes within the read that decoded its request and, one request
        // allowed, un-pauses the connection while the decoder still delivers that request. The RDMA channel above
        // completes failures from registered memory on delivery, later; an embedded channel completes every write
        // at once.
        try (ShuffleBlockServer server = server(null, RdmaShuffleConf.MAX_REQUESTS_PER_CONNECTION, "1")) {
            EmbeddedChannel ch = new EmbeddedChannel(new ChannelInitializer<>() {
                @Override
                protected void initChannel(Channel c) {
                    server.initConnection(c);
                }
            });
            ByteBuf challenge = ch.readOutbound();
            assertEquals(BlockFrame.CHALLENGE, challenge.getByte(BlockFrame.LENGTH_FIELD_LENGTH));
            challenge.release();
            ch.writeInbound(pipelinedFetches(ch, true));
            ByteBuf proof = ch.readOutbound();
            assertEquals(BlockFrame.PROOF, proof.getByte(BlockFrame.LENGTH_FIELD_LENGTH), "the proof comes first");
            proof.release();
            List<Frame> responses = new ArrayList<>();
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            do {
                ch.runPendingTasks();
                for (Object o; (o = ch.readOutbound()) != null; ) {
                    responses.add(embeddedResponse((ByteBuf) o, ch));
                }
            } while (responses.size() < PIPELINED.length && ch.isActive() && System.nanoTime() < deadline);
            assertAnsweredOnceInOrder(responses);
            assertTrue(ch.isActive(), "the connection stays open");
            assertTrue(ch.config().isAutoRead(), "reading again once every request is answered");
            assertEquals(List.of(), warnings.lines);
            assertFalse(ch.finishAndReleaseAll(), "nothing left over");
        }
    }

    /** The FETCH frames for {@link #PIPELINED}, request id = index, after the RESPONSE if asked, in one buffer. */
    private static ByteBuf pipelinedFetches(Channel ch, boolean withResponse) {
        List<ByteBuf> frames = new ArrayList<>();
        if (withResponse) {
            frames.add(BlockFrame.response(ch.alloc(), new byte[BlockFrame.MAC_LENGTH], RawPeer.NONCE));
        }
        for (int i = 0; i < PIPELINED.length; i++) {
            frames.add(BlockFrame.fetch(ch.alloc(), i, PIPELINED[i]));
        }
        ByteBuf batch = ch.alloc().buffer();
        for (ByteBuf f : frames) {
            batch.writeBytes(f);
            f.release();
        }
        return batch;
    }

    private void assertAnsweredOnceInOrder(List<Frame> responses) {
        assertEquals(PIPELINED.length, responses.size(), responses.toString());
        for (int i = 0; i < PIPELINED.length; i++) {
            Frame response = responses.get(i);
            assertEquals(i, response.requestId, "responses in request order, each once: " + responses);
            if (PIPELINED[i].startsWith("missing")) {
                assertEquals(BlockFrame.FAILURE, response.type, response.toString());
                assertTrue(response.text().startsWith("cannot serve " + PIPELINED[i] + ": "), response.text());
            } else {
                assertEquals(BlockFrame.BLOCK, response.type, response.toString());
                String[] f = PIPELINED[i].split("_");
                assertArrayEquals(slice(Integer.parseInt(f[1]), Integer.parseInt(f[2])), response.body, PIPELINED[i]);
            }
        }
    }

    /** One response the server wrote to an embedded channel: a FAILURE frame, or a BLOCK header and its payload. */
    private static Frame embeddedResponse(ByteBuf frame, EmbeddedChannel ch) {
        try {
            frame.skipBytes(BlockFrame.LENGTH_FIELD_LENGTH);
            byte type = frame.readByte();
            long requestId = frame.readLong();
            if (type != BlockFrame.BLOCK) {
                byte[] text = new byte[frame.readableBytes()];
                frame.readBytes(text);
                return new Frame(type, requestId, text);
            }
            FileRegion payload = ch.readOutbound();
            try {
                ByteArrayOutputStream body = new ByteArrayOutputStream();
                payload.transferTo(Channels.newChannel(body), 0);
                return new Frame(type, requestId, body.toByteArray());
            } finally {
                payload.release();
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } finally {
            frame.release();
        }
    }

    @Test
    void shouldHoldAPeerThatStopsReadingToItsShareOfThePinnedMemoryCap() throws Exception {
        int size = 32 * 1024;
        try (ShuffleBlockServer server = server(null, RdmaShuffleConf.PINNED_MEMORY_CAP, "256k",
                RdmaShuffleConf.PINNED_MEMORY_PER_CONNECTION, "64k", RdmaShuffleConf.WRITE_TIMEOUT, NO_TIMEOUT)) {
            Baseline baseline = new Baseline();
            RawPeer greedy = authenticatedPeer(server);
            greedy.ch.config().setAutoRead(false);
            for (int i = 0; i < 100; i++) {
                greedy.fetch(i, "b_" + i * 1000 + "_" + size);
            }
            greedy.ch.flush();
            waitFor(() -> server.inFlightBytes() > 0);
            try (ShuffleBlockClient client = client(null)) {
                String[] ids = new String[16];
                for (int i = 0; i < ids.length; i++) {
                    ids[i] = "b_" + (i * 7919) + "_" + size;
                }
                assertFetches(client, server, ids);
            }
            assertTrue(greedy.ch.isActive(), "held to its share, not cut off");
            // Once the good client's last completions are in, what is left in flight is the greedy peer's share.
            waitFor(() -> server.inFlightBytes() <= 64 * 1024, () -> "greedy peer holds " + server.inFlightBytes());
            assertTrue(server.peakInFlightBytes() <= 256 * 1024, "peak: " + server.peakInFlightBytes());
            greedy.close();
            waitFor(() -> server.inFlightBytes() == 0);
            baseline.awaitReturn(server);
        }
    }

    @Test
    void shouldReleaseTheBlocksOfResponsesDroppedWithTheirConnection() throws Exception {
        int size = 64 * 1024;
        List<ByteBuf> opened = new CopyOnWriteArrayList<>();
        source = id -> {
            ByteBuf buf = Unpooled.directBuffer(size).writeZero(size);
            opened.add(buf);
            return new NettyManagedBuffer(buf);
        };
        try (ShuffleBlockServer server = server(null, RdmaShuffleConf.PINNED_MEMORY_PER_CONNECTION, "64k",
                RdmaShuffleConf.WRITE_TIMEOUT, NO_TIMEOUT)) {
            Baseline baseline = new Baseline();
            RawPeer greedy = authenticatedPeer(server);
            greedy.ch.config().setAutoRead(false);
            for (int i = 0; i < 100; i++) {
                greedy.fetch(i, "block_" + i);
            }
            greedy.ch.flush();
            // Its receive credits spent, the peer holds one response in flight; the others wait in the queue.
            waitFor(() -> opened.size() == 100 && server.inFlightBytes() > 0);
            greedy.close();
            waitFor(() -> server.openConnections() == 0);
            assertTrue(serverMetrics.blocksServed.getCount() < 99, "served: " + serverMetrics.blocksServed.getCount());
            waitFor(() -> opened.stream().allMatch(b -> b.refCnt() == 0), () -> opened.stream()
                    .filter(b -> b.refCnt() > 0).count() + " of 100 blocks not released, "
                    + serverMetrics.blocksServed.getCount() + " served");
            baseline.awaitReturn(server);
        }
    }

    @Test
    void shouldCloseAPeerThatStopsReadingAfterTheWriteTimeoutReleasingTheCap() throws Exception {
        int cap = 1 << 20;
        try (ShuffleBlockServer server = server("right", RdmaShuffleConf.PINNED_MEMORY_CAP, Integer.toString(cap),
                RdmaShuffleConf.WRITE_TIMEOUT, "300ms")) {
            Baseline baseline = new Baseline();
            RawPeer hostile = peer(server);
            Frame challenge = hostile.next();
            hostile.answer(new PeerAuthenticator("right").clientAnswer(EXECUTOR,
                    Arrays.copyOfRange(challenge.body, 1, 33), RawPeer.NONCE));
            assertEquals(BlockFrame.PROOF, hostile.proofs.poll(10, TimeUnit.SECONDS).type);
            hostile.ch.config().setAutoRead(false);
            // One block as large as the whole cap, never read: it goes out alone and everyone else waits on it.
            hostile.fetch(1, "b_0_" + cap);
            hostile.ch.flush();
            waitFor(() -> server.inFlightBytes() == cap);
            try (ShuffleBlockClient client = client("right")) {
                assertFetches(client, server, "b_100_10000", "b_200_20000", "b_300_30000");
            }
            assertEquals(1, serverMetrics.connectionsTimedOut.getCount());
            assertEquals(1, warnings.containing("spark.shuffle.rdma.writeTimeout").size(), warnings.lines.toString());
            waitFor(() -> server.inFlightBytes() == 0 && server.openConnections() == 0);
            // Reading nothing, the hostile side cannot see the reset; its own close ends it.
            hostile.close();
            baseline.awaitReturn(server);
        }
    }

    @Test
    void shouldCloseAPeerThatConsumesOneResponseNowAndThenOnceItsOldestIsOlderThanTheWriteTimeout() throws Exception {
        // Each completion came within the write timeout of the one before, so the connection counted as progressing
        // and held its share of pinned memory for as long as the peer went on: here one block every 150 ms of 8.
        try (ShuffleBlockServer server = server(null, RdmaShuffleConf.WRITE_TIMEOUT, "300ms")) {
            HeldWrites held = new HeldWrites();
            EmbeddedChannel ch = new EmbeddedChannel(new ChannelInitializer<>() {
                @Override
                protected void initChannel(Channel c) {
                    c.pipeline().addLast(held);
                    server.initConnection(c);
                }
            });
            ch.writeInbound(BlockFrame.response(ch.alloc(), new byte[BlockFrame.MAC_LENGTH], RawPeer.NONCE));
            held.passAll(ch);
            for (Object o; (o = ch.readOutbound()) != null; ) {
                ReferenceCountUtil.release(o);
            }
            ByteBuf fetches = ch.alloc().buffer();
            for (int i = 0; i < 8; i++) {
                ByteBuf f = BlockFrame.fetch(ch.alloc(), i, "b_" + i * 1000 + "_1000");
                fetches.writeBytes(f);
                f.release();
            }
            ch.writeInbound(fetches);
            ch.runPendingTasks();
            assertEquals(16, held.size(), "a header and a payload for each of the 8 blocks, all sent");
            long start = System.nanoTime();
            int consumed = 0;
            while (ch.isActive() && consumed < 8) {
                Thread.sleep(150);
                held.pass(ch, 2);
                consumed++;
                ch.runPendingTasks();
                ch.runScheduledPendingTasks();
            }
            long elapsedMillis = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
            assertFalse(ch.isActive(), "the connection was open after the peer had consumed all 8 responses over "
                    + elapsedMillis + " ms, one every 150 ms, with a write timeout of 300 ms");
            assertTrue(consumed < 5, "consumed " + consumed + " of 8 before the connection was closed");
            assertEquals(1, serverMetrics.connectionsTimedOut.getCount());
            assertEquals(1, warnings.containing("is not consumed yet (spark.shuffle.rdma.writeTimeout=300 ms").size(),
                    warnings.lines.toString());
            waitFor(() -> server.inFlightBytes() == 0 && server.openConnections() == 0);
            ch.finishAndReleaseAll();
        }
    }

    @Test
    void shouldFailABlockIdTooLongForTheWireOnItsOwnAndFetchTheOthers() throws Exception {
        // Spark's ids are far shorter; the thrown refusal escaped the event loop's task, and neither that id nor the
        // ones after it got a callback: Spark's reader waited on them for ever.
        String tooLong = "b_0_" + "1".repeat(BlockFrame.MAX_BLOCK_ID_LENGTH);
        try (ShuffleBlockServer server = server("right");
             ShuffleBlockClient client = client("right")) {
            Collector c = new Collector(3);
            client.fetch(EXECUTOR, address(server), new String[] {"b_0_1000", tooLong, "b_5000_3000"}, c);
            c.await();
            assertEquals(Set.of(tooLong), c.failures.keySet());
            assertInstanceOf(IllegalArgumentException.class, c.failures.get(tooLong));
            assertTrue(c.failures.get(tooLong).getMessage().contains("(expected: at most 256 UTF-8 bytes)"),
                    c.failures.get(tooLong)::toString);
            assertArrayEquals(slice(0, 1000), c.received.get("b_0_1000"));
            assertArrayEquals(slice(5000, 3000), c.received.get("b_5000_3000"));
            c.buffers.values().forEach(FetchedBlockBuffer::release);
        }
    }

    /**
     * Holds the writes that reach it, as a peer that reads nothing holds a channel's, and passes them on when told;
     * those still held when the channel closes fail, as a closed channel's do.
     */
    private static final class HeldWrites extends ChannelOutboundHandlerAdapter {
        private final ArrayDeque<Object> messages = new ArrayDeque<>();
        private final ArrayDeque<ChannelPromise> promises = new ArrayDeque<>();
        private ChannelHandlerContext ctx;

        @Override
        public void handlerAdded(ChannelHandlerContext ctx) {
            this.ctx = ctx;
        }

        @Override
        public void write(ChannelHandlerContext ctx, Object msg, ChannelPromise promise) {
            messages.add(msg);
            promises.add(promise);
        }

        @Override
        public void close(ChannelHandlerContext ctx, ChannelPromise promise) {
            while (!messages.isEmpty()) {
                ReferenceCountUtil.release(messages.poll());
                promises.poll().tryFailure(new ClosedChannelException());
            }
            ctx.close(promise);
        }

        int size() {
            return messages.size();
        }

        void pass(EmbeddedChannel ch, int count) {
            for (int i = 0; i < count && !messages.isEmpty(); i++) {
                ctx.write(messages.poll(), promises.poll());
            }
            ctx.flush();
            ch.runPendingTasks();
        }

        void passAll(EmbeddedChannel ch) {
            pass(ch, Integer.MAX_VALUE);
        }
    }

    private static void waitFor(BooleanSupplier condition) throws InterruptedException {
        waitFor(condition, () -> "");
    }

    private static void waitFor(BooleanSupplier condition, Supplier<String> message) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!condition.getAsBoolean() && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        assertTrue(condition.getAsBoolean(), message);
    }

    /** How many warnings one logged line stands for: itself and those it says were suppressed before it. */
    private static long linesStoodFor(String line) {
        Matcher m = Pattern.compile("\\((\\d+) more like this suppressed").matcher(line);
        return 1 + (m.find() ? Long.parseLong(m.group(1)) : 0);
    }

    private ShuffleBlockServer server(String secret, String... keysAndValues) {
        return server(secret, 0, keysAndValues);
    }

    private ShuffleBlockServer server(String secret, int port, String... keysAndValues) {
        SparkConf conf = new SparkConf(false);
        for (int i = 0; i < keysAndValues.length; i += 2) {
            conf.set(keysAndValues[i], keysAndValues[i + 1]);
        }
        return new ShuffleBlockServer(transport, EXECUTOR, "127.0.0.1", port, source,
                new PeerAuthenticator(secret), new RdmaShuffleConf(conf), serverMetrics);
    }

    private ShuffleBlockClient client(String secret) {
        RdmaShuffleConf conf = new RdmaShuffleConf(new SparkConf(false));
        return new ShuffleBlockClient(transport, new PeerAuthenticator(secret), 5_000, 10_000,
                conf::maxFetchedBlockLength, conf.maxFetchedBytesPerConnection, clientMetrics);
    }

    /** Block "b_OFFSET_LENGTH" is that segment of the data file. */
    private ManagedBuffer open(String blockId) {
        String[] f = blockId.split("_");
        return new FileSegmentManagedBuffer(TRANSPORT_CONF, data, Long.parseLong(f[1]), Long.parseLong(f[2]));
    }

    private void assertFetches(ShuffleBlockClient client, ShuffleBlockServer server, String... ids)
            throws InterruptedException {
        Collector c = new Collector(ids.length);
        client.fetch(EXECUTOR, address(server), ids, c);
        c.await();
        assertEquals(Map.of(), c.failures);
        for (String id : ids) {
            String[] f = id.split("_");
            assertArrayEquals(slice(Integer.parseInt(f[1]), Integer.parseInt(f[2])), c.received.get(id), id);
        }
        c.buffers.values().forEach(FetchedBlockBuffer::release);
    }

    private RawPeer peer(ShuffleBlockServer server) throws InterruptedException {
        return peer(server, "127.0.0.1");
    }

    /** A raw peer connecting from {@code localHost}, an address of this host's loopback (127.0.0.0/8). */
    private RawPeer peer(ShuffleBlockServer server, String localHost) throws InterruptedException {
        RawPeer p = new RawPeer(address(server), localHost);
        peers.add(p);
        return p;
    }

    /** A raw peer past the challenge of a server without a secret. */
    private RawPeer authenticatedPeer(ShuffleBlockServer server) throws InterruptedException {
        return authenticatedPeer(server, "127.0.0.1");
    }

    private RawPeer authenticatedPeer(ShuffleBlockServer server, String localHost) throws InterruptedException {
        RawPeer p = peer(server, localHost);
        assertEquals(BlockFrame.CHALLENGE, p.next().type);
        p.answer(new byte[BlockFrame.MAC_LENGTH]);
        return p;
    }

    private static InetSocketAddress address(ShuffleBlockServer server) {
        return new InetSocketAddress("127.0.0.1", server.localAddress().getPort());
    }

    private byte[] slice(int offset, int length) {
        return Arrays.copyOfRange(bytes, offset, offset + length);
    }

    private record Frame(byte type, long requestId, byte[] body) {
        String text() {
            return new String(body, java.nio.charset.StandardCharsets.UTF_8);
        }

        @Override
        public String toString() {
            return (type == BlockFrame.FAILURE ? "FAILURE " + requestId + " \"" + text() + "\""
                    : "type=" + type + " " + requestId + " (" + body.length + " bytes)");
        }
    }

    /**
     * Queue pairs, completion queues and connection ids with the listener alone, to return to at the end. Registered
     * memory may stay above its baseline by the shared arena's slabs, which are kept until the transport returns idle
     * registered memory (issue 11, item 9); everything per connection is gone with its queue pair.
     */
    private final class Baseline {
        private static final long ARENA_ALLOWANCE = 4 << 20;
        private final ResourceUsage usage = transport.provider().resourceUsage();
        private final String connections = describe(usage);
        private final long registeredBytes = usage.registeredBytes();

        void awaitReturn(ShuffleBlockServer server) throws InterruptedException {
            waitFor(() -> server.openConnections() == 0 && connections.equals(describe(usage))
                    && usage.registeredBytes() - registeredBytes <= ARENA_ALLOWANCE, () -> "baseline " + connections
                    + " registered=" + registeredBytes + ", now " + describe(usage) + " registered="
                    + usage.registeredBytes());
        }

        private static String describe(ResourceUsage u) {
            return "qp=" + u.queuePairs() + " cq=" + u.completionQueues() + " cm=" + u.cmIds();
        }
    }

    /**
     * A client that speaks the block protocol only as far as the test says: it keeps every frame it receives and
     * answers, fetches or stops reading when told.
     */
    private final class RawPeer {
        /** The client nonce every raw peer sends: the server must not care whose nonce it is. */
        static final byte[] NONCE = new byte[BlockFrame.NONCE_LENGTH];

        final Channel ch;
        private final BlockingQueue<Frame> frames = new LinkedBlockingQueue<>();
        /** The server's PROOF frames, kept apart so that {@link #next} returns what follows them. */
        final BlockingQueue<Frame> proofs = new LinkedBlockingQueue<>();

        RawPeer(InetSocketAddress server, String localHost) throws InterruptedException {
            ch = transport.newBootstrap().handler(new ChannelInitializer<>() {
                @Override
                protected void initChannel(Channel c) {
                    c.pipeline().addLast(BlockFrame.newFrameDecoder(Integer.MAX_VALUE - BlockFrame.LENGTH_FIELD_LENGTH),
                            new SimpleChannelInboundHandler<ByteBuf>() {
                                @Override
                                protected void channelRead0(ChannelHandlerContext ctx, ByteBuf frame) {
                                    byte type = frame.readByte();
                                    long id = type == BlockFrame.BLOCK || type == BlockFrame.FAILURE
                                            ? frame.readLong() : 0;
                                    byte[] body = new byte[frame.readableBytes()];
                                    frame.readBytes(body);
                                    (type == BlockFrame.PROOF ? proofs : frames).add(new Frame(type, id, body));
                                }

                                @Override
                                public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
                                    ctx.close();
                                }
                            });
                }
            }).connect(server, new InetSocketAddress(localHost, 0)).sync().channel();
        }

        Frame next() throws InterruptedException {
            Frame f = frames.poll(10, TimeUnit.SECONDS);
            assertNotNull(f, "a frame from the server");
            return f;
        }

        void answer(byte[] mac) {
            ch.writeAndFlush(BlockFrame.response(ch.alloc(), mac, NONCE));
        }

        void fetch(long requestId, String blockId) {
            ch.write(BlockFrame.fetch(ch.alloc(), requestId, blockId));
        }

        void awaitClosed() throws InterruptedException {
            assertTrue(ch.closeFuture().await(10, TimeUnit.SECONDS), "the server closed the connection");
        }

        void close() {
            ch.close().syncUninterruptibly();
        }
    }

    /** The block server's WARN lines, as formatted, while the test runs. */
    private static final class CapturedWarnings extends AbstractAppender implements AutoCloseable {
        final List<String> lines = new CopyOnWriteArrayList<>();
        private final Logger logger = (Logger) LogManager.getLogger(ShuffleBlockServer.class);

        CapturedWarnings() {
            super("captured-warnings", null, null, true, Property.EMPTY_ARRAY);
            start();
            logger.addAppender(this);
        }

        @Override
        public void append(LogEvent event) {
            if (event.getLevel() == org.apache.logging.log4j.Level.WARN) {
                lines.add(event.getMessage().getFormattedMessage());
            }
        }

        List<String> containing(String text) {
            return lines.stream().filter(l -> l.contains(text)).toList();
        }

        @Override
        public void close() {
            logger.removeAppender(this);
            stop();
        }
    }
}
