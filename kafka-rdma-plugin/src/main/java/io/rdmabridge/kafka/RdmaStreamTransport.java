package io.rdmabridge.kafka;

import java.io.Closeable;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.util.concurrent.CompletableFuture;

/**
 * Opens {@link RdmaStream}s between brokers: the leader listens on an RDMA address of its own and expects the
 * follower that was told a one-time token over TCP; the follower connects there presenting that token.
 * Thread-safe.
 */
interface RdmaStreamTransport extends Closeable {

    /** Whether streams can be opened; when false {@link #unavailabilityCause()} says why and how to fix it. */
    boolean isAvailable();

    String unavailabilityCause();

    /** The port followers connect their RDMA stream to (on the leader's inter-broker host). */
    int listenPort();

    /**
     * The broker this transport answers for: its probe answers and token acknowledgements name it, and the leader's
     * preamble replies name it too, so that a follower, which requires one id in all three, compares like with like.
     */
    int brokerId();

    /**
     * Leader side: completes with the stream of the follower presenting {@code token}. Cancelling the future
     * forgets the token; a stream arriving after that is closed.
     */
    CompletableFuture<RdmaStream> expect(long token);

    /**
     * Follower side, before anything is sent on the leader's TCP connection: asks whatever listens at
     * {@code leaderRdma} (the leader's RDMA port) which broker's plugin it is. Completes with that broker id, or
     * exceptionally when nothing listens there (a stock broker, or one whose plugin is off or has no RDMA) or what
     * answers is not this plugin. Either way the probe's connection is closed once it completes; cancelling it closes
     * it too. A listener that accepted the probe's connection and closed it before a whole answer fails it with
     * {@link ProbeRefusedException}: something of this transport listens there, but it did not answer this time.
     */
    CompletableFuture<Integer> probe(InetSocketAddress leaderRdma);

    /**
     * Follower side: connects to the leader's RDMA listener and presents {@code token}. Completes once the leader has
     * taken this stream for the token, never merely once the token was sent: exceptionally when the leader refuses it
     * (unknown, already presented by another connection, or expired), or acknowledges it as a broker other than
     * {@code leaderBrokerId}.
     */
    CompletableFuture<RdmaStream> connect(InetSocketAddress leader, long token, int leaderBrokerId);

    /** Provider name, for logs and metrics. */
    String providerName();

    @Override
    void close();

    /**
     * The leader's RDMA listener accepted a probe's connection and closed it before answering: its plugin is closing,
     * or gave up on the probe. Unlike a probe that reaches no listener, this does not mean the leader lacks the plugin,
     * so a follower tries again rather than leaving the leader on TCP for minutes. (A listener that holds as many
     * connections without a token as it allows refuses the connection before accepting it, which a NIC reports as it
     * reports a port where nothing listens; see {@code ReplicationSocketChannel}'s probe.)
     */
    final class ProbeRefusedException extends IOException {
        private static final long serialVersionUID = 1L;

        ProbeRefusedException(String message) {
            super(message);
        }
    }

    /** A transport that opens nothing and names its cause; a leader's declines name {@code brokerId} (-1: none). */
    static RdmaStreamTransport unavailable(int brokerId, String cause) {
        return new RdmaStreamTransport() {
            @Override
            public boolean isAvailable() {
                return false;
            }

            @Override
            public String unavailabilityCause() {
                return cause;
            }

            @Override
            public int listenPort() {
                return 0;
            }

            @Override
            public int brokerId() {
                return brokerId;
            }

            @Override
            public CompletableFuture<RdmaStream> expect(long token) {
                return CompletableFuture.failedFuture(new java.io.IOException(cause));
            }

            @Override
            public CompletableFuture<Integer> probe(InetSocketAddress leaderRdma) {
                return CompletableFuture.failedFuture(new java.io.IOException(cause));
            }

            @Override
            public CompletableFuture<RdmaStream> connect(InetSocketAddress leader, long token, int leaderBrokerId) {
                return CompletableFuture.failedFuture(new java.io.IOException(cause));
            }

            @Override
            public String providerName() {
                return "none";
            }

            @Override
            public void close() {
            }
        };
    }
}
