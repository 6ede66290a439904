package io.rdmabridge.kafka;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

/**
 * A test double of the RDMA connection core: streams are pairs of bounded in-memory queues, so the channel's switch
 * from TCP to "the RDMA byte stream" can be proven without an RDMA provider. It is never used outside tests.
 */
final class InMemoryStreamTransport implements RdmaStreamTransport {
    static final int CAPACITY = 64 * 1024;

    private final Map<Long, CompletableFuture<RdmaStream>> expected = new ConcurrentHashMap<>();
    volatile IOException connectFailure;
    /** When set, what {@link #connect} returns: a test's scripted connect. */
    volatile CompletableFuture<RdmaStream> connectResult;
    /** The broker id a probe is answered with: the leader id of a fetcher thread named "ReplicaFetcherThread-0-2". */
    volatile int probeAnswer = 2;
    /** When set, probes fail with it, as against a leader without the plugin. */
    volatile IOException probeFailure;
    /** How many probes, from the next on, the leader's plugin refuses (it holds as many handshakes as it allows). */
    volatile int probeRefusals;
    /** How a refused probe fails when set; else as one the leader's plugin accepted and closed before answering. */
    volatile IOException probeRefusal;
    /**
     * When set, a leader-side stream's close does not release it: {@link Stream#release()} does, as a queue pair
     * outlives its channel's close while the close delivers what was written.
     */
    volatile boolean holdLeaderReleases;
    /** The leader's side of the last stream connected. */
    volatile Stream lastLeaderStream;
    /** When positive, how long a probe takes to be answered. */
    volatile long probeDelayMillis;
    volatile int probes;
    /** When set, run as a probe starts: what happens meanwhile on the probing broker. */
    volatile Runnable onProbe;

    @Override
    public boolean isAvailable() {
        return true;
    }

    @Override
    public String unavailabilityCause() {
        return null;
    }

    @Override
    public int listenPort() {
        return 4791;
    }

    /** The leader's id in its replies: the one probes are answered with. */
    @Override
    public int brokerId() {
        return probeAnswer;
    }

    @Override
    public CompletableFuture<RdmaStream> expect(long token) {
        CompletableFuture<RdmaStream> f = new CompletableFuture<>();
        expected.put(token, f);
        f.whenComplete((s, e) -> expected.remove(token, f));
        return f;
    }

    @Override
    public CompletableFuture<Integer> probe(InetSocketAddress leaderRdma) {
        probes++;
        Runnable meanwhile = onProbe;
        if (meanwhile != null) {
            meanwhile.run();
        }
        if (probeFailure != null) {
            return CompletableFuture.failedFuture(probeFailure);
        }
        if (probeRefusals > 0) {
            probeRefusals--;
            IOException refusal = probeRefusal;
            return CompletableFuture.failedFuture(refusal != null ? refusal : new ProbeRefusedException("test: "
                    + leaderRdma + " closed the RDMA probe after 0 of 8 answer bytes"));
        }
        return probeDelayMillis <= 0 ? CompletableFuture.completedFuture(probeAnswer)
                : CompletableFuture.supplyAsync(() -> probeAnswer,
                        CompletableFuture.delayedExecutor(probeDelayMillis, TimeUnit.MILLISECONDS));
    }

    /** The leader's broker id is not checked here: {@code RdmaChannelTransportTest} covers the acknowledgement. */
    @Override
    public CompletableFuture<RdmaStream> connect(InetSocketAddress leader, long token, int leaderBrokerId) {
        if (connectFailure != null) {
            return CompletableFuture.failedFuture(connectFailure);
        }
        if (connectResult != null) {
            return connectResult;
        }
        CompletableFuture<RdmaStream> leaderSide = expected.get(token);
        if (leaderSide == null) {
            return CompletableFuture.failedFuture(new IOException("token " + token + " not expected"));
        }
        Pipe a = new Pipe();
        Pipe b = new Pipe();
        Stream follower = new Stream(a, b);
        Stream leaderStream = new Stream(b, a);
        leaderStream.holdRelease = holdLeaderReleases;
        lastLeaderStream = leaderStream;
        leaderSide.complete(leaderStream);
        return CompletableFuture.completedFuture(follower);
    }

    @Override
    public String providerName() {
        return "in-memory";
    }

    @Override
    public void close() {
    }

    /** One direction: a bounded byte queue. */
    static final class Pipe {
        private final ByteBuffer buf = ByteBuffer.allocate(CAPACITY);
        private boolean shut;
        volatile Runnable readerListener = () -> { };
        volatile Runnable writerListener = () -> { };

        synchronized int put(ByteBuffer src) {
            int n = Math.min(src.remaining(), buf.remaining());
            ByteBuffer s = src.slice();
            s.limit(n);
            buf.put(s);
            src.position(src.position() + n);
            return n;
        }

        synchronized int take(ByteBuffer dst) {
            buf.flip();
            int n = Math.min(dst.remaining(), buf.remaining());
            if (n == 0 && shut) {
                buf.compact();
                return -1;
            }
            ByteBuffer s = buf.slice();
            s.limit(n);
            dst.put(s);
            buf.position(buf.position() + n);
            buf.compact();
            return n;
        }

        synchronized boolean readable() {
            return buf.position() > 0 || shut;
        }

        synchronized boolean writable() {
            return buf.hasRemaining();
        }

        synchronized void shut() {
            shut = true;
        }
    }

    static final class Stream implements RdmaStream {
        private final Pipe out;
        private final Pipe in;
        private long copiedIn;
        private long copiedOut;
        private final CompletableFuture<Void> closed = new CompletableFuture<>();
        private volatile boolean holdRelease;

        Stream(Pipe out, Pipe in) {
            this.out = out;
            this.in = in;
        }

        @Override
        public int read(ByteBuffer dst) {
            int n = in.take(dst);
            if (n > 0) {
                copiedIn += n;
                in.writerListener.run();
            }
            return n;
        }

        @Override
        public int write(ByteBuffer src) {
            int n = out.put(src);
            if (n > 0) {
                copiedOut += n;
                out.readerListener.run();
            }
            return n;
        }

        @Override
        public boolean isReadable() {
            return in.readable();
        }

        @Override
        public boolean isWritable() {
            return out.writable();
        }

        @Override
        public void readinessListener(Runnable listener) {
            in.readerListener = listener;
            out.writerListener = listener;
        }

        @Override
        public long copiedBytesReceived() {
            return copiedIn;
        }

        @Override
        public long copiedBytesSent() {
            return copiedOut;
        }

        @Override
        public void shutdownOutput() {
            out.shut();
            out.readerListener.run();
        }

        /** Released once this end is closed, or, when held, once {@link #release()} runs. */
        @Override
        public void whenClosed(Runnable action) {
            closed.thenRun(action);
        }

        @Override
        public String describe() {
            return "in-memory test stream";
        }

        @Override
        public void close() {
            shutdownOutput();
            if (!holdRelease) {
                release();
            }
        }

        /** The stream's resources are gone: runs the actions {@link #whenClosed} registered. */
        void release() {
            closed.complete(null);
        }
    }
}
