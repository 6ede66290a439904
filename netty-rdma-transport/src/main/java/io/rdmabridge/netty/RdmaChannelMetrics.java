package io.rdmabridge.netty;

/**
 * Counters of one RDMA channel, or of all channels of one event loop: bytes by the path they took, bytes the CPU
 * copied, and flow-control events. Written by the event loop only; read from any thread (values may be a moment
 * stale). Obtain with {@link RdmaSocketChannel#metrics()} and {@link RdmaSocketChannel#eventLoopMetrics()}.
 */
public final class RdmaChannelMetrics {
    private volatile long inlineBytes;
    private volatile long eagerBytes;
    private volatile long rendezvousBytes;
    private volatile long fileBytes;
    private volatile long copiedBytes;
    private volatile long receivedBytes;
    private volatile long receivedCopiedBytes;
    private volatile long creditStalls;
    private volatile long receiverNotReady;

    RdmaChannelMetrics() {
    }

    /** Bytes sent inline in the work request (small frames). */
    public long inlineBytes() {
        return inlineBytes;
    }

    /** Bytes sent by eager SEND from registered memory (not inline). */
    public long eagerBytes() {
        return eagerBytes;
    }

    /** Bytes the peer pulled by RDMA READ (rendezvous). */
    public long rendezvousBytes() {
        return rendezvousBytes;
    }

    /** Bytes sent from files ({@code FileRegion}); also counted in the path they took. */
    public long fileBytes() {
        return fileBytes;
    }

    /** Bytes written that the CPU copied into registered memory first (heap, unregistered or composite buffers). */
    public long copiedBytes() {
        return copiedBytes;
    }

    /** Bytes received and handed up the pipeline. */
    public long receivedBytes() {
        return receivedBytes;
    }

    /** Received bytes copied out of a receive buffer because the application held too many of them. */
    public long receivedCopiedBytes() {
        return receivedCopiedBytes;
    }

    /** Times data waited for a credit from the peer. */
    public long creditStalls() {
        return creditStalls;
    }

    /** Receiver-not-ready errors (a peer that had no receive posted). */
    public long receiverNotReady() {
        return receiverNotReady;
    }

    // Single writer (the event loop), so a plain read-modify-write of the volatile is safe.
    void addInline(long n) {
        inlineBytes += n;
    }

    void addEager(long n) {
        eagerBytes += n;
    }

    void addRendezvous(long n) {
        rendezvousBytes += n;
    }

    void addFile(long n) {
        fileBytes += n;
    }

    void addCopied(long n) {
        copiedBytes += n;
    }

    void addReceived(long n) {
        receivedBytes += n;
    }

    void addReceivedCopied(long n) {
        receivedCopiedBytes += n;
    }

    void addCreditStalls(long n) {
        creditStalls += n;
    }

    void addReceiverNotReady(long n) {
        receiverNotReady += n;
    }

    @Override
    public String toString() {
        return "RdmaChannelMetrics{inline=" + inlineBytes + ", eager=" + eagerBytes + ", rendezvous="
                + rendezvousBytes + ", file=" + fileBytes + ", copied=" + copiedBytes + ", received=" + receivedBytes
                + ", receivedCopied=" + receivedCopiedBytes + ", creditStalls=" + creditStalls
                + ", receiverNotReady=" + receiverNotReady + '}';
    }
}
