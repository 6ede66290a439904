package io.rdmabridge.verbs.disni;

import com.ibm.disni.verbs.IbvCQ;
import com.ibm.disni.verbs.IbvCompChannel;
import com.ibm.disni.verbs.IbvWC;
import com.ibm.disni.verbs.SVCReqNotify;
import com.ibm.disni.verbs.impl.NatIbvCQ;
import com.ibm.disni.verbs.impl.NatIbvCompChannel;
import com.ibm.disni.verbs.impl.NativeDispatcher;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WorkCompletions;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A completion queue over DiSNI's {@link IbvCQ} with a completion channel of its own.
 *
 * <p>Polling calls {@code ibv_poll_cq} through DiSNI's native dispatcher into a native array of {@code struct ibv_wc}
 * owned by this queue, and reads every entry itself. DiSNI's own {@code SVCPollCq} is not used because it copies
 * only {@code wr_id}, {@code status} and {@code opcode} of an error completion and leaves {@code qp_num} and
 * {@code vendor_err} stale, so a flush could be routed to the wrong queue pair.
 *
 * <p>Waking: {@link #requestNotify()} arms with a reused {@link SVCReqNotify}. The queue has a completion channel of
 * its own, because DiSNI's {@code getCqEvent} does not say which queue an event is for and each event must be
 * acknowledged on its own queue. The provider's {@link CompletionEventThread} watches the channel with every other
 * queue's; when it is readable, it takes the event ({@code ibv_get_cq_event}, which does not block then),
 * acknowledges it and signals the notifier. Where that thread cannot be used ({@code sun.nio.ch} not opened), a
 * daemon thread of this queue's own waits on the channel instead, with a timeout so that it notices {@link #close()}.
 * Without a notifier nothing waits.
 *
 * <p>Closing: with a waiting thread, {@link #close()} only hands the queue to it, and that thread destroys the queue
 * and its channel once the channel is out of its wait (at once for the shared thread; within {@link
 * #EVENT_WAIT_MILLIS} for a queue's own). The closing thread is a channel's event loop, which must not wait for that
 * for every channel it closes; {@link io.rdmabridge.verbs.ResourceUsage} counts the queue until it is destroyed.
 *
 * <p>Threading: {@link #poll} and {@link #requestNotify()} belong to the owning thread, which also owns the queue
 * pairs attached here (the table that routes completions to them is not thread-safe).
 */
final class DisniCompletionQueue implements CompletionQueue, CompletionEventThread.Watched {
    private static final Logger logger = LoggerFactory.getLogger(DisniCompletionQueue.class);
    /**
     * Offset of {@code fd} in {@code struct ibv_comp_channel { struct ibv_context *context; int fd; int refcnt; }}
     * (libibverbs, LP64). DiSNI 2.1's {@code IbvCompChannel.getFd()} is always 0: it never reads the descriptor.
     */
    private static final int COMP_CHANNEL_FD = 8;
    /** The kernel's name for a completion channel's file, as {@code /proc/self/fd} shows it. */
    private static final String COMP_CHANNEL_FILE = "anon_inode:[infinibandevent]";
    private static final AtomicBoolean channelFdWarned = new AtomicBoolean();
    /** How long the event thread blocks in {@code ibv_get_cq_event} before it looks whether the queue is closing. */
    static final int EVENT_WAIT_MILLIS = 100;
    // Who destroys the queue: the event thread when close() finds it waiting; close() itself when there is no event
    // thread or it stopped on a failure.
    private static final int WAITING = 0;
    private static final int CLOSE_REQUESTED = 1;
    private static final int EVENTS_FAILED = 2;
    /** Completions fetched per {@code ibv_poll_cq} call at most. */
    static final int POLL_BATCH = 128;

    // struct ibv_wc (libibverbs, LP64): the offsets of the fields the SPI reports.
    private static final int WC_WR_ID = 0;
    private static final int WC_STATUS = 8;
    private static final int WC_OPCODE = 12;
    private static final int WC_VENDOR_ERR = 16;
    private static final int WC_BYTE_LEN = 20;
    private static final int WC_IMM_DATA = 24;
    private static final int WC_QP_NUM = 28;
    private static final int WC_FLAGS = 36;

    private final DisniDevice device;
    private final IbvCompChannel channel;
    private final IbvCQ cq;
    private final long cqHandle;
    private final int capacity;
    private final EventNotifier notifier;
    private final NativeDispatcher dispatcher;
    private final SVCReqNotify arm;
    private final ByteBuffer wc;
    private final ByteBuffer wcBigEndian;
    private final long wcAddress;
    private final int wcSize;
    private final QueuePairTable queuePairs = new QueuePairTable();
    /** The provider's thread that waits for this queue's events, or null. */
    private final CompletionEventThread sharedEvents;
    /** The completion channel's descriptor, where the shared thread watches it; else -1. */
    private final int channelFd;
    /** This queue's own waiting thread, where there is no shared one; or null. */
    private final Thread eventThread;
    private final AtomicInteger events = new AtomicInteger(WAITING);
    private int users;
    /** Why nothing waits for this queue's events any more, or null; the next arming reports it to the owner. */
    private volatile String eventsFailure;
    /** Set by the owner's close; read by {@link DisniCmId#createQueuePair}, which may run on another thread. */
    private volatile boolean closed;

    DisniCompletionQueue(DisniDevice device, IbvCompChannel channel, IbvCQ cq, int capacity, EventNotifier notifier)
            throws IOException {
        this.device = device;
        this.channel = channel;
        this.cq = cq;
        this.cqHandle = ((NatIbvCQ) cq).getObjId();
        this.capacity = capacity;
        this.notifier = notifier;
        this.dispatcher = device.disniProvider().dispatcher();
        this.arm = cq.reqNotification(false);
        // IbvWC.CSIZE was corrected to the native sizeof(struct ibv_wc) when libdisni was loaded.
        this.wcSize = IbvWC.CSIZE;
        this.wc = ByteBuffer.allocateDirect(wcSize * POLL_BATCH).order(ByteOrder.nativeOrder());
        this.wcBigEndian = wc.duplicate().order(ByteOrder.BIG_ENDIAN); // imm_data is __be32
        this.wcAddress = DirectMemory.address(wc);
        CompletionEventThread shared = notifier != null ? device.disniProvider().completionEvents() : null;
        this.channelFd = shared != null ? channelFd(channel) : -1;
        this.sharedEvents = channelFd >= 0 ? shared : null;
        if (notifier != null && sharedEvents == null) {
            eventThread = new Thread(this::waitForEvents, "disni-cq-events-" + device.name());
            eventThread.setDaemon(true);
            eventThread.start();
        } else {
            eventThread = null;
        }
        if (sharedEvents != null) {
            try {
                sharedEvents.add(this); // last: the thread may take an event from now on
            } catch (IOException | RuntimeException e) {
                arm.free(); // the caller destroys the queue and its channel
                throw e;
            }
        }
    }

    IbvCQ cq() {
        return cq;
    }

    @Override
    public RdmaDevice device() {
        return device;
    }

    @Override
    public int capacity() {
        return capacity;
    }

    void attach(DisniQueuePair qp) {
        queuePairs.put(qp.qpNumber(), qp);
        users++;
    }

    void detach(DisniQueuePair qp) {
        queuePairs.remove(qp.qpNumber());
        users--;
    }

    @Override
    public int poll(WorkCompletions out) {
        if (closed) {
            throw new IllegalStateException("poll: completion queue is closed");
        }
        int n = Math.min(out.capacity(), POLL_BATCH);
        int polled;
        try {
            polled = dispatcher._pollCQ(cqHandle, n, wcAddress);
        } catch (IOException e) {
            throw new IllegalStateException("ibv_poll_cq on " + device.name() + " failed: " + DisniErrors.clean(e),
                    e);
        }
        if (polled < 0) {
            throw new IllegalStateException("ibv_poll_cq on " + device.name() + " returned " + polled
                    + " (the completion queue overflowed or the device failed: size it for every outstanding"
                    + " work request)");
        }
        for (int i = 0; i < polled; i++) {
            int base = i * wcSize;
            int status = wc.getInt(base + WC_STATUS);
            int opcode = wc.getInt(base + WC_OPCODE);
            int qpNumber = wc.getInt(base + WC_QP_NUM);
            // ibv_poll_cq(3): an error completion defines only wr_id, status, qp_num and vendor_err.
            boolean ok = status == WcStatus.SUCCESS;
            int flags = ok ? wc.getInt(base + WC_FLAGS) & WorkCompletions.WITH_IMM : 0;
            int imm = flags != 0 ? wcBigEndian.getInt(base + WC_IMM_DATA) : 0;
            out.set(i, wc.getLong(base + WC_WR_ID), status, opcode, ok ? wc.getInt(base + WC_BYTE_LEN) : 0, qpNumber,
                    flags, imm, ok ? 0 : wc.getInt(base + WC_VENDOR_ERR));
            DisniQueuePair qp = queuePairs.get(qpNumber);
            if (qp != null) {
                qp.completed(status, opcode);
            }
        }
        return polled;
    }

    @Override
    public void requestNotify() {
        if (notifier == null || closed) {
            return; // nobody waits: arming could only produce events nobody reads
        }
        String failure = eventsFailure;
        if (failure != null) {
            // Armed or not, nothing would wake the owner: a connection left on it would move only on timers.
            throw new IllegalStateException("completion events of " + device.name() + " stopped (" + failure
                    + "): nothing wakes this queue's owner any more; close the connection and open a new one");
        }
        try {
            arm.execute();
        } catch (IOException e) {
            throw new IllegalStateException("ibv_req_notify_cq on " + device.name() + " failed: "
                    + DisniErrors.clean(e), e);
        }
    }

    private void waitForEvents() {
        while (events.get() == WAITING) {
            try {
                if (channel.getCqEvent(cq, EVENT_WAIT_MILLIS)) {
                    // Every event must be acknowledged, or ibv_destroy_cq blocks forever.
                    cq.ackEvents(1);
                    notifier.signal();
                }
            } catch (IOException | RuntimeException e) {
                if (events.compareAndSet(WAITING, EVENTS_FAILED)) {
                    eventsFailure = DisniErrors.clean(e);
                    logger.warn("Completion events of {} stopped: {}", device.name(), eventsFailure);
                    notifier.signal(); // the owner polls, and its next arming reports the failure (requestNotify)
                    return;
                }
                break; // closing: the failure is the channel's teardown racing the wait
            }
        }
        try {
            destroy();
        } catch (RuntimeException e) {
            logger.warn("Closing a completion queue of {} failed: {}", device.name(), e.getMessage());
        }
    }

    @Override
    public int fd() {
        return channelFd;
    }

    /**
     * The descriptor of {@code channel}, read from libibverbs' struct and checked against what the kernel says it is;
     * -1 (logged once) where it is not a completion channel's, which leaves the queue a thread of its own.
     */
    private static int channelFd(IbvCompChannel channel) {
        int fd = NativeWords.getInt(((NatIbvCompChannel) channel).getObjId() + COMP_CHANNEL_FD);
        String file;
        try {
            file = Files.readSymbolicLink(Path.of("/proc/self/fd/" + fd)).toString();
        } catch (IOException | RuntimeException e) {
            file = e.toString();
        }
        if (fd > 2 && file.equals(COMP_CHANNEL_FILE)) {
            return fd;
        }
        if (channelFdWarned.compareAndSet(false, true)) {
            logger.warn("A completion channel's descriptor is not where struct ibv_comp_channel keeps it in"
                    + " libibverbs (read {}, which is {}, not {}): each completion queue waits for its events on a"
                    + " thread of its own. Report this with the output of ibv_devinfo -v", fd, file,
                    COMP_CHANNEL_FILE);
        }
        return -1;
    }

    /** The shared thread found the channel readable: take the event, acknowledge it, wake the owner. */
    @Override
    public void readable() throws IOException {
        if (!channel.getCqEvent(cq, 0)) {
            throw new IOException("completion channel " + channelFd + " was readable but ibv_get_cq_event"
                    + " returned no event");
        }
        // Every event must be acknowledged, or ibv_destroy_cq blocks forever.
        cq.ackEvents(1);
        notifier.signal();
    }

    @Override
    public void failed(Throwable cause) {
        eventsFailure = DisniErrors.clean(cause);
        logger.warn("Completion events of {} stopped: {}", device.name(), eventsFailure);
        notifier.signal(); // the owner polls, and its next arming reports the failure (requestNotify)
    }

    /** The shared thread has taken the channel out of its wait, after {@link #close()}. */
    @Override
    public void released() {
        try {
            destroy();
        } catch (RuntimeException e) {
            logger.warn("Closing a completion queue of {} failed: {}", device.name(), e.getMessage());
        }
    }

    boolean isClosed() {
        return closed;
    }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        if (users != 0) {
            throw new IllegalStateException("completion queue still used by " + users + " queue pairs (expected:"
                    + " close them first)");
        }
        closed = true;
        if (sharedEvents != null) {
            sharedEvents.remove(this);
            return;
        }
        if (eventThread == null || !events.compareAndSet(WAITING, CLOSE_REQUESTED)) {
            // No thread, or one that has stopped already: nobody else destroys the queue.
            if (eventThread != null) {
                joinUninterruptibly(eventThread);
            }
            destroy();
        }
    }

    private void destroy() {
        arm.free();
        // DiSNI marks its objects closed and returns the verbs' result instead of throwing: a refusal (EBUSY, while a
        // queue pair the kernel still holds uses the queue) would leak it silently, counted as gone.
        int cqResult;
        int channelResult;
        try {
            cqResult = cq.destroyCQ();
            channelResult = cqResult == 0 ? channel.destroyCompChannel() : 0;
        } catch (IOException e) {
            throw new IllegalStateException("ibv_destroy_cq on " + device.name() + " failed: "
                    + DisniErrors.clean(e), e);
        }
        if (cqResult != 0) {
            throw new IllegalStateException("ibv_destroy_cq on " + device.name() + " returned " + cqResult
                    + ": the completion queue and its channel are left allocated (a queue pair the kernel has not "
                    + "destroyed still uses it: look for a failed rdma_destroy_qp)");
        }
        device.disniProvider().usage().completionQueues(-1);
        if (channelResult != 0) {
            throw new IllegalStateException("ibv_destroy_comp_channel on " + device.name() + " returned "
                    + channelResult + ": its descriptor is left open");
        }
    }

    static void joinUninterruptibly(Thread thread) {
        boolean interrupted = false;
        while (true) {
            try {
                thread.join();
                break;
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
    }
}
