package io.rdmabridge.connection;

/**
 * Tunables of one connection, fixed when it is set up. Immutable, so any thread may share it.
 *
 * @param receiveBufferSize     bytes of each posted receive, frame header included; bounds one eager frame
 * @param receiveQueueDepth     receives posted for data frames (the data credits granted to the peer)
 * @param controlCredits        receives posted for control frames (credit updates, shutdown)
 * @param sendQueueDepth        outstanding send work requests (a power of two)
 * @param signalInterval        signal one send in this many (completion moderation); the last of a batch always is
 * @param rendezvousThreshold   messages of at least this many bytes go by rendezvous (RDMA READ by the receiver)
 * @param maxMessageSize        largest rendezvous message accepted from the peer
 */
public record ConnectionConfig(int receiveBufferSize, int receiveQueueDepth, int controlCredits, int sendQueueDepth,
                               int signalInterval, int rendezvousThreshold, int maxMessageSize) {

    /**
     * Defaults. The largest message (16 MiB) bounds what one peer can make this side allocate for a rendezvous
     * before anything above the transport has looked at it; senders split larger writes. Rendezvous starts at 256 KiB:
     * below that, writes packed into full eager frames streamed faster across processes than one READ per message
     * (docs/benchmarks.md). Receive buffers are 64 KiB, Netty's largest read, so that a stream of HTTP/2 DATA frames
     * (16,393 bytes each) arrives mostly whole in one buffer instead of straddling every 16 KiB one, which made gRPC's
     * decoder copy nearly every byte into its cumulation; 16 of them keep a connection's posted receive memory at
     * 1 MiB (docs/grpc.md, "Receive buffers").
     */
    public static final ConnectionConfig DEFAULT = new ConnectionConfig(64 * 1024, 16, 8, 128, 16, 256 * 1024,
            16 * 1024 * 1024);

    public ConnectionConfig {
        if (sendQueueDepth < 8 || Integer.bitCount(sendQueueDepth) != 1) {
            throw new IllegalArgumentException("sendQueueDepth: " + sendQueueDepth + " (expected: a power of 2, >= 8)");
        }
        if (signalInterval < 1 || signalInterval > sendQueueDepth / 2) {
            throw new IllegalArgumentException("signalInterval: " + signalInterval + " (expected: 1.."
                    + sendQueueDepth / 2 + ", half the send queue depth)");
        }
        if (rendezvousThreshold < 1) {
            throw new IllegalArgumentException("rendezvousThreshold: " + rendezvousThreshold + " (expected: > 0)");
        }
        // The handshake checks the remaining bounds and names them.
        handshake(receiveBufferSize, receiveQueueDepth, controlCredits, maxMessageSize);
    }

    private static Handshake handshake(int receiveBufferSize, int receiveQueueDepth, int controlCredits,
                                       int maxMessageSize) {
        return new Handshake(receiveBufferSize, receiveQueueDepth, controlCredits, maxMessageSize);
    }

    /** What this side announces to its peer. */
    public Handshake handshake() {
        return handshake(receiveBufferSize, receiveQueueDepth, controlCredits, maxMessageSize);
    }
}
