package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.ResourceUsage;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.NetworkInterface;
import java.net.SocketException;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.util.Iterator;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The JVM-wide state of the software device: the memory-key tables, the in-JVM listener registry,
 * the live links, the resource counters and the two provider threads.
 *
 * <h2>Threads</h2>
 * <ul>
 *   <li>{@code soft-rdma-engine}: one NIO {@link Selector} for every TCP listener and connection of the JVM. It
 *       accepts, runs handshakes, reads frames and executes them against registered memory, and writes when a
 *       socket that was full becomes writable. Other threads hand it work with {@link #execute(Runnable)}. While
 *       same-host links read {@link ShmRing}s, it polls them between non-blocking selects for
 *       {@value #RING_SPIN_PROPERTY} after the last frame, then parks them (flag, fence, last look) and blocks in
 *       {@code select()} until a DOORBELL, a socket event or a task wakes it, or {@link #PARK_MILLIS} pass; the poll
 *       allocates nothing. Threads polling the queue pairs' completion queues execute ring frames too
 *       ({@link TcpLink#progress}); the engine executes what they leave. A poller asleep on a ring with a wake socket
 *       of its own keeps the parked flag: the peer wakes it directly, and the engine leaves that flag alone.</li>
 *   <li>{@code soft-rdma-timer}: receiver-not-ready retries, injected send delays, connect and handshake
 *       timeouts.</li>
 * </ul>
 * Both are daemon threads started on first use. Thread-safe.
 */
final class SoftEngine {
    static final Logger logger = LoggerFactory.getLogger("io.rdmabridge.verbs.soft");

    private static volatile SoftEngine instance;

    final ResourceUsage usage = new ResourceUsage();
    final SoftFaults faults = new SoftFaults(this);
    /** Every live region's lkey and rkey (one key per region, as mlx5 has it). */
    final MemoryKeyTable keys = new MemoryKeyTable();
    /** Registered memory a same-host peer can map, and the same-host test of the handshake. */
    final SharedMemoryFiles sharedMemory = new SharedMemoryFiles();
    /** The second thread of large one-sided copies on the same-host path. */
    final CopyHelper copyHelper = new CopyHelper();
    /** Listening ids by bound port: connects to a local address with that port take the direct path. */
    final ConcurrentHashMap<Integer, SoftCmId> listeners = new ConcurrentHashMap<>();
    final Set<SoftLink> links = ConcurrentHashMap.newKeySet();

    private final Object keyLock = new Object();
    private final AtomicInteger nextQpNumber = new AtomicInteger();
    private final AtomicInteger nextDomainId = new AtomicInteger();
    private final AtomicInteger nextDirectPort = new AtomicInteger();
    private final ConcurrentLinkedQueue<Runnable> tasks = new ConcurrentLinkedQueue<>();
    /** Same-host links whose peer's ring the engine thread polls; replaced whole under {@code this} (rare). */
    private volatile TcpLink[] ringLinks = new TcpLink[0];
    private volatile Selector selector;
    private volatile Thread thread;
    private volatile ScheduledThreadPoolExecutor timer;

    /** Event channels not yet closed, for {@link ResourceUsage#toString()}'s account of a leak. */
    final Set<SoftEventChannel> liveEventChannels = ConcurrentHashMap.newKeySet();

    private SoftEngine() {
        usage.describeLiveResourcesWith(() -> liveEventChannels.toString());
    }

    /**
     * The local port of an unbound active id on the direct path: that path uses no socket, so the port is a label in
     * its own port space (as rdma_cm's ports are apart from the kernel's TCP ports), cycling over the ephemeral range
     * 32768..60999 and never 0. A bound id uses its bound port instead.
     */
    int nextDirectPort() {
        return 32768 + Math.floorMod(nextDirectPort.getAndIncrement(), 60999 - 32768 + 1);
    }

    static SoftEngine get() {
        SoftEngine e = instance;
        if (e == null) {
            synchronized (SoftEngine.class) {
                e = instance;
                if (e == null) {
                    e = new SoftEngine();
                    instance = e;
                }
            }
        }
        return e;
    }

    /** A protection domain's id in the shared key table: regions and queue pairs must share one. */
    int nextDomainId() {
        return nextDomainId.incrementAndGet();
    }

    int nextQpNumber() {
        for (;;) {
            int n = nextQpNumber.incrementAndGet() & 0xffffff;
            if (n != 0) {
                return n;
            }
        }
    }

    /**
     * Registers {@code mr} (new, or closed by its owner) under a fresh key ({@link MemoryKeyTable}): its lkey, and
     * its rkey too when it grants remote access. A region without remote access gets rkey 0, which names no region:
     * the InfiniBand specification returns an R_Key only for remote access, and rxe does exactly this (mlx5 reports
     * the lkey's value instead); 0 makes a misused key fail at once rather than look valid. A read-only mapping of a
     * file (from {@code fileOffset}; -1 for any other memory) is noted for same-host peers ({@link MappedFileLinks}).
     * Allocates nothing, but for a file mapping's note.
     */
    void register(SoftMemoryRegion mr, long address, long length, int access, long fileOffset)
            throws RdmaException {
        synchronized (keyLock) {
            int key = keys.add(mr);
            if (key == 0) {
                throw new RdmaException("soft0: " + MemoryKeyTable.MAX_REGIONS + " memory regions are registered"
                        + " already, the device's limit (expected: deregister regions no longer used)");
            }
            mr.open(address, length, access, key);
            sharedMemory.publish(key, mr.pd.id, access, address, length);
            if (fileOffset >= 0) {
                sharedMemory.fileLinks.registered(key, address, length, fileOffset);
            }
            usage.memoryRegistered(length);
        }
    }

    /** Frees {@code key}, the cleared key of a region of {@code length} bytes. */
    void deregister(int key, long length) {
        synchronized (keyLock) {
            // Before the slot is free: once this returns, no same-host peer copies into or out of the region.
            sharedMemory.fileLinks.deregistered(key);
            if (sharedMemory.withdraw(key)) {
                keys.remove(key);
            } else {
                keys.retire(key);
            }
            usage.memoryDeregistered(length);
        }
    }

    // ------------------------------------------------------------------ listener registry

    /**
     * The in-JVM listener a connect to {@code remote} reaches, or {@code null} when the address is not local or
     * nothing of this JVM listens there.
     */
    SoftCmId localListener(InetSocketAddress remote) {
        SoftCmId listener = listeners.get(remote.getPort());
        if (listener == null) {
            return null;
        }
        InetAddress target = remote.getAddress();
        InetSocketAddress bound = listener.localAddress();
        if (target == null || bound == null) {
            return null;
        }
        InetAddress boundAddress = bound.getAddress();
        if (boundAddress.isAnyLocalAddress()) {
            return isLocal(target) ? listener : null;
        }
        if (boundAddress.equals(target)) {
            return listener;
        }
        return target.isAnyLocalAddress() && boundAddress.isLoopbackAddress() ? listener : null;
    }

    /** Whether {@code address} is one of this host's (loopback and wildcard included). */
    static boolean isLocal(InetAddress address) {
        if (address.isLoopbackAddress() || address.isAnyLocalAddress()) {
            return true;
        }
        try {
            return NetworkInterface.getByInetAddress(address) != null;
        } catch (SocketException e) {
            return false;
        }
    }

    static boolean loopbackIsDirect() {
        return !"tcp".equalsIgnoreCase(System.getProperty("rdmabridge.soft.loopback", "direct").trim());
    }

    /** Accepted sockets of one listener that may wait for their connect request at once; more are closed. */
    static int maxPendingHandshakesPerListener() {
        return Integer.getInteger("rdmabridge.soft.maxPendingHandshakes", 64);
    }

    /**
     * How long the engine thread keeps polling the rings of same-host links after the last frame before it parks in
     * {@code select()} (a peer's DOORBELL then wakes it); {@value #RING_SPIN_PROPERTY}, in microseconds, read once.
     * Default 0: on a 2-core host both processes' spinning engines take the cores their peers need (measured with
     * CrossProcessChannelBenchmark, 1 KiB: p50 latency 83 us at 0, 105 us at 20, 292 us at 100); a host with cores
     * to spare may gain from a few tens of microseconds.
     */
    static final String RING_SPIN_PROPERTY = "rdmabridge.soft.ringSpinMicros";
    static final long RING_SPIN_NANOS = Math.max(0, Long.getLong(RING_SPIN_PROPERTY, 0)) * 1_000L;
    /**
     * How long the engine blocks while it reads rings: a completion-queue poller may take the parked flag after the
     * engine blocked ({@link TcpLink#progress}) and give it back only when it arms its queue; one that stops polling
     * without arming (a verbs user that polls in a loop of its own) leaves frames to the engine's next look, at most
     * this late. 100 looks a second cost the idle engine a few microseconds each.
     */
    static final long PARK_MILLIS = SoftCompletionQueue.POLL_PROGRESS ? 10 : 1000;

    synchronized void addRingLink(TcpLink link) {
        TcpLink[] a = java.util.Arrays.copyOf(ringLinks, ringLinks.length + 1);
        a[a.length - 1] = link;
        ringLinks = a;
        Selector s = selector;
        if (s != null) {
            s.wakeup();
        }
    }

    /**
     * A fault on a shared mapping ({@link InternalError}) surfaced in {@code at}'s code on the engine thread. From
     * compiled code HotSpot 17 raises it only at the thread's next safepoint or VM transition, which may lie in
     * another link's code, so blame goes by evidence: every other ring link whose ring file is now shorter than its
     * mapping closes here, with that reason; the caller closes {@code at} (its work was interrupted either way).
     */
    void closeTruncatedRings(Throwable fault, TcpLink at) {
        for (TcpLink l : ringLinks) {
            if (l != at && l.ringTruncated()) {
                l.closeForRingFault(fault);
            }
        }
    }

    synchronized void removeRingLink(TcpLink link) {
        ringLinks = java.util.Arrays.stream(ringLinks).filter(l -> l != link).toArray(TcpLink[]::new);
    }

    static long handshakeTimeoutMillis() {
        return Long.getLong("rdmabridge.soft.handshakeTimeoutMillis", 10_000L);
    }

    // ------------------------------------------------------------------ threads

    /** The selector of the engine thread, started on first use. */
    Selector selector() throws RdmaException {
        Selector s = selector;
        if (s == null) {
            synchronized (this) {
                s = selector;
                if (s == null) {
                    try {
                        s = Selector.open();
                    } catch (IOException e) {
                        throw new RdmaException("soft0: cannot open an NIO selector for the TCP path: " + e, e);
                    }
                    selector = s;
                    Thread t = new Thread(this::runEngine, "soft-rdma-engine");
                    t.setDaemon(true);
                    thread = t;
                    t.start();
                }
            }
        }
        return s;
    }

    /** Whether the caller is the engine thread. */
    boolean onEngineThread() {
        return Thread.currentThread() == thread;
    }

    /** Runs {@code task} on the engine thread. */
    void execute(Runnable task) {
        tasks.add(task);
        Selector s = selector;
        if (s != null) {
            s.wakeup();
        }
    }

    /** Tasks queued and not yet run (tests: linear in their number). */
    int pendingTasks() {
        return tasks.size();
    }

    ScheduledThreadPoolExecutor timer() {
        ScheduledThreadPoolExecutor t = timer;
        if (t == null) {
            synchronized (this) {
                t = timer;
                if (t == null) {
                    t = new ScheduledThreadPoolExecutor(1, r -> {
                        Thread thread = new Thread(r, "soft-rdma-timer");
                        thread.setDaemon(true);
                        return thread;
                    });
                    t.setRemoveOnCancelPolicy(true);
                    timer = t;
                }
            }
        }
        return t;
    }

    ScheduledFuture<?> schedule(Runnable task, long delayNanos) {
        // Cancelling removes the task from the timer's queue (remove-on-cancel), so it pins nothing afterwards.
        return timer().schedule(() -> runSafely(task), Math.max(0, delayNanos), TimeUnit.NANOSECONDS);
    }

    /** Runs {@code task} on the timer thread now. */
    void kick(Runnable task) {
        timer().execute(() -> runSafely(task));
    }

    private static void runSafely(Runnable task) {
        try {
            task.run();
        } catch (Throwable t) {
            logger.warn("soft0: unexpected failure in a provider task", t);
        }
    }

    /** One poll of every same-host link's ring; whether any held frames. A failure closes that link alone. */
    private static boolean pollRings(TcpLink[] rings) {
        boolean any = false;
        for (TcpLink l : rings) {
            try {
                any |= l.pollRing();
            } catch (Throwable t) {
                logger.warn("soft0: unexpected failure while serving {}", l, t);
                l.onFailure(t);
            }
        }
        return any;
    }

    /** Something the engine thread services when its key is selected. */
    interface Handler {
        void onSelected(SelectionKey key);

        /** The handler failed unexpectedly: release its socket. */
        void onFailure(Throwable cause);
    }

    private void runEngine() {
        Selector s = selector;
        long lastFrame = System.nanoTime();
        for (;;) {
            try {
                TcpLink[] rings = ringLinks;
                if (rings.length == 0) {
                    s.select(1000);
                } else if (pollRings(rings)) {
                    lastFrame = System.nanoTime();
                    s.selectNow();
                } else if (System.nanoTime() - lastFrame < RING_SPIN_NANOS) {
                    Thread.onSpinWait();
                    s.selectNow();
                } else {
                    // Park: flags first, then a last look; whatever a peer publishes after that rings our socket.
                    boolean arrived = false;
                    for (TcpLink l : rings) {
                        arrived |= l.parkRing();
                    }
                    if (arrived) {
                        s.selectNow();
                    } else {
                        s.select(PARK_MILLIS);
                    }
                    for (TcpLink l : rings) {
                        l.unparkRing();
                    }
                    lastFrame = System.nanoTime();
                }
                Runnable task;
                while ((task = tasks.poll()) != null) {
                    runSafely(task);
                }
                Iterator<SelectionKey> it = s.selectedKeys().iterator();
                while (it.hasNext()) {
                    SelectionKey key = it.next();
                    it.remove();
                    Handler handler = (Handler) key.attachment();
                    try {
                        if (key.isValid()) {
                            handler.onSelected(key);
                        }
                    } catch (Throwable t) {
                        logger.warn("soft0: unexpected failure while serving {}", handler, t);
                        handler.onFailure(t);
                    }
                }
            } catch (Throwable t) {
                logger.warn("soft0: unexpected failure in the engine loop", t);
            }
        }
    }
}
