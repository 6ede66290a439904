package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.DirectMemory;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.FileChannel;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

/**
 * A second thread for the large one-sided copies of the same-host path ({@link SharedPeer}): the requester's drainer
 * and this thread take the chunks of one RDMA READ or WRITE of at least {@link #SPLIT_BYTES} from a shared cursor,
 * each copying its chunks between the peer's memory file and our scatter/gather entries with positional I/O.
 *
 * <h2>Why</h2>
 * A rendezvous READ of 1 MiB was one {@code pread} on one core, through tmpfs's page-by-page read path, while
 * loopback TCP spreads its two copies over the sending and the receiving thread (docs/benchmarks.md has the profile).
 * Two threads reading halves of a tmpfs file move about twice the bytes per second of one. A NIC does this copy with
 * no CPU at all, so this makes the emulator's cost nearer a device's, not the channel's code faster.
 *
 * <h2>A late helper costs little</h2>
 * The drainer copies chunks itself from the start and does not wait for this thread to wake: chunks are taken with
 * one atomic add each, so a helper that is late (its core busy) finds fewer or none left, and the drainer then waits
 * only for the chunk the helper is copying, or withdraws the job if the helper has not started. One job at a time:
 * a drainer that finds the helper taken (another link's) copies alone. The drainer returns only once the helper is
 * done with the job, so the file and our memory are used only within the request ({@link SharedPeer#execute}).
 *
 * <p>Threading: {@link #tryCopy} from any drainer; the helper thread, {@code soft-rdma-copy}, a daemon started on
 * first use and parked while idle. Nothing is allocated and no lock is taken per copy. {@value #PROPERTY}{@code
 * =false} turns it off (every copy on the drainer, as before), for comparison.
 */
final class CopyHelper {
    /** System property: {@code false} makes the drainer copy alone. Read once. For comparison and diagnosis. */
    static final String PROPERTY = "rdmabridge.soft.copyHelper";
    static final boolean ENABLED = !"false".equalsIgnoreCase(System.getProperty(PROPERTY, "true").trim());
    /** The smallest copy split: below, the hand-over costs about what it saves (a wake-up against a chunk's copy). */
    static final int SPLIT_BYTES = 256 * 1024;
    /** A chunk: a few tens of microseconds of copying, so that a late helper leaves little for the drainer's wait. */
    static final int CHUNK_BYTES = 128 * 1024;

    /** Outcomes of a copy. */
    static final int COPIED = 0;
    static final int SHORT = 1;

    private static final int IDLE = 0;
    private static final int CLAIMED = 1;
    private static final int POSTED = 2;
    private static final int WORKING = 3;
    private static final int FINISHED = 4;
    /** What the views are duplicates of: a duplicate frees nothing, whatever it is pointed at. */
    private static final ByteBuffer VIEW_BASE = ByteBuffer.allocateDirect(1);

    private final AtomicInteger state = new AtomicInteger();
    /** The next byte of the job not yet taken by either thread. */
    private final AtomicLong cursor = new AtomicLong();
    private final ByteBuffer view = newView();
    private volatile Thread thread;
    // The job, written by the drainer before POSTED, read by the helper after it.
    private FileChannel channel;
    private ScatterGatherLists sges;
    private int slot;
    private int length;
    private long at;
    private boolean read;
    private Thread waiter;
    /** The drainer is parked, or about to park, until FINISHED: only then does the helper unpark it. */
    private volatile boolean waiterParked;
    // The helper's outcome, written before FINISHED.
    private int outcome;
    private Throwable error;
    /** Jobs in which the helper copied at least one chunk (tests and diagnosis). */
    final AtomicLong shared = new AtomicLong();

    /**
     * Copies bytes {@code [0, length)} of send slot {@code i}'s scatter list from ({@code read}) or to the file
     * {@code ch} at position {@code at}, the helper taking chunks too; or returns -1 at once, having copied nothing,
     * when {@code length} is below {@link #SPLIT_BYTES} or the helper is off or taken (the caller copies alone).
     * {@code drainerView} is the caller's own view.
     *
     * @return {@link #COPIED}, {@link #SHORT} (a read found the file's end first), or -1 as above
     * @throws IOException as positional I/O on {@code ch} throws it, in either thread; {@link ClosedChannelException}
     *         when {@code ch} was closed under the copy (an interrupt of the caller). Whatever else the helper's copy
     *         throws is thrown here too.
     */
    int tryCopy(FileChannel ch, ByteBuffer drainerView, ScatterGatherLists sges, int i, int length, long at,
            boolean read) throws IOException {
        if (!ENABLED || length < SPLIT_BYTES || !state.compareAndSet(IDLE, CLAIMED)) {
            return -1;
        }
        Thread helper = thread;
        if (helper == null) {
            helper = start();
        }
        channel = ch;
        this.sges = sges;
        slot = i;
        this.length = length;
        this.at = at;
        this.read = read;
        waiter = Thread.currentThread();
        outcome = COPIED;
        error = null;
        cursor.set(0);
        state.set(POSTED);
        LockSupport.unpark(helper);
        Throwable mine = null;
        int result = COPIED;
        try {
            result = takeChunks(ch, drainerView, sges, i, length, at, read, false);
        } catch (IOException | RuntimeException e) {
            mine = e; // thrown once the helper is done with the job
        }
        // Withdrawn if the helper has not started; either way the job stays ours (CLAIMED or FINISHED) until IDLE.
        if (!state.compareAndSet(POSTED, CLAIMED)) {
            awaitHelper();
            if (mine == null && error != null) {
                mine = error;
            } else if (result == COPIED) {
                result = outcome;
            }
            error = null;
        }
        channel = null;
        this.sges = null;
        waiter = null;
        state.set(IDLE);
        if (mine instanceof IOException e) {
            throw e;
        }
        if (mine instanceof RuntimeException e) {
            throw e;
        }
        if (mine != null) {
            throw (Error) mine;
        }
        return result;
    }

    /** A view for {@link #copyRange}, one per thread that copies ({@link DirectMemory#retarget}). */
    static ByteBuffer newView() {
        return VIEW_BASE.duplicate();
    }

    /** Waits until the helper is done with the job: a spin first, as it copies beside us, then parked. */
    private void awaitHelper() {
        for (int spins = 0; state.get() != FINISHED; spins++) {
            if (spins < 1_000) {
                Thread.onSpinWait();
            } else {
                waiterParked = true;
                if (state.get() != FINISHED) {
                    LockSupport.park(this);
                }
                waiterParked = false;
            }
        }
    }

    private synchronized Thread start() {
        Thread t = thread;
        if (t == null) {
            t = new Thread(this::run, "soft-rdma-copy");
            t.setDaemon(true);
            t.start();
            thread = t;
        }
        return t;
    }

    private void run() {
        for (;;) {
            if (state.get() == POSTED && state.compareAndSet(POSTED, WORKING)) {
                Thread w = waiter;
                int result;
                try {
                    result = takeChunks(channel, view, sges, slot, length, at, read, true);
                } catch (Throwable t) {
                    // The drainer throws it: this thread stays, or the drainer would wait for ever.
                    error = t;
                    result = COPIED;
                }
                outcome = result;
                state.set(FINISHED);
                if (waiterParked) {
                    LockSupport.unpark(w);
                }
            } else {
                LockSupport.park(this);
            }
        }
    }

    /** Copies chunks taken from the cursor until none is left or one fails; a failure stops the other thread too. */
    private int takeChunks(FileChannel ch, ByteBuffer v, ScatterGatherLists sges, int i, int length, long at,
            boolean read, boolean helper) throws IOException {
        boolean took = false;
        for (;;) {
            long from = cursor.getAndAdd(CHUNK_BYTES);
            if (from >= length) {
                if (took && helper) {
                    shared.incrementAndGet();
                }
                return COPIED;
            }
            took = true;
            int r;
            try {
                r = copyRange(ch, v, sges, i, (int) from, (int) Math.min(length, from + CHUNK_BYTES), at, read);
            } catch (IOException | RuntimeException e) {
                cursor.set(Integer.MAX_VALUE);
                throw e;
            }
            if (r != COPIED) {
                cursor.set(Integer.MAX_VALUE);
                return r;
            }
        }
    }

    /**
     * Copies bytes {@code [from, to)} of send slot {@code i}'s scatter list from ({@code read}) or to {@code ch},
     * whose byte {@code at} is the list's first, through {@code v}, retargeted at each entry in turn.
     *
     * @return {@link #COPIED}, or {@link #SHORT} when a read found the file's end first
     */
    static int copyRange(FileChannel ch, ByteBuffer v, ScatterGatherLists sges, int i, int from, int to, long at,
            boolean read) throws IOException {
        int entryStart = 0;
        for (int j = 0, n = sges.numSge(i); j < n && entryStart < to; j++) {
            int l = sges.length(i, j);
            int start = Math.max(from, entryStart);
            int end = Math.min(to, entryStart + l);
            if (start < end) {
                ByteBuffer b = DirectMemory.retarget(v, sges.address(i, j) + (start - entryStart), end - start);
                long position = at + start;
                while (b.hasRemaining()) {
                    if (read) {
                        if (ch.read(b, position + b.position()) <= 0) {
                            return SHORT;
                        }
                    } else {
                        ch.write(b, position + b.position());
                    }
                }
            }
            entryStart += l;
        }
        return COPIED;
    }
}
