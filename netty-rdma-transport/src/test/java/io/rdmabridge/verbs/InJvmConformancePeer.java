package io.rdmabridge.verbs;

import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.FutureTask;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.BooleanSupplier;
import java.util.zip.CRC32;

/**
 * A {@link ConformancePeer} on a thread of its own in this JVM. That thread owns every verbs object of the peer (as
 * the SPI's threading rule demands): callers hand it commands through a queue and wake it with its
 * {@link EventNotifier}, which its event channel and completion queues signal as well. {@link ConformancePeerMain}
 * runs the same class in a child JVM for the cross-process mode.
 */
final class InJvmConformancePeer implements ConformancePeer {
    private static final long CONN_WAIT_MILLIS = 10_000;
    private static final long COMMAND_TIMEOUT_MILLIS = 60_000;
    private static final long ECHO_TAG = 1L << 41;
    private static final int CQ_ENTRIES = 32768;
    /** A provider may destroy a resource on its own thread shortly after the close returned (DiSNI's queues). */
    private static final Duration RELEASE_PATIENCE = Duration.ofSeconds(5);

    private final RdmaProvider provider;
    private final EventNotifier notifier = new EventNotifier();
    private final ConcurrentLinkedQueue<FutureTask<?>> commands = new ConcurrentLinkedQueue<>();
    private final Thread thread;
    private volatile boolean running = true;

    // Owned by the peer thread.
    private final WorkCompletions wc = new WorkCompletions(256);
    private final CmEvent event = new CmEvent();
    private final SendWorkRequest sendWr = new SendWorkRequest(8);
    private final RecvWorkRequest recvWr = new RecvWorkRequest(8);
    private final List<Waiter> waiters = new ArrayList<>();
    private final List<Conn> conns = new ArrayList<>();
    private final Map<Integer, Conn> connsByQp = new HashMap<>();
    private final List<PeerRegion> regions = new ArrayList<>();
    private final List<byte[]> requests = new ArrayList<>();
    private Config config;
    private RdmaEventChannel channel;
    private RdmaCmId listener;
    private ProtectionDomain pd;
    private CompletionQueue sendCq;
    private CompletionQueue recvCq;
    private byte[] gather = new byte[0];

    InJvmConformancePeer(RdmaProvider provider) {
        this.provider = provider;
        thread = new Thread(this::loop, "conformance-peer-" + provider.name());
        thread.setDaemon(true);
        thread.start();
    }

    /** Per connection: its id, queue pair, receive slots and what it saw. */
    private static final class Conn {
        final int index;
        final RdmaCmId id;
        QueuePair qp;
        PeerRegion slots;
        boolean[] slotPosted;
        final ArrayDeque<Completion> completions = new ArrayDeque<>();
        final List<PeerRegion> sendRegions = new ArrayList<>();
        Config config;
        boolean established;
        boolean disconnected;

        Conn(int index, RdmaCmId id) {
            this.index = index;
            this.id = id;
        }
    }

    private static final class PeerRegion {
        final ByteBuffer buffer;
        final int guard;
        MemoryRegion mr;

        PeerRegion(ByteBuffer buffer, int guard) {
            this.buffer = buffer;
            this.guard = guard;
        }

        long address() {
            return DirectMemory.address(buffer) + guard;
        }
    }

    /** A command that completes only once a condition holds on the peer thread, or its deadline passes. */
    private static final class Waiter {
        final BooleanSupplier condition;
        final long deadline;
        final FutureTask<?> done;

        Waiter(BooleanSupplier condition, long deadline, FutureTask<?> done) {
            this.condition = condition;
            this.deadline = deadline;
            this.done = done;
        }
    }

    // ---- commands (any thread) ----

    private <T> T call(Callable<T> command) throws Exception {
        FutureTask<T> task = new FutureTask<>(command);
        return submit(task, COMMAND_TIMEOUT_MILLIS);
    }

    private <T> T submit(FutureTask<T> task, long timeoutMillis) throws Exception {
        if (!running) {
            throw new IllegalStateException("conformance peer closed");
        }
        commands.add(task);
        notifier.signal();
        try {
            return task.get(timeoutMillis, TimeUnit.MILLISECONDS);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof Exception) {
                throw (Exception) cause;
            }
            throw e;
        } catch (TimeoutException e) {
            throw new TimeoutException("conformance peer did not answer within " + timeoutMillis + " ms");
        }
    }

    /** Runs {@code command} on the peer thread once {@code condition} holds there, or once {@code timeout} passes. */
    private <T> T callWhen(BooleanSupplier condition, long timeoutMillis, Callable<T> command) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMillis);
        FutureTask<T> result = new FutureTask<>(command);
        FutureTask<Void> register = new FutureTask<>(() -> {
            waiters.add(new Waiter(condition, deadline, result));
            return null;
        });
        submit(register, COMMAND_TIMEOUT_MILLIS);
        try {
            return result.get(timeoutMillis + COMMAND_TIMEOUT_MILLIS, TimeUnit.MILLISECONDS);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof Exception) {
                throw (Exception) cause;
            }
            throw e;
        }
    }

    @Override
    public int listen(String host, Config config) throws Exception {
        return call(() -> {
            if (channel != null) {
                throw new IllegalStateException("already listening: reset() first");
            }
            this.config = config;
            channel = provider.createEventChannel(notifier);
            listener = channel.createId();
            InetSocketAddress bound = listener.listen(new InetSocketAddress(host, 0), 128);
            RdmaDevice device = listener.device();
            pd = device.allocProtectionDomain();
            int entries = Math.min(CQ_ENTRIES, device.attributes().maxCqe());
            sendCq = device.createCompletionQueue(entries, notifier);
            recvCq = device.createCompletionQueue(entries, notifier);
            return bound.getPort();
        });
    }

    @Override
    public void configure(Config config) throws Exception {
        call(() -> {
            this.config = config;
            return null;
        });
    }

    @Override
    public List<byte[]> connectRequests() throws Exception {
        return call(() -> List.copyOf(requests));
    }

    @Override
    public Region register(long length, int access, int guard) throws Exception {
        return call(() -> {
            // Through the domain, as the channel allocates: the provider may share it with a same-host peer.
            ByteBuffer buffer = pd.allocateMemory(Math.toIntExact(length + 2L * guard));
            PeerRegion r = new PeerRegion(buffer, guard);
            r.mr = pd.register(r.address(), length, access);
            regions.add(r);
            return new Region(regions.size() - 1, r.mr.address(), r.mr.rkey(), length, guard);
        });
    }

    @Override
    public void fill(int region, long seed) throws Exception {
        call(() -> {
            TestPattern.fill(regions.get(region).buffer.duplicate().clear(), seed, 0);
            return null;
        });
    }

    @Override
    public long checksum(int region, long offset, long length) throws Exception {
        return call(() -> {
            PeerRegion r = regions.get(region);
            return TestPattern.crc(r.buffer, r.guard + offset, length);
        });
    }

    @Override
    public void deregister(int region) throws Exception {
        call(() -> {
            regions.get(region).mr.close();
            return null;
        });
    }

    @Override
    public void postRecvs(int conn, int count) throws Exception {
        callWhen(() -> conns.size() > conn, CONN_WAIT_MILLIS, () -> {
            Conn c = conn(conn);
            int posted = 0;
            for (int slot = 0; slot < c.slotPosted.length && posted < count; slot++) {
                if (!c.slotPosted[slot]) {
                    postSlot(c, slot);
                    posted++;
                }
            }
            if (posted < count) {
                throw new IllegalStateException("connection " + conn + ": only " + posted + " of " + count
                        + " receive slots were free (expected: raise Config.recvSlots)");
            }
            return null;
        });
    }

    @Override
    public void send(int conn, int count, int size, long seed, int opcode, int imm) throws Exception {
        callWhen(() -> conns.size() > conn && conns.get(conn).established, CONN_WAIT_MILLIS, () -> {
            Conn c = conn(conn);
            ByteBuffer buffer = ByteBuffer.allocateDirect(Math.max(1, count * size));
            PeerRegion r = new PeerRegion(buffer, 0);
            for (int i = 0; i < count; i++) {
                TestPattern.fill(buffer.duplicate().position(i * size).limit((i + 1) * size),
                        TestPattern.messageSeed(seed, i), 0);
            }
            r.mr = pd.register(r.address(), buffer.capacity(), 0);
            c.sendRegions.add(r);
            for (int i = 0; i < count; i++) {
                sendWr.reset().wrId(SEND_TAG + i).opcode(opcode).flags(SendWorkRequest.SIGNALED).immData(imm + i)
                        .addSge(r.address() + (long) i * size, size, r.mr.lkey());
                c.qp.postSend(sendWr);
            }
            return null;
        });
    }

    @Override
    public List<Completion> takeCompletions(int conn, int min, long timeoutMillis) throws Exception {
        return callWhen(() -> conns.size() > conn && conns.get(conn).completions.size() >= min, timeoutMillis, () -> {
            if (conns.size() <= conn) {
                return List.of();
            }
            Conn c = conns.get(conn);
            List<Completion> out = new ArrayList<>(c.completions);
            c.completions.clear();
            return out;
        });
    }

    @Override
    public boolean awaitDisconnected(int conn, long timeoutMillis) throws Exception {
        return callWhen(() -> conns.size() > conn && conns.get(conn).disconnected, timeoutMillis,
                () -> conns.size() > conn && conns.get(conn).disconnected);
    }

    @Override
    public InetSocketAddress remoteAddress(int conn) throws Exception {
        return callWhen(() -> conns.size() > conn, CONN_WAIT_MILLIS, () -> conn(conn).id.remoteAddress());
    }

    @Override
    public QpState qpState(int conn) throws Exception {
        return callWhen(() -> conns.size() > conn, CONN_WAIT_MILLIS, () -> conn(conn).qp.state());
    }

    @Override
    public void disconnect(int conn) throws Exception {
        callWhen(() -> conns.size() > conn, CONN_WAIT_MILLIS, () -> {
            conn(conn).id.disconnect();
            return null;
        });
    }

    @Override
    public void destroy(int conn) throws Exception {
        callWhen(() -> conns.size() > conn, CONN_WAIT_MILLIS, () -> {
            Conn c = conn(conn);
            c.qp.close();
            c.id.close();
            return null;
        });
    }

    @Override
    public Usage reset() throws Exception {
        return call(() -> {
            release();
            ResourceUsage usage = provider.resourceUsage();
            return new Usage(usage.awaitZero(RELEASE_PATIENCE), usage.toString());
        });
    }

    @Override
    public boolean canDie() {
        return false;
    }

    @Override
    public void kill() {
        throw new UnsupportedOperationException("an in-JVM peer cannot die abruptly; use the provider's fault hooks");
    }

    @Override
    public boolean isAlive() {
        return running && thread.isAlive();
    }

    @Override
    public void close() {
        if (!running) {
            return;
        }
        try {
            reset();
        } catch (Exception e) {
            System.err.println("conformance peer: reset on close failed: " + e);
        }
        running = false;
        notifier.signal();
        try {
            thread.join(10_000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    // ---- peer thread ----

    private Conn conn(int index) {
        if (index >= conns.size()) {
            throw new IllegalStateException("connection " + index + " was never accepted (accepted: " + conns.size()
                    + ")");
        }
        return conns.get(index);
    }

    private void loop() {
        while (running) {
            try {
                boolean progress = runCommands();
                progress |= pollEvents();
                progress |= pollCompletions(sendCq);
                progress |= pollCompletions(recvCq);
                checkWaiters();
                if (!progress && commands.isEmpty()) {
                    if (sendCq != null) {
                        sendCq.requestNotify();
                        recvCq.requestNotify();
                        if (pollCompletions(sendCq) | pollCompletions(recvCq)) {
                            continue;
                        }
                    }
                    // Bounded so that waiters' deadlines are honoured even when nothing happens.
                    notifier.await(waiters.isEmpty() ? 1_000_000_000L : 20_000_000L);
                }
            } catch (Throwable t) {
                // The peer must survive a failed step: report it and keep serving commands.
                System.err.println("conformance peer: " + t);
                t.printStackTrace();
            }
        }
    }

    private boolean runCommands() {
        boolean any = false;
        FutureTask<?> task;
        while ((task = commands.poll()) != null) {
            task.run();
            any = true;
        }
        return any;
    }

    private void checkWaiters() {
        for (int i = 0; i < waiters.size(); i++) {
            Waiter w = waiters.get(i);
            if (w.condition.getAsBoolean() || System.nanoTime() - w.deadline >= 0) {
                waiters.remove(i--);
                w.done.run();
            }
        }
    }

    private boolean pollEvents() throws RdmaException {
        if (channel == null) {
            return false;
        }
        boolean any = false;
        while (channel.poll(event)) {
            any = true;
            switch (event.type()) {
                case CONNECT_REQUEST:
                    onConnectRequest(event.id(), event.privateData());
                    break;
                case ESTABLISHED:
                    if (event.id().attachment() instanceof Conn) {
                        ((Conn) event.id().attachment()).established = true;
                    }
                    break;
                case DISCONNECTED:
                    if (event.id().attachment() instanceof Conn) {
                        ((Conn) event.id().attachment()).disconnected = true;
                    }
                    break;
                default:
                    System.err.println("conformance peer: " + event);
                    if (event.id() != null && event.id().attachment() instanceof Conn) {
                        ((Conn) event.id().attachment()).disconnected = true;
                    }
                    break;
            }
        }
        return any;
    }

    private void onConnectRequest(RdmaCmId id, byte[] privateData) throws RdmaException {
        requests.add(privateData.clone());
        Config cfg = config;
        if (cfg.reject()) {
            id.reject(cfg.replyPrivateData());
            id.close();
            return;
        }
        Conn c = new Conn(conns.size(), id);
        c.config = cfg;
        id.attach(c);
        DeviceAttributes limits = id.device().attributes();
        int slots = Math.max(1, cfg.recvSlots());
        int maxWr = Math.min(limits.maxQpWr(), Math.max(1024, slots));
        int maxSge = Math.min(limits.maxSge(), 8);
        c.qp = id.createQueuePair(pd, sendCq, recvCq, new QpCapabilities(maxWr, maxWr, maxSge, maxSge,
                Math.min(64, limits.maxInlineData())));
        int slotBytes = cfg.recvSges() * (cfg.recvSize() / cfg.recvSges() + cfg.recvSize() % cfg.recvSges() + 64);
        PeerRegion r = new PeerRegion(ByteBuffer.allocateDirect(Math.max(1, slots * slotBytes)), 0);
        r.mr = pd.register(r.address(), r.buffer.capacity(), Access.LOCAL_WRITE);
        c.slots = r;
        c.slotPosted = new boolean[slots];
        gather = gather.length >= cfg.recvSize() ? gather : new byte[cfg.recvSize()];
        conns.add(c);
        connsByQp.put(c.qp.qpNumber(), c);
        for (int i = 0; i < Math.min(cfg.prepost(), cfg.recvSlots()); i++) {
            postSlot(c, i);
        }
        id.accept(ConnectionParameters.DEFAULT.withPrivateData(cfg.replyPrivateData())
                .withRnrRetryCount(cfg.rnrRetryCount()));
    }

    /** Scatter entry {@code j} of a slot: entries lie in reverse order with 64-byte gaps. */
    private static long sgeAddress(Conn c, int slot, int j) {
        Config cfg = c.config;
        int part = cfg.recvSize() / cfg.recvSges();
        int stride = part + cfg.recvSize() % cfg.recvSges() + 64;
        long slotBase = c.slots.address() + (long) slot * cfg.recvSges() * stride;
        return slotBase + (long) (cfg.recvSges() - 1 - j) * stride;
    }

    private static int sgeLength(Conn c, int j) {
        Config cfg = c.config;
        int part = cfg.recvSize() / cfg.recvSges();
        return j == cfg.recvSges() - 1 ? part + cfg.recvSize() % cfg.recvSges() : part;
    }

    private void postSlot(Conn c, int slot) throws RdmaException {
        recvWr.reset().wrId(slot);
        for (int j = 0; j < c.config.recvSges(); j++) {
            recvWr.addSge(sgeAddress(c, slot, j), sgeLength(c, j), c.slots.mr.lkey());
        }
        c.qp.postRecv(recvWr);
        c.slotPosted[slot] = true;
    }

    private boolean pollCompletions(CompletionQueue cq) throws RdmaException {
        if (cq == null) {
            return false;
        }
        boolean any = false;
        int n;
        while ((n = cq.poll(wc)) > 0) {
            any = true;
            for (int i = 0; i < n; i++) {
                onCompletion(cq == recvCq, i);
            }
        }
        return any;
    }

    private void onCompletion(boolean recv, int i) throws RdmaException {
        Conn c = connsByQp.get(wc.qpNumber(i));
        if (c == null) {
            System.err.println("conformance peer: completion for an unknown queue pair: " + wc.toString(i));
            return;
        }
        long wrId = wc.wrId(i);
        int status = wc.status(i);
        if (!recv && (wrId & ECHO_TAG) != 0) {
            int slot = (int) (wrId & ~ECHO_TAG);
            c.slotPosted[slot] = false;
            if (status == WcStatus.SUCCESS) {
                postSlot(c, slot);
                return;
            }
            c.completions.add(new Completion(false, wrId, status, wc.opcode(i), wc.byteLength(i), false, 0, 0, 0));
            return;
        }
        long crc = 0;
        long head = 0;
        if (recv) {
            int slot = (int) wrId;
            c.slotPosted[slot] = false;
            if (status == WcStatus.SUCCESS && wc.opcode(i) == WcOpcode.RECV) {
                int len = Math.min(wc.byteLength(i), c.config.recvSize());
                gatherSlot(c, slot, len);
                CRC32 crc32 = new CRC32();
                crc32.update(gather, 0, len);
                crc = crc32.getValue();
                if (len >= 8) {
                    head = ByteBuffer.wrap(gather, 0, 8).order(ByteOrder.LITTLE_ENDIAN).getLong();
                }
                if (c.config.echo()) {
                    echo(c, slot, len, wc.hasImmediate(i), wc.immData(i));
                } else if (c.config.autoRepost()) {
                    postSlot(c, slot);
                }
            } else if (status == WcStatus.SUCCESS && c.config.autoRepost()) {
                postSlot(c, slot);
            }
        }
        c.completions.add(new Completion(recv, wrId, status, wc.opcode(i), wc.byteLength(i), wc.hasImmediate(i),
                wc.immData(i), crc, head));
    }

    private void gatherSlot(Conn c, int slot, int len) {
        int done = 0;
        for (int j = 0; done < len; j++) {
            int n = Math.min(sgeLength(c, j), len - done);
            DirectMemory.copyToArray(sgeAddress(c, slot, j), gather, done, n);
            done += n;
        }
    }

    private void echo(Conn c, int slot, int len, boolean hasImm, int imm) throws RdmaException {
        sendWr.reset().wrId(ECHO_TAG | slot).flags(SendWorkRequest.SIGNALED)
                .opcode(hasImm ? WrOpcode.SEND_WITH_IMM : WrOpcode.SEND).immData(imm);
        int done = 0;
        for (int j = 0; done < len; j++) {
            int n = Math.min(sgeLength(c, j), len - done);
            sendWr.addSge(sgeAddress(c, slot, j), n, c.slots.mr.lkey());
            done += n;
        }
        // The slot stays taken until the echo's completion reposts it.
        c.slotPosted[slot] = true;
        c.qp.postSend(sendWr);
    }

    /** Destroys everything in dependency order: queue pairs, ids, regions, domain, queues, channel. */
    private void release() {
        for (Conn c : conns) {
            c.qp.close();
            c.id.close();
            c.slots.mr.close();
            for (PeerRegion r : c.sendRegions) {
                r.mr.close();
            }
        }
        conns.clear();
        connsByQp.clear();
        for (PeerRegion r : regions) {
            r.mr.close();
            pd.freeMemory(r.buffer);
        }
        regions.clear();
        requests.clear();
        if (listener != null) {
            listener.close();
            listener = null;
        }
        if (pd != null) {
            pd.close();
            pd = null;
        }
        // Each queue is closed on its own: a setup that failed half-way may have created only the first.
        if (sendCq != null) {
            sendCq.close();
            sendCq = null;
        }
        if (recvCq != null) {
            recvCq.close();
            recvCq = null;
        }
        if (channel != null) {
            channel.close();
            channel = null;
        }
        notifier.close();
        for (Waiter w : waiters) {
            w.done.cancel(false);
        }
        waiters.clear();
    }
}
