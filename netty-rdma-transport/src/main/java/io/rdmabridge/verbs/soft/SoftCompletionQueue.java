package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.WorkCompletions;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * A bounded many-producer, single-consumer ring of completions kept in primitive arrays (a Vyukov-style sequence per
 * slot), so neither producing nor reading completions allocates or locks.
 *
 * <p>Polling also makes progress, as a software provider's completion read does (libfabric's manual progress): before
 * it reads completions, {@link #poll} executes the frames its queue pairs' same-host peers published in their rings
 * ({@link TcpLink#progress(boolean)}), so an event loop that is awake does not wait for the engine thread to wake and
 * hand them over. Executing a frame takes its queue pair's lock, as on the engine. The engine still executes whatever
 * no poller takes. When the owner sleeps ({@link #requestNotify}), it parks on those rings with its notifier's
 * {@link EventNotifier#loopbackWakePort() wake socket}, so a peer's next frame wakes it directly (a datagram), not the
 * engine (a DOORBELL), which would then have to wake it in turn ({@value #DIRECT_WAKE_PROPERTY}).
 *
 * <p>Threading: {@link #poll} and {@link #requestNotify} belong to the owning thread; {@link #push} may be called by
 * any number of provider threads (posting threads of in-JVM peers, the engine, the timer) at once.
 */
final class SoftCompletionQueue implements CompletionQueue {
    /**
     * System property: {@code false} leaves the execution of ring frames to the engine thread alone (polls only read
     * completions); read once. For comparison and diagnosis.
     */
    static final String POLL_PROGRESS_PROPERTY = "rdmabridge.soft.pollProgress";
    static final boolean POLL_PROGRESS =
            !"false".equalsIgnoreCase(System.getProperty(POLL_PROGRESS_PROPERTY, "true").trim());
    /**
     * System property: {@code false} makes a sleeping poller leave its rings to the engine thread, which a peer's
     * DOORBELL wakes and which then wakes the poller; by default the poller parks on its rings itself with its
     * notifier's {@link EventNotifier#loopbackWakePort() wake socket}, so a peer wakes it directly. Read once. For
     * comparison and diagnosis.
     */
    static final String DIRECT_WAKE_PROPERTY = "rdmabridge.soft.directWake";
    static final boolean DIRECT_WAKE =
            !"false".equalsIgnoreCase(System.getProperty(DIRECT_WAKE_PROPERTY, "true").trim());

    private final SoftEngine engine;
    private final SoftDevice device;
    private final EventNotifier notifier;
    private final int capacity;
    private final int mask;
    private final AtomicLongArray sequence;
    private final long[] wrId;
    private final int[] status;
    private final int[] opcode;
    private final int[] byteLength;
    private final int[] qpNumber;
    private final int[] flags;
    private final int[] immData;
    private final int[] vendorError;
    private final AtomicLong tail = new AtomicLong();
    private final AtomicBoolean armed = new AtomicBoolean();
    private final AtomicBoolean closed = new AtomicBoolean();
    private final AtomicBoolean overrunLogged = new AtomicBoolean();
    /** Queue pairs using this queue as send or receive queue (one count per role). */
    final AtomicInteger users = new AtomicInteger();
    private long head;
    /** The notifier's wake socket port; {@code -1} until the first arm with rings needs it. Owner thread. */
    private int wakePort = -1;
    /** Same-host links of those queue pairs that read the peer's frames from a ring; replaced whole (rare). */
    private volatile TcpLink[] progress = NO_LINKS;
    private static final TcpLink[] NO_LINKS = new TcpLink[0];

    SoftCompletionQueue(SoftDevice device, SoftEngine engine, int entries, EventNotifier notifier) {
        this.device = device;
        this.engine = engine;
        this.notifier = notifier;
        int c = Integer.highestOneBit(entries);
        capacity = c == entries ? c : c << 1;
        mask = capacity - 1;
        sequence = new AtomicLongArray(capacity);
        for (int i = 0; i < capacity; i++) {
            sequence.set(i, i);
        }
        wrId = new long[capacity];
        status = new int[capacity];
        opcode = new int[capacity];
        byteLength = new int[capacity];
        qpNumber = new int[capacity];
        flags = new int[capacity];
        immData = new int[capacity];
        vendorError = new int[capacity];
        engine.usage.completionQueues(1);
    }

    /**
     * Adds a completion; any thread.
     *
     * @return {@code false} when the queue is full (the completion is lost: the caller moves its queue pair to error)
     */
    boolean push(long id, int st, int op, int len, int qpn, int fl, int imm, int vendor) {
        if (closed.get()) {
            return false;
        }
        long t;
        for (;;) {
            t = tail.get();
            long seq = sequence.get((int) t & mask);
            if (seq == t) {
                if (tail.compareAndSet(t, t + 1)) {
                    break;
                }
            } else if (seq < t) {
                if (overrunLogged.compareAndSet(false, true)) {
                    SoftEngine.logger.warn("soft0: completion queue of {} entries overran (expected: size it for every"
                            + " outstanding work request); its queue pairs move to ERROR", capacity);
                }
                return false;
            }
        }
        int i = (int) t & mask;
        wrId[i] = id;
        status[i] = st;
        opcode[i] = op;
        byteLength[i] = len;
        qpNumber[i] = qpn;
        flags[i] = fl;
        immData[i] = imm;
        vendorError[i] = vendor;
        // A volatile store, not a lazy one: it must be ordered before the read of 'armed' below (Dekker with
        // requestNotify, which stores 'armed' and then polls).
        sequence.set(i, t + 1);
        if (armed.get() && armed.compareAndSet(true, false) && notifier != null) {
            notifier.signal();
        }
        return true;
    }

    @Override
    public RdmaDevice device() {
        return device;
    }

    @Override
    public int capacity() {
        return capacity;
    }

    /** {@code link}'s ring is mapped: polls of this queue execute its frames too ({@link TcpLink#progress}). */
    synchronized void addProgress(TcpLink link) {
        if (!POLL_PROGRESS) {
            return;
        }
        TcpLink[] a = java.util.Arrays.copyOf(progress, progress.length + 1);
        a[a.length - 1] = link;
        progress = a;
    }

    synchronized void removeProgress(TcpLink link) {
        progress = java.util.Arrays.stream(progress).filter(l -> l != link).toArray(TcpLink[]::new);
    }

    @Override
    public int poll(WorkCompletions out) {
        TcpLink[] links = progress;
        if (links.length > 0) {
            // Armed: the owner is about to sleep (this is its last look), so it must not take over a parked flag.
            boolean takePark = !armed.get();
            for (TcpLink l : links) {
                l.progress(takePark);
            }
        }
        int n = 0;
        int max = out.capacity();
        long h = head;
        while (n < max) {
            int i = (int) h & mask;
            if (sequence.get(i) != h + 1) {
                break;
            }
            out.set(n++, wrId[i], status[i], opcode[i], byteLength[i], qpNumber[i], flags[i], immData[i],
                    vendorError[i]);
            sequence.lazySet(i, h + capacity);
            h++;
        }
        head = h;
        return n;
    }

    @Override
    public void requestNotify() {
        if (engine.faults.takeNotifyRequestFailure()) {
            throw new IllegalStateException("injected fault: ibv_req_notify_cq refused"
                    + " (SoftFaults.failNotifyRequests)");
        }
        armed.set(true);
        TcpLink[] links = progress;
        if (links.length > 0) {
            int port = wakePort();
            for (TcpLink l : links) {
                l.pollerSleeps(port);
            }
        }
    }

    /** The port same-host peers wake the owner at, opened with the first ring; {@code 0}: through the engine. */
    private int wakePort() {
        int p = wakePort;
        if (p < 0) {
            try {
                p = DIRECT_WAKE && notifier != null ? notifier.loopbackWakePort() : 0;
            } catch (IllegalStateException e) {
                p = 0; // the notifier was closed: its loop is gone
            }
            wakePort = p;
        }
        return p;
    }

    /**
     * Counts a queue pair role about to use this queue, or refuses it when the queue is closed: counted before the
     * look at {@code closed}, which {@link #close()} sets before it reads the count, so one always sees the other.
     */
    void userStarting() throws RdmaException {
        users.incrementAndGet();
        if (closed.get()) {
            users.decrementAndGet();
            throw new RdmaException("createQueuePair with a closed completion queue (expected: create queue pairs"
                    + " before closing it)");
        }
    }

    @Override
    public void close() {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        int u = users.get();
        if (u != 0) {
            closed.set(false);
            throw new IllegalStateException("completion queue still used by " + u
                    + " queue pair role(s) (expected: close its queue pairs first)");
        }
        engine.usage.completionQueues(-1);
    }

    boolean isClosed() {
        return closed.get();
    }

    @Override
    public String toString() {
        return "SoftCompletionQueue{capacity=" + capacity + '}';
    }
}
