package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.kafka.LeaderHandshake.State;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

class LeaderHandshakeTest {
    /** A Kafka request as it starts on the wire: size 10, then ApiVersions' api key and version. */
    private static final byte[] KAFKA_BYTES = {0, 0, 0, 10, 0, 18, 0, 3, 0, 0, 0, 1, 0, 0};

    private final SourceAdmission admission = SourceAdmission.handshakes(4, "RDMA handshakes in progress");
    /** The follower's address of every handshake here but those that say otherwise. */
    private static final InetAddress FOLLOWER = InetAddress.getLoopbackAddress();
    private final SourceAdmission connections = SourceAdmission.connections(2);
    private final AtomicInteger wakeups = new AtomicInteger();

    private LeaderHandshake handshake(FakeTcp tcp, RdmaStreamTransport transport) {
        return handshake(tcp, transport, FOLLOWER);
    }

    private LeaderHandshake handshake(FakeTcp tcp, RdmaStreamTransport transport, InetAddress source) {
        return new LeaderHandshake(tcp, source, transport, 7, admission, connections, wakeups::incrementAndGet);
    }

    private static InetAddress host(int n) throws UnknownHostException {
        return InetAddress.getByAddress(new byte[] {10, 0, 0, (byte) n});
    }

    private static byte[] concat(byte[] a, byte[] b) {
        byte[] r = Arrays.copyOf(a, a.length + b.length);
        System.arraycopy(b, 0, r, a.length, b.length);
        return r;
    }

    private static byte[] bytes(ByteBuffer b) {
        byte[] a = new byte[b.remaining()];
        b.duplicate().get(a);
        return a;
    }

    @Test
    void shouldHandKafkasFirstByteBackAndLeaveTheRestUnread() throws Exception {
        FakeTcp tcp = new FakeTcp().arrive(KAFKA_BYTES);
        LeaderHandshake hs = handshake(tcp, RdmaStreamTransport.unavailable(7, "none"));
        assertEquals(State.TCP, hs.advance());
        assertArrayEquals(KAFKA_BYTES, concat(bytes(hs.replay()), tcp.unread()), "no byte lost");
        assertEquals(0, tcp.written().length, "nothing written to a plain peer");
        assertEquals(0, admission.held());
    }

    @Test
    void shouldWaitWithoutConsumingWhenNoByteArrived() throws Exception {
        FakeTcp tcp = new FakeTcp();
        LeaderHandshake hs = handshake(tcp, RdmaStreamTransport.unavailable(7, "none"));
        assertEquals(State.SNIFF, hs.advance());
        tcp.arrive(KAFKA_BYTES);
        assertEquals(State.TCP, hs.advance());
        assertArrayEquals(KAFKA_BYTES, concat(bytes(hs.replay()), tcp.unread()));
    }

    @Test
    void shouldDeclineWhenRdmaIsUnavailableAndKeepKafkasBytes() throws Exception {
        FakeTcp tcp = new FakeTcp().arrive(Preamble.hello(3));
        LeaderHandshake hs = handshake(tcp, RdmaStreamTransport.unavailable(7, "provider disni: libdisni not found"));
        assertEquals(State.TCP, hs.advance());
        ByteBuffer reply = ByteBuffer.wrap(tcp.written());
        assertEquals(Preamble.REPLY_LENGTH, reply.remaining());
        assertEquals(Preamble.STATUS_DECLINE_UNAVAILABLE, reply.get(Preamble.REPLY_STATUS_OFFSET));
        assertEquals(7, reply.getInt(Preamble.REPLY_BROKER_ID_OFFSET));
        assertEquals("provider disni: libdisni not found", hs.fallbackReason());
        assertEquals(3, hs.peerBrokerId());
        tcp.arrive(KAFKA_BYTES);
        assertEquals(0, hs.replay().remaining());
        assertArrayEquals(KAFKA_BYTES, tcp.unread(), "Kafka's bytes after the preamble are untouched");
    }

    @Test
    void shouldAssembleAPreambleArrivingByteByByte() throws Exception {
        FakeTcp tcp = new FakeTcp();
        LeaderHandshake hs = handshake(tcp, RdmaStreamTransport.unavailable(7, "none"));
        byte[] hello = bytes(Preamble.hello(3));
        for (int i = 0; i < hello.length - 1; i++) {
            tcp.arrive(hello[i]);
            State s = hs.advance();
            assertEquals(State.HELLO, s, "after byte " + i);
        }
        tcp.arrive(hello[hello.length - 1]);
        assertEquals(State.TCP, hs.advance());
    }

    @Test
    void shouldCutOffGarbageThatStartsLikeThePreamble() throws Exception {
        byte[] garbage = new byte[Preamble.HELLO_LENGTH];
        garbage[0] = Preamble.MAGIC_FIRST_BYTE;
        FakeTcp tcp = new FakeTcp().arrive(garbage);
        LeaderHandshake hs = handshake(tcp, RdmaStreamTransport.unavailable(7, "none"));
        assertEquals(State.FAILED, hs.advance());
        assertEquals("invalid RDMA preamble: magic=0x52000000 (expected: 0x52444d41)", hs.failure());
        assertEquals(0, admission.held(), "place given back");
    }

    @Test
    void shouldCutOffNonZeroReservedFields() throws Exception {
        ByteBuffer hello = Preamble.hello(3);
        hello.putInt(Preamble.HELLO_RESERVED2_OFFSET, 0xdead);
        LeaderHandshake hs = handshake(new FakeTcp().arrive(hello), RdmaStreamTransport.unavailable(7, "none"));
        assertEquals(State.FAILED, hs.advance());
        assertEquals("invalid RDMA preamble: flags/reserved=0x0/0x0/0xdead (expected: 0)", hs.failure());
    }

    @Test
    void shouldCutOffATruncatedPreamble() throws Exception {
        FakeTcp tcp = new FakeTcp().arrive((byte) 'R', (byte) 'D', (byte) 'M').eof();
        LeaderHandshake hs = handshake(tcp, RdmaStreamTransport.unavailable(7, "none"));
        assertEquals(State.FAILED, hs.advance());
        assertEquals("connection closed after 3 of 16 preamble bytes", hs.failure());
        assertEquals(0, admission.held());
    }

    @Test
    void shouldExpireASlowPreambleAndReleaseItsPermit() throws Exception {
        FakeTcp tcp = new FakeTcp().arrive((byte) 'R', (byte) 'D');
        LeaderHandshake hs = handshake(tcp, RdmaStreamTransport.unavailable(7, "none"));
        assertEquals(State.HELLO, hs.advance());
        assertEquals(1, admission.held(), "a handshake in progress holds a place");
        hs.expire("RDMA handshake did not complete within 50 ms");
        assertEquals(State.FAILED, hs.state());
        assertEquals("RDMA handshake did not complete within 50 ms", hs.failure());
        assertEquals(0, admission.held());
        assertEquals(1, wakeups.get(), "the channel is woken so that Kafka reads the failure");
        tcp.arrive(KAFKA_BYTES);
        assertEquals(State.FAILED, hs.advance(), "nothing revives an expired handshake");
    }

    @Test
    void shouldDeclineWhenTooManyHandshakesAreInProgress() throws Exception {
        for (int i = 1; i <= 4; i++) {
            assertNull(admission.admit(host(i)));
        }
        FakeTcp tcp = new FakeTcp().arrive(Preamble.hello(3));
        LeaderHandshake hs = handshake(tcp, new InMemoryStreamTransport());
        assertEquals(State.TCP, hs.advance());
        assertEquals(Preamble.STATUS_DECLINE_BUSY, ByteBuffer.wrap(tcp.written()).get(Preamble.REPLY_STATUS_OFFSET));
        assertTrue(hs.fallbackReason().contains("more than 4 RDMA handshakes in progress"), hs.fallbackReason());
        hs.connectionClosed();
        assertEquals(4, admission.held(), "no place invented, none given back that was not taken");
    }

    /**
     * The preamble comes before Kafka's authentication: anyone who reaches the inter-broker listener can hold a place
     * until the handshake timeout by sending a first byte. One host used to be able to hold them all, and every
     * follower's upgrade was declined meanwhile, leaving its connection on TCP for its lifetime.
     */
    @Test
    void shouldKeepHalfThePlacesForAddressesOtherThanOneHoldingItsShare() throws Exception {
        InetAddress flooding = host(9);
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        List<FakeTcp> floods = new ArrayList<>();
        List<LeaderHandshake> held = new ArrayList<>();
        for (int i = 0; i < 4; i++) {
            FakeTcp flood = new FakeTcp().arrive(Preamble.MAGIC_FIRST_BYTE);
            LeaderHandshake hs = new LeaderHandshake(flood, flooding, transport, 7, admission, connections,
                    wakeups::incrementAndGet);
            assertEquals(State.HELLO, hs.advance());
            floods.add(flood);
            held.add(hs);
        }
        assertEquals(2, admission.held(), "places held by 10.0.0.9, which sent one byte each (half of 4)");

        FakeTcp tcp = new FakeTcp().arrive(Preamble.hello(3));
        LeaderHandshake follower = handshake(tcp, transport);
        assertEquals(State.DECISION, follower.advance(), "the follower at another address was declined: "
                + follower.fallbackReason());
        assertEquals(Preamble.STATUS_ACCEPT, ByteBuffer.wrap(tcp.written()).get(Preamble.REPLY_STATUS_OFFSET));

        // 10.0.0.9's third connection completes its HELLO: declined, naming the share and the key.
        FakeTcp third = floods.get(2);
        byte[] hello = bytes(Preamble.hello(5));
        third.arrive(Arrays.copyOfRange(hello, 1, hello.length));
        assertEquals(State.TCP, held.get(2).advance());
        assertEquals(Preamble.STATUS_DECLINE_BUSY, ByteBuffer.wrap(third.written()).get(Preamble.REPLY_STATUS_OFFSET));
        assertTrue(held.get(2).fallbackReason().contains("more than 2 RDMA handshakes in progress from 10.0.0.9 (one "
                + "address may hold 2 of rdma.handshake.max.in.progress=4"), held.get(2).fallbackReason());
        for (LeaderHandshake hs : held) {
            hs.expire("test: done");
        }
        follower.expire("test: done");
        assertEquals(0, admission.held(), "every place given back");
    }

    /**
     * The upgrade comes before Kafka's authentication, so anyone who reaches the listener can ask for one; each RDMA
     * connection holds a queue pair and megabytes of registered memory. Past rdma.max.connections open ones, an
     * upgrade is declined (the connection stays on TCP) until one closes. There used to be no bound: only handshakes
     * in progress were counted, and a peer could open RDMA connections one after another without limit.
     */
    @Test
    void shouldDeclineAnUpgradeWhileRdmaMaxConnectionsAreOpenUntilOneCloses() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        LeaderHandshake[] open = new LeaderHandshake[2];
        for (int i = 0; i < open.length; i++) {
            open[i] = upgraded(transport, host(1 + i));
        }
        assertEquals(2, connections.held(), "each RDMA connection holds its place");
        assertEquals(0, admission.held(), "no handshake is in progress");

        FakeTcp tcp = new FakeTcp().arrive(Preamble.hello(3));
        LeaderHandshake declined = handshake(tcp, transport, host(3));
        assertEquals(State.TCP, declined.advance());
        assertEquals(Preamble.STATUS_DECLINE_BUSY, ByteBuffer.wrap(tcp.written()).get(Preamble.REPLY_STATUS_OFFSET));
        assertTrue(declined.fallbackReason().startsWith("more than 2 RDMA connections open (rdma.max.connections; "
                + "raise it if this broker has that many follower connections"), declined.fallbackReason());
        declined.connectionClosed();
        assertEquals(2, connections.held(), "a declined connection gives back no place it did not hold");

        open[0].connectionClosed();
        open[0].connectionClosed();
        assertEquals(1, connections.held(), "a closed connection gives its place back, once");
        upgraded(transport, host(3));
        assertEquals(2, connections.held());
    }

    /**
     * A stream the leader took and then dropped (the follower decided on TCP, or the handshake failed) keeps its queue
     * pair while its close delivers what was written (the token's acknowledgement), for up to its linger: its place
     * under rdma.max.connections comes back only then. It used to come back at once, so a peer that presented the
     * token and then decided on TCP, again and again, held queue pairs beyond the cap.
     */
    @Test
    void shouldHoldThePlaceOfAStreamItDroppedUntilTheStreamIsReleased() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        transport.holdLeaderReleases = true;
        FakeTcp tcp = new FakeTcp().arrive(Preamble.hello(3));
        LeaderHandshake hs = handshake(tcp, transport);
        assertEquals(State.DECISION, hs.advance());
        transport.connect(null, ByteBuffer.wrap(tcp.written()).getLong(Preamble.REPLY_TOKEN_OFFSET), 1).join();
        tcp.arrive(Preamble.DECISION_TCP);
        assertEquals(State.TCP, hs.advance());
        hs.connectionClosed();
        assertEquals(1, connections.held(), "the dropped stream's queue pair still holds its place");
        transport.lastLeaderStream.release();
        assertEquals(0, connections.held(), "its place comes back once it is released");
        hs.connectionClosed();
        assertEquals(0, connections.held(), "once");
    }

    /**
     * Anyone who reaches the listener can upgrade, and an upgraded connection holds its place under
     * rdma.max.connections for as long as it stays open: one host may hold half of them, so that it cannot keep every
     * other broker's replication on TCP. There used to be no share: one address took every place.
     */
    @Test
    void shouldKeepHalfTheRdmaConnectionsForAddressesOtherThanOneHoldingItsShare() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        LeaderHandshake held = upgraded(transport, host(9));
        FakeTcp tcp = new FakeTcp().arrive(Preamble.hello(3));
        LeaderHandshake declined = handshake(tcp, transport, host(9));
        assertEquals(State.TCP, declined.advance());
        assertEquals(Preamble.STATUS_DECLINE_BUSY, ByteBuffer.wrap(tcp.written()).get(Preamble.REPLY_STATUS_OFFSET));
        assertEquals("more than 1 RDMA connections open from 10.0.0.9 (one address may hold 1 of "
                + "rdma.max.connections=2; raise it to at least twice num.replica.fetchers times the brokers on that "
                + "host, or allow only the brokers' hosts to reach the port)", declined.fallbackReason());
        assertEquals(1, connections.held(), "places held by 10.0.0.9");
        LeaderHandshake other = upgraded(transport, FOLLOWER);
        assertEquals(2, connections.held(), "another address takes the other half");
        held.connectionClosed();
        other.connectionClosed();
        declined.connectionClosed();
        assertEquals(0, connections.held(), "every place given back");
    }

    /** A handshake taken to RDMA. */
    private LeaderHandshake upgraded(InMemoryStreamTransport transport) throws Exception {
        return upgraded(transport, FOLLOWER);
    }

    private LeaderHandshake upgraded(InMemoryStreamTransport transport, InetAddress source) throws Exception {
        FakeTcp tcp = new FakeTcp().arrive(Preamble.hello(3));
        LeaderHandshake hs = handshake(tcp, transport, source);
        assertEquals(State.DECISION, hs.advance());
        transport.connect(null, ByteBuffer.wrap(tcp.written()).getLong(Preamble.REPLY_TOKEN_OFFSET), 1).join();
        tcp.arrive(Preamble.DECISION_RDMA);
        assertEquals(State.RDMA, hs.advance());
        return hs;
    }

    @Test
    void shouldSwitchToTheRdmaStreamAfterTheFollowersDecision() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        FakeTcp tcp = new FakeTcp().arrive(Preamble.hello(3));
        LeaderHandshake hs = handshake(tcp, transport);
        assertEquals(State.DECISION, hs.advance());
        ByteBuffer reply = ByteBuffer.wrap(tcp.written());
        assertEquals(Preamble.STATUS_ACCEPT, reply.get(Preamble.REPLY_STATUS_OFFSET));
        assertEquals(4791, reply.getInt(Preamble.REPLY_PORT_OFFSET));
        RdmaStream follower = transport.connect(null, reply.getLong(Preamble.REPLY_TOKEN_OFFSET), 1).join();
        tcp.arrive(Preamble.DECISION_RDMA);
        assertEquals(State.RDMA, hs.advance());
        assertNotNull(hs.stream());
        assertTrue(wakeups.get() >= 1);
        assertEquals(0, admission.held());
        follower.write(ByteBuffer.wrap(KAFKA_BYTES));
        ByteBuffer got = ByteBuffer.allocate(KAFKA_BYTES.length);
        assertEquals(KAFKA_BYTES.length, hs.stream().read(got));
        assertArrayEquals(KAFKA_BYTES, got.array());
    }

    @Test
    void shouldStayOnTcpWhenTheFollowerCouldNotOpenItsStream() throws Exception {
        FakeTcp tcp = new FakeTcp().arrive(Preamble.hello(3));
        LeaderHandshake hs = handshake(tcp, new InMemoryStreamTransport());
        assertEquals(State.DECISION, hs.advance());
        tcp.arrive(Preamble.DECISION_TCP).arrive(KAFKA_BYTES);
        assertEquals(State.TCP, hs.advance());
        assertEquals(0, hs.replay().remaining());
        assertArrayEquals(KAFKA_BYTES, tcp.unread(), "Kafka's bytes after the decision are untouched");
        assertEquals(0, admission.held());
        assertEquals(0, connections.held(), "a connection left on TCP holds no RDMA place");
    }

    @Test
    void shouldCloseAStreamThatArrivedBeforeTheFollowersTcpDecision() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        FakeTcp tcp = new FakeTcp().arrive(Preamble.hello(3));
        LeaderHandshake hs = handshake(tcp, transport);
        assertEquals(State.DECISION, hs.advance());
        // The follower presents the token over RDMA (the leader's side completes), then says 'T' all the same.
        RdmaStream follower = transport.connect(null,
                ByteBuffer.wrap(tcp.written()).getLong(Preamble.REPLY_TOKEN_OFFSET), 1).join();
        tcp.arrive(Preamble.DECISION_TCP);
        assertEquals(State.TCP, hs.advance());
        assertNull(hs.stream());
        assertEquals(-1, follower.read(ByteBuffer.allocate(1)), "the leader closed the stream it does not use");
        assertEquals(0, admission.held());
    }

    @Test
    void shouldStayExpiredWhenTheDeadlineFiresWhileTheReplyIsWritten() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        LeaderHandshake[] hs = new LeaderHandshake[1];
        RdmaStream[] follower = new RdmaStream[1];
        // The reply reaches the follower, whose stream arrives at once; then, before the network thread moves on,
        // the deadline fires on the timer thread.
        FakeTcp tcp = new FakeTcp() {
            @Override
            public int write(ByteBuffer src) {
                int n = super.write(src);
                follower[0] = transport.connect(null,
                        ByteBuffer.wrap(written()).getLong(Preamble.REPLY_TOKEN_OFFSET), 1).join();
                hs[0].expire("RDMA handshake did not complete within 50 ms");
                return n;
            }
        }.arrive(Preamble.hello(3)).arrive(Preamble.DECISION_RDMA);
        hs[0] = new LeaderHandshake(tcp, FOLLOWER, transport, 7, admission, connections, wakeups::incrementAndGet);
        assertEquals(State.FAILED, hs[0].advance(), "an expiry is final");
        assertEquals("RDMA handshake did not complete within 50 ms", hs[0].failure());
        assertEquals(-1, follower[0].read(ByteBuffer.allocate(1)), "the expiry closed the stream");
        assertArrayEquals(new byte[] {Preamble.DECISION_RDMA}, tcp.unread(), "nothing read after the expiry");
        assertEquals(0, admission.held());
        assertEquals(0, connections.held());
    }

    @Test
    void shouldCutOffAnInvalidDecision() throws Exception {
        FakeTcp tcp = new FakeTcp().arrive(Preamble.hello(3));
        LeaderHandshake hs = handshake(tcp, new InMemoryStreamTransport());
        assertEquals(State.DECISION, hs.advance());
        assertEquals(1, connections.held(), "an accepted upgrade holds its place from the reply on");
        tcp.arrive((byte) 0x7f);
        assertEquals(State.FAILED, hs.advance());
        assertEquals("invalid RDMA decision byte 0x7f (expected: 'D' or 'T')", hs.failure());
        assertEquals(0, admission.held());
        assertEquals(0, connections.held());
    }

    /** A replica fetcher's first request: ApiVersions v3 with Kafka's client id for broker 3's fetcher 0. */
    private static byte[] fetcherRequest(String clientId) {
        byte[] id = clientId.getBytes(java.nio.charset.StandardCharsets.US_ASCII);
        ByteBuffer b = ByteBuffer.allocate(4 + 10 + id.length + 5);
        b.putInt(b.capacity() - 4).putShort((short) 18).putShort((short) 3).putInt(1).putShort((short) id.length)
                .put(id).put(new byte[5]);
        return b.array();
    }

    @Test
    void shouldNameAStockFollowerByItsFetcherClientIdAndHandEveryByteBack() throws Exception {
        byte[] request = fetcherRequest("broker-3-fetcher-0");
        FakeTcp tcp = new FakeTcp();
        LeaderHandshake hs = handshake(tcp, new InMemoryStreamTransport());
        for (int i = 0; i < 4 + 10 + 18 - 1; i++) {
            tcp.arrive(request[i]);
            assertEquals(State.REQUEST_HEADER, hs.advance(), "after byte " + i);
        }
        tcp.arrive(Arrays.copyOfRange(request, 4 + 10 + 18 - 1, request.length));
        assertEquals(State.TCP, hs.advance());
        assertEquals(3, hs.peerBrokerId());
        assertNull(hs.fallbackReason());
        assertFalse(hs.attempted(), "no upgrade was attempted");
        assertArrayEquals(request, concat(bytes(hs.replay()), tcp.unread()), "no byte lost");
        assertEquals(5, tcp.unread().length, "nothing read past the client id");
        assertEquals(0, tcp.written().length, "nothing written to a stock follower");
    }

    @Test
    void shouldLeaveOtherClientsUnnamed() throws Exception {
        for (String id : new String[] {"producer-1", "broker-3-fetcher-", "broker--fetcher-0", "broker-3-fetcher-0x",
                "broker-99999999999-fetcher-0"}) {
            byte[] request = fetcherRequest(id);
            FakeTcp tcp = new FakeTcp().arrive(request);
            LeaderHandshake hs = handshake(tcp, new InMemoryStreamTransport());
            assertEquals(State.TCP, hs.advance(), id);
            assertEquals(-1, hs.peerBrokerId(), id);
            assertArrayEquals(request, concat(bytes(hs.replay()), tcp.unread()), id);
        }
    }

    @Test
    void shouldNotWaitForHeaderBytesBeyondTheRequestOrForTls() throws Exception {
        // A size too small for a header: after the size Kafka takes over (it rejects such a request itself).
        FakeTcp tiny = new FakeTcp().arrive(new byte[] {0, 0, 0, 2, 0, 18});
        LeaderHandshake hs = handshake(tiny, RdmaStreamTransport.unavailable(7, "none"));
        assertEquals(State.TCP, hs.advance());
        assertEquals(4, hs.replay().remaining());
        // An oversized first request: not a fetcher's, left to Kafka after its size.
        FakeTcp large = new FakeTcp().arrive(new byte[] {0, 0x10, 0, 0, 0, 1});
        hs = handshake(large, RdmaStreamTransport.unavailable(7, "none"));
        assertEquals(State.TCP, hs.advance());
        assertEquals(4, hs.replay().remaining());
        // TLS: the header is encrypted, so the first byte goes straight back.
        FakeTcp tls = new FakeTcp().arrive(new byte[] {0x16, 3, 1, 0, 5});
        hs = handshake(tls, RdmaStreamTransport.unavailable(7, "none"));
        assertEquals(State.TCP, hs.advance());
        assertEquals(1, hs.replay().remaining());
        assertEquals(0, admission.held());
    }
}
