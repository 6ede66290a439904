package io.rdmabridge.kafka;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * The follower's side of the upgrade: a blocking {@link Preamble} exchange on a freshly connected replication socket,
 * run in Kafka's replica fetcher thread (which waits for its connection anyway) before Kafka writes anything.
 * Every failure is bounded by one deadline and maps to an {@link Outcome} that loses no Kafka byte: nothing of
 * Kafka's has been written yet. Not thread-safe; one call per connection.
 */
final class FollowerHandshake {

    enum Kind {
        /** Kafka's bytes go over the RDMA stream. */
        RDMA,
        /** The leader knows the connection stays on TCP: Kafka continues on this socket. */
        TCP,
        /**
         * As {@link #TCP}, because the leader holds as many handshakes or RDMA connections as it allows: a fresh
         * socket may be upgraded a moment later.
         */
        BUSY,
        /** The socket cannot carry Kafka's bytes (the leader closed it, or may still be negotiating): redial. */
        REDIAL
    }

    record Outcome(Kind kind, RdmaStream stream, int leaderBrokerId, String reason) {
    }

    private FollowerHandshake() {
    }

    /**
     * @param tcp            a connected socket channel in blocking mode; left in blocking mode
     * @param leaderBrokerId the broker whose plugin answered the probe: the reply and the stream's acknowledgement
     *                       must name it
     * @param rdmaPort       where that plugin answered the probe (the leader's inter-broker port +
     *                       {@code rdma.port.offset}): the only port the reply may offer the stream at
     * @param deadline       {@link System#nanoTime()} by which the exchange ends, whatever its outcome
     * @param timeoutMs      {@code rdma.handshake.timeout.ms}, which set the deadline, for the messages
     */
    static Outcome negotiate(SocketChannel tcp, int localBrokerId, RdmaStreamTransport transport,
                             InetSocketAddress leader, int leaderBrokerId, int rdmaPort, long deadline,
                             long timeoutMs) {
        ByteBuffer reply = ByteBuffer.allocate(Preamble.REPLY_LENGTH);
        try {
            ByteBuffer hello = Preamble.hello(localBrokerId);
            while (hello.hasRemaining()) {
                tcp.write(hello);
            }
            InputStream in = tcp.socket().getInputStream();
            while (reply.hasRemaining()) {
                tcp.socket().setSoTimeout(ReplicationSocketChannel.millisLeft(deadline));
                int n = in.read(reply.array(), reply.position(), reply.remaining());
                if (n < 0) {
                    throw new EOFException();
                }
                reply.position(reply.position() + n);
            }
        } catch (SocketTimeoutException e) {
            return new Outcome(Kind.REDIAL, null, -1, "leader " + leader + " did not answer the RDMA preamble "
                    + "within the upgrade's " + timeoutMs + " ms (rdma.handshake.timeout.ms)");
        } catch (EOFException e) {
            return new Outcome(Kind.REDIAL, null, -1, "leader " + leader + " closed the connection on the RDMA "
                    + "preamble after " + reply.position() + " reply bytes: it runs without the RDMA plugin, or with "
                    + "rdma.replication.enable=false");
        } catch (IOException e) {
            return new Outcome(Kind.REDIAL, null, -1, "leader " + leader + " dropped the connection on the RDMA "
                    + "preamble (" + e + "): it runs without the RDMA plugin, or with rdma.replication.enable=false");
        }
        reply.flip();
        String invalid = Preamble.validateReply(reply);
        if (invalid != null) {
            return new Outcome(Kind.REDIAL, null, -1, "leader " + leader + " sent an invalid RDMA reply: " + invalid);
        }
        int leaderId = reply.getInt(Preamble.REPLY_BROKER_ID_OFFSET);
        byte status = reply.get(Preamble.REPLY_STATUS_OFFSET);
        int port = reply.getInt(Preamble.REPLY_PORT_OFFSET);
        String cause = untrusted(leader, leaderId, status, port, leaderBrokerId, rdmaPort);
        if (status != Preamble.STATUS_ACCEPT) {
            if (cause != null) {
                // On TCP as after any decline, but the wrong broker's "busy" is not asked again.
                return new Outcome(Kind.TCP, null, leaderId, cause);
            }
            return new Outcome(status == Preamble.STATUS_DECLINE_BUSY ? Kind.BUSY : Kind.TCP, null, leaderId,
                    "leader " + leaderId + " " + Preamble.statusName(status));
        }
        long token = reply.getLong(Preamble.REPLY_TOKEN_OFFSET);
        RdmaStream stream = null;
        if (cause == null) {
            var future = transport.connect(new InetSocketAddress(leader.getAddress(), port), token, leaderBrokerId);
            try {
                stream = future.get(Math.max(1, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
            } catch (TimeoutException e) {
                abandon(future);
                cause = "RDMA connect to " + leader.getAddress() + ":" + port + " did not complete within the "
                        + "upgrade's " + timeoutMs + " ms (rdma.handshake.timeout.ms)";
            } catch (ExecutionException e) {
                cause = "RDMA connect to " + leader.getAddress() + ":" + port + " failed: " + e.getCause();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                abandon(future);
                cause = "interrupted while connecting RDMA to " + leader.getAddress() + ":" + port;
            }
        }
        try {
            ByteBuffer decision = ByteBuffer.wrap(new byte[] {stream != null ? Preamble.DECISION_RDMA
                    : Preamble.DECISION_TCP});
            while (decision.hasRemaining()) {
                tcp.write(decision);
            }
        } catch (IOException e) {
            if (stream != null) {
                try {
                    stream.close();
                } catch (IOException ignored) {
                    // Redialling anyway.
                }
            }
            return new Outcome(Kind.REDIAL, null, leaderId, "leader " + leaderId + " dropped the connection during "
                    + "the RDMA handshake: " + e);
        }
        if (stream == null) {
            return new Outcome(Kind.TCP, null, leaderId, cause);
        }
        return new Outcome(Kind.RDMA, stream, leaderId, null);
    }

    /**
     * Why a valid reply is not to be followed, or {@code null}: it must come from the broker whose plugin answered the
     * probe, and offer the stream where that plugin answered, or it could steer the follower's RDMA connect, and the
     * token, to any port of the leader's host.
     */
    private static String untrusted(InetSocketAddress leader, int leaderId, byte status, int port, int leaderBrokerId,
                                    int rdmaPort) {
        if (leaderId != leaderBrokerId) {
            return "leader " + leader + " replied to the RDMA preamble as broker " + leaderId + " (expected: "
                    + leaderBrokerId + ", whose plugin answered the probe at " + leader.getAddress() + ":" + rdmaPort
                    + "): its plugin is broken, or is not this plugin";
        }
        if (status == Preamble.STATUS_ACCEPT && port != rdmaPort) {
            return "leader " + leaderId + " offered its RDMA stream at port " + port + " (expected: " + rdmaPort
                    + ", its inter-broker port + " + RdmaReplicationConfig.RDMA_PORT_OFFSET + ", where its plugin "
                    + "answered the probe): its plugin is broken, or is not this plugin";
        }
        return null;
    }

    /** Cancels a connect given up on; a stream that completed it meanwhile is closed, not leaked. */
    private static void abandon(CompletableFuture<RdmaStream> future) {
        if (!future.cancel(false) && !future.isCompletedExceptionally()) {
            try {
                future.join().close();
            } catch (IOException | RuntimeException ignored) {
                // Staying on TCP anyway.
            }
        }
    }
}
