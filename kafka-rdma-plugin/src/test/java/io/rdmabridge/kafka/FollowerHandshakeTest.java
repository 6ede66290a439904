package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** The follower's blocking exchange against scripted leaders on a real loopback socket. */
class FollowerHandshakeTest {
    private ServerSocketChannel server;
    private SocketChannel follower;
    private InetSocketAddress address;

    @BeforeEach
    void listen() throws IOException {
        server = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0));
        address = (InetSocketAddress) server.getLocalAddress();
        follower = SocketChannel.open(address);
    }

    @AfterEach
    void close() throws IOException {
        follower.close();
        server.close();
    }

    private static ByteBuffer readFully(SocketChannel ch, int n) throws IOException {
        ByteBuffer b = ByteBuffer.allocate(n);
        while (b.hasRemaining()) {
            if (ch.read(b) < 0) {
                throw new IOException("end of stream after " + b.position());
            }
        }
        return b.flip();
    }

    /** A leader that reads the HELLO and accepts: RDMA port 4791, broker 1, token 99. */
    private CompletableFuture<SocketChannel> acceptingLeader() {
        return leader(ch -> {
            readFully(ch, Preamble.HELLO_LENGTH);
            ch.write(Preamble.reply(Preamble.STATUS_ACCEPT, 4791, 1, 99));
        });
    }

    private CompletableFuture<SocketChannel> leader(ThrowingConsumer script) {
        return CompletableFuture.supplyAsync(() -> {
            try {
                SocketChannel ch = server.accept();
                script.accept(ch);
                return ch;
            } catch (IOException e) {
                throw new RuntimeException(e);
            }
        });
    }

    interface ThrowingConsumer {
        void accept(SocketChannel ch) throws IOException;
    }

    /** The deadline {@code ms} from now. */
    private static long in(long ms) {
        return System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ms);
    }

    @Test
    void shouldRedialWhenAStockLeaderClosesOnThePreamble() throws Exception {
        // What stock Kafka does: reads a 4-byte size of 0x52444d41, rejects it, closes.
        leader(ch -> {
            readFully(ch, 4);
            ch.close();
        });
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(follower, 2, new InMemoryStreamTransport(),
                address, 1, 4791, in(5000), 5000);
        assertEquals(FollowerHandshake.Kind.REDIAL, o.kind());
        assertTrue(o.reason().contains("runs without the RDMA plugin"), o.reason());
    }

    @Test
    void shouldRedialWhenTheLeaderIsSilent() throws Exception {
        leader(ch -> readFully(ch, Preamble.HELLO_LENGTH));
        long start = System.nanoTime();
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(follower, 2, new InMemoryStreamTransport(),
                address, 1, 4791, in(300), 300);
        long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
        assertEquals(FollowerHandshake.Kind.REDIAL, o.kind());
        assertTrue(o.reason().endsWith(
                "did not answer the RDMA preamble within the upgrade's 300 ms (rdma.handshake.timeout.ms)"),
                o.reason());
        assertTrue(ms >= 250 && ms < 5000, "bounded by the timeout: " + ms + " ms");
    }

    @Test
    void shouldRedialOnAnInvalidReply() throws Exception {
        leader(ch -> {
            readFully(ch, Preamble.HELLO_LENGTH);
            ByteBuffer reply = Preamble.reply(Preamble.STATUS_ACCEPT, 70000, 1, 5);
            ch.write(reply);
        });
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(follower, 2, new InMemoryStreamTransport(),
                address, 1, 4791, in(5000), 5000);
        assertEquals(FollowerHandshake.Kind.REDIAL, o.kind());
        assertTrue(o.reason().endsWith("sent an invalid RDMA reply: port=70000 (expected: 1..65535)"), o.reason());
    }

    @Test
    void shouldRedialOnAnAcceptanceInAnotherVersion() throws Exception {
        leader(ch -> {
            readFully(ch, Preamble.HELLO_LENGTH);
            ByteBuffer reply = Preamble.reply(Preamble.STATUS_ACCEPT, 4791, 1, 5);
            reply.put(Preamble.REPLY_VERSION_OFFSET, (byte) (Preamble.VERSION + 1));
            ch.write(reply);
        });
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(follower, 2, new InMemoryStreamTransport(),
                address, 1, 4791, in(5000), 5000);
        assertEquals(FollowerHandshake.Kind.REDIAL, o.kind());
        assertTrue(o.reason().endsWith("sent an invalid RDMA reply: an acceptance in version 3 (expected: 2, the one "
                + "this broker asked)"), o.reason());
    }

    @Test
    void shouldContinueOnTheSameSocketWhenTheLeaderDeclines() throws Exception {
        byte[] kafka = {0, 0, 0, 3, 1, 2, 3};
        CompletableFuture<SocketChannel> leader = leader(ch -> {
            ByteBuffer hello = readFully(ch, Preamble.HELLO_LENGTH);
            assertEquals(2, hello.getInt(Preamble.HELLO_BROKER_ID_OFFSET));
            ch.write(Preamble.reply(Preamble.STATUS_DECLINE_UNAVAILABLE, 0, 1, 0));
        });
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(follower, 2, new InMemoryStreamTransport(),
                address, 1, 4791, in(5000), 5000);
        assertEquals(FollowerHandshake.Kind.TCP, o.kind());
        assertEquals(1, o.leaderBrokerId());
        assertTrue(o.reason().contains("the leader's RDMA provider is unavailable"), o.reason());
        follower.write(ByteBuffer.wrap(kafka));
        assertArrayEquals(kafka, readFully(leader.get(5, TimeUnit.SECONDS), kafka.length).array(),
                "Kafka's first bytes follow the preamble intact");
    }

    @Test
    void shouldSendTcpDecisionWhenItsStreamCannotConnect() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        transport.connectFailure = new IOException("test: no route to RDMA port");
        CompletableFuture<SocketChannel> leader = acceptingLeader();
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(follower, 2, transport, address, 1, 4791, in(5000),
                5000);
        assertEquals(FollowerHandshake.Kind.TCP, o.kind());
        assertTrue(o.reason().contains("test: no route to RDMA port"), o.reason());
        assertEquals(Preamble.DECISION_TCP, readFully(leader.get(5, TimeUnit.SECONDS), 1).get(0));
    }

    @Test
    void shouldCloseAStreamThatConnectsRightAtTheDeadline() throws Exception {
        InMemoryStreamTransport.Pipe toLeader = new InMemoryStreamTransport.Pipe();
        InMemoryStreamTransport.Pipe toFollower = new InMemoryStreamTransport.Pipe();
        RdmaStream late = new InMemoryStreamTransport.Stream(toLeader, toFollower);
        RdmaStream leaderSide = new InMemoryStreamTransport.Stream(toFollower, toLeader);
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        // The wait for the connect times out, and the connect completes before it can be cancelled.
        transport.connectResult = new CompletableFuture<>() {
            @Override
            public RdmaStream get(long timeout, TimeUnit unit) throws TimeoutException {
                complete(late);
                throw new TimeoutException();
            }
        };
        CompletableFuture<SocketChannel> leader = acceptingLeader();
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(follower, 2, transport, address, 1, 4791, in(5000),
                5000);
        assertEquals(FollowerHandshake.Kind.TCP, o.kind());
        assertTrue(o.reason().endsWith("did not complete within the upgrade's 5000 ms (rdma.handshake.timeout.ms)"),
                o.reason());
        assertEquals(Preamble.DECISION_TCP, readFully(leader.get(5, TimeUnit.SECONDS), 1).get(0));
        assertEquals(-1, leaderSide.read(ByteBuffer.allocate(1)), "the follower closed the stream it gave up on");
    }

    /**
     * The reply's port must be the one where the leader's plugin answered the probe: a hostile or broken leader could
     * otherwise steer the follower's RDMA connect, and the token, to any port of its host.
     */
    @Test
    void shouldStayOnTcpWhenTheLeaderOffersTheStreamAtAnotherPort() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        CompletableFuture<RdmaStream> leaderStream = transport.expect(99);
        CompletableFuture<SocketChannel> leader = acceptingLeader();
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(follower, 2, transport, address, 1, 4790, in(5000),
                5000);
        assertEquals(FollowerHandshake.Kind.TCP, o.kind());
        assertEquals("leader 1 offered its RDMA stream at port 4791 (expected: 4790, its inter-broker port + "
                + "rdma.port.offset, where its plugin answered the probe): its plugin is broken, or is not this plugin",
                o.reason());
        assertFalse(leaderStream.isDone(), "no RDMA connect to the port the reply named");
        assertEquals(Preamble.DECISION_TCP, readFully(leader.get(5, TimeUnit.SECONDS), 1).get(0));
    }

    /** The reply must come from the broker whose plugin answered the probe. */
    @Test
    void shouldStayOnTcpWhenTheLeaderRepliesAsAnotherBroker() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        CompletableFuture<RdmaStream> leaderStream = transport.expect(99);
        CompletableFuture<SocketChannel> leader = acceptingLeader();
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(follower, 2, transport, address, 3, 4791, in(5000),
                5000);
        assertEquals(FollowerHandshake.Kind.TCP, o.kind());
        assertEquals("leader " + address + " replied to the RDMA preamble as broker 1 (expected: 3, whose plugin "
                + "answered the probe at " + address.getAddress() + ":4791): its plugin is broken, or is not this "
                + "plugin", o.reason());
        assertFalse(leaderStream.isDone(), "no RDMA connect on another broker's reply");
        assertEquals(Preamble.DECISION_TCP, readFully(leader.get(5, TimeUnit.SECONDS), 1).get(0));
    }

    /** Another broker's "busy" is not asked again: the connection stays on TCP. */
    @Test
    void shouldNotAskAgainWhenAnotherBrokerDeclinesAsBusy() throws Exception {
        leader(ch -> {
            readFully(ch, Preamble.HELLO_LENGTH);
            ch.write(Preamble.reply(Preamble.STATUS_DECLINE_BUSY, 0, 1, 0));
        });
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(follower, 2, new InMemoryStreamTransport(),
                address, 3, 4791, in(5000), 5000);
        assertEquals(FollowerHandshake.Kind.TCP, o.kind());
        assertTrue(o.reason().contains("replied to the RDMA preamble as broker 1 (expected: 3"), o.reason());
    }

    @Test
    void shouldSwitchToTheStreamOnAccept() throws Exception {
        InMemoryStreamTransport transport = new InMemoryStreamTransport();
        CompletableFuture<RdmaStream> leaderStream = transport.expect(99);
        CompletableFuture<SocketChannel> leader = acceptingLeader();
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(follower, 2, transport, address, 1, 4791, in(5000),
                5000);
        assertEquals(FollowerHandshake.Kind.RDMA, o.kind());
        assertNotNull(o.stream());
        assertTrue(leaderStream.isDone());
        assertEquals(Preamble.DECISION_RDMA, readFully(leader.get(5, TimeUnit.SECONDS), 1).get(0));
    }
}
