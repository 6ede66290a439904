package io.rdmabridge.benchmarks.perf;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.CmEvent;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.QpCapabilities;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RecvWorkRequest;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WorkCompletions;
import io.rdmabridge.verbs.WrOpcode;

import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Queue;
import java.util.concurrent.TimeUnit;

/**
 * perftest's patterns over the verbs SPI alone: one RC queue pair per side, one registered data buffer of the largest
 * message size, and a small control protocol of SEND_WITH_IMMs (the immediate carries the type and a 24-bit
 * argument, the 16-byte payload two longs) that frames each measurement:
 * <pre>
 * client                              server
 *   INFO(addr, rkey|len, rxDepth)  &lt;-&gt;  INFO           both, once
 *   BEGIN(test; size, iterations)   -&gt;                  per size
 *                                  &lt;-   READY
 *   ... SENDs / WRITEs / READs; CREDIT(n) &lt;- for send_bw
 *   END                             -&gt;
 *                                  &lt;-   DONE(server CPU ns)
 *   QUIT                            -&gt;
 * </pre>
 * Every receive lands at offset 0 of the data buffer (contents are not checked, as in perftest); control messages
 * only arrive when no data is in flight, so they are read before anything overwrites them. The server validates
 * every control field it gets from the network and drops a client that sends nonsense.
 *
 * <p>Completion handling polls first and sleeps on the completion channel after a short spin, so that both ends can
 * share a small machine in loopback mode. Not thread-safe: one thread per {@link Endpoint}.
 */
final class VerbsPerf {
    static final int INFO = 1;
    static final int BEGIN = 2;
    static final int READY = 3;
    static final int END = 4;
    static final int DONE = 5;
    static final int CREDIT = 6;
    static final int QUIT = 7;

    private static final long RECV_TAG = 1L << 62;
    private static final long TIMEOUT_NANOS = TimeUnit.SECONDS.toNanos(30);
    private static final int SPINS = 2000;
    /** Receives the server keeps for control messages beyond the client's data credits. */
    private static final int CONTROL_RESERVE = 2;

    private VerbsPerf() {
    }

    /**
     * Queue sizes and the buffer every connection uses, and how long a side waits for a completion the peer owes it
     * before it gives up on the peer.
     */
    record Settings(int maxSize, int sendDepth, int recvDepth, int signalInterval, long stallNanos) {
        Settings(int maxSize, int sendDepth, int recvDepth, int signalInterval) {
            this(maxSize, sendDepth, recvDepth, signalInterval, TIMEOUT_NANOS);
        }

        Settings {
            if (maxSize < 16) {
                maxSize = 16;
            }
            if (sendDepth < 2 || recvDepth < 2 * CONTROL_RESERVE + 2) {
                throw new IllegalArgumentException("sendDepth: " + sendDepth + ", recvDepth: " + recvDepth
                        + " (expected: sendDepth >= 2, recvDepth >= " + (2 * CONTROL_RESERVE + 2) + ")");
            }
            signalInterval = Math.max(1, Math.min(signalInterval, sendDepth / 2));
            if (stallNanos <= 0) {
                throw new IllegalArgumentException("stallNanos: " + stallNanos + " (expected: > 0)");
            }
        }
    }

    /** Runs the client side: every size of {@code sizes}, warm-up first; returns one row per size. */
    static List<PerfResult> runClient(RdmaProvider provider, InetSocketAddress server, PerfTest test, int[] sizes,
                                      long iterationsOverride, Settings settings, boolean loopback) throws Exception {
        List<PerfResult> rows = new ArrayList<>();
        try (Endpoint ep = Endpoint.connect(provider, server, settings)) {
            for (int size : sizes) {
                if (size > ep.remoteLength || size > ep.data.capacity()) {
                    throw new IllegalArgumentException("size: " + size + " (expected: <= " + ep.remoteLength
                            + ", the server's buffer; start it with --size/--sizes at least as large)");
                }
                long iterations = iterationsOverride > 0 ? iterationsOverride : defaultIterations(test, size);
                ep.measure(test, size, Math.max(1, iterations / 10), null);
                rows.add(ep.measure(test, size, iterations, "verbs/" + provider.name() + (loopback ? "" : "/remote")));
            }
            ep.sendControl(QUIT, 0, 0, 0);
        }
        return rows;
    }

    /** perftest-like defaults: 1000 round trips; bandwidth tests move about 256 MiB, 100..20000 messages. */
    static long defaultIterations(PerfTest test, int size) {
        if (test.isLatency()) {
            return 1000;
        }
        return Math.max(100, Math.min(20_000, (256L << 20) / size));
    }

    /** Listens on {@code bind}; serves {@code clients} connections one after another (negative: forever). */
    static void serve(RdmaProvider provider, InetSocketAddress bind, Settings settings, int clients,
                      java.util.function.Consumer<InetSocketAddress> onListening) throws Exception {
        EventNotifier notifier = new EventNotifier();
        RdmaEventChannel channel = provider.createEventChannel(notifier);
        // Requests that arrived while a client was served (one at a time), oldest first.
        Queue<RdmaCmId> waiting = new ArrayDeque<>();
        try {
            RdmaCmId listener = channel.createId();
            try {
                InetSocketAddress bound = listener.listen(bind, 16);
                onListening.accept(bound);
                for (int served = 0; clients < 0 || served < clients; served++) {
                    RdmaCmId request = waiting.poll();
                    if (request == null) {
                        request = Endpoint.awaitCm(channel, notifier, new CmEvent(), CmEventType.CONNECT_REQUEST,
                                null, -1).id();
                    }
                    try (Endpoint ep = Endpoint.accept(provider, channel, notifier, request, settings, waiting)) {
                        ep.serveClient();
                    } catch (RdmaException | IllegalStateException e) {
                        if (clients > 0) {
                            throw e;
                        }
                        System.err.println("rdma-perf server: client dropped: " + e.getMessage());
                    }
                }
            } finally {
                for (RdmaCmId request : waiting) {
                    rejectQuietly(request);
                }
                listener.close();
            }
        } finally {
            channel.close();
            notifier.close();
        }
    }

    private static void rejectQuietly(RdmaCmId request) {
        try {
            request.reject(new byte[0]);
        } catch (RdmaException e) {
            // The client gave up already; its id goes away below either way.
        }
        request.close();
    }

    /** One side of a connection: its queue pair, completion queue, registered data buffer and control state. */
    static final class Endpoint implements AutoCloseable {
        private final RdmaEventChannel channel;
        private final boolean ownsChannel;
        private final EventNotifier notifier;
        private final Settings settings;
        /** Server: where connect requests that arrive while this client is served wait; {@code null} for a client. */
        private final Queue<RdmaCmId> waitingRequests;
        private final CmEvent event = new CmEvent();
        private final WorkCompletions wc = new WorkCompletions(64);
        private final SendWorkRequest swr = new SendWorkRequest(1);
        private final RecvWorkRequest rwr = new RecvWorkRequest(1);
        /** Control payloads pass through here: two longs, big-endian on the wire. */
        private final ByteBuffer scratch = ByteBuffer.allocate(16);
        private RdmaCmId id;
        private ProtectionDomain pd;
        private CompletionQueue cq;
        private QueuePair qp;
        private ByteBuffer data;
        private ByteBuffer control;
        private MemoryRegion dataMr;
        private MemoryRegion controlMr;
        private int maxInline;

        private long postedSends;
        private long completedSends;
        private long dataReceives;
        private int credits;
        private int sinceCredit;
        private int idleSpins;
        private long lastProgress;
        private boolean quitReceived;
        private boolean peerGone;

        // Control messages received and not yet taken, as parallel rings.
        private final int[] ctrlType = new int[64];
        private final int[] ctrlArg = new int[64];
        private final long[] ctrlA = new long[64];
        private final long[] ctrlB = new long[64];
        private int ctrlHead;
        private int ctrlTail;

        private long remoteAddress;
        private int remoteRkey;
        private int remoteLength;
        private int remoteRecvDepth;

        private Endpoint(RdmaEventChannel channel, boolean ownsChannel, EventNotifier notifier, Settings settings,
                         Queue<RdmaCmId> waitingRequests) {
            this.channel = channel;
            this.ownsChannel = ownsChannel;
            this.notifier = notifier;
            this.settings = settings;
            this.waitingRequests = waitingRequests;
        }

        static Endpoint connect(RdmaProvider provider, InetSocketAddress server, Settings settings)
                throws RdmaException {
            EventNotifier notifier = new EventNotifier();
            Endpoint ep = new Endpoint(provider.createEventChannel(notifier), true, notifier, settings, null);
            try {
                ep.id = ep.channel.createId();
                ep.id.resolve(server, 5000);
                awaitCm(ep.channel, notifier, ep.event, CmEventType.ADDR_RESOLVED, ep.id, TIMEOUT_NANOS);
                ep.setUp();
                ep.id.connect(ConnectionParameters.DEFAULT);
                awaitCm(ep.channel, notifier, ep.event, CmEventType.ESTABLISHED, ep.id, TIMEOUT_NANOS);
                ep.exchangeInfo();
                return ep;
            } catch (RdmaException | RuntimeException e) {
                ep.close();
                throw e;
            }
        }

        static Endpoint accept(RdmaProvider provider, RdmaEventChannel channel, EventNotifier notifier, RdmaCmId id,
                               Settings settings, Queue<RdmaCmId> waitingRequests) throws RdmaException {
            Endpoint ep = new Endpoint(channel, false, notifier, settings, waitingRequests);
            ep.id = id;
            try {
                ep.setUp();
                id.accept(ConnectionParameters.DEFAULT);
                awaitCm(channel, notifier, ep.event, CmEventType.ESTABLISHED, id, TIMEOUT_NANOS);
                ep.exchangeInfo();
                return ep;
            } catch (RdmaException | RuntimeException e) {
                ep.close();
                throw e;
            }
        }

        /** Takes CM events until one of {@code type} for {@code id} (any id when null); fails on an error event. */
        static CmEvent awaitCm(RdmaEventChannel channel, EventNotifier notifier, CmEvent event, CmEventType type,
                               RdmaCmId id, long timeoutNanos) throws RdmaException {
            long deadline = System.nanoTime() + timeoutNanos;
            while (true) {
                while (!channel.poll(event)) {
                    long left = deadline - System.nanoTime();
                    if (timeoutNanos >= 0 && left <= 0) {
                        throw new RdmaException("timed out after " + TimeUnit.NANOSECONDS.toSeconds(timeoutNanos)
                                + " s waiting for the connection manager event " + type
                                + ": is an rdma-perf server listening there, on the same provider?");
                    }
                    notifier.await(timeoutNanos >= 0 ? left : TimeUnit.SECONDS.toNanos(1));
                }
                if (id != null && event.id() != id) {
                    continue; // a late event of an earlier connection
                }
                if (event.type() == type) {
                    return event;
                }
                if (event.type() == CmEventType.DISCONNECTED && type == CmEventType.CONNECT_REQUEST) {
                    continue;
                }
                throw new RdmaException("expected the connection manager event " + type + " but got " + event);
            }
        }

        private void setUp() throws RdmaException {
            lastProgress = System.nanoTime();
            pd = id.device().allocProtectionDomain();
            // From the domain: the soft provider's same-host path lets the peer reach it one-sided.
            data = pd.allocateMemory(settings.maxSize());
            dataMr = pd.register(data, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ);
            control = ByteBuffer.allocateDirect(64);
            controlMr = pd.register(control, Access.LOCAL_WRITE);
            int entries = Integer.highestOneBit(settings.sendDepth() + settings.recvDepth() + 8) << 1;
            cq = id.device().createCompletionQueue(Math.min(entries, id.device().attributes().maxCqe()), notifier);
            maxInline = Math.min(256, id.device().attributes().maxInlineData());
            qp = id.createQueuePair(pd, cq, cq, new QpCapabilities(settings.sendDepth(), settings.recvDepth(), 1, 1,
                    maxInline));
            maxInline = qp.capabilities().maxInlineData();
            for (int i = 0; i < settings.recvDepth(); i++) {
                postReceive(i);
            }
        }

        private void postReceive(long slot) throws RdmaException {
            rwr.reset().wrId(RECV_TAG | slot).addSge(dataMr.address(), data.capacity(), dataMr.lkey());
            qp.postRecv(rwr);
        }

        private void exchangeInfo() throws RdmaException {
            sendControl(INFO, settings.recvDepth(), dataMr.address(),
                    ((long) dataMr.rkey() << 32) | (data.capacity() & 0xFFFFFFFFL));
            takeControl(INFO);
            remoteAddress = ctrlA[ctrlHead];
            remoteRkey = (int) (ctrlB[ctrlHead] >>> 32);
            remoteLength = (int) ctrlB[ctrlHead];
            remoteRecvDepth = ctrlArg[ctrlHead];
            ctrlHead = (ctrlHead + 1) & 63;
            if (remoteLength <= 0 || remoteRecvDepth <= CONTROL_RESERVE) {
                throw new IllegalStateException("peer sent INFO with buffer length " + remoteLength
                        + " and receive depth " + remoteRecvDepth + " (expected: both positive)");
            }
        }

        /** Client: one BEGIN..DONE cycle; returns a row, or null for a warm-up ({@code path == null}). */
        PerfResult measure(PerfTest test, int size, long iterations, String path) throws RdmaException {
            if (iterations > Integer.MAX_VALUE || test.isLatency() && iterations > 50_000_000) {
                throw new IllegalArgumentException("iterations: " + iterations + " (expected: fewer)");
            }
            begin(test, size, iterations);
            long[] rtt = test.isLatency() ? new long[(int) iterations] : null;
            long cpu0 = CpuClock.processNanos();
            long start = System.nanoTime();
            switch (test) {
                case SEND_LAT:
                    for (int i = 0; i < iterations; i++) {
                        long t0 = System.nanoTime();
                        long expected = dataReceives + 1;
                        postSend(WrOpcode.SEND, size, true, settings.sendDepth());
                        while (dataReceives < expected) {
                            pollOrWait();
                        }
                        rtt[i] = System.nanoTime() - t0;
                    }
                    break;
                case SEND_BW:
                    for (long i = 0; i < iterations; i++) {
                        while (credits == 0) {
                            pollOrWait();
                        }
                        credits--;
                        postSend(WrOpcode.SEND, size, i == iterations - 1, settings.sendDepth());
                    }
                    break;
                case WRITE_BW:
                    for (long i = 0; i < iterations; i++) {
                        postSend(WrOpcode.RDMA_WRITE, size, i == iterations - 1, settings.sendDepth());
                    }
                    break;
                case READ_BW:
                    int readDepth = Math.min(settings.sendDepth(), ConnectionParameters.DEFAULT.initiatorDepth());
                    for (long i = 0; i < iterations; i++) {
                        postSend(WrOpcode.RDMA_READ, size, i == iterations - 1, readDepth);
                    }
                    break;
                default:
                    throw new AssertionError(test);
            }
            awaitSends(postedSends);
            long nanos = System.nanoTime() - start;
            long cpu = CpuClock.processNanos() - cpu0;
            long peerCpu = end();
            if (path == null) {
                return null;
            }
            if (rtt != null) {
                Arrays.sort(rtt);
            }
            long bytes = (long) size * iterations * (test.isLatency() ? 2 : 1);
            return PerfResult.of(test.id(), path, size, iterations, nanos, bytes, rtt, cpu,
                    path.endsWith("/remote") ? peerCpu : -1);
        }

        /** Client: announces one measurement and waits until the server is ready for it. */
        void begin(PerfTest test, int size, long iterations) throws RdmaException {
            sendControl(BEGIN, test.ordinal(), size, iterations);
            takeControl(READY);
            ctrlHead = (ctrlHead + 1) & 63;
            credits = remoteRecvDepth - CONTROL_RESERVE;
        }

        /** Client: ends the measurement, every data work request completed; returns the server's CPU nanoseconds. */
        long end() throws RdmaException {
            sendControl(END, 0, 0, 0);
            takeControl(DONE);
            long peerCpu = ctrlA[ctrlHead];
            ctrlHead = (ctrlHead + 1) & 63;
            return peerCpu;
        }

        /** Server: answers BEGIN..END cycles until QUIT. */
        void serveClient() throws RdmaException {
            while (true) {
                takeControl(-1);
                int type = ctrlType[ctrlHead];
                int arg = ctrlArg[ctrlHead];
                long size = ctrlA[ctrlHead];
                long iterations = ctrlB[ctrlHead];
                ctrlHead = (ctrlHead + 1) & 63;
                if (type == QUIT) {
                    awaitPeerDisconnect();
                    return;
                }
                if (type != BEGIN || arg < 0 || arg >= PerfTest.values().length || size <= 0
                        || size > data.capacity() || iterations <= 0 || iterations > Integer.MAX_VALUE) {
                    throw new IllegalStateException("bad control message from the client: type=" + type + ", test="
                            + arg + ", size=" + size + ", iterations=" + iterations + " (expected: BEGIN with test 0.."
                            + (PerfTest.values().length - 1) + ", size 1.." + data.capacity() + ")");
                }
                PerfTest test = PerfTest.values()[arg];
                long cpu0 = CpuClock.processNanos();
                sinceCredit = 0;
                // The first ping may land while READY's own completion is awaited: count from before READY.
                long received = dataReceives;
                sendControl(READY, 0, 0, 0);
                if (test == PerfTest.SEND_LAT) {
                    for (long i = 0; i < iterations; i++) {
                        while (dataReceives <= received + i) {
                            pollOrWait();
                            if (ctrlHead != ctrlTail) {
                                throw new IllegalStateException("control message in the middle of send_lat");
                            }
                        }
                        postSend(WrOpcode.SEND, (int) size, true, settings.sendDepth());
                    }
                }
                if (test.isOneSided()) {
                    awaitEndOfOneSidedPhase(test);
                }
                while (ctrlHead == ctrlTail) {
                    pollOrWait();
                    if (test == PerfTest.SEND_BW && sinceCredit >= settings.recvDepth() / 4) {
                        int n = sinceCredit;
                        sinceCredit = 0;
                        sendControl(CREDIT, n, 0, 0);
                    }
                }
                if (ctrlType[ctrlHead] != END) {
                    throw new IllegalStateException("bad control message from the client: type=" + ctrlType[ctrlHead]
                            + " (expected: END)");
                }
                ctrlHead = (ctrlHead + 1) & 63;
                awaitSends(postedSends);
                sendControl(DONE, 0, CpuClock.processNanos() - cpu0, 0);
            }
        }

        /**
         * Server, during write_bw and read_bw: the client's WRITEs and READs complete at the client only, so this side
         * is owed no completion until END, however long the phase lasts on a slow device, and the stall timeout would
         * drop a client that is working. It waits without one, and ends when END arrives, when the client's disconnect
         * flushes the receives posted here (poll throws), or when the connection manager reports the client gone. A
         * client whose host dies without a word is waited for, as perftest's server does.
         */
        private void awaitEndOfOneSidedPhase(PerfTest test) throws RdmaException {
            while (ctrlHead == ctrlTail) {
                if (poll() > 0) {
                    continue;
                }
                if (++idleSpins < SPINS) {
                    Thread.onSpinWait();
                    continue;
                }
                idleSpins = 0;
                takeConnectionEvents(test);
                cq.requestNotify();
                if (poll() == 0) {
                    notifier.await(TimeUnit.MILLISECONDS.toNanos(10));
                }
            }
        }

        /**
         * Server: takes the events of the shared event channel; one that ends this client's connection fails the
         * phase, connect requests of other clients wait for their turn, and the rest are late events of earlier
         * connections.
         */
        private void takeConnectionEvents(PerfTest test) throws RdmaException {
            while (channel.poll(event)) {
                CmEventType type = event.type();
                if (type == CmEventType.CONNECT_REQUEST) {
                    waitingRequests.add(event.id());
                } else if (event.id() == id && type == CmEventType.DISCONNECTED) {
                    throw new RdmaException("the client left during " + test.id() + " without END (" + event
                            + ")");
                }
            }
        }

        /**
         * After QUIT the client disconnects first (it still awaits QUIT's completion, which a disconnect from here
         * could turn into a flush error); its disconnect shows here as flushed receives.
         */
        private void awaitPeerDisconnect() {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (!peerGone && System.nanoTime() < deadline) {
                int n = cq.poll(wc);
                for (int i = 0; i < n; i++) {
                    if (wc.status(i) != WcStatus.SUCCESS) {
                        return;
                    }
                }
                if (n == 0) {
                    cq.requestNotify();
                    if (cq.poll(wc) == 0) {
                        notifier.await(TimeUnit.MILLISECONDS.toNanos(10));
                    } else if (wc.status(0) != WcStatus.SUCCESS) {
                        return;
                    }
                }
            }
        }

        /** Posts a data work request of {@code size} bytes at offset 0, waiting for room under {@code depth}. */
        private void postSend(int opcode, int size, boolean signal, int depth) throws RdmaException {
            while (postedSends - completedSends >= depth) {
                pollOrWait();
            }
            long wrId = postedSends;
            boolean signaled = signal || wrId % settings.signalInterval() == settings.signalInterval() - 1;
            int flags = signaled ? SendWorkRequest.SIGNALED : 0;
            if (size <= maxInline && opcode != WrOpcode.RDMA_READ) {
                flags |= SendWorkRequest.INLINE;
            }
            swr.reset().wrId(wrId).opcode(opcode).flags(flags).addSge(dataMr.address(), size, dataMr.lkey());
            if (opcode == WrOpcode.RDMA_WRITE || opcode == WrOpcode.RDMA_READ) {
                swr.remote(remoteAddress, remoteRkey);
            }
            qp.postSend(swr);
            postedSends++;
        }

        /** Sends a control message, signaled, and waits for its completion (its payload buffer is then free). */
        void sendControl(int type, int arg, long a, long b) throws RdmaException {
            while (postedSends - completedSends >= settings.sendDepth()) {
                pollOrWait();
            }
            long address = controlMr.address();
            scratch.putLong(0, a).putLong(8, b);
            DirectMemory.copyFromArray(scratch.array(), 0, address, 16);
            swr.reset().wrId(postedSends).opcode(WrOpcode.SEND_WITH_IMM)
                    .flags(SendWorkRequest.SIGNALED | (maxInline >= 16 ? SendWorkRequest.INLINE : 0))
                    .immData(type << 24 | (arg & 0xFFFFFF)).addSge(address, 16, controlMr.lkey());
            qp.postSend(swr);
            postedSends++;
            awaitSends(postedSends);
        }

        private void takeControl(int expectedType) throws RdmaException {
            while (ctrlHead == ctrlTail) {
                pollOrWait();
            }
            if (expectedType >= 0 && ctrlType[ctrlHead] != expectedType) {
                throw new IllegalStateException("control message type " + ctrlType[ctrlHead] + " from the peer"
                        + " (expected: " + expectedType + ")");
            }
        }

        private void awaitSends(long target) throws RdmaException {
            while (completedSends < target) {
                pollOrWait();
            }
        }

        /** Polls once; after a spin without progress, arms the queue and sleeps on the notifier. */
        private void pollOrWait() throws RdmaException {
            if (poll() > 0) {
                return;
            }
            if (++idleSpins < SPINS) {
                Thread.onSpinWait();
                return;
            }
            idleSpins = 0;
            cq.requestNotify();
            if (poll() > 0) {
                return;
            }
            notifier.await(TimeUnit.MILLISECONDS.toNanos(1));
            if (System.nanoTime() - lastProgress > settings.stallNanos()) {
                throw new RdmaException("no completion for " + TimeUnit.NANOSECONDS.toMillis(settings.stallNanos())
                        + " ms (posted sends " + postedSends + ", completed " + completedSends + ", data receives "
                        + dataReceives + "): the peer stopped answering");
            }
        }

        private int poll() throws RdmaException {
            int n = cq.poll(wc);
            if (n == 0) {
                return 0;
            }
            idleSpins = 0;
            lastProgress = System.nanoTime();
            for (int i = 0; i < n; i++) {
                if (wc.status(i) != WcStatus.SUCCESS) {
                    if (quitReceived && wc.status(i) == WcStatus.WR_FLUSH_ERR) {
                        // The client said QUIT and disconnected before this side took the message.
                        peerGone = true;
                        return n;
                    }
                    throw new RdmaException("work completion failed: " + wc.toString(i));
                }
                long wrId = wc.wrId(i);
                if ((wrId & RECV_TAG) == 0) {
                    // On RC a completion covers every earlier send, signaled or not.
                    completedSends = Math.max(completedSends, wrId + 1);
                    continue;
                }
                if (wc.hasImmediate(i)) {
                    onControl(wc.immData(i), wc.byteLength(i));
                } else {
                    dataReceives++;
                    sinceCredit++;
                }
                postReceive(wrId & ~RECV_TAG);
            }
            return n;
        }

        private void onControl(int imm, int length) {
            if (length != 16) {
                throw new IllegalStateException("control message of " + length + " bytes (expected: 16)");
            }
            int type = imm >>> 24;
            int arg = imm & 0xFFFFFF;
            if (type == CREDIT) {
                credits += arg;
                return;
            }
            quitReceived |= type == QUIT;
            if (((ctrlTail + 1) & 63) == ctrlHead) {
                throw new IllegalStateException("peer sent more than 63 unanswered control messages");
            }
            DirectMemory.copyToArray(dataMr.address(), scratch.array(), 0, 16);
            ctrlType[ctrlTail] = type;
            ctrlArg[ctrlTail] = arg;
            ctrlA[ctrlTail] = scratch.getLong(0);
            ctrlB[ctrlTail] = scratch.getLong(8);
            ctrlTail = (ctrlTail + 1) & 63;
        }

        @Override
        public void close() {
            if (id != null) {
                id.disconnect();
                if (qp != null) {
                    drainFlushes();
                    qp.close();
                }
            }
            if (cq != null) {
                cq.close();
            }
            if (dataMr != null) {
                dataMr.close();
            }
            if (data != null) {
                pd.freeMemory(data);
            }
            if (controlMr != null) {
                controlMr.close();
            }
            if (pd != null) {
                pd.close();
            }
            if (id != null) {
                id.close();
            }
            if (ownsChannel) {
                channel.close();
                notifier.close();
            }
        }

        // Disconnect flushes the posted receives; take those completions before the queue goes away.
        private void drainFlushes() {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
            int flushed = 0;
            while (flushed < settings.recvDepth() && System.nanoTime() < deadline) {
                int n = cq.poll(wc);
                if (n == 0) {
                    cq.requestNotify();
                    n = cq.poll(wc);
                    if (n == 0) {
                        notifier.await(TimeUnit.MILLISECONDS.toNanos(10));
                    }
                }
                flushed += n;
            }
        }
    }
}
