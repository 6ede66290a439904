package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.fail;

import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * The local end of a conformance test, driven by the test thread, which owns every verbs object made here (the SPI's
 * threading rule). It tracks what it creates and destroys all of it in {@link #close()}, in dependency order.
 *
 * <p>Every wait has a deadline and fails naming what it waited for; waits follow the arm/poll/await pattern of
 * {@link CompletionQueue}'s javadoc with the whole remaining time, so a provider that loses a wake-up fails here
 * instead of being papered over by a short polling interval.
 */
final class LocalEnd implements AutoCloseable {
    final RdmaProvider provider;
    final EventNotifier notifier = new EventNotifier();
    final RdmaEventChannel channel;

    private final CmEvent event = new CmEvent();
    private final ArrayDeque<Cm> pending = new ArrayDeque<>();
    private final Map<RdmaDevice, ProtectionDomain> pds = new HashMap<>();
    private final List<Connection> connections = new ArrayList<>();
    private final List<RdmaCmId> ids = new ArrayList<>();
    private final List<CompletionQueue> cqs = new ArrayList<>();
    private final List<MemoryRegion> regions = new ArrayList<>();
    /** Memory from {@link ProtectionDomain#allocateMemory}, given back after the regions are closed. */
    private final List<Buffer> buffers = new ArrayList<>();
    private final WorkCompletions wc = new WorkCompletions(512);
    /** Completions polled from a queue beyond what a caller asked for, handed out first next time. */
    private final Map<CompletionQueue, ArrayDeque<Wc>> backlog = new HashMap<>();

    LocalEnd(RdmaProvider provider) throws RdmaException {
        this.provider = provider;
        channel = provider.createEventChannel(notifier);
    }

    /** A copy of one CM event (the {@link CmEvent} holder is reused). */
    record Cm(CmEventType type, RdmaCmId id, RdmaCmId listenId, byte[] privateData, int status, String detail) {
        @Override
        public String toString() {
            return type + (detail != null ? "(" + detail + ")" : "") + (status != 0 ? " status=" + status : "")
                    + " privateData=" + privateData.length + "B";
        }
    }

    /** A copy of one work completion. */
    record Wc(long wrId, int status, int opcode, int byteLength, int qpNumber, boolean hasImm, int imm,
              int vendorError) {
        @Override
        public String toString() {
            return "wc{wrId=" + wrId + ", " + WcStatus.name(status) + ", " + WcOpcode.name(opcode) + ", byteLen="
                    + byteLength + ", qp=" + qpNumber + (hasImm ? ", imm=0x" + Integer.toHexString(imm) : "")
                    + (vendorError != 0 ? ", vendorErr=" + vendorError : "") + '}';
        }
    }

    /** A direct buffer and the region registered over it. */
    record Buffer(ByteBuffer buf, MemoryRegion mr) {
        long address() {
            return mr.address();
        }

        int lkey() {
            return mr.lkey();
        }
    }

    /** One connected (or connecting) active-side id with its queue pair and completion queues. */
    static final class Connection {
        final RdmaCmId id;
        final QueuePair qp;
        final CompletionQueue sendCq;
        final CompletionQueue recvCq;
        Cm established;
        /** The peer's number for this connection ({@link ConformancePeer}), or -1. */
        int peerIndex = -1;

        Connection(RdmaCmId id, QueuePair qp, CompletionQueue sendCq, CompletionQueue recvCq) {
            this.id = id;
            this.qp = qp;
            this.sendCq = sendCq;
            this.recvCq = recvCq;
        }
    }

    // ---- resources ----

    ProtectionDomain pd(RdmaDevice device) throws RdmaException {
        ProtectionDomain pd = pds.get(device);
        if (pd == null) {
            pd = device.allocProtectionDomain();
            pds.put(device, pd);
        }
        return pd;
    }

    RdmaDevice defaultDevice() throws RdmaException {
        return connections.isEmpty() ? provider.devices().get(0) : connections.get(0).id.device();
    }

    Buffer register(RdmaDevice device, int size, int access) throws RdmaException {
        // Through the domain, as the channel allocates: the provider may share it with a same-host peer.
        ProtectionDomain pd = pd(device);
        ByteBuffer buf = pd.allocateMemory(size);
        MemoryRegion mr;
        try {
            mr = pd.register(buf, access);
        } catch (RdmaException | RuntimeException e) {
            pd.freeMemory(buf);
            throw e;
        }
        regions.add(mr);
        Buffer b = new Buffer(buf, mr);
        buffers.add(b);
        return b;
    }

    Buffer register(Connection c, int size, int access) throws RdmaException {
        return register(c.id.device(), size, access);
    }

    CompletionQueue newCq(RdmaDevice device, int entries) throws RdmaException {
        CompletionQueue cq = device.createCompletionQueue(Math.min(entries, device.attributes().maxCqe()), notifier);
        cqs.add(cq);
        return cq;
    }

    /** Capabilities of {@code sendWr}/{@code recvWr} work requests, 4 entries, 64 bytes inline, within the device. */
    static QpCapabilities caps(RdmaDevice device, int sendWr, int recvWr) {
        DeviceAttributes a = device.attributes();
        return new QpCapabilities(Math.min(sendWr, a.maxQpWr()), Math.min(recvWr, a.maxQpWr()), Math.min(4, a.maxSge()),
                Math.min(4, a.maxSge()), Math.min(64, a.maxInlineData()));
    }

    /** Destroys {@code id} with this end (an id handed over by a CONNECT_REQUEST). */
    RdmaCmId track(RdmaCmId id) {
        ids.add(id);
        return id;
    }

    RdmaCmId newId() throws RdmaException {
        RdmaCmId id = channel.createId();
        ids.add(id);
        return id;
    }

    // ---- connection management ----

    /** Resolves {@code remote} and waits for ADDR_RESOLVED. */
    RdmaCmId resolve(InetSocketAddress remote) throws Exception {
        RdmaCmId id = newId();
        id.resolve(remote, 5_000);
        awaitCm(id, CmEventType.ADDR_RESOLVED, 10_000);
        return id;
    }

    /** Resolves, creates a queue pair with its own completion queues, and starts connecting. */
    Connection startConnect(InetSocketAddress remote, ConnectionParameters params, int sendWr, int recvWr)
            throws Exception {
        RdmaCmId id = resolve(remote);
        return startConnect(id, params, sendWr, recvWr, null, null);
    }

    Connection startConnect(RdmaCmId id, ConnectionParameters params, int sendWr, int recvWr,
                            CompletionQueue sendCq, CompletionQueue recvCq) throws Exception {
        Connection c = createQueuePair(id, sendWr, recvWr, sendCq, recvCq);
        id.connect(params);
        return c;
    }

    /** Creates a queue pair on a resolved id (state INIT), with its own completion queues unless given. */
    Connection createQueuePair(RdmaCmId id, int sendWr, int recvWr, CompletionQueue sendCq, CompletionQueue recvCq)
            throws RdmaException {
        RdmaDevice device = id.device();
        QpCapabilities caps = caps(device, sendWr, recvWr);
        CompletionQueue scq = sendCq != null ? sendCq : newCq(device, caps.maxSendWr());
        CompletionQueue rcq = recvCq != null ? recvCq : newCq(device, caps.maxRecvWr());
        QueuePair qp = id.createQueuePair(pd(device), scq, rcq, caps);
        Connection c = new Connection(id, qp, scq, rcq);
        connections.add(c);
        return c;
    }

    /** Connects and waits for ESTABLISHED. */
    Connection connect(InetSocketAddress remote, ConnectionParameters params, int sendWr, int recvWr)
            throws Exception {
        Connection c = startConnect(remote, params, sendWr, recvWr);
        c.established = awaitCm(c.id, CmEventType.ESTABLISHED, 10_000);
        return c;
    }

    /** Takes every CM event available now into the pending list. */
    private void drainEvents() {
        while (channel.poll(event)) {
            pending.add(new Cm(event.type(), event.id(), event.listenId(), event.privateData().clone(),
                    event.status(), event.detail()));
        }
    }

    /** The next event about {@code id} (any type), within {@code timeoutMillis}. */
    Cm nextCm(RdmaCmId id, long timeoutMillis) {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMillis);
        while (true) {
            drainEvents();
            for (Iterator<Cm> it = pending.iterator(); it.hasNext(); ) {
                Cm cm = it.next();
                if (cm.id() == id || cm.listenId() == id) {
                    it.remove();
                    return cm;
                }
            }
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                fail("no CM event for " + id + " within " + timeoutMillis + " ms (events for other ids: " + pending
                        + ")");
            }
            notifier.await(left);
        }
    }

    /** The next event about {@code id}, which must be of type {@code expected}. */
    Cm awaitCm(RdmaCmId id, CmEventType expected, long timeoutMillis) {
        Cm cm = nextCm(id, timeoutMillis);
        if (cm.type() != expected) {
            fail("expected CM event " + expected + " but got " + cm);
        }
        return cm;
    }

    // ---- completions ----

    /** Exactly {@code n} completions from {@code cq} within {@code timeoutMillis}, or fails naming what arrived. */
    List<Wc> poll(CompletionQueue cq, int n, long timeoutMillis) {
        List<Wc> out = new ArrayList<>(n);
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMillis);
        while (out.size() < n) {
            if (pollInto(cq, out, n) > 0) {
                continue;
            }
            cq.requestNotify();
            if (pollInto(cq, out, n) > 0) {
                continue;
            }
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                int late = pollInto(cq, out, n);
                fail("waited " + timeoutMillis + " ms for " + n + " completions, got " + (out.size() - late)
                        + (late > 0 ? " (and " + late + " more that arrived without a notifier signal)" : "")
                        + ": " + summary(out));
            }
            notifier.await(left);
        }
        return out;
    }

    /** Completions that arrive within {@code millis} (used to prove that nothing more arrives). */
    List<Wc> pollFor(CompletionQueue cq, long millis) {
        List<Wc> out = new ArrayList<>();
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
        while (true) {
            pollInto(cq, out, Integer.MAX_VALUE);
            cq.requestNotify();
            pollInto(cq, out, Integer.MAX_VALUE);
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                return out;
            }
            notifier.await(left);
        }
    }

    /** Moves completions into {@code out} until it holds {@code max}; extras wait in the backlog. */
    private int pollInto(CompletionQueue cq, List<Wc> out, int max) {
        ArrayDeque<Wc> extra = backlog.computeIfAbsent(cq, k -> new ArrayDeque<>());
        int total = 0;
        while (out.size() < max) {
            if (extra.isEmpty()) {
                int n = cq.poll(wc);
                if (n == 0) {
                    break;
                }
                for (int i = 0; i < n; i++) {
                    extra.add(new Wc(wc.wrId(i), wc.status(i), wc.opcode(i), wc.byteLength(i), wc.qpNumber(i),
                            wc.hasImmediate(i), wc.immData(i), wc.vendorError(i)));
                }
            }
            out.add(extra.poll());
            total++;
        }
        return total;
    }

    /** The first completion and counts by status, for failure messages. */
    static String summary(List<Wc> list) {
        if (list.isEmpty()) {
            return "[]";
        }
        Map<String, Integer> byStatus = new HashMap<>();
        for (Wc w : list) {
            byStatus.merge(WcStatus.name(w.status()), 1, Integer::sum);
        }
        return "first " + list.get(0) + ", by status " + byStatus;
    }

    /** Asserts one completion's status by name, so a failure reads {@code expected REM_ACCESS_ERR but was ...}. */
    static void assertStatus(int expected, Wc wc) {
        assertEquals(WcStatus.name(expected), WcStatus.name(wc.status()), () -> "completion " + wc);
    }

    static byte[] bytes(ByteBuffer buf, int index, int length) {
        byte[] out = new byte[length];
        buf.duplicate().position(index).get(out);
        return out;
    }

    static String hexHead(byte[] b) {
        return Arrays.toString(Arrays.copyOf(b, Math.min(16, b.length)));
    }

    /** Destroys everything: queue pairs, ids, completion queues, regions, domains, the channel. */
    @Override
    public void close() {
        // Keep going after a failure so that one bad close does not leak everything after it.
        List<Throwable> failures = new ArrayList<>();
        for (Connection c : connections) {
            closeAndRecord(c.qp, failures);
        }
        for (RdmaCmId id : ids) {
            closeAndRecord(id, failures);
        }
        for (CompletionQueue cq : cqs) {
            closeAndRecord(cq, failures);
        }
        for (MemoryRegion mr : regions) {
            closeAndRecord(mr, failures);
        }
        for (Buffer b : buffers) {
            b.mr().protectionDomain().freeMemory(b.buf());
        }
        buffers.clear();
        for (ProtectionDomain pd : pds.values()) {
            closeAndRecord(pd, failures);
        }
        closeAndRecord(channel, failures);
        closeAndRecord(notifier, failures);
        if (!failures.isEmpty()) {
            IllegalStateException e = new IllegalStateException("closing the local end failed: " + failures);
            failures.forEach(e::addSuppressed);
            throw e;
        }
    }

    private static void closeAndRecord(AutoCloseable c, List<Throwable> failures) {
        try {
            c.close();
        } catch (Throwable t) {
            failures.add(t);
        }
    }
}
