package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.RdmaProviders;
import io.rdmabridge.verbs.soft.SoftProvider;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.lang.management.ManagementFactory;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.FileChannel;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.channels.spi.SelectorProvider;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import javax.management.ObjectName;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The channel under a JDK {@link Selector}, as Kafka drives it: a leader that echoes every byte back (and answers the
 * byte {@code 'F'} with a file sent by {@code FileChannel.transferTo}), a follower opened on a thread named like
 * Kafka's replica fetcher. Proves that readiness reaches the selector through the TCP socket it polls and, for the
 * stream, through {@link SelectorWakeups}, and that no byte is lost or reordered by the switch.
 */
class ReplicationSocketChannelTest {
    private static final int PAYLOAD = 3 * 1024 * 1024 + 17;

    @TempDir
    Path dir;

    /** When set, {@link #exchange} holds back send completions on it while the two sides close. */
    private SoftProvider holdCloses;

    @AfterEach
    void reset() {
        RdmaReplication.get().pluginClosed();
    }

    private RdmaSelectorProvider configure(int port, RdmaStreamTransport transport) {
        int offset = transport.isAvailable() ? transport.listenPort() - port : 1000;
        RdmaReplication r = RdmaReplication.get();
        r.agentInstalled();
        r.configure(Map.of("rdma.replication.enable", "true", "node.id", "1", "listeners",
                "REPLICATION://127.0.0.1:" + port, "inter.broker.listener.name", "REPLICATION",
                "rdma.handshake.timeout.ms", "2000", "rdma.port.offset", Integer.toString(offset)),
                transport);
        return new RdmaSelectorProvider(SelectorProvider.provider());
    }

    @Test
    void shouldLeaveABrokerWithThePluginOffAsStockKafkaWhateverItsOtherKeysSay() {
        RdmaReplication r = RdmaReplication.get();
        r.agentInstalled();
        // Its RDMA port would be 65000 + 1000: out of range, which fails the broker's start only with the flag on.
        Map<String, String> props = Map.of("node.id", "1", "listeners", "REPLICATION://127.0.0.1:65000",
                "inter.broker.listener.name", "REPLICATION");
        String status = r.configure(props);
        assertTrue(status.startsWith("RDMA replication inactive: rdma.replication.enable is not true"), status);
        assertFalse(r.transport().isAvailable(), "no transport opened");
        r.pluginClosed();
        Map<String, String> on = new HashMap<>(props);
        on.put("rdma.replication.enable", "true");
        assertThrows(IllegalArgumentException.class, () -> r.configure(on), "the same keys with the flag on");
    }

    @Test
    void shouldCarryKafkasBytesOverTheStreamAfterTheUpgrade() throws Exception {
        ReplicationMetrics.Peer peer = exchange(new InMemoryStreamTransport(), true);
        assertEquals(PAYLOAD + fileBytes().length, peer.rdmaReceived.sum(), "follower-side bytes counted as RDMA");
        assertEquals(0, peer.tcpReceived.sum());
        assertEquals(1, RdmaReplication.get().metrics().succeeded() / 2, "both sides count one upgrade");
    }

    /**
     * Anyone who reaches the inter-broker listener can upgrade connections, with a broker id of its choosing: the
     * leader's line for each upgrade, at INFO, was one line per connection a peer opened, with no limit. It is at
     * DEBUG, counted by upgrades-succeeded-total; the follower, which chose to connect, still says so at INFO.
     */
    @Test
    void shouldLogNoLeaderSideLineAtInfoPerUpgrade() throws Exception {
        PrintStream err = System.err;
        ByteArrayOutputStream captured = new ByteArrayOutputStream();
        // slf4j-simple writes to System.err as it is at each line.
        System.setErr(new PrintStream(captured, true, StandardCharsets.UTF_8));
        try {
            exchange(new InMemoryStreamTransport(), true);
        } finally {
            System.setErr(err);
        }
        String log = captured.toString(StandardCharsets.UTF_8);
        err.print(log);
        assertEquals(2, RdmaReplication.get().metrics().succeeded(), "both sides count the upgrade");
        assertTrue(log.contains("INFO io.rdmabridge.kafka.ReplicationSocketChannel - Replication connection to "
                + "leader 2 at "), "the follower's line; log:\n" + log);
        assertFalse(log.contains("Replication connection from broker"), "a leader-side line per upgrade; log:\n" + log);
    }

    @Test
    void shouldCarryKafkasBytesOverTheRdmaChannelWithOneCopyEachSide() throws Exception {
        SoftProvider soft = (SoftProvider) RdmaProviders.byName("soft");
        RdmaChannelTransport transport = RdmaChannelTransport.open(soft, 2, "127.0.0.1", 0, 2000, 64, 64, 16);
        holdCloses = soft;
        ReplicationMetrics.Peer follower = exchange(transport, true);
        ReplicationMetrics.Peer leader = RdmaReplication.get().metrics().peer("1");
        long total = PAYLOAD + fileBytes().length;
        assertEquals(total, follower.rdmaReceived.sum(), "follower-side bytes counted as RDMA");
        assertEquals(0, follower.tcpReceived.sum());
        // The leader echoed the payload and sent the file from a mapped segment (transferTo): one copy per byte into
        // registered memory, and the follower one copy per byte out of the receive buffers, none by the channel.
        assertEquals(total, leader.rdmaSent.sum(), "leader-side bytes counted as RDMA");
        assertEquals(total, leader.copiedSent.sum(), "leader: exactly one CPU copy per replicated byte");
        assertEquals(total, follower.copiedReceived.sum(), "follower: exactly one CPU copy per replicated byte");
        RdmaReplication.get().pluginClosed();
        assertTrue(soft.resourceUsage().isZero(), "leaked: " + soft.resourceUsage());
    }

    @Test
    void shouldStayOnTcpWithNoByteLostWhenRdmaIsUnavailable() throws Exception {
        ReplicationMetrics.Peer peer = exchange(RdmaStreamTransport.unavailable(2, "test: provider forced off"), false);
        assertEquals(PAYLOAD + fileBytes().length, peer.tcpReceived.sum(), "follower-side bytes counted as TCP");
        assertEquals(0, peer.rdmaReceived.sum());
        assertEquals(0, RdmaReplication.get().metrics().succeeded());
    }

    @Test
    void shouldStayOnTcpWhenTheFollowersStreamCannotConnect() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        transport.connectFailure = new IOException("test: RDMA connect refused");
        ReplicationMetrics.Peer peer = exchange(transport, false);
        assertEquals(PAYLOAD + fileBytes().length, peer.tcpReceived.sum());
        assertEquals(2, RdmaReplication.get().metrics().fellBack(), "follower and leader count the fallback");
    }

    /**
     * A sniffer of the clear-text REPLY presents its token on the leader's RDMA port before the follower does. The
     * follower's stream is refused, so it decides on TCP and the leader closes the sniffer's stream: replication goes
     * on over TCP, where it used to go to a closed stream at every reconnect.
     */
    @Test
    void shouldStayOnTcpWhenAnotherConnectionPresentedTheTokenFirst() throws Exception {
        SoftProvider soft = (SoftProvider) RdmaProviders.byName("soft");
        RdmaChannelTransport real = RdmaChannelTransport.open(soft, 2, "127.0.0.1", 0, 2000, 64, 64, 16);
        List<RdmaStream> sniffers = new ArrayList<>();
        RdmaStreamTransport sniffed = new RdmaStreamTransport() {
            @Override
            public boolean isAvailable() {
                return real.isAvailable();
            }

            @Override
            public String unavailabilityCause() {
                return real.unavailabilityCause();
            }

            @Override
            public int listenPort() {
                return real.listenPort();
            }

            @Override
            public int brokerId() {
                return real.brokerId();
            }

            @Override
            public CompletableFuture<RdmaStream> expect(long token) {
                return real.expect(token);
            }

            @Override
            public CompletableFuture<Integer> probe(InetSocketAddress leaderRdma) {
                return real.probe(leaderRdma);
            }

            @Override
            public CompletableFuture<RdmaStream> connect(InetSocketAddress leader, long token, int leaderBrokerId) {
                sniffers.add(real.connect(leader, token, leaderBrokerId).join());
                return real.connect(leader, token, leaderBrokerId);
            }

            @Override
            public String providerName() {
                return real.providerName();
            }

            @Override
            public void close() {
                real.close();
            }
        };
        ReplicationMetrics.Peer peer = exchange(sniffed, false);
        assertEquals(PAYLOAD + fileBytes().length, peer.tcpReceived.sum(), "follower-side bytes counted as TCP");
        assertEquals(1, sniffers.size(), "one upgrade attempted");
        assertEquals(2, RdmaReplication.get().metrics().fellBack(), "follower and leader count the fallback");
        sniffers.get(0).close();
        RdmaReplication.get().pluginClosed();
        assertTrue(soft.resourceUsage().isZero(), "leaked: " + soft.resourceUsage());
    }

    /**
     * rdma.handshake.timeout.ms bounds the whole upgrade, as the docs say: the probe, the preamble and the RDMA connect
     * share one deadline. Each used to have a timeout of its own, so the fetcher thread could wait several times it.
     */
    @Test
    void shouldBoundTheWholeUpgradeByOneHandshakeTimeout() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        transport.probeDelayMillis = 1500;
        // A leader whose plugin answers the probe late, then takes the HELLO and never replies.
        try (ServerSocketChannel silent = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0))) {
            int port = ((InetSocketAddress) silent.getLocalAddress()).getPort();
            RdmaSelectorProvider provider = configure(port, transport);
            SocketChannel follower = onFetcherThread(provider::openSocketChannel);
            long start = System.nanoTime();
            assertTrue(onFetcherThread(() -> follower.connect(new InetSocketAddress("127.0.0.1", port))));
            long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
            assertFalse(((ReplicationSocketChannel) follower).isRdma());
            // 2000 ms of handshake timeout; with a timeout per step it took 1500 + 2000 ms.
            assertTrue(ms >= 1900 && ms < 3000, "connect() blocked the fetcher thread " + ms + " ms");
            follower.close();
        }
    }

    @Test
    void shouldNotTakeALeaderForOneWithoutThePluginWhenItsOwnPluginClosedDuringTheProbe() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        // The probe fails because this broker's plugin closed meanwhile (its transport with it): the leader said nothing.
        transport.probeFailure = new IOException("test: closed");
        transport.onProbe = () -> RdmaReplication.get().pluginClosed();
        try (ServerSocketChannel leader = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0))) {
            int port = ((InetSocketAddress) leader.getLocalAddress()).getPort();
            InetSocketAddress address = new InetSocketAddress("127.0.0.1", port);
            RdmaSelectorProvider provider = configure(port, transport);
            SocketChannel follower = onFetcherThread(provider::openSocketChannel);
            assertTrue(onFetcherThread(() -> follower.connect(address)));
            assertFalse(((ReplicationSocketChannel) follower).isRdma());
            follower.close();
            // Configured again (a reporter added back): the leader is tried over RDMA at once, not in 5 minutes.
            configure(port, new InMemoryStreamTransport());
            assertEquals(null, RdmaReplication.get().followerSkipReason(address));
        }
    }

    /**
     * A leader's plugin that holds as many handshakes as it allows closes a probe before answering. That used to
     * count as a leader without the plugin, so brokers reconnecting together (or anyone holding the leader's
     * handshake slots) left followers on TCP for five minutes.
     */
    @Test
    void shouldAskAgainALeaderWhosePluginRefusedAProbeAndUpgrade() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        transport.probeRefusals = 3;
        ReplicationMetrics.Peer peer = exchange(transport, true);
        assertEquals(4, transport.probes, "three refused probes, then the one answered");
        assertEquals(PAYLOAD + fileBytes().length, peer.rdmaReceived.sum(), "follower-side bytes counted as RDMA");
        assertEquals(0, peer.tcpReceived.sum());
    }

    /**
     * On a NIC a leader's plugin that refuses a connection and a port where nothing listens look the same (REJECTED),
     * so brokers starting together ask a leader never heard from a few times before taking it for a stock broker.
     */
    @Test
    void shouldAskALeaderNeverHeardFromAgainAfterARejectedProbe() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        transport.probeRefusals = ReplicationSocketChannel.UNKNOWN_LEADER_PROBE_RETRIES;
        transport.probeRefusal = new IOException("test: connection refused");
        ReplicationMetrics.Peer peer = exchange(transport, true);
        assertEquals(1 + ReplicationSocketChannel.UNKNOWN_LEADER_PROBE_RETRIES, transport.probes);
        assertEquals(0, peer.tcpReceived.sum());
    }

    @Test
    void shouldLeaveALeaderThatRefusedEveryProbeOnTcpForLessThanOneWithoutThePlugin() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        transport.probeRefusals = Integer.MAX_VALUE;
        try (ServerSocketChannel leader = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0))) {
            int port = ((InetSocketAddress) leader.getLocalAddress()).getPort();
            InetSocketAddress address = new InetSocketAddress("127.0.0.1", port);
            RdmaSelectorProvider provider = configure(port, transport);
            SocketChannel follower = onFetcherThread(provider::openSocketChannel);
            long start = System.nanoTime();
            assertTrue(onFetcherThread(() -> follower.connect(address)));
            long tookMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
            long now = System.currentTimeMillis();
            assertFalse(((ReplicationSocketChannel) follower).isRdma());
            assertTrue(tookMs < ReplicationSocketChannel.BUSY_RETRY_MS + 500, "the probes went on past "
                    + ReplicationSocketChannel.BUSY_RETRY_MS + " ms: " + tookMs + " ms");
            assertTrue(transport.probes >= 5, "asked again for a while: " + transport.probes + " probes");
            assertEquals(0, RdmaReplication.get().metrics().attempted(), "no preamble without an answered probe");
            Long retryAt = RdmaReplication.get().plainPeerRetryAt(address);
            assertTrue(retryAt != null && retryAt <= now + RdmaReplication.REFUSED_PEER_RETRY_MS,
                    "tried again over RDMA at " + retryAt + ", " + (retryAt == null ? "never" : retryAt - now
                    + " ms from now") + " (a leader without the plugin waits "
                    + RdmaReplication.PLAIN_PEER_RETRY_MS + " ms)");
            follower.close();
        }
    }

    /**
     * A leader whose plugin has answered before is taken for a busy one when its port rejects the probe, and is
     * asked again for a while; once that fails it counts as never heard from, so that a plugin turned off costs
     * one connection those retries and not every one.
     */
    @Test
    void shouldAskALeaderThatAnsweredBeforeUntilTheDeadlineThenForgetItsAnswer() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        transport.probeRefusals = Integer.MAX_VALUE;
        transport.probeRefusal = new IOException("test: connection refused");
        try (ServerSocketChannel leader = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0))) {
            int port = ((InetSocketAddress) leader.getLocalAddress()).getPort();
            InetSocketAddress address = new InetSocketAddress("127.0.0.1", port);
            RdmaSelectorProvider provider = configure(port, transport);
            RdmaReplication.get().answered(address);
            SocketChannel follower = onFetcherThread(provider::openSocketChannel);
            assertTrue(onFetcherThread(() -> follower.connect(address)));
            long now = System.currentTimeMillis();
            assertFalse(((ReplicationSocketChannel) follower).isRdma());
            assertTrue(transport.probes > 1 + ReplicationSocketChannel.UNKNOWN_LEADER_PROBE_RETRIES,
                    "asked again for a while: " + transport.probes + " probes");
            assertTrue(RdmaReplication.get().plainPeerRetryAt(address) <= now + RdmaReplication.REFUSED_PEER_RETRY_MS,
                    "left on TCP as a busy leader, not as one without the plugin");
            assertFalse(RdmaReplication.get().answeredBefore(address), "its earlier answer still counts");
            follower.close();
        }
    }

    /**
     * A leader that holds as many handshakes as it allows declines the upgrade as busy, and the declined socket stays on
     * TCP for its lifetime. The follower asks again on a fresh socket until the deadline, so a burst of handshakes
     * (brokers reconnecting together) leaves no connection on TCP for good.
     */
    @Test
    void shouldAskAgainOnAFreshSocketWhenTheLeaderDeclinesAsBusy() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        transport.onProbe = () -> {
            SourceAdmission admission = RdmaReplication.get().handshakeAdmission();
            List<InetAddress> held = holdEveryHandshakePlace();
            CompletableFuture.delayedExecutor(150, TimeUnit.MILLISECONDS).execute(() -> held.forEach(
                    admission::release));
        };
        ReplicationMetrics.Peer peer = exchange(transport, true);
        assertEquals(PAYLOAD + fileBytes().length, peer.rdmaReceived.sum(), "follower-side bytes counted as RDMA");
        assertEquals(0, peer.tcpReceived.sum());
        assertTrue(RdmaReplication.get().metrics().fellBack() >= 1, "the leader declined it first");
    }

    @Test
    void shouldStayOnTcpWithNoByteLostWhenTheLeaderIsBusyUntilTheDeadline() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        transport.onProbe = this::holdEveryHandshakePlace;
        ReplicationMetrics.Peer peer = exchange(transport, false);
        assertEquals(PAYLOAD + fileBytes().length, peer.tcpReceived.sum(), "follower-side bytes counted as TCP");
        assertEquals(0, peer.rdmaReceived.sum());
        // The follower's one fall-back, and the leader's declines: more than one, since it asked again.
        assertTrue(RdmaReplication.get().metrics().fellBack() > 2, "declines and fall-backs: "
                + RdmaReplication.get().metrics().fellBack());
    }

    /**
     * A leader that declined as busy and then drops the socket the follower asks again on has a plugin: it answered
     * the probe and the first preamble. The follower redials for Kafka's bytes, and does not leave that leader on TCP
     * for minutes as one without the plugin.
     */
    @Test
    void shouldRedialWithoutRememberingALeaderThatDroppedTheSocketAskedAgainAfterItDeclinedAsBusy() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        try (ServerSocketChannel fake = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0))) {
            int port = ((InetSocketAddress) fake.getLocalAddress()).getPort();
            InetSocketAddress leader = new InetSocketAddress("127.0.0.1", port);
            RdmaSelectorProvider provider = configure(port, transport);
            byte[] kafka = {0, 0, 0, 10, 0, 18, 0, 3, 0, 0, 0, 1, 0, 0};
            CompletableFuture<byte[]> third = CompletableFuture.supplyAsync(() -> {
                try (SocketChannel busy = fake.accept()) {
                    readFully(busy, ByteBuffer.allocate(Preamble.HELLO_LENGTH));
                    ByteBuffer decline = Preamble.reply(Preamble.STATUS_DECLINE_BUSY, 0, 2, 0);
                    while (decline.hasRemaining()) {
                        busy.write(decline);
                    }
                    try (SocketChannel askedAgain = fake.accept()) {
                        readFully(askedAgain, ByteBuffer.allocate(Preamble.HELLO_LENGTH));
                    }
                    try (SocketChannel plain = fake.accept()) {
                        ByteBuffer got = ByteBuffer.allocate(kafka.length);
                        readFully(plain, got);
                        return got.array();
                    }
                } catch (Exception e) {
                    throw new AssertionError(e);
                }
            });
            SocketChannel follower = onFetcherThread(provider::openSocketChannel);
            assertTrue(onFetcherThread(() -> follower.connect(leader)));
            follower.write(ByteBuffer.wrap(kafka));
            assertArrayEquals(kafka, third.get(10, TimeUnit.SECONDS), "Kafka's bytes went on a fresh plain socket");
            assertFalse(((ReplicationSocketChannel) follower).isRdma());
            assertNull(RdmaReplication.get().plainPeerRetryAt(leader),
                    "a leader that answered is not left on TCP as one without the plugin");
            assertEquals(1, transport.probes, "probed once");
            follower.close();
        }
    }

    /**
     * Another thread closes the follower while its upgrade waits for the RDMA connect. The decision the follower then
     * cannot send says nothing of the leader: the connect fails as closed, the leader is not remembered as one without
     * the plugin, no socket is dialled again for a closed channel, and the stream that connected is closed. Before,
     * the follower took the failed write for a leader that dropped the preamble, and kept that leader on TCP for
     * minutes.
     */
    @Test
    void shouldReleaseWhatTheUpgradeMadeWhenAnotherThreadClosesTheChannelMeanwhile() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        InMemoryStreamTransport.Pipe toLeader = new InMemoryStreamTransport.Pipe();
        InMemoryStreamTransport.Pipe toFollower = new InMemoryStreamTransport.Pipe();
        RdmaStream followerStream = new InMemoryStreamTransport.Stream(toLeader, toFollower);
        RdmaStream leaderStream = new InMemoryStreamTransport.Stream(toFollower, toLeader);
        AtomicReference<SocketChannel> follower = new AtomicReference<>();
        transport.connectResult = new CompletableFuture<>() {
            @Override
            public RdmaStream get(long timeout, TimeUnit unit) throws InterruptedException, ExecutionException {
                CompletableFuture.runAsync(() -> {
                    try {
                        follower.get().close();
                    } catch (IOException e) {
                        throw new AssertionError(e);
                    }
                }).get();
                return followerStream;
            }
        };
        try (ServerSocketChannel fake = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0))) {
            int port = ((InetSocketAddress) fake.getLocalAddress()).getPort();
            InetSocketAddress leader = new InetSocketAddress("127.0.0.1", port);
            RdmaSelectorProvider provider = configure(port, transport);
            CompletableFuture<Void> accepting = CompletableFuture.runAsync(() -> {
                try (SocketChannel first = fake.accept()) {
                    readFully(first, ByteBuffer.allocate(Preamble.HELLO_LENGTH));
                    ByteBuffer accept = Preamble.reply(Preamble.STATUS_ACCEPT, 4791, 2, 77);
                    while (accept.hasRemaining()) {
                        first.write(accept);
                    }
                    ByteBuffer rest = ByteBuffer.allocate(1);
                    while (first.read(rest) >= 0) {
                        rest.clear();
                    }
                } catch (Exception e) {
                    throw new AssertionError(e);
                }
            });
            follower.set(onFetcherThread(provider::openSocketChannel));
            assertThrows(ClosedChannelException.class, () -> onFetcherThread(() -> follower.get().connect(leader)));
            accepting.get(10, TimeUnit.SECONDS);
            assertNull(RdmaReplication.get().plainPeerRetryAt(leader),
                    "a leader is not left on TCP for the follower's own close");
            fake.configureBlocking(false);
            Thread.sleep(200);
            assertNull(fake.accept(), "a closed follower dialled the leader again");
            assertEquals(-1, leaderStream.read(ByteBuffer.allocate(1)), "the follower closed the stream it made");
        }
    }

    /** Takes every place of the leader's preamble admission, from two addresses other than the follower's. */
    private List<InetAddress> holdEveryHandshakePlace() {
        SourceAdmission admission = RdmaReplication.get().handshakeAdmission();
        List<InetAddress> held = new ArrayList<>();
        try {
            for (int host = 1; host <= 2; host++) {
                InetAddress a = InetAddress.getByAddress(new byte[] {10, 0, 0, (byte) host});
                while (admission.admit(a) == null) {
                    held.add(a);
                }
            }
        } catch (IOException e) {
            throw new AssertionError(e);
        }
        assertEquals(RdmaReplicationConfig.DEFAULT_MAX_HANDSHAKES, held.size(), "places held");
        return held;
    }

    @Test
    void shouldSendALeaderWithoutThePluginNothingButKafkasBytes() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        transport.probeFailure = new IOException("test: connection refused");
        try (ServerSocketChannel stock = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0))) {
            int port = ((InetSocketAddress) stock.getLocalAddress()).getPort();
            RdmaSelectorProvider provider = configure(port, transport);
            SocketChannel follower = onFetcherThread(provider::openSocketChannel);
            assertTrue(onFetcherThread(() -> follower.connect(new InetSocketAddress("127.0.0.1", port))));
            byte[] kafka = {0, 0, 0, 10, 0, 18, 0, 3, 0, 0, 0, 1, 0, 0};
            follower.write(ByteBuffer.wrap(kafka));
            try (SocketChannel leader = stock.accept()) {
                ByteBuffer got = ByteBuffer.allocate(kafka.length);
                while (got.hasRemaining()) {
                    assertTrue(leader.read(got) >= 0);
                }
                assertArrayEquals(kafka, got.array(), "the stock leader's first bytes are Kafka's own");
            }
            assertEquals(1 + ReplicationSocketChannel.UNKNOWN_LEADER_PROBE_RETRIES, transport.probes,
                    "the leader's RDMA port was asked first, and a few times more");
            assertTrue(RdmaReplication.get().plainPeerRetryAt(new InetSocketAddress("127.0.0.1", port))
                    > System.currentTimeMillis() + RdmaReplication.REFUSED_PEER_RETRY_MS, "left on TCP for minutes");
            assertFalse(((ReplicationSocketChannel) follower).isRdma());
            assertEquals(0, RdmaReplication.get().metrics().attempted(), "no upgrade attempted with a stock leader");
            follower.close();
        }
    }

    @Test
    void shouldNameAStockFollowerAndCountTheResponsesSendfileSends() throws Exception {
        Path file = dir.resolve("records");
        Files.write(file, fileBytes());
        ServerSocketChannel probe = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0));
        int port = ((InetSocketAddress) probe.getLocalAddress()).getPort();
        probe.close();
        RdmaSelectorProvider provider = configure(port, new InMemoryStreamTransport());
        ServerSocketChannel server = provider.openServerSocketChannel();
        server.bind(new InetSocketAddress("127.0.0.1", port));
        ByteBuffer request = fetchRequest(3);
        long expectedSent = 0;
        try (SocketChannel stock = SocketChannel.open(new InetSocketAddress("127.0.0.1", port));
             SocketChannel leader = server.accept();
             FileChannel records = FileChannel.open(file, StandardOpenOption.READ)) {
            leader.configureBlocking(false);
            for (int round = 0; round < 2; round++) {
                stock.write(request.duplicate());
                ByteBuffer in = ByteBuffer.allocate(request.remaining());
                long deadline = System.nanoTime() + 10_000_000_000L;
                while (in.hasRemaining()) {
                    assertTrue(System.nanoTime() < deadline, "request stalled at " + in.position());
                    if (leader.read(in) == 0) {
                        Thread.sleep(1);
                    }
                }
                // A fetch response as Kafka sends it: size and header by a gathering write, records by transferTo.
                int size = 8 + (int) records.size();
                ByteBuffer[] head = {ByteBuffer.allocate(4).putInt(0, size), ByteBuffer.allocate(8).putInt(0, 7)};
                while (head[1].hasRemaining()) {
                    leader.write(head, 0, 2);
                }
                long position = 0;
                while (position < records.size()) {
                    position += records.transferTo(position, records.size() - position, leader);
                }
                expectedSent += 4 + size;
                ByteBuffer response = ByteBuffer.allocate(4 + size);
                while (response.hasRemaining()) {
                    assertTrue(stock.read(response) >= 0);
                }
                assertEquals(size, response.getInt(0));
            }
        }
        server.close();
        ReplicationMetrics.Peer three = RdmaReplication.get().metrics().peer("3");
        assertEquals(expectedSent, three.tcpSent.sum(), "every response byte, sendfile's included");
        assertEquals(2L * request.remaining(), three.tcpReceived.sum());
        assertTrue(ManagementFactory.getPlatformMBeanServer().queryNames(
                new ObjectName("kafka.server:type=rdma-replication,peer=unknown"), null).isEmpty(),
                "the stock follower is named by its broker id, not counted as unknown");
    }

    /** The start of a fetch request as a stock replica fetcher of broker {@code follower} sends it. */
    private static ByteBuffer fetchRequest(int follower) {
        byte[] clientId = ("broker-" + follower + "-fetcher-0").getBytes(java.nio.charset.StandardCharsets.US_ASCII);
        ByteBuffer request = ByteBuffer.allocate(4 + 10 + clientId.length);
        return request.putInt(request.capacity() - 4).putShort((short) 1).putShort((short) 17).putInt(7)
                .putShort((short) clientId.length).put(clientId).flip();
    }

    /**
     * Kafka removes a reporter from {@code metric.reporters} at runtime by closing it, and the last plugin's close
     * releases the metrics and the handshake timer. A stock follower's connection accepted just before is Kafka's to
     * read: its first read used to throw a NullPointerException (no metrics), which Kafka's selector logs before
     * closing the connection. Its counters go nowhere: a closed plugin publishes no new bean.
     */
    @Test
    void shouldHandAStockFollowersBytesToKafkaWhenThePluginClosedAfterTheAccept() throws Exception {
        ByteBuffer request = fetchRequest(3);
        try (Accepted a = acceptThenClosePlugin(new InMemoryStreamTransport(), request.duplicate())) {
            ByteBuffer in = ByteBuffer.allocate(request.remaining());
            readFully(a.leader, in);
            assertArrayEquals(request.array(), in.array(), "Kafka reads the request as sent");
            assertFalse(((ReplicationSocketChannel) a.leader).isRdma());
        }
        assertTrue(ManagementFactory.getPlatformMBeanServer().queryNames(
                new ObjectName("kafka.server:type=rdma-replication,*"), null).isEmpty(),
                "the closed plugin's metrics registered a bean again");
    }

    /**
     * As above, for a follower with the plugin whose HELLO the leader reads after the close: its closed RDMA listener
     * declines, and the connection goes on over TCP. It used to fail with a NullPointerException.
     */
    @Test
    void shouldDeclineTheUpgradeOfAConnectionAcceptedJustBeforeThePluginClosed() throws Exception {
        SoftProvider soft = (SoftProvider) RdmaProviders.byName("soft");
        RdmaChannelTransport transport = RdmaChannelTransport.open(soft, 2, "127.0.0.1", 0, 2000, 64, 64, 16);
        ByteBuffer request = fetchRequest(3);
        try (Accepted a = acceptThenClosePlugin(transport, Preamble.hello(3))) {
            a.follower.write(request.duplicate());
            ByteBuffer in = ByteBuffer.allocate(request.remaining());
            readFully(a.leader, in);
            assertArrayEquals(request.array(), in.array(), "Kafka reads the request that follows the preamble");
            ByteBuffer reply = ByteBuffer.allocate(Preamble.REPLY_LENGTH);
            while (reply.hasRemaining()) {
                assertTrue(a.follower.read(reply) >= 0, "the leader closed the connection");
            }
            assertEquals(Preamble.STATUS_DECLINE_UNAVAILABLE, reply.get(Preamble.REPLY_STATUS_OFFSET));
        }
        assertTrue(soft.resourceUsage().isZero(), "leaked: " + soft.resourceUsage());
    }

    /**
     * A handshake still in progress when the plugin has closed has no timer left to bound it: the connection is
     * closed with a cause that names the close, not with a NullPointerException. (The in-memory transport stays
     * available after its close, so the leader accepts the HELLO and waits for the follower's decision.)
     */
    @Test
    void shouldCloseAHandshakeThePluginsCloseLeftWithoutATimerNamingTheClose() throws Exception {
        try (Accepted a = acceptThenClosePlugin(new InMemoryStreamTransport(), Preamble.hello(3))) {
            IOException e = assertThrows(IOException.class, () -> readFully(a.leader, ByteBuffer.allocate(1)));
            assertTrue(e.getMessage().contains("rejected: the RDMA replication plugin was closed during the "
                    + "handshake"), e.getMessage());
        }
    }

    /** A handshake in progress when the plugin closes keeps its deadline: the close used to cancel it. */
    @Test
    void shouldEndAHandshakeInProgressAtItsDeadlineAfterThePluginClosed() throws Exception {
        try (Accepted a = accept(new InMemoryStreamTransport(), Preamble.hello(3))) {
            // Accepted, the REPLY sent: it waits for the follower's decision, which never comes.
            assertEquals(0, a.leader.read(ByteBuffer.allocate(1)));
            RdmaReplication.get().pluginClosed();
            IOException e = assertThrows(IOException.class, () -> readFully(a.leader, ByteBuffer.allocate(1)));
            assertTrue(e.getMessage().endsWith("rejected: RDMA handshake did not complete within 2000 ms "
                    + "(rdma.handshake.timeout.ms)"), e.getMessage());
        }
    }

    /** The follower's side of the same race: a connection opened just before the close stays on TCP. */
    @Test
    void shouldKeepAFollowerConnectionOpenedJustBeforeThePluginClosedOnTcp() throws Exception {
        try (ServerSocketChannel leader = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0))) {
            int port = ((InetSocketAddress) leader.getLocalAddress()).getPort();
            RdmaSelectorProvider provider = configure(port, new InMemoryStreamTransport());
            RdmaReplication.get().pluginClosed();
            // What RdmaSelectorProvider.openSocketChannel does once it has seen the plugin active.
            try (SocketChannel follower = ReplicationSocketChannel.forFollower(provider, RdmaReplication.get(),
                    SocketChannel.open(), "2");
                 SocketChannel stock = connectAndAccept(follower, leader, port)) {
                assertFalse(((ReplicationSocketChannel) follower).isRdma());
                follower.write(fetchRequest(3));
                ByteBuffer in = ByteBuffer.allocate(fetchRequest(3).remaining());
                readFully(stock, in);
                assertArrayEquals(fetchRequest(3).array(), in.array(), "the leader gets nothing but Kafka's bytes");
            }
        }
    }

    /**
     * A connection on the inter-broker port that never upgrades (a client, a stock follower) costs its socket and no
     * more: Kafka's selector polls the socket itself. Each used to add an epoll set and an eventfd from the accept on,
     * so a max.connections sized against the descriptor limit ran out of descriptors at a third of it.
     */
    @Test
    void shouldCostAPlainConnectionNoDescriptorBeyondItsSocket() throws Exception {
        int connections = 50;
        int port = freePort();
        RdmaSelectorProvider provider = configure(port, new InMemoryStreamTransport());
        List<SocketChannel> clients = new ArrayList<>();
        List<SocketChannel> leaders = new ArrayList<>();
        try (ServerSocketChannel server = provider.openServerSocketChannel();
             Selector sel = provider.openSelector()) {
            server.bind(new InetSocketAddress("127.0.0.1", port), connections + 1);
            // One connection through every step first: what loads classes (and opens jars) does so before counting.
            SocketChannel warmUp = SocketChannel.open(new InetSocketAddress("127.0.0.1", port));
            clients.add(warmUp);
            closeAsKafkaDoes(acceptAndRegister(server, sel), sel);
            for (int i = 0; i < connections; i++) {
                clients.add(SocketChannel.open(new InetSocketAddress("127.0.0.1", port)));
            }
            long before = openDescriptors();
            for (int i = 0; i < connections; i++) {
                leaders.add(acceptAndRegister(server, sel));
            }
            sel.selectNow();
            long accepted = openDescriptors() - before;
            // Slack for a file another thread of the test JVM may open meanwhile.
            assertTrue(accepted <= connections + 3, accepted + " descriptors for " + connections
                    + " plain connections, registered with Kafka's selector (expected: one each)");
            for (SocketChannel leader : leaders) {
                closeAsKafkaDoes(leader, sel);
            }
            long left = openDescriptors() - before;
            assertTrue(left <= 3, left + " descriptors left open after " + connections + " connections closed");
        } finally {
            for (SocketChannel c : clients) {
                c.close();
            }
        }
    }

    /**
     * Kafka closes a connection through its socket first ({@code socket().close()}, then the channel), and the
     * selector drops the key at its next select. The socket's number stays taken until then, as the JDK's own channel
     * keeps it: the next connection accepted, which takes the lowest free number, used to take it, and the
     * selector's clean-up of the old key then stopped watching the new connection.
     */
    @Test
    void shouldKeepAClosedConnectionsDescriptorUntilTheSelectorDropsIt() throws Exception {
        int port = freePort();
        RdmaSelectorProvider provider = configure(port, new InMemoryStreamTransport());
        InetSocketAddress address = new InetSocketAddress("127.0.0.1", port);
        try (ServerSocketChannel server = provider.openServerSocketChannel();
             Selector sel = provider.openSelector();
             SocketChannel first = SocketChannel.open()) {
            server.bind(address);
            first.connect(address);
            SocketChannel old = acceptAndRegister(server, sel);
            sel.selectNow();
            // Connected before the close, so that the accepted end is the next descriptor made.
            try (SocketChannel next = SocketChannel.open(address)) {
                old.socket().close();
                old.close();
                SocketChannel leader = acceptAndRegister(server, sel);
                try {
                    next.write(fetchRequest(3));
                    boolean readable = false;
                    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
                    while (!readable && System.nanoTime() < deadline) {
                        sel.select(100);
                        readable = leader.keyFor(sel).isReadable();
                        sel.selectedKeys().clear();
                    }
                    assertTrue(readable, "the selector never reported the next connection's request");
                } finally {
                    closeAsKafkaDoes(leader, sel);
                }
            }
        }
    }

    /** The handshake's timer, on a thread of its own, wakes Kafka's selector, which waits on the socket. */
    @Test
    void shouldWakeASelectorWaitingOnAHandshakeAtItsDeadline() throws Exception {
        try (Accepted a = accept(new InMemoryStreamTransport(), Preamble.hello(3));
             Selector sel = Selector.open()) {
            SelectionKey key = a.leader.register(sel, SelectionKey.OP_READ);
            // The HELLO is read and the REPLY sent; then nothing comes from the follower, whose decision is awaited.
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(1);
            while (System.nanoTime() < deadline) {
                sel.select(100);
                sel.selectedKeys().clear();
                assertEquals(0, a.leader.read(ByteBuffer.allocate(1)));
            }
            // A wake-up ends the select under way; the select after it reports the key, as Kafka's next poll does.
            long start = System.nanoTime();
            int selects = 0;
            while (!sel.selectedKeys().contains(key) && selects++ < 3) {
                sel.select(10_000);
            }
            long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
            assertTrue(sel.selectedKeys().contains(key) && key.isReadable(), "no report in " + ms + " ms");
            assertTrue(ms < 2_000, "the selector reported it only after " + ms + " ms of selects (deadline 2000 ms)");
            IOException e = assertThrows(IOException.class, () -> a.leader.read(ByteBuffer.allocate(1)));
            assertTrue(e.getMessage().endsWith("did not complete within 2000 ms (rdma.handshake.timeout.ms)"),
                    e.getMessage());
        }
    }

    /**
     * A follower registered with a selector before it connects stays on TCP: the selector polls its socket, which the
     * upgrade may replace. Kafka registers after connecting.
     */
    @Test
    void shouldKeepAFollowerRegisteredBeforeItConnectsOnTcp() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        try (ServerSocketChannel leader = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0));
             Selector sel = Selector.open()) {
            int port = ((InetSocketAddress) leader.getLocalAddress()).getPort();
            RdmaSelectorProvider provider = configure(port, transport);
            SocketChannel follower = onFetcherThread(provider::openSocketChannel);
            follower.configureBlocking(false);
            SelectionKey key = follower.register(sel, SelectionKey.OP_CONNECT);
            boolean connected = onFetcherThread(() -> follower.connect(new InetSocketAddress("127.0.0.1", port)));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (!connected) {
                assertTrue(System.nanoTime() < deadline, "the selector never reported the connect");
                sel.select(100);
                connected = key.isConnectable() && follower.finishConnect();
            }
            assertEquals(0, transport.probes, "an upgrade was tried");
            assertFalse(((ReplicationSocketChannel) follower).isRdma());
            try (SocketChannel stock = leader.accept()) {
                follower.write(fetchRequest(3));
                ByteBuffer in = ByteBuffer.allocate(fetchRequest(3).remaining());
                readFully(stock, in);
                assertArrayEquals(fetchRequest(3).array(), in.array());
            } finally {
                follower.close();
            }
        }
    }

    /** A connection's close gives back its peer's place in the peer table, which a broker seen later may take. */
    @Test
    void shouldGiveBackThePeersPlaceInThePeerTableWhenAConnectionCloses() throws Exception {
        ByteBuffer request = fetchRequest(3);
        Accepted a = accept(new InMemoryStreamTransport(), request.duplicate());
        ReplicationMetrics metrics = RdmaReplication.get().metrics();
        try {
            readFully(a.leader, ByteBuffer.allocate(request.remaining()));
            assertTrue(ManagementFactory.getPlatformMBeanServer().isRegistered(
                    new ObjectName("kafka.server:type=rdma-replication,peer=3")), "the stock follower is named");
            for (int i = 1; i < ReplicationMetrics.MAX_PEERS; i++) {
                metrics.peer("held-" + i);
            }
        } finally {
            a.close();
        }
        assertEquals("7", metrics.peer("7").id(), "the place broker 3's connection held");
    }

    private static int freePort() throws IOException {
        try (ServerSocketChannel probe = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0))) {
            return ((InetSocketAddress) probe.getLocalAddress()).getPort();
        }
    }

    private static long openDescriptors() throws IOException {
        try (var fds = Files.list(Path.of("/proc/self/fd"))) {
            return fds.count();
        }
    }

    /** Accepts one connection on the plugin's listener and registers it for reading, as Kafka's processor does. */
    private static SocketChannel acceptAndRegister(ServerSocketChannel server, Selector sel) throws IOException {
        SocketChannel ch = server.accept();
        assertInstanceOf(ReplicationSocketChannel.class, ch);
        ch.configureBlocking(false);
        ch.register(sel, SelectionKey.OP_READ);
        return ch;
    }

    /** Closes as Kafka's PlaintextTransportLayer and Selector do; the selector's next select drops the key. */
    private static void closeAsKafkaDoes(SocketChannel ch, Selector sel) throws IOException {
        ch.socket().close();
        ch.close();
        sel.selectNow();
    }

    private static SocketChannel connectAndAccept(SocketChannel follower, ServerSocketChannel leader, int port)
            throws Exception {
        assertTrue(onFetcherThread(() -> follower.connect(new InetSocketAddress("127.0.0.1", port))));
        return leader.accept();
    }

    /** Both ends of one connection to the inter-broker listener; closing closes both. */
    private record Accepted(SocketChannel follower, SocketChannel leader) implements AutoCloseable {
        @Override
        public void close() throws IOException {
            try {
                leader.close();
            } finally {
                follower.close();
            }
        }
    }

    /**
     * Accepts a connection on the plugin's inter-broker listener, has its peer send {@code first}, then closes the
     * plugin as Kafka does when its reporter is removed from {@code metric.reporters}
     * ({@link RdmaReplicationPlugin#close()}), before the leader reads a byte.
     */
    private Accepted acceptThenClosePlugin(RdmaStreamTransport transport, ByteBuffer first) throws Exception {
        Accepted a = accept(transport, first);
        RdmaReplication.get().pluginClosed();
        return a;
    }

    /** Accepts a connection on the plugin's inter-broker listener (non-blocking), whose peer sends {@code first}. */
    private Accepted accept(RdmaStreamTransport transport, ByteBuffer first) throws Exception {
        ServerSocketChannel probe = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0));
        int port = ((InetSocketAddress) probe.getLocalAddress()).getPort();
        probe.close();
        RdmaSelectorProvider provider = configure(port, transport);
        try (ServerSocketChannel server = provider.openServerSocketChannel()) {
            server.bind(new InetSocketAddress("127.0.0.1", port));
            SocketChannel follower = SocketChannel.open(new InetSocketAddress("127.0.0.1", port));
            SocketChannel leader = server.accept();
            assertInstanceOf(ReplicationSocketChannel.class, leader);
            leader.configureBlocking(false);
            while (first.hasRemaining()) {
                follower.write(first);
            }
            return new Accepted(follower, leader);
        }
    }

    /** Reads until {@code dst} is full, as Kafka's network thread would over several polls; fails after 10 s. */
    private static void readFully(SocketChannel ch, ByteBuffer dst) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (dst.hasRemaining()) {
            assertTrue(System.nanoTime() < deadline, "read stalled at " + dst.position() + " bytes");
            int n = ch.read(dst);
            assertTrue(n >= 0, "end of stream after " + dst.position() + " bytes");
            if (n == 0) {
                Thread.sleep(1);
            }
        }
    }

    interface FetcherCall<T> {
        T call() throws Exception;
    }

    /** Runs {@code call} on this thread renamed as Kafka's replica fetcher of leader 2. */
    private static <T> T onFetcherThread(FetcherCall<T> call) throws Exception {
        Thread self = Thread.currentThread();
        String name = self.getName();
        self.setName("ReplicaFetcherThread-0-2");
        try {
            return call.call();
        } finally {
            self.setName(name);
        }
    }

    private byte[] fileBytes() {
        byte[] b = new byte[700_001];
        new Random(7).nextBytes(b);
        return b;
    }

    private ReplicationMetrics.Peer exchange(RdmaStreamTransport transport, boolean expectRdma) throws Exception {
        Path file = dir.resolve("segment");
        Files.write(file, fileBytes());
        ServerSocketChannel probe = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0));
        int port = ((InetSocketAddress) probe.getLocalAddress()).getPort();
        probe.close();
        RdmaSelectorProvider provider = configure(port, transport);
        ServerSocketChannel server = provider.openServerSocketChannel();
        assertInstanceOf(ReplicationServerSocketChannel.class, server);
        server.bind(new InetSocketAddress("127.0.0.1", port));
        AtomicReference<Throwable> leaderError = new AtomicReference<>();
        AtomicReference<SocketChannel> accepted = new AtomicReference<>();
        Thread leader = new Thread(() -> {
            try {
                echo(provider, server, file, accepted);
            } catch (Throwable t) {
                leaderError.set(t);
            }
        }, "leader");
        leader.start();

        Thread self = Thread.currentThread();
        String name = self.getName();
        SocketChannel follower;
        self.setName("ReplicaFetcherThread-0-2");
        try {
            follower = provider.openSocketChannel();
            follower.configureBlocking(false);
            // Negotiated connections return connected; one that skips the upgrade connects as the JDK's does.
            boolean connected = follower.connect(new InetSocketAddress("127.0.0.1", port));
            assertTrue(connected || !expectRdma, "an upgraded connection is connected once negotiated");
            long deadline = System.nanoTime() + 10_000_000_000L;
            while (!follower.finishConnect()) {
                assertTrue(System.nanoTime() < deadline, "connect did not finish");
                Thread.sleep(1);
            }
        } finally {
            self.setName(name);
        }
        assertInstanceOf(ReplicationSocketChannel.class, follower);
        assertEquals(expectRdma, ((ReplicationSocketChannel) follower).isRdma());

        byte[] payload = new byte[PAYLOAD];
        new Random(42).nextBytes(payload);
        byte[] echoed = new byte[PAYLOAD + fileBytes().length];
        try (Selector sel = provider.openSelector()) {
            SelectionKey key = follower.register(sel, SelectionKey.OP_READ | SelectionKey.OP_WRITE);
            ByteBuffer out = ByteBuffer.wrap(payload);
            ByteBuffer in = ByteBuffer.wrap(echoed);
            ByteBuffer fileRequest = ByteBuffer.wrap(new byte[] {'F'});
            long deadline = System.nanoTime() + 30_000_000_000L;
            int idleSelects = 0;
            while (in.hasRemaining()) {
                assertTrue(System.nanoTime() < deadline, "echo stalled at " + in.position() + " bytes; leader error: "
                        + leaderError.get());
                long before = System.nanoTime();
                if (sel.select(1000) == 0 && System.nanoTime() - before >= 900_000_000L) {
                    idleSelects++;
                }
                sel.selectedKeys().clear();
                if (key.isValid() && key.isWritable()) {
                    if (out.hasRemaining()) {
                        follower.write(out);
                    } else if (fileRequest.hasRemaining()) {
                        follower.write(fileRequest);
                    } else {
                        key.interestOps(SelectionKey.OP_READ);
                    }
                }
                if (key.isValid() && key.isReadable()) {
                    assertTrue(follower.read(in) >= 0, "end of stream after " + in.position() + " bytes");
                }
            }
            // Something is always in flight here, so a select that times out means a lost wake-up (each costs 1 s);
            // two are tolerated for a loaded machine.
            assertTrue(idleSelects <= 2, "selects that timed out with bytes in flight: " + idleSelects);
        }
        byte[] expected = new byte[echoed.length];
        System.arraycopy(payload, 0, expected, 0, PAYLOAD);
        System.arraycopy(fileBytes(), 0, expected, PAYLOAD, fileBytes().length);
        assertArrayEquals(expected, echoed, "every byte back, in order");
        if (holdCloses != null) {
            // The leader's close then waits for its end of stream to complete: its queue pair outlives Kafka's close.
            holdCloses.faults().delaySendCompletions(TimeUnit.SECONDS.toNanos(3));
        }
        try {
            follower.close();
            leader.join(10_000);
        } finally {
            if (holdCloses != null) {
                holdCloses.faults().reset();
            }
        }
        assertFalse(leader.isAlive());
        if (leaderError.get() != null) {
            throw new AssertionError("leader failed", leaderError.get());
        }
        assertEquals(expectRdma, ((ReplicationSocketChannel) accepted.get()).isRdma());
        assertFalse(accepted.get().isOpen(), "the leader closed its side");
        // The upgraded connection held a place under rdma.max.connections until its RDMA connection closed.
        long placeDeadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
        while (RdmaReplication.get().connectionAdmission().held() != 0) {
            assertTrue(System.nanoTime() < placeDeadline, "the place under rdma.max.connections never came back");
            Thread.sleep(1);
        }
        server.close();
        return RdmaReplication.get().metrics().peer("2");
    }

    /**
     * A place under {@code rdma.max.connections} stands for a queue pair and its registered memory: given back once
     * the RDMA connection has closed, not when Kafka closes the channel, after which the stream still delivers what it
     * took (up to its linger). Checked the moment Kafka's close returns: place first, then the connection, since the
     * place comes back after the connection closed.
     */
    private static void assertPlaceHeldWhileTheQueuePairLives(ReplicationSocketChannel leader) {
        if (leader.stream() instanceof RdmaChannelStream s) {
            boolean placeBack = RdmaReplication.get().connectionAdmission().held() == 0;
            assertFalse(placeBack && s.channel().isOpen(),
                    "the place under rdma.max.connections came back while the RDMA connection was open");
        }
    }

    /**
     * The leader: echoes bytes; on 'F' (after the payload) sends the file with transferTo; ends at end of stream. A
     * connection that ends before a byte of Kafka's (a follower asking again on a fresh socket) is replaced by the next.
     */
    private static void echo(RdmaSelectorProvider provider, ServerSocketChannel server, Path file,
                             AtomicReference<SocketChannel> accepted) throws IOException {
        try (Selector sel = provider.openSelector(); FileChannel fc = FileChannel.open(file, StandardOpenOption.READ)) {
            server.configureBlocking(false);
            server.register(sel, SelectionKey.OP_ACCEPT);
            ByteBuffer buf = ByteBuffer.allocate(100_000);
            long received = 0;
            long filePosition = -1;
            SocketChannel ch = null;
            SelectionKey key = null;
            while (true) {
                sel.select(1000);
                for (SelectionKey k : sel.selectedKeys()) {
                    if (k.isValid() && k.isAcceptable()) {
                        SocketChannel next = server.accept();
                        if (next == null) {
                            continue;
                        }
                        if (ch != null) {
                            // A follower that asks again on a fresh socket closes the one it used before.
                            assertEquals(0, received, "a second connection after Kafka's bytes");
                            ch.close();
                        }
                        ch = next;
                        accepted.set(ch);
                        ch.configureBlocking(false);
                        key = ch.register(sel, SelectionKey.OP_READ);
                    }
                }
                sel.selectedKeys().clear();
                if (ch == null) {
                    continue;
                }
                if (key.isValid() && key.isReadable() && buf.hasRemaining()) {
                    int n = ch.read(buf);
                    if (n < 0 && received == 0) {
                        // Declined and closed by the follower, which asks again on a fresh socket.
                        ch.close();
                        ch = null;
                        continue;
                    }
                    if (n < 0) {
                        ch.close();
                        assertPlaceHeldWhileTheQueuePairLives((ReplicationSocketChannel) ch);
                        return;
                    }
                    received += n;
                }
                if (received > PAYLOAD && filePosition < 0) {
                    // The 'F' request arrived with (or after) the last payload bytes: it is not echoed.
                    buf.limit(buf.position() - 1);
                    buf.position(buf.limit());
                    buf.limit(buf.capacity());
                    filePosition = 0;
                    received--;
                }
                buf.flip();
                if (buf.hasRemaining()) {
                    ch.write(buf);
                }
                buf.compact();
                if (buf.position() == 0 && filePosition >= 0 && filePosition < fc.size()) {
                    filePosition += fc.transferTo(filePosition, fc.size() - filePosition, ch);
                }
                boolean pending = buf.position() > 0 || (filePosition >= 0 && filePosition < fc.size());
                key.interestOps((buf.hasRemaining() ? SelectionKey.OP_READ : 0)
                        | (pending ? SelectionKey.OP_WRITE : 0));
            }
        }
    }
}
