package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.QueuePair;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

/**
 * Fault injection for tests of everything built on the software device: refused registrations, slow links and
 * peers that vanish. One per JVM, shared by every {@link SoftProvider}. Thread-safe.
 */
public final class SoftFaults {
    private final SoftEngine engine;
    private final AtomicInteger failRegistrations = new AtomicInteger();
    private final AtomicInteger failReceivePosts = new AtomicInteger();
    private final AtomicInteger failAccepts = new AtomicInteger();
    private final AtomicInteger failNotifyRequests = new AtomicInteger();
    private final AtomicInteger abandonConnectRequests = new AtomicInteger();
    private final AtomicReference<QueuePair> lateMappingFault = new AtomicReference<>();
    private volatile long sendDelayNanos;
    private volatile long sendCompletionDelayNanos;
    private volatile Runnable beforeReadResponseCopy;
    private volatile Runnable beforeRemoteWriteCopy;

    SoftFaults(SoftEngine engine) {
        this.engine = engine;
    }

    /**
     * Makes the next {@code count} memory registrations throw {@code RdmaException("injected fault: ...")}.
     */
    public void failRegistrations(int count) {
        failRegistrations.set(checkCount(count));
    }

    /**
     * Makes the next {@code count} {@code postRecv} calls throw {@code RdmaException("injected fault: ...")}, as
     * {@code ibv_post_recv} does when the device refuses a work request (ENOMEM).
     */
    public void failReceivePosts(int count) {
        failReceivePosts.set(checkCount(count));
    }

    /**
     * Makes the next {@code count} accepts of a listener's TCP sockets throw {@code IOException("injected fault:
     * ...")}, as {@code accept} does when the process is out of file descriptors (EMFILE).
     */
    public void failAccepts(int count) {
        failAccepts.set(checkCount(count));
    }

    /**
     * Makes the peers of the next {@code count} connect requests give them up as soon as they arrive: each passive id
     * gets REJECTED right after its CONNECT_REQUEST, as rdma_cm reports on a device when the connecting side
     * destroys its id before the request is answered.
     */
    public void abandonConnectRequests(int count) {
        abandonConnectRequests.set(checkCount(count));
    }

    /**
     * Makes the next {@code count} {@code requestNotify} calls on completion queues throw
     * {@code IllegalStateException("injected fault: ...")}, as the DiSNI provider does when {@code ibv_req_notify_cq}
     * fails (a device removed under the process).
     */
    public void failNotifyRequests(int count) {
        failNotifyRequests.set(checkCount(count));
    }

    /**
     * Makes the next drain of {@code qp}'s outgoing frames raise {@link InternalError} after its work, while it still
     * holds the link's drain, as HotSpot 17 raises a fault of a truncated shared mapping: at the thread's next
     * safepoint or VM transition, which may lie past the code that made the access and its catch.
     */
    public void raiseLateMappingFault(QueuePair qp) {
        if (!(qp instanceof SoftQueuePair)) {
            throw new IllegalArgumentException("qp: " + qp + " (expected: a queue pair of the soft provider)");
        }
        lateMappingFault.set(qp);
    }

    /** Injected notify-request failures not yet consumed. */
    public int notifyRequestFailuresLeft() {
        return failNotifyRequests.get();
    }

    /** Injected accept failures not yet consumed. */
    public int acceptFailuresLeft() {
        return failAccepts.get();
    }

    /**
     * Delays each outgoing work request by {@code nanos} before it reaches the peer; {@code 0} turns the delay off.
     * Work requests stay in order, so later ones wait behind a delayed one.
     */
    public void delaySends(long nanos) {
        if (nanos < 0) {
            throw new IllegalArgumentException("nanos: " + nanos + " (expected: >= 0)");
        }
        sendDelayNanos = nanos;
    }

    /**
     * Holds each successful send completion back until {@code nanos} after its work request was posted, while the
     * work request itself reaches the peer at once; {@code 0} turns the delay off. Completions stay in order. This
     * is what a device that acknowledges lazily, or coalesces acknowledgements, does: the peer's answer to a send
     * can arrive before the send's own completion. Applies to work requests posted from now on.
     */
    public void delaySendCompletions(long nanos) {
        if (nanos < 0) {
            throw new IllegalArgumentException("nanos: " + nanos + " (expected: >= 0)");
        }
        sendCompletionDelayNanos = nanos;
    }

    /**
     * Cuts the link under {@code qp} abruptly, as if the peer process died: both sides see
     * {@code DISCONNECTED} and flush their outstanding work requests. Does nothing when {@code qp} is not connected.
     */
    public void dropConnection(QueuePair qp) {
        if (!(qp instanceof SoftQueuePair)) {
            throw new IllegalArgumentException("qp: " + qp + " (expected: a queue pair of the soft provider)");
        }
        SoftLink link = ((SoftQueuePair) qp).link;
        if (link != null) {
            link.drop("connection dropped by SoftFaults.dropConnection");
        }
    }

    /**
     * Silences the TCP link under {@code qp} as if its host vanished without a reset (power lost, cable cut,
     * partition): that side stops reading and writing and runs no transport timeout of its own, its socket stays
     * open, and its peer hears nothing more. The peer's waiting work requests then end by its transport timeout
     * ({@code rdmabridge.soft.transportTimeoutMillis}). The silenced side closes as usual when its queue pair or id is
     * closed.
     *
     * @throws IllegalArgumentException when {@code qp} is not connected over TCP (an in-JVM peer cannot vanish; use
     *                                  {@code rdmabridge.soft.loopback=tcp})
     */
    public void silence(QueuePair qp) {
        if (!(qp instanceof SoftQueuePair) || !(((SoftQueuePair) qp).link instanceof TcpLink)) {
            throw new IllegalArgumentException("qp: " + qp + " (expected: a soft queue pair connected over TCP; set "
                    + "rdmabridge.soft.loopback=tcp for peers in one JVM)");
        }
        ((TcpLink) ((SoftQueuePair) qp).link).silence();
    }

    /** Cuts every live link of this JVM's software device, as {@link #dropConnection(QueuePair)} does. */
    public void dropAllConnections() {
        for (SoftLink link : engine.links) {
            link.drop("connection dropped by SoftFaults.dropAllConnections");
        }
    }

    /**
     * Runs {@code action} each time a chunk of an RDMA READ's response is about to be copied out of registered memory
     * for a peer across the TCP link, after the chunk's key check; {@code null} turns it off. On the thread that
     * writes the link (the engine or a poster), so {@code action} must be short. For tests of what a deregistration
     * racing the copy may do.
     */
    public void beforeReadResponseCopy(Runnable action) {
        beforeReadResponseCopy = action;
    }

    /**
     * Runs {@code action} each time a frame of a peer's RDMA WRITE is about to be copied into registered memory across
     * the TCP link, after the frame's key check; {@code null} turns it off. On the thread that executes the peer's
     * frames (the engine or a poller), so {@code action} must be short and must not deregister that region itself.
     * For tests of what a deregistration racing the copy may do.
     */
    public void beforeRemoteWriteCopy(Runnable action) {
        beforeRemoteWriteCopy = action;
    }

    /**
     * Clears pending registration, receive-post, accept and notify-request failures and late mapping faults, the send
     * and completion delays and the copy hooks.
     */
    public void reset() {
        failRegistrations.set(0);
        failReceivePosts.set(0);
        failAccepts.set(0);
        failNotifyRequests.set(0);
        abandonConnectRequests.set(0);
        lateMappingFault.set(null);
        sendDelayNanos = 0;
        sendCompletionDelayNanos = 0;
        beforeReadResponseCopy = null;
        beforeRemoteWriteCopy = null;
    }

    Runnable beforeReadResponseCopy() {
        return beforeReadResponseCopy;
    }

    Runnable beforeRemoteWriteCopy() {
        return beforeRemoteWriteCopy;
    }

    /** Whether this connect request's peer gives it up at once; consumes one injected fault. */
    boolean takeAbandonedConnectRequest() {
        return take(abandonConnectRequests);
    }

    /** Whether this registration must fail; consumes one injected failure. */
    boolean takeRegistrationFailure() {
        return take(failRegistrations);
    }

    /** Whether this receive post must fail; consumes one injected failure. */
    boolean takeReceivePostFailure() {
        return take(failReceivePosts);
    }

    /** Whether this accept must fail; consumes one injected failure. */
    boolean takeAcceptFailure() {
        return take(failAccepts);
    }

    /** Whether this notify request must fail; consumes one injected failure. */
    boolean takeNotifyRequestFailure() {
        return take(failNotifyRequests);
    }

    /** Throws the late fault armed for {@code qp} by {@link #raiseLateMappingFault}, if there is one; consumes it. */
    void throwArmedLateMappingFault(SoftQueuePair qp) {
        QueuePair target = lateMappingFault.get();
        if (target != null && target == qp && lateMappingFault.compareAndSet(qp, null)) {
            throw new InternalError("injected fault: a fault occurred in a recent unsafe memory access operation");
        }
    }

    private static int checkCount(int count) {
        if (count < 0) {
            throw new IllegalArgumentException("count: " + count + " (expected: >= 0)");
        }
        return count;
    }

    private static boolean take(AtomicInteger failures) {
        for (;;) {
            int left = failures.get();
            if (left == 0) {
                return false;
            }
            if (failures.compareAndSet(left, left - 1)) {
                return true;
            }
        }
    }

    long sendDelayNanos() {
        return sendDelayNanos;
    }

    long sendCompletionDelayNanos() {
        return sendCompletionDelayNanos;
    }
}
