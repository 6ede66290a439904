package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.bootstrap.Bootstrap;
import io.netty.buffer.AbstractByteBufAllocator;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.buffer.UnpooledDirectByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandler;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.rdmabridge.netty.RdmaIoHandler;
import io.rdmabridge.netty.RdmaSocketChannel;
import io.rdmabridge.verbs.RateLimitedWarning;
import io.rdmabridge.verbs.RdmaProviders;
import io.rdmabridge.verbs.soft.SoftProvider;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@link RdmaChannelTransport} on the soft provider: the token opens exactly one stream, back-pressure bounds what a
 * writer can queue while nobody reads, a mapped file segment costs one copy on each side, and every verbs resource is
 * returned once the transport closes.
 */
class RdmaChannelTransportTest {
    private final SoftProvider soft = (SoftProvider) RdmaProviders.byName("soft");
    private RdmaChannelTransport transport;

    @TempDir
    Path dir;

    @BeforeEach
    void open() throws IOException {
        transport = RdmaChannelTransport.open(soft, 1, "127.0.0.1", 0, 2000, 64, 64, 4);
    }

    @AfterEach
    void close() {
        transport.close();
        assertTrue(soft.resourceUsage().isZero(), "leaked: " + soft.resourceUsage());
    }

    /** Replaces the transport with one of this handshake timeout and cap on connections without a token. */
    private void reopen(int handshakeTimeoutMs, int maxUnidentified) throws IOException {
        transport.close();
        transport = RdmaChannelTransport.open(soft, 1, "127.0.0.1", 0, handshakeTimeoutMs, 64, 64, maxUnidentified);
    }

    /** A connection's only handler: it sends nothing, so it never presents a token. One serves every connection. */
    @ChannelHandler.Sharable
    private static final class Silent extends ChannelInboundHandlerAdapter {
    }

    private InetSocketAddress listener() {
        return new InetSocketAddress("127.0.0.1", transport.listenPort());
    }

    private RdmaStream[] pair(long token) throws Exception {
        CompletableFuture<RdmaStream> leader = transport.expect(token);
        RdmaStream follower = transport.connect(listener(), token, 1).get(10, TimeUnit.SECONDS);
        return new RdmaStream[] {leader.get(10, TimeUnit.SECONDS), follower};
    }

    private static void readFully(RdmaStream s, ByteBuffer dst) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (dst.hasRemaining()) {
            int n = s.read(dst);
            assertTrue(n >= 0, "end of stream after " + dst.position() + " bytes");
            if (n == 0) {
                assertTrue(System.nanoTime() < deadline, "read stalled at " + dst.position() + " bytes");
                Thread.sleep(1);
            }
        }
    }

    private static void writeFully(RdmaStream s, ByteBuffer src) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (src.hasRemaining()) {
            if (s.write(src) == 0) {
                assertTrue(System.nanoTime() < deadline, "write stalled at " + src.position() + " bytes");
                Thread.sleep(1);
            }
        }
    }

    /**
     * A socket's close still delivers what its send buffer holds; so does the stream's, for the bytes write() took
     * and the channel had not yet sent (the peer had stopped reading). They used to be dropped, and the peer read a
     * clean end of stream after a cut stream.
     */
    @Test
    @Timeout(60)
    void shouldDeliverWhatWriteAcceptedBeforeTheEndOfStreamWhenClosed() throws Exception {
        RdmaStream[] s = pair(21);
        byte[] chunk = new byte[64 * 1024];
        new Random(21).nextBytes(chunk);
        long written = 0;
        // The follower does not read: once its credits and the leader's water mark run out, write() takes nothing.
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        for (int refused = 0; refused < 20; ) {
            assertTrue(System.nanoTime() < deadline, "writes were never refused");
            int n = s[0].write(ByteBuffer.wrap(chunk));
            written += n;
            if (n == 0) {
                refused++;
                Thread.sleep(5);
            }
        }
        s[0].close();
        ByteBuffer got = ByteBuffer.allocate(chunk.length);
        long read = 0;
        deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        for (;;) {
            int n = s[1].read(got);
            if (n < 0) {
                break;
            }
            if (n == 0) {
                assertTrue(System.nanoTime() < deadline, "read stalled at " + read + " of " + written + " bytes");
                Thread.sleep(1);
            }
            if (!got.hasRemaining()) {
                assertArrayEquals(chunk, got.array(), "the chunk ending at byte " + (read + n));
                got.clear();
            }
            read += n;
        }
        assertEquals(written, read, "bytes read before the end of stream");
        assertEquals(0, read % chunk.length);
        s[1].close();
    }

    /** A peer that takes nothing within the close's linger gets a reset: never a cut stream that ends cleanly. */
    @Test
    @Timeout(60)
    void shouldResetAPeerThatTakesNothingWithinTheCloseLinger() throws Exception {
        RdmaStream[] s = pair(22);
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        for (int refused = 0; refused < 20; ) {
            assertTrue(System.nanoTime() < deadline, "writes were never refused");
            if (s[0].write(ByteBuffer.allocate(64 * 1024)) == 0) {
                refused++;
                Thread.sleep(5);
            }
        }
        s[0].close();
        Thread.sleep(RdmaChannelStream.CLOSE_LINGER_MILLIS + 1000);
        ByteBuffer sink = ByteBuffer.allocate(64 * 1024);
        deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        IOException reset = null;
        try {
            for (;;) {
                int n = s[1].read(sink.clear());
                assertTrue(n >= 0, "a clean end of stream after a stream the closer could not deliver");
                if (n == 0) {
                    assertTrue(System.nanoTime() < deadline, "neither a reset nor an end of stream");
                    Thread.sleep(1);
                }
            }
        } catch (IOException e) {
            reset = e;
        }
        assertTrue(reset.getMessage().contains("reset"), reset.toString());
        s[1].close();
    }

    @Test
    @Timeout(60)
    void shouldSendAMappedFileSegmentWithOneCopyOnEachSide() throws Exception {
        byte[] content = new byte[3 * 1024 * 1024 + 5];
        new Random(3).nextBytes(content);
        Path file = dir.resolve("segment");
        Files.write(file, content);
        RdmaStream[] s = pair(0x1122334455667788L);
        try (FileChannel fc = FileChannel.open(file, StandardOpenOption.READ)) {
            MappedByteBuffer mapped = fc.map(FileChannel.MapMode.READ_ONLY, 0, content.length);
            ByteBuffer received = ByteBuffer.allocate(content.length);
            Thread reader = new Thread(() -> {
                try {
                    readFully(s[1], received);
                } catch (Exception e) {
                    throw new AssertionError(e);
                }
            });
            reader.start();
            writeFully(s[0], mapped);
            reader.join(30_000);
            assertFalse(reader.isAlive());
            assertArrayEquals(content, received.array());
        }
        assertEquals(content.length, s[0].copiedBytesSent(), "sender: one copy into registered memory per byte");
        assertEquals(content.length, s[1].copiedBytesReceived(), "receiver: one copy out of registered memory");
        s[0].close();
        s[1].close();
    }

    @Test
    @Timeout(60)
    void shouldReleaseItsBufferWhenTheCopyIntoItFails() throws Exception {
        RdmaStream[] s = pair(13);
        ByteBuf[] allocated = new ByteBuf[1];
        // What a mapped file segment truncated under the leader does to the copy when it faults synchronously.
        ((RdmaChannelStream) s[0]).channel().config().setAllocator(new AbstractByteBufAllocator(true) {
            @Override
            protected ByteBuf newHeapBuffer(int initialCapacity, int maxCapacity) {
                return Unpooled.buffer(initialCapacity, maxCapacity);
            }

            @Override
            protected ByteBuf newDirectBuffer(int initialCapacity, int maxCapacity) {
                allocated[0] = new UnpooledDirectByteBuf(this, initialCapacity, maxCapacity) {
                    @Override
                    public ByteBuf writeBytes(ByteBuffer src) {
                        throw new InternalError("test: a fault occurred in an unsafe memory access operation");
                    }
                };
                return allocated[0];
            }

            @Override
            public boolean isDirectBufferPooled() {
                return false;
            }
        });
        ByteBuffer src = ByteBuffer.wrap("fetch".getBytes());
        // An IOException, which Kafka's selector answers by closing the connection; an Error it does not catch there.
        IOException e = assertThrows(IOException.class, () -> s[0].write(src));
        assertTrue(e.getCause() instanceof InternalError, String.valueOf(e.getCause()));
        assertTrue(e.getMessage().contains("log segment truncated"), e.getMessage());
        assertEquals(0, allocated[0].refCnt(), "the buffer the bytes were to be copied into was released");
        assertEquals(src.capacity(), src.limit(), "the caller's limit restored");
        s[0].close();
        s[1].close();
    }

    @Test
    @Timeout(60)
    void shouldStopTakingBytesWhileThePeerDoesNotReadAndResumeWhenItDoes() throws Exception {
        RdmaStream[] s = pair(42);
        AtomicInteger signals = new AtomicInteger();
        s[0].readinessListener(signals::incrementAndGet);
        byte[] chunk = new byte[100_000];
        new Random(1).nextBytes(chunk);
        long written = 0;
        long idleSince = System.nanoTime();
        while (System.nanoTime() - idleSince < TimeUnit.MILLISECONDS.toNanos(500)) {
            ByteBuffer b = ByteBuffer.wrap(chunk, (int) (written % chunk.length),
                    chunk.length - (int) (written % chunk.length));
            int n = s[0].write(b);
            if (n > 0) {
                written += n;
                idleSince = System.nanoTime();
                assertTrue(written < 64L * 1024 * 1024, "the writer was never stopped: " + written + " bytes taken");
            } else {
                Thread.sleep(1);
            }
        }
        assertFalse(s[0].isWritable(), "a writer that was refused is not writable");
        // Receiver ring (1 MiB plus one message), in flight between the two, and the sender's water mark (1 MiB plus
        // one write): a few MiB at most, never what the writer offered.
        assertTrue(written <= 6L * 1024 * 1024, "bytes taken while nobody read: " + written);

        byte[] received = new byte[(int) written];
        readFully(s[1], ByteBuffer.wrap(received));
        for (int i = 0; i < received.length; i++) {
            if (received[i] != chunk[i % chunk.length]) {
                throw new AssertionError("byte " + i + " differs");
            }
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!s[0].isWritable()) {
            assertTrue(System.nanoTime() < deadline, "the writer never became writable again");
            Thread.sleep(1);
        }
        assertTrue(signals.get() > 0, "writability change signalled to the listener");
        s[0].close();
        s[1].close();
    }

    @Test
    @Timeout(60)
    void shouldCloseAConnectionWithAnUnknownTokenAndKeepTheExpectedOne() throws Exception {
        CompletableFuture<RdmaStream> expected = transport.expect(7);
        assertRefused(transport.connect(listener(), 8, 1));
        assertFalse(expected.isDone(), "a wrong token does not complete the expected stream");

        RdmaStream follower = transport.connect(listener(), 7, 1).get(10, TimeUnit.SECONDS);
        RdmaStream leader = expected.get(10, TimeUnit.SECONDS);
        writeFully(follower, ByteBuffer.wrap("fetch".getBytes()));
        ByteBuffer in = ByteBuffer.allocate(5);
        readFully(leader, in);
        assertEquals("fetch", new String(in.array()));
        follower.close();
        leader.close();
    }

    @Test
    @Timeout(60)
    void shouldCloseAStreamWhoseTokenWasForgotten() throws Exception {
        // The leader gave up on the handshake (its future cancelled): a stream arriving later is closed.
        CompletableFuture<RdmaStream> cancelled = transport.expect(9);
        cancelled.cancel(false);
        assertRefused(transport.connect(listener(), 9, 1));
    }

    /**
     * The token crosses the network in clear. A connection that presents it before the follower takes the leader's
     * side of the stream; the follower must then learn that its own was refused before it decides on RDMA. Its
     * connect used to complete once the token was sent: it decided on RDMA, Kafka's bytes went to a stream the leader
     * had closed, and so on at every reconnect.
     */
    @Test
    @Timeout(60)
    void shouldFailTheConnectOfAFollowerWhoseTokenAnotherConnectionPresentedFirst() throws Exception {
        CompletableFuture<RdmaStream> expected = transport.expect(13);
        RdmaStream thief = transport.connect(listener(), 13, 1).get(10, TimeUnit.SECONDS);
        RdmaStream leader = expected.get(10, TimeUnit.SECONDS);
        try {
            assertRefused(transport.connect(listener(), 13, 1));
        } finally {
            thief.close();
            leader.close();
        }
    }

    /**
     * The acknowledgement names the broker that took the token: a follower that expected another one (the broker
     * whose plugin answered its probe) does not decide on RDMA. Its broker id used to be ignored.
     */
    @Test
    @Timeout(60)
    void shouldFailTheConnectOfAFollowerWhoseTokenAnotherBrokerAcknowledged() throws Exception {
        CompletableFuture<RdmaStream> expected = transport.expect(21);
        ExecutionException e = assertThrows(ExecutionException.class,
                () -> transport.connect(listener(), 21, 2).get(10, TimeUnit.SECONDS));
        assertEquals(listener() + " acknowledged the RDMA stream's token as broker 1 (expected: leader 2, which "
                + "answered the probe): another broker's plugin listens there, or the leader is broken",
                e.getCause().getMessage());
        expected.get(10, TimeUnit.SECONDS).close();
    }

    /** Asserts that the leader refused the stream's token: the connect fails, naming the refusal. */
    private static void assertRefused(CompletableFuture<RdmaStream> connect) throws Exception {
        ExecutionException e = assertThrows(ExecutionException.class, () -> connect.get(10, TimeUnit.SECONDS),
                "the connect of a refused token completed");
        assertTrue(e.getCause().getMessage().contains("refused the token"), e.getCause().toString());
    }

    @Test
    @Timeout(60)
    void shouldAnswerAProbeWithItsBrokerIdAndLeaveNothingBehind() throws Exception {
        assertEquals(1, transport.probe(listener()).get(10, TimeUnit.SECONDS), "the leader's broker id");
        // The probe used no token: the stream a real follower opens next is unaffected.
        RdmaStream[] s = pair(11);
        writeFully(s[1], ByteBuffer.wrap("fetch".getBytes()));
        ByteBuffer in = ByteBuffer.allocate(5);
        readFully(s[0], in);
        assertEquals("fetch", new String(in.array()));
        s[0].close();
        s[1].close();
    }

    /**
     * Whether the leader closed the connection behind {@code connect} within 15 s, or refused it; closes the
     * follower's side either way.
     */
    private static boolean closedByLeader(CompletableFuture<RdmaStream> connect) throws Exception {
        RdmaStream s;
        try {
            s = connect.get(15, TimeUnit.SECONDS);
        } catch (ExecutionException e) {
            return true;
        }
        try {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
            ByteBuffer b = ByteBuffer.allocate(16);
            while (System.nanoTime() < deadline) {
                try {
                    if (s.read(b.clear()) < 0) {
                        return true;
                    }
                } catch (IOException e) {
                    return true;
                }
                Thread.sleep(1);
            }
            return false;
        } finally {
            s.close();
        }
    }

    /**
     * Opens a probe's connection that reads the answer but, sending nothing more, never acknowledges it. The answer
     * has the form of a token's acknowledgement, so the stream's connect completes once the answer has arrived.
     */
    private RdmaStream silentProbe() throws Exception {
        return transport.connect(listener(), Preamble.PROBE_TOKEN, 1).get(10, TimeUnit.SECONDS);
    }

    @Test
    @Timeout(60)
    void shouldCloseAProbeWhoseAnswerIsNotDeliveredAtTheHandshakeTimeout() throws Exception {
        reopen(500, 4);
        // The answer reaches the follower, but the leader learns it only from the send completion, held back here.
        soft.faults().delaySendCompletions(TimeUnit.SECONDS.toNanos(60));
        try {
            RdmaStream probe = silentProbe();
            assertTrue(closedByLeader(CompletableFuture.completedFuture(probe)),
                    "a probe whose answer was never delivered stayed open past the handshake timeout");
        } finally {
            soft.faults().reset();
        }
    }

    @Test
    @Timeout(60)
    void shouldCountAProbeAgainstTheHandshakeCapUntilItIsClosed() throws Exception {
        reopen(5000, 1);
        soft.faults().delaySendCompletions(TimeUnit.SECONDS.toNanos(60));
        RdmaStream probe;
        try {
            probe = silentProbe();
        } finally {
            soft.faults().reset();
        }
        try {
            CompletableFuture<RdmaStream> expected = transport.expect(12);
            assertTrue(closedByLeader(transport.connect(listener(), 12, 1)), "a connection beyond "
                    + "rdma.handshake.max.in.progress=1 was accepted while a probe's answer was not delivered");
            assertFalse(expected.isDone(), "it presented no token");
        } finally {
            probe.close();
        }
    }

    @Test
    @Timeout(60)
    void shouldCountAndCloseConnectionsThatNeverCompleteTheTransportHandshake() throws Exception {
        reopen(8000, 1);
        // Every work request is held back: no HELLO arrives, so neither end of a connection ever becomes active, and
        // each holds its queue pair and receive buffers.
        soft.faults().delaySends(TimeUnit.SECONDS.toNanos(60));
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(soft));
        try {
            Bootstrap b = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .option(ChannelOption.CONNECT_TIMEOUT_MILLIS, 50_000).handler(new Silent());
            ChannelFuture first = b.connect(listener());
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (transport.unidentifiedConnections() == 0 && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            assertEquals(1, transport.unidentifiedConnections(), "the accepted connection is not counted");
            ChannelFuture second = b.connect(listener());
            assertTrue(second.await(5, TimeUnit.SECONDS), "a connection beyond rdma.handshake.max.in.progress=1 "
                    + "was kept while the first had not completed the transport's handshake");
            assertFalse(second.isSuccess());
            assertFalse(first.isDone(), "the first connection was closed before rdma.handshake.timeout.ms");
            assertTrue(first.await(20, TimeUnit.SECONDS), "a connection that never completed the transport's "
                    + "handshake was kept past rdma.handshake.timeout.ms");
            assertFalse(first.isSuccess());
            assertEquals(0, transport.unidentifiedConnections());
        } finally {
            soft.faults().reset();
            group.shutdownGracefully(0, 1, TimeUnit.SECONDS).syncUninterruptibly();
        }
    }

    /**
     * rdma.handshake.max.in.progress connections that never complete the transport's handshake, each within its
     * address's share, all hold their places: each reserves (64 + 8) x 64 KiB of receive buffers until it is active,
     * and the event loop's handshake memory used to be the transport's 64 MiB default, which the transport enforced by
     * rejecting the 15th of the default 16 (logged only at DEBUG).
     */
    @Test
    @Timeout(60)
    void shouldAdmitAsManyConnectionsWithoutTheTransportHandshakeAsTheCapAllows() throws Exception {
        int cap = RdmaReplicationConfig.DEFAULT_MAX_HANDSHAKES;
        reopen(30_000, cap);
        soft.faults().delaySends(TimeUnit.SECONDS.toNanos(60));
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(soft));
        List<ChannelFuture> connects = new ArrayList<>();
        try {
            Bootstrap b = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .option(ChannelOption.CONNECT_TIMEOUT_MILLIS, 50_000).handler(new Silent());
            // Half the places per address: four addresses of four connections each stay within their shares.
            for (int i = 0; i < cap; i++) {
                connects.add(b.connect(listener(), new InetSocketAddress("127.0.0." + (2 + i % 4), 0)));
            }
            RateLimitedWarning dropped = transport.refusalLines(RdmaChannelTransport.Refusal.TRANSPORT);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
            while (transport.unidentifiedConnections() < cap && refusals(dropped) == 0
                    && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            // Long enough for the transport's accept of the last ones to have run, and to have refused them.
            Thread.sleep(500);
            assertEquals(0, refusals(dropped), "connections the transport refused before their token, of " + cap
                    + " within rdma.handshake.max.in.progress and each address's share");
            assertEquals(cap, transport.unidentifiedConnections(), "places held");
            assertEquals(0, connects.stream().filter(ChannelFuture::isDone).count(), "connects that ended");
        } finally {
            for (ChannelFuture f : connects) {
                f.channel().close();
            }
            soft.faults().reset();
            group.shutdownGracefully(0, 1, TimeUnit.SECONDS).syncUninterruptibly();
        }
    }

    /**
     * Anyone who reaches the RDMA port can hold a handshake slot until the handshake timeout. One host used to be
     * able to hold them all, and every follower's probe was refused meanwhile, which left it on TCP for minutes.
     */
    @Test
    @Timeout(60)
    void shouldKeepHalfTheHandshakeSlotsForAddressesOtherThanOneHoldingItsShare() throws Exception {
        reopen(30_000, 4);
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(soft));
        List<Channel> flood = new ArrayList<>();
        try {
            Bootstrap b = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new Silent());
            for (int i = 0; i < 4; i++) {
                ChannelFuture f = b.connect(listener(), new InetSocketAddress("127.0.0.2", 0));
                assertTrue(f.await(10, TimeUnit.SECONDS), "connect " + i + " did not end");
                flood.add(f.channel());
            }
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (flood.stream().filter(Channel::isActive).count() > 2 && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            assertEquals(2, transport.unidentifiedConnections(), "slots held by 127.0.0.2, which presented no token");
            assertEquals(2, flood.stream().filter(Channel::isActive).count(),
                    "connections from 127.0.0.2 kept without a token, of 4 (rdma.handshake.max.in.progress=4)");
            assertEquals(1, transport.probe(listener()).get(10, TimeUnit.SECONDS),
                    "a probe from 127.0.0.1 is answered while 127.0.0.2 holds its share");
        } finally {
            for (Channel c : flood) {
                c.close().syncUninterruptibly();
            }
            group.shutdownGracefully(0, 1, TimeUnit.SECONDS).syncUninterruptibly();
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (transport.unidentifiedConnections() > 0 && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
        assertEquals(0, transport.unidentifiedConnections(), "slots given back once the connections closed");
    }

    /**
     * Anyone who reaches the RDMA port can make the leader's refusal lines. Each kind is limited on its own: a flood
     * of unknown tokens logs one line, not one per connection, and hides neither the first refusal over the cap nor
     * the first connection that presents no token.
     */
    @Test
    @Timeout(60)
    void shouldLimitTheRefusalLinesOfEachKindOnItsOwn() throws Exception {
        transport.close();
        transport = RdmaChannelTransport.open(soft, 1, "127.0.0.1", 0, 500, 64, 64, 2, 60_000);
        for (int i = 0; i < 10; i++) {
            assertRefused(transport.connect(listener(), 100 + i, 1));
        }
        RateLimitedWarning unknown = transport.refusalLines(RdmaChannelTransport.Refusal.UNKNOWN_TOKEN);
        assertEquals(1, unknown.emitted(), "lines for 10 unknown tokens within the interval");
        assertEquals(9, unknown.suppressed(), "unknown tokens counted for the next line");

        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(soft));
        List<Channel> silent = new ArrayList<>();
        try {
            Bootstrap b = new Bootstrap().group(group).channel(RdmaSocketChannel.class).handler(new Silent());
            // rdma.handshake.max.in.progress=2: one address holds one place, and its second connection is refused.
            for (int i = 0; i < 2; i++) {
                ChannelFuture f = b.connect(listener(), new InetSocketAddress("127.0.0.2", 0));
                assertTrue(f.await(10, TimeUnit.SECONDS), "connect " + i + " did not end");
                silent.add(f.channel());
            }
            RateLimitedWarning overCap = transport.refusalLines(RdmaChannelTransport.Refusal.OVER_CAP);
            RateLimitedWarning noToken = transport.refusalLines(RdmaChannelTransport.Refusal.NO_TOKEN);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while ((refusals(overCap) == 0 || refusals(noToken) == 0) && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            assertEquals(1, overCap.emitted(), "line for the connection over 127.0.0.2's share");
            assertEquals(1, noToken.emitted(), "line for the connection without a token past "
                    + "rdma.handshake.timeout.ms=500");
            assertEquals(0, overCap.suppressed() + noToken.suppressed(), "lines of those kinds left out");
            assertEquals(9, unknown.suppressed(), "unknown tokens counted for the next line, and nothing else");
            assertEquals(1, unknown.emitted());
        } finally {
            for (Channel c : silent) {
                c.close().syncUninterruptibly();
            }
            group.shutdownGracefully(0, 1, TimeUnit.SECONDS).syncUninterruptibly();
        }
    }

    /**
     * A connection the transport fails before its token (here its peer gave up its request before the accept; its
     * handshake memory spent is another cause) makes a line of its own kind, limited like the others: it used to be
     * logged only at DEBUG, so the leader's log said nothing of why a follower's probe was refused.
     */
    @Test
    @Timeout(60)
    void shouldLimitTheLinesOfConnectionsTheTransportFailsBeforeTheirToken() throws Exception {
        transport.close();
        transport = RdmaChannelTransport.open(soft, 1, "127.0.0.1", 0, 5000, 64, 64, 4, 60_000);
        soft.faults().abandonConnectRequests(2);
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(soft));
        List<ChannelFuture> connects = new ArrayList<>();
        try {
            Bootstrap b = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .option(ChannelOption.CONNECT_TIMEOUT_MILLIS, 2000).handler(new Silent());
            for (int i = 0; i < 2; i++) {
                connects.add(b.connect(listener()));
            }
            RateLimitedWarning dropped = transport.refusalLines(RdmaChannelTransport.Refusal.TRANSPORT);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (refusals(dropped) < 2 && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            assertEquals(1, dropped.emitted(), "lines for 2 connections the transport failed within the interval");
            assertEquals(1, dropped.suppressed(), "the second counted for the next line");
            assertEquals(0, transport.unidentifiedConnections(), "places given back");
        } finally {
            for (ChannelFuture f : connects) {
                f.channel().close();
            }
            soft.faults().reset();
            group.shutdownGracefully(0, 1, TimeUnit.SECONDS).syncUninterruptibly();
        }
    }

    /** The listener's handshake memory fits its cap, and respects a larger rdmabridge.handshakeMemoryBytes. */
    @Test
    void shouldGiveTheListenerTheHandshakeMemoryItsCapNeeds() {
        long defaultConnection = (64 + 8) * 64 * 1024L;
        assertEquals(16 * defaultConnection, RdmaChannelTransport.handshakeMemoryBytes(64, 16),
                "the default cap at the default depth: 72 MiB, above the transport's 64 MiB");
        assertEquals(64L << 20, RdmaChannelTransport.handshakeMemoryBytes(64, 4), "never below the property's default");
        String before = System.getProperty(RdmaIoHandler.HANDSHAKE_MEMORY_PROPERTY);
        System.setProperty(RdmaIoHandler.HANDSHAKE_MEMORY_PROPERTY, Long.toString(1L << 30));
        try {
            assertEquals(1L << 30, RdmaChannelTransport.handshakeMemoryBytes(64, 16), "the operator's larger value");
        } finally {
            if (before == null) {
                System.clearProperty(RdmaIoHandler.HANDSHAKE_MEMORY_PROPERTY);
            } else {
                System.setProperty(RdmaIoHandler.HANDSHAKE_MEMORY_PROPERTY, before);
            }
        }
    }

    /** Refusals a line limit has seen since its last line, that line included. */
    private static long refusals(RateLimitedWarning lines) {
        return lines.emitted() + lines.suppressed();
    }

    @Test
    @Timeout(60)
    void shouldFailAProbeWhereNoPluginListens() throws Exception {
        int port;
        try (ServerSocket unused = new ServerSocket(0, 1, InetAddress.getByName("127.0.0.1"))) {
            port = unused.getLocalPort();
        }
        ExecutionException e = assertThrows(ExecutionException.class,
                () -> transport.probe(new InetSocketAddress("127.0.0.1", port)).get(10, TimeUnit.SECONDS));
        assertNotNull(e.getCause(), "names why");
    }

    @Test
    @Timeout(60)
    void shouldFailAProbeAnsweredBySomethingElse() throws Exception {
        // A plain TCP service on the port: whatever the soft provider makes of it, it is no plugin's answer.
        try (ServerSocket other = new ServerSocket(0, 1, InetAddress.getByName("127.0.0.1"))) {
            CompletableFuture<Void> serve = CompletableFuture.runAsync(() -> {
                try (Socket s = other.accept()) {
                    s.getOutputStream().write(new byte[64]);
                    s.getInputStream().read(new byte[64]);
                } catch (IOException ignored) {
                    // The probe closed it.
                }
            });
            assertThrows(ExecutionException.class, () -> transport.probe(
                    new InetSocketAddress("127.0.0.1", other.getLocalPort())).get(10, TimeUnit.SECONDS));
            serve.get(10, TimeUnit.SECONDS);
        }
    }
}
