package io.rdmabridge.netty;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.EventLoop;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.rdmabridge.connection.FrameHeader;
import io.rdmabridge.connection.Handshake;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.RdmaProviders;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.soft.SoftProvider;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.junitpioneer.jupiter.SetSystemProperty;

import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.UnaryOperator;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Memory for rendezvous READs is granted from the event loop's budget, never taken because a peer advertised a size:
 * peers that each advertise 16 MiB get it one READ after another (the budget fits one), every byte still arrives
 * intact, and a READ the peer never answers fails its connection after the READ timeout and frees its share.
 * (Thirty advertisements of 16 MiB used to commit 480 MiB at once and exhaust direct memory.)
 */
@SetSystemProperty(key = RdmaIoHandler.RENDEZVOUS_BUDGET_PROPERTY, value = "" + RdmaRendezvousBudgetTest.BUDGET)
@SetSystemProperty(key = RdmaIoHandler.RENDEZVOUS_READ_TIMEOUT_PROPERTY, value = "1000")
class RdmaRendezvousBudgetTest {
    private static final int MESSAGE = 16 * 1024 * 1024;
    static final long BUDGET = 20L * 1024 * 1024;

    private final SoftProvider provider = (SoftProvider) RdmaProviders.byName("soft");
    private EventLoopGroup group;
    /** The children of the test's server, with their failures. */
    private final ChildRecorder recorder = new ChildRecorder();
    /** Each message the children of {@link #bindRecordingServer} hand up, copied. */
    private final LinkedBlockingQueue<byte[]> received = new LinkedBlockingQueue<>();

    @BeforeEach
    void setUp() {
        group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
    }

    @AfterEach
    void tearDown() throws Exception {
        provider.faults().reset();
        group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        assertTrue(provider.resourceUsage().isZero(), "leaked: " + provider.resourceUsage());
    }

    private RdmaIoHandler handlerOf(Channel ch) {
        return ((RdmaSocketChannel) ch).handler;
    }

    @Test
    void shouldReadAdvertisedMessagesWithinTheLoopsBudget() throws Exception {
        int peers = 4;
        Channel server = bindRecordingServer(null);
        List<RawVerbsPeer> raws = new ArrayList<>();
        try {
            // READ requests reach their target 300 ms late, so several would be in flight at once without a budget.
            provider.faults().delaySends(300_000_000L);
            List<byte[]> sent = new ArrayList<>();
            for (int p = 0; p < peers; p++) {
                RawVerbsPeer raw = connectRaw(server, 4);
                raws.add(raw);
                byte[] contents = new byte[MESSAGE];
                Arrays.fill(contents, (byte) p);
                contents[MESSAGE - 1] = (byte) (100 + p);
                sent.add(contents);
                MemoryRegion region = raw.exposeForRead(contents);
                assertEquals(WcStatus.SUCCESS, raw.sendRendezvous(region.address(), MESSAGE, region.rkey()));
            }
            RdmaIoHandler handler = handlerOf(recorder.children.poll(10, TimeUnit.SECONDS));
            long most = 0;
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (received.size() < peers && System.nanoTime() < deadline) {
                most = Math.max(most, handler.rendezvousCommitted());
                Thread.sleep(5);
            }
            assertEquals(peers, received.size(), "messages delivered");
            assertTrue(most <= BUDGET, "committed at once: " + most + " bytes (budget " + BUDGET + ")");
            assertTrue(most > 0, "the budget was never used");
            for (byte[] message : received) {
                assertArrayEquals(sent.get(message[0]), message, "message of peer " + message[0]);
            }
            assertEquals(0, handler.rendezvousCommitted(), "budget not returned");
        } finally {
            provider.faults().reset();
            raws.forEach(RawVerbsPeer::close);
            server.close().sync();
        }
    }

    /**
     * The budget counts the block a READ lands in: a pooled size class rounds a length just above a power of two up
     * to the next, so counting the advertised length let such lengths hold twice the budget.
     */
    @Test
    void shouldCountTheBlockAReadLandsInAgainstTheBudget() throws Exception {
        int length = 512 * 1024 + 1;
        Channel server = bindRecordingServer(null);
        RawVerbsPeer raw = connectRaw(server, 4);
        try {
            // The READ reaches its target 300 ms late, so the budget is held long enough to be seen.
            provider.faults().delaySends(300_000_000L);
            byte[] contents = new byte[length];
            new Random(7).nextBytes(contents);
            MemoryRegion region = raw.exposeForRead(contents);
            assertEquals(WcStatus.SUCCESS, raw.sendRendezvous(region.address(), length, region.rkey()));
            RdmaIoHandler handler = handlerOf(recorder.children.poll(10, TimeUnit.SECONDS));
            long held = 0;
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (held == 0 && received.isEmpty() && System.nanoTime() < deadline) {
                held = handler.rendezvousCommitted();
                Thread.sleep(1);
            }
            assertEquals(1024 * 1024, held, "budget held by a READ of " + length + " bytes");
            assertArrayEquals(contents, received.poll(10, TimeUnit.SECONDS), "message");
            assertEquals(0, handler.rendezvousCommitted(), "budget not returned");
        } finally {
            provider.faults().reset();
            raw.close();
            server.close().sync();
        }
    }

    /**
     * Also while other work keeps the loop from ever sleeping (a task that queues itself again, as busy channels
     * do): the timeout was looked at only before the loop slept, so under load a stalled READ held its budget for
     * as long as the load lasted.
     */
    @ParameterizedTest(name = "busy loop={0}")
    @ValueSource(booleans = {false, true})
    void shouldFailAConnectionWhoseReadIsNeverAnswered(boolean busy) throws Exception {
        AtomicBoolean spinning = new AtomicBoolean(busy);
        EventLoop loop = group.next();
        Runnable spin = new Runnable() {
            @Override
            public void run() {
                if (spinning.get()) {
                    loop.execute(this);
                }
            }
        };
        LinkedBlockingQueue<Throwable> failures = recorder.failures;
        Channel server = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                .childHandler(recorder)
                .bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();
        try (RawVerbsPeer raw = connectRaw(server, 4)) {
            MemoryRegion region = raw.exposeForRead(new byte[MESSAGE]);
            Channel child = acceptedChild();
            // Every work request now reaches its peer 3 s late: the advertisement, then the server's READ, which
            // outlives the 1 s READ timeout. To the server, a peer that stalls its answer.
            provider.faults().delaySends(3_000_000_000L);
            assertEquals(WcStatus.SUCCESS, raw.sendRendezvous(region.address(), MESSAGE, region.rkey()));
            loop.execute(spin);
            Throwable cause = failures.poll(15, TimeUnit.SECONDS);
            assertNotNull(cause, "the stalled READ did not fail its connection");
            assertTrue(cause.getMessage().contains("did not answer an RDMA READ of " + MESSAGE + " bytes"),
                    cause.getMessage());
            provider.faults().reset();
            assertTrue(child.closeFuture().await(15, TimeUnit.SECONDS), "the connection was not closed");
            assertEquals(0, handlerOf(child).rendezvousCommitted(), "the stalled READ kept its budget");
        } finally {
            spinning.set(false);
            provider.faults().reset();
            server.close().sync();
        }
    }

    @Test
    void shouldNotLetAStreamOfSmallerAdvertisementsStarveALargerOne() throws Exception {
        // With 20 MiB of budget, a peer with a queue of 8 MiB advertisements had its next READ granted the moment the
        // previous message was handed up, before a waiting 16 MiB advertisement of another peer (which fits only
        // when at most 4 MiB are in use) was looked at again: that one waited until the queue ran dry. Now it waits
        // its turn only.
        int streamed = 12;
        int small = 8 * 1024 * 1024;
        Map<Channel, Long> bytes = new ConcurrentHashMap<>();
        Map<Channel, Byte> sender = new ConcurrentHashMap<>();
        List<String> finished = new CopyOnWriteArrayList<>();
        Channel server = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                .childHandler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public void channelRead(ChannelHandlerContext ctx, Object msg) {
                        ByteBuf buf = (ByteBuf) msg;
                        byte kind = sender.computeIfAbsent(ctx.channel(), ch -> buf.getByte(buf.readerIndex()));
                        long total = bytes.merge(ctx.channel(), (long) buf.readableBytes(), Long::sum);
                        buf.release();
                        if (kind == 1 && total == MESSAGE) {
                            finished.add("large");
                        } else if (kind == 0 && total == (long) streamed * small) {
                            finished.add("stream");
                        }
                    }

                    @Override
                    public boolean isSharable() {
                        return true;
                    }
                })
                .bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();
        try (RawVerbsPeer stream = connectRaw(server, 4);
             RawVerbsPeer large = connectRaw(server, 4)) {
            MemoryRegion smallRegion = stream.exposeForRead(new byte[small]);
            byte[] ones = new byte[MESSAGE];
            Arrays.fill(ones, (byte) 1);
            MemoryRegion largeRegion = large.exposeForRead(ones);
            for (int i = 0; i < streamed; i++) {
                assertEquals(WcStatus.SUCCESS, stream.sendRendezvous(smallRegion.address(), small,
                        smallRegion.rkey()));
            }
            assertEquals(WcStatus.SUCCESS, large.sendRendezvous(largeRegion.address(), MESSAGE, largeRegion.rkey()));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (finished.size() < 2) {
                assertTrue(System.nanoTime() < deadline, "finished: " + finished);
                Thread.sleep(1);
            }
            assertEquals(List.of("large", "stream"), finished, "which peer's messages were all read first");
        } finally {
            server.close().sync();
        }
    }

    /**
     * A READ that has landed waits for the application to read the message, which with {@code autoRead} off is the
     * application's to pace: the channel used to fail once the READ timeout passed, blaming the peer for a READ it
     * had answered. Meanwhile the message holds no share of the budget (see the next test).
     */
    @Test
    void shouldNotFailALandedRendezvousLeftUnreadPastTheReadTimeout() throws Exception {
        Channel server = bindRecordingServer(null);
        try (RawVerbsPeer raw = connectRaw(server, 4)) {
            Channel child = acceptedChild();
            byte[] contents = new byte[MESSAGE];
            new Random(7).nextBytes(contents);
            landUnread(raw, child, contents);
            RdmaIoHandler handler = handlerOf(child);
            // Two and a half READ timeouts with the landed message unread.
            Throwable failure = recorder.failures.poll(2500, TimeUnit.MILLISECONDS);
            assertNull(failure, () -> "failed: " + failure);
            assertTrue(child.isActive(), "the channel was closed");
            assertTrue(received.isEmpty(), "handed up with autoRead off");
            assertEquals(0, handler.rendezvousCommitted(), "the unread message kept its share of the budget");
            assertEquals(MESSAGE, handler.rendezvousParked(), "the unread message, parked");
            child.config().setAutoRead(true);
            assertArrayEquals(contents, received.poll(10, TimeUnit.SECONDS), "the message once read");
            assertEquals(0, handler.rendezvousCommitted(), "budget not returned");
            assertEquals(0, handler.rendezvousParked(), "parked allowance not returned");
            assertTrue(recorder.failures.isEmpty(), () -> "failed: " + recorder.failures);
        } finally {
            provider.faults().reset();
            server.close().sync();
        }
    }

    /**
     * A message that landed while its application does not read gives its share of the budget back, so that other
     * connections' rendezvous go on. It used to hold its share until read: with Kafka, which stops reading a
     * connection whose response the peer does not take, a peer that never authenticated could hold the whole budget
     * of the loop with one message per connection, and the broker's own replication on that loop waited.
     */
    @Test
    void shouldNotLetAnUnreadLandedMessageStallAnotherConnectionsRendezvous() throws Exception {
        Channel server = bindRecordingServer(null);
        try (RawVerbsPeer paused = connectRaw(server, 4)) {
            Channel pausedChild = acceptedChild();
            byte[] unread = filled((byte) 1);
            landUnread(paused, pausedChild, unread);
            RdmaIoHandler handler = handlerOf(pausedChild);
            try (RawVerbsPeer other = connectRaw(server, 4)) {
                acceptedChild();
                // Both messages together exceed the budget (BUDGET).
                byte[] contents = advertiseRandom(other, 9);
                byte[] first = received.poll(10, TimeUnit.SECONDS);
                assertNotNull(first, "the other connection's message waited for the unread one");
                assertArrayEquals(contents, first, "the other connection's message");
                assertTrue(received.isEmpty(), "handed up with autoRead off");
                pausedChild.config().setAutoRead(true);
                assertArrayEquals(unread, received.poll(10, TimeUnit.SECONDS), "the unread message once read");
                assertEquals(0, handler.rendezvousCommitted(), "budget not returned");
                assertEquals(0, handler.rendezvousParked(), "parked allowance not returned");
                assertTrue(recorder.failures.isEmpty(), () -> "failed: " + recorder.failures);
            }
        } finally {
            provider.faults().reset();
            server.close().sync();
        }
    }

    /**
     * Messages parked for applications that do not read are bounded too: past the loop's parked allowance, an unread
     * message keeps its share of the budget, as before there was an allowance, so that a loop commits at most budget
     * plus allowance whatever its applications do.
     */
    @Test
    @SetSystemProperty(key = RdmaIoHandler.RENDEZVOUS_PARKED_PROPERTY, value = "" + (MESSAGE - 1))
    void shouldKeepTheBudgetOfAnUnreadMessageThatTheParkedAllowanceCannotHold() throws Exception {
        Channel server = bindRecordingServer(null);
        try (RawVerbsPeer raw = connectRaw(server, 4)) {
            Channel child = acceptedChild();
            byte[] contents = new byte[MESSAGE];
            new Random(10).nextBytes(contents);
            landUnread(raw, child, contents);
            RdmaIoHandler handler = handlerOf(child);
            assertEquals(MESSAGE, handler.rendezvousCommitted(), "the unread message's share of the budget");
            assertEquals(0, handler.rendezvousParked(), "parked beyond the allowance");
            child.config().setAutoRead(true);
            assertArrayEquals(contents, received.poll(10, TimeUnit.SECONDS), "the message once read");
            assertEquals(0, handler.rendezvousCommitted(), "budget not returned");
            assertTrue(recorder.failures.isEmpty(), () -> "failed: " + recorder.failures);
        } finally {
            provider.faults().reset();
            server.close().sync();
        }
    }

    /**
     * Past the parked allowance an unread message keeps its share of the budget, but not for ever while another
     * connection waits for it: once the message has gone unread for the READ timeout, its channel fails, naming the
     * allowance, and the other's message goes on. It used to wait until the application read, which a peer can
     * postpone without end on an application that pauses (12 such connections filled allowance and budget).
     */
    @Test
    @SetSystemProperty(key = RdmaIoHandler.RENDEZVOUS_PARKED_PROPERTY, value = "" + (MESSAGE - 1))
    void shouldFailAnUnreadMessageBeyondTheAllowanceThatOthersWaitForPastTheReadTimeout() throws Exception {
        Channel server = bindRecordingServer(null);
        try (RawVerbsPeer paused = connectRaw(server, 4)) {
            Channel pausedChild = acceptedChild();
            byte[] unread = filled((byte) 2);
            landUnread(paused, pausedChild, unread);
            RdmaIoHandler handler = handlerOf(pausedChild);
            assertEquals(MESSAGE, handler.rendezvousCommitted(), "the unread message's share of the budget");
            try (RawVerbsPeer other = connectRaw(server, 4)) {
                acceptedChild();
                // Both messages together exceed the budget (BUDGET): the other's waits.
                byte[] contents = advertiseRandom(other, 11);
                Throwable failure = recorder.failures.poll(10, TimeUnit.SECONDS);
                assertNotNull(failure, "the unread message held its share past the READ timeout while another waited");
                assertTrue(failure.getMessage().contains("did not read a landed message of " + MESSAGE + " bytes "
                        + "within 1000 ms") && failure.getMessage().contains(RdmaIoHandler.RENDEZVOUS_PARKED_PROPERTY),
                        failure::toString);
                assertArrayEquals(contents, received.poll(10, TimeUnit.SECONDS), "the other connection's message");
                assertTrue(received.isEmpty(), "the unread message was handed up");
                assertTrue(pausedChild.closeFuture().await(10, TimeUnit.SECONDS), "the paused channel stays open");
                assertEquals(0, handler.rendezvousCommitted(), "budget not returned");
            }
        } finally {
            provider.faults().reset();
            server.close().sync();
        }
    }

    /** A message of {@link #MESSAGE} bytes, each {@code value}. */
    private static byte[] filled(byte value) {
        byte[] b = new byte[MESSAGE];
        Arrays.fill(b, value);
        return b;
    }

    /** Has {@code raw} advertise {@link #MESSAGE} random bytes (from {@code seed}); returns them. */
    private static byte[] advertiseRandom(RawVerbsPeer raw, long seed) throws Exception {
        byte[] contents = new byte[MESSAGE];
        new Random(seed).nextBytes(contents);
        MemoryRegion region = raw.exposeForRead(contents);
        assertEquals(WcStatus.SUCCESS, raw.sendRendezvous(region.address(), MESSAGE, region.rkey()));
        return contents;
    }

    /**
     * Has {@code raw} advertise {@code contents} to {@code child} and lets the child's READ land after its
     * application stopped reading: the READ reaches the peer 600 ms late, time to turn {@code autoRead} off while it
     * is posted.
     */
    private void landUnread(RawVerbsPeer raw, Channel child, byte[] contents) throws Exception {
        MemoryRegion region = raw.exposeForRead(contents);
        provider.faults().delaySends(600_000_000L);
        assertEquals(WcStatus.SUCCESS, raw.sendRendezvous(region.address(), contents.length, region.rkey()));
        RdmaIoHandler handler = handlerOf(child);
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (handler.rendezvousCommitted() == 0) {
            assertTrue(System.nanoTime() < deadline, "the READ was never posted");
            Thread.sleep(1);
        }
        child.config().setAutoRead(false);
        provider.faults().reset();
        RdmaChannelInbound inbound = ((RdmaSocketChannel) child).inbound;
        assertTrue(child.eventLoop().submit(inbound::isReadOutstanding).get(), "the READ landed too early");
        deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (child.eventLoop().submit(inbound::isReadOutstanding).get()) {
            assertTrue(System.nanoTime() < deadline, "the READ never landed");
            Thread.sleep(5);
        }
    }

    /**
     * A rendezvous that arrives while the send queue is full waits for room without taking budget or memory. Here
     * the peer posts no more receives, so the server's SENDs wait for the peer's RNR timer and fill its queue of 8.
     * Budget and buffer used to be taken at once, and the channel failed after the READ timeout, blaming the peer
     * for a READ that was not even posted.
     */
    @Test
    void shouldHoldNoBudgetWhileARendezvousWaitsForSendQueueRoom() throws Exception {
        Channel server = bindRecordingServer(b -> b
                .childOption(RdmaChannelOption.SEND_QUEUE_DEPTH, 8)
                // A credit return is due after each message read, so a CREDIT frame takes the queue's last place.
                .childOption(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, 4));
        // 16 data credits, but 8 receives posted: the server's HELLO and 7 DATA frames land, later SENDs wait.
        try (RawVerbsPeer raw = connectRaw(server, 16)) {
            RdmaSocketChannel child = acceptedChild();
            // One message at a time, each posted before the next is written, so each is a frame of its own (messages
            // that wait for room together go in one frame): 7 land, 7 wait.
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            for (int i = 0; i < 14; i++) {
                child.writeAndFlush(Unpooled.wrappedBuffer(new byte[] {(byte) i}));
                while (child.metrics().inlineBytes() + child.metrics().eagerBytes() <= i) {
                    assertTrue(System.nanoTime() < deadline, "message " + i + " was not posted");
                    Thread.sleep(1);
                }
            }
            for (int i = 0; i < 8; i++) {
                raw.receivedFrame();
            }
            assertEquals(WcStatus.SUCCESS, raw.sendFrame(FrameHeader.DATA, new byte[] {42}));
            assertArrayEquals(new byte[] {42}, received.poll(10, TimeUnit.SECONDS));
            byte[] contents = advertiseRandom(raw, 8);
            RdmaChannelInbound inbound = child.inbound;
            deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
            while (!child.eventLoop().submit(inbound::isReadAwaitingSendQueue).get()) {
                assertTrue(System.nanoTime() < deadline, "the READ did not wait for send-queue room");
                Thread.sleep(1);
            }
            assertEquals(0, handlerOf(child).rendezvousCommitted(), "budget taken for a READ not posted");
            // Past the READ timeout, within the RNR timer's retries (about 4 s).
            Throwable failure = recorder.failures.poll(1500, TimeUnit.MILLISECONDS);
            assertNull(failure, () -> "failed: " + failure);
            raw.postReceives();
            assertArrayEquals(contents, received.poll(10, TimeUnit.SECONDS), "the message once the queue drained");
            assertEquals(0, handlerOf(child).rendezvousCommitted(), "budget not returned");
            assertTrue(child.isActive(), "the channel was closed");
            assertTrue(recorder.failures.isEmpty(), () -> "failed: " + recorder.failures);
        } finally {
            server.close().sync();
        }
    }

    /**
     * A raw peer connected to {@code server} that has sent its HELLO: receive buffers of 4 KiB, {@code dataCredits}
     * data credits, messages of up to {@link #MESSAGE} bytes.
     */
    private RawVerbsPeer connectRaw(Channel server, int dataCredits) throws Exception {
        return RawVerbsPeer.connectWithHello(provider, server, new Handshake(4096, dataCredits, 4, MESSAGE));
    }

    /** The next child of the test's server to become active, which must within 10 s. */
    private RdmaSocketChannel acceptedChild() throws InterruptedException {
        Channel child = recorder.children.poll(10, TimeUnit.SECONDS);
        assertNotNull(child);
        return (RdmaSocketChannel) child;
    }

    /**
     * A server whose children are recorded in {@link #recorder} and hand each message up, copied, to
     * {@link #received}.
     */
    private Channel bindRecordingServer(UnaryOperator<ServerBootstrap> options) throws InterruptedException {
        ServerBootstrap b = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                .childHandler(new ChannelInitializer<Channel>() {
                    @Override
                    protected void initChannel(Channel ch) {
                        ch.pipeline().addLast(recorder, new ChannelInboundHandlerAdapter() {
                            @Override
                            public void channelRead(ChannelHandlerContext ctx, Object msg) {
                                ByteBuf buf = (ByteBuf) msg;
                                byte[] bytes = new byte[buf.readableBytes()];
                                buf.readBytes(bytes);
                                buf.release();
                                received.add(bytes);
                            }
                        });
                    }
                });
        if (options != null) {
            b = options.apply(b);
        }
        return b.bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();
    }
}
