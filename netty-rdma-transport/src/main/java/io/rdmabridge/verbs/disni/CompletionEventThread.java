package io.rdmabridge.verbs.disni;

import io.rdmabridge.internal.LinuxEpoll;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReferenceArray;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One thread that waits for the events of many completion channels: it watches their descriptors in one epoll set
 * and, for each that is readable, lets its owner take the event ({@code ibv_get_cq_event}, which then does not block).
 *
 * <p>Why: DiSNI waits on one completion channel per call ({@code getCqEvent}) and does not say which queue an event
 * is for, so without this every completion queue needs a channel and a thread of its own. A connection has a queue,
 * and a peer decides how many connections it opens: thousands of threads, each waking every 100 ms to look whether
 * its queue is closing. Here a thousand queues cost one thread that sleeps until an event or a change.
 *
 * <p>The thread starts with the first {@link #add} and ends once no channel has been watched for {@link
 * #IDLE_LINGER_MILLIS} (a later add starts a new one), so an idle provider holds no thread and no descriptor, and a
 * peer that connects and closes over and over does not make a thread each time. {@link #remove} hands the channel
 * back to the thread, which takes it out of the set and then calls {@link Watched#released()} (the queue's
 * destruction): a channel's descriptor is never closed while the thread may still read it. A channel whose {@link
 * Watched#readable()} fails is taken out of the set and told through {@link Watched#failed}; the others go on.
 *
 * <p>Threading: {@link #add} and {@link #remove} from any thread (they take this object's lock, and are called once
 * per completion queue, never per completion); the callbacks run on the thread, which finds a ready descriptor's
 * channel without the lock.
 */
final class CompletionEventThread {
    private static final Logger logger = LoggerFactory.getLogger(CompletionEventThread.class);
    /** Ready descriptors taken per {@code epoll_wait}; more are reported by the next. */
    static final int MAX_EVENTS = 64;
    /** How long the thread stays after its last channel left, for the next one. */
    static final long IDLE_LINGER_MILLIS = 5_000;

    /** A completion channel and what to do with it. */
    interface Watched {
        /** The descriptor to watch: readable while an event waits. */
        int fd();

        /** The descriptor is readable: take the event. Throwing takes it out of the set ({@link #failed}). */
        void readable() throws IOException;

        /** It left the set because {@link #readable()} or the thread failed. On the thread. */
        void failed(Throwable cause);

        /** After {@link #remove}: it is out of the set, release it. Once, on the thread or on {@link #remove}'s. */
        void released();
    }

    private final String threadName;
    private final long lingerNanos;
    private final ConcurrentLinkedQueue<Watched> removals = new ConcurrentLinkedQueue<>();
    // Guarded by this: the running thread and its set.
    private Thread thread;
    private LinuxEpoll.WakeableSet set;
    /**
     * What is watched, by descriptor number: written under this object's lock (a grown array is filled before it is
     * published), read by the thread without it.
     */
    private volatile AtomicReferenceArray<Watched> byFd = new AtomicReferenceArray<>(0);
    /** Written under this object's lock; the thread reads it without, then checks again under it. */
    private volatile int watched;

    CompletionEventThread(String threadName) {
        this(threadName, IDLE_LINGER_MILLIS);
    }

    /** With another linger than {@link #IDLE_LINGER_MILLIS} (tests). */
    CompletionEventThread(String threadName, long lingerMillis) {
        this.threadName = threadName;
        this.lingerNanos = TimeUnit.MILLISECONDS.toNanos(lingerMillis);
    }

    /** Why no such thread can be used in this JVM (naming the fix), or {@code null} when it can. */
    static Throwable unavailabilityCause() {
        return LinuxEpoll.unavailabilityCause();
    }

    /** Starts watching {@code w}; starts the thread if none runs. */
    synchronized void add(Watched w) throws IOException {
        int fd = w.fd();
        AtomicReferenceArray<Watched> table = byFd;
        if (fd < 0 || (fd < table.length() && table.get(fd) != null)) {
            throw new IllegalArgumentException("descriptor " + fd + " (expected: an open one not watched yet)");
        }
        if (thread == null) {
            start();
        }
        if (fd >= table.length()) {
            byFd = table = grown(table, fd + 1);
        }
        // Known before it joins the set: the thread may see it ready at once.
        table.set(fd, w);
        int rc;
        try {
            rc = set.ctl(LinuxEpoll.CTL_ADD, fd, LinuxEpoll.EPOLLIN);
        } catch (IOException | RuntimeException e) {
            table.set(fd, null);
            throw e;
        }
        if (rc != 0) {
            table.set(fd, null);
            signalWake(); // a thread just started for this channel ends again, after its linger, with nothing to watch
            throw new IOException("epoll_ctl(ADD) of completion channel " + fd + " failed: errno " + rc);
        }
        watched++;
    }

    /** Stops watching {@code w}, then releases it (on the thread, or here when no thread runs). Any thread. */
    void remove(Watched w) {
        synchronized (this) {
            if (thread != null) {
                removals.add(w);
                signalWake();
                return;
            }
        }
        w.released(); // no thread runs: nothing reads the descriptor
    }

    /** Whether the thread runs (tests: it ends after its linger once the last channel left). */
    synchronized boolean isRunning() {
        return thread != null;
    }

    private void start() throws IOException {
        LinuxEpoll.WakeableSet s = LinuxEpoll.WakeableSet.open(MAX_EVENTS);
        Thread t = new Thread(() -> run(s), threadName);
        t.setDaemon(true);
        try {
            t.start();
        } catch (Throwable e) {
            // No thread (the process is out of them): no set may be left that nobody reads.
            s.close();
            throw e;
        }
        set = s;
        thread = t;
    }

    private void signalWake() {
        try {
            set.wake();
        } catch (IOException | RuntimeException e) {
            // An open eventfd takes the write; the thread still finds the removal at its next event.
            logger.warn("Waking the completion event thread failed: {}", e.toString());
        }
    }

    private void run(LinuxEpoll.WakeableSet s) {
        long idleSince = 0;
        try {
            while (true) {
                int timeout = -1;
                if (idleSince != 0) {
                    timeout = (int) Math.max(1, TimeUnit.NANOSECONDS.toMillis(lingerNanos - (System.nanoTime()
                            - idleSince)) + 1);
                }
                int n = s.wait(timeout);
                for (int i = 0; i < n; i++) {
                    int ready = s.readyDescriptor(i);
                    if (s.isWake(ready)) {
                        s.resetWake();
                        continue;
                    }
                    Watched w = watchedAt(ready);
                    if (w == null) {
                        continue; // removed by an earlier entry of this batch
                    }
                    try {
                        w.readable();
                    } catch (IOException | RuntimeException e) {
                        if (forget(w)) {
                            failedQuietly(w, e);
                        }
                    }
                }
                Watched w;
                while ((w = removals.poll()) != null) {
                    forget(w);
                    releaseQuietly(w);
                }
                if (watched > 0 || !removals.isEmpty()) {
                    idleSince = 0;
                } else if (idleSince == 0) {
                    idleSince = System.nanoTime();
                } else if (System.nanoTime() - idleSince >= lingerNanos && stopIfIdle()) {
                    return;
                }
            }
        } catch (Throwable t) {
            // An Error too: a thread that died without fail() would leave every later channel in a set nobody reads.
            fail(t);
            if (t instanceof Error e) {
                throw e;
            }
        }
    }

    /** A copy of {@code table} with room for at least {@code length} descriptors, filled before it is published. */
    private static AtomicReferenceArray<Watched> grown(AtomicReferenceArray<Watched> table, int length) {
        AtomicReferenceArray<Watched> grown = new AtomicReferenceArray<>(Math.max(length, table.length() * 2));
        for (int i = 0; i < table.length(); i++) {
            grown.set(i, table.get(i));
        }
        return grown;
    }

    private Watched watchedAt(int fd) {
        AtomicReferenceArray<Watched> table = byFd;
        return fd < table.length() ? table.get(fd) : null;
    }

    /** Takes {@code w} out of the set; whether it was in it. */
    private synchronized boolean forget(Watched w) {
        int fd = w.fd();
        AtomicReferenceArray<Watched> table = byFd;
        if (fd < 0 || fd >= table.length() || table.get(fd) != w) {
            return false;
        }
        // Before its descriptor closes (released() does that), so that the number can be reused.
        set.removeQuietly(fd);
        table.set(fd, null);
        watched--;
        return true;
    }

    /** Ends the thread (closing the set) when nothing is watched and nothing waits for removal; whether it did. */
    private synchronized boolean stopIfIdle() {
        if (watched > 0 || !removals.isEmpty()) {
            return false;
        }
        closeSet();
        return true;
    }

    private synchronized void closeSet() {
        set.close();
        set = null;
        thread = null;
    }

    /** The set itself failed: every channel leaves it, told why; removals waiting are released. */
    private void fail(Throwable cause) {
        logger.warn("The completion event thread {} stopped: {}", threadName, cause.toString());
        List<Watched> failed = new ArrayList<>();
        List<Watched> released = new ArrayList<>();
        synchronized (this) {
            AtomicReferenceArray<Watched> table = byFd;
            for (int i = 0; i < table.length(); i++) {
                Watched w = table.getAndSet(i, null);
                if (w != null) {
                    failed.add(w);
                }
            }
            watched = 0;
            // Taken with the set: a removal after this lock belongs to the thread the next add starts.
            Watched w;
            while ((w = removals.poll()) != null) {
                released.add(w);
            }
            closeSet();
        }
        for (Watched w : failed) {
            failedQuietly(w, cause);
        }
        for (Watched w : released) {
            releaseQuietly(w);
        }
    }

    // A callback that throws concerns its own channel: the others, and the thread, go on.
    private static void failedQuietly(Watched w, Throwable cause) {
        try {
            w.failed(cause);
        } catch (RuntimeException e) {
            logger.warn("Telling a completion channel that its events stopped failed: {}", e.toString());
        }
    }

    private static void releaseQuietly(Watched w) {
        try {
            w.released();
        } catch (RuntimeException e) {
            logger.warn("Releasing a completion channel failed: {}", e.toString());
        }
    }
}
