package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.QpCapabilities;
import io.rdmabridge.verbs.QpState;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RecvWorkRequest;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WcOpcode;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WorkCompletions;
import io.rdmabridge.verbs.WrOpcode;
import java.util.concurrent.atomic.AtomicReferenceFieldUpdater;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A reliable-connected queue pair of the software device.
 *
 * <h2>Queues</h2>
 * The send queue is a preallocated ring of slots indexed by a 64-bit sequence number whose low 32 bits are the
 * packet sequence number (PSN) on the wire: {@code sqHead} (oldest not yet completed) ≤ {@code sqSent} (next to
 * transmit or execute) ≤ {@code sqTail} (next free). A slot whose {@code sStatus} is non-zero has failed; it
 * completes with that status when it reaches the head, which keeps completions in posting order, and then the
 * connection is torn down. The receive queue is a single-producer ring: the owner posts at {@code rqTail}, the
 * responder (the in-JVM peer's posting thread, the timer or the engine) consumes at {@code rqHead}.
 *
 * <h2>Threading and locks</h2>
 * {@code sqLock} guards the send queue's completion side (head, done flags, failures); {@code rqLock} guards
 * consumption of the receive queue. Lock order: a send-queue lock may be held while taking a receive-queue lock
 * (the in-JVM requester executes against its peer's receive queue), never the reverse, and never two send-queue
 * locks; teardown runs with no lock held. Posting takes the uncontended {@code sqLock} once; receives are posted
 * without a lock. No allocation on any of these paths.
 *
 * <h2>Receiver not ready</h2>
 * A SEND or WRITE_WITH_IMM that finds no posted receive is retried every 655.36 ms, at most
 * {@link ConnectionParameters#rnrRetryCount()} times of the responder's parameters (the count each side asks of its
 * peer, as the CM's REQ and REP carry it to the other side's queue pair), then completes with
 * {@link WcStatus#RNR_RETRY_EXC_ERR}: the timer of a real device connected through rdma_cm, which leaves the
 * responder's minimum RNR timer at 0 (655.36 ms in the InfiniBand encoding), so 6 retries give a receiver about 4 s.
 * (A shorter emulated timer gave up within ~126 ms, sooner than any device, and failed peers that were merely slow.)
 * In-JVM, posting a receive retries a stalled peer at once.
 */
final class SoftQueuePair implements QueuePair {
    static final int RNR = -1;
    static final long RNR_TIMER_NANOS = 655_360_000L;

    private static final AtomicReferenceFieldUpdater<SoftQueuePair, QpState> STATE =
            AtomicReferenceFieldUpdater.newUpdater(SoftQueuePair.class, QpState.class, "state");

    final SoftEngine engine;
    final SoftCmId cmId;
    final SoftProtectionDomain pd;
    final SoftCompletionQueue sendCq;
    final SoftCompletionQueue recvCq;
    final QpCapabilities caps;
    final int qpn;
    volatile QpState state = QpState.INIT;
    volatile SoftLink link;
    /** Published in the shared key table, so that a same-host peer may WRITE and READ one-sided. */
    private volatile boolean shared;
    /** Our parameters (connect or accept) and the peer's; set before the queue pair reaches RTS. */
    volatile ConnectionParameters localParams = ConnectionParameters.DEFAULT;
    volatile ConnectionParameters peerParams = ConnectionParameters.DEFAULT;
    final Runnable pumpTask = this::pumpSendQueue;
    private final Runnable retireTask = this::retireDelayed;

    // ---- send queue
    final ReentrantLock sqLock = new ReentrantLock();
    final int sqDepth;
    final int sqMask;
    final int maxInline;
    final long[] sWrId;
    final int[] sOpcode;
    final int[] sFlags;
    final int[] sImm;
    final long[] sRemote;
    final int[] sRkey;
    final ScatterGatherLists sSges;
    final int[] sLength;
    final int[] sStatus;
    final long[] sDue;
    /** {@link SoftFaults#delaySendCompletions}: when the slot's completion may be published, or 0 for at once. */
    final long[] sCompletionDue;
    final int[] sRnrCount;
    final boolean[] sDone;
    final byte[] sInline;
    long sqHead;
    /** A retire waits on the timer for a delayed completion; guarded by {@code sqLock}. */
    private boolean retireScheduled;
    volatile long sqSent;
    volatile long sqTail;

    // ---- receive queue
    final ReentrantLock rqLock = new ReentrantLock();
    final int rqDepth;
    final int rqMask;
    final long[] rWrId;
    final ScatterGatherLists rSges;
    final long[] rLength;
    volatile long rqHead;
    volatile long rqTail;
    /** An in-JVM requester stalled because our receive queue was empty; retried when we post a receive. */
    volatile SoftQueuePair rnrWaiter;
    /** In-JVM: the head work request waits for its RNR timer until then, unless a receive shows up first. */
    private long rnrUntil;

    SoftQueuePair(SoftEngine engine, SoftCmId cmId, SoftProtectionDomain pd, SoftCompletionQueue sendCq,
                  SoftCompletionQueue recvCq, QpCapabilities caps) {
        this.engine = engine;
        this.cmId = cmId;
        this.pd = pd;
        this.sendCq = sendCq;
        this.recvCq = recvCq;
        this.caps = caps;
        qpn = engine.nextQpNumber();
        sqDepth = caps.maxSendWr();
        int sqSize = ringSize(sqDepth);
        sqMask = sqSize - 1;
        maxInline = caps.maxInlineData();
        sWrId = new long[sqSize];
        sOpcode = new int[sqSize];
        sFlags = new int[sqSize];
        sImm = new int[sqSize];
        sRemote = new long[sqSize];
        sRkey = new int[sqSize];
        sSges = new ScatterGatherLists(sqSize, caps.maxSendSge());
        sLength = new int[sqSize];
        sStatus = new int[sqSize];
        sDue = new long[sqSize];
        sCompletionDue = new long[sqSize];
        sRnrCount = new int[sqSize];
        sDone = new boolean[sqSize];
        sInline = new byte[sqSize * maxInline];
        rqDepth = caps.maxRecvWr();
        int rqSize = ringSize(rqDepth);
        rqMask = rqSize - 1;
        rWrId = new long[rqSize];
        rSges = new ScatterGatherLists(rqSize, caps.maxRecvSge());
        rLength = new long[rqSize];
        engine.usage.queuePairs(1);
    }

    private static int ringSize(int depth) {
        int c = Integer.highestOneBit(depth);
        return c == depth ? c : c << 1;
    }

    int sIndex(long seq) {
        return (int) seq & sqMask;
    }

    int rIndex(long seq) {
        return (int) seq & rqMask;
    }

    // ------------------------------------------------------------------ state

    /** Moves INIT/RTS to ERROR; a destroyed queue pair stays destroyed. */
    boolean markError() {
        for (;;) {
            QpState s = state;
            if (s == QpState.ERROR || s == QpState.DESTROYED) {
                return false;
            }
            if (STATE.compareAndSet(this, s, QpState.ERROR)) {
                withdrawShared();
                return true;
            }
        }
    }

    /** Lets the same-host peer WRITE and READ this queue pair's memory one-sided; an RTS queue pair only. */
    void publishShared() {
        SharedKeyTable t = engine.sharedMemory.keyTable();
        if (t != null && state == QpState.RTS) {
            shared = true;
            t.publishQueuePair(qpn, pd.id);
            if (state != QpState.RTS) {
                t.withdrawQueuePair(qpn); // lost a race with an error or close, which may have run first
            }
        }
    }

    private void withdrawShared() {
        if (shared) {
            shared = false;
            engine.sharedMemory.keyTable().withdrawQueuePair(qpn);
        }
    }

    void markReadyToSend(SoftLink link) {
        this.link = link;
        STATE.compareAndSet(this, QpState.INIT, QpState.RTS);
    }

    /** Moves to ERROR and flushes both queues. Call with no queue-pair lock held. */
    void enterError() {
        markError();
        sqLock.lock();
        try {
            flushSendQueueLocked();
        } finally {
            sqLock.unlock();
        }
        rqLock.lock();
        try {
            flushRecvQueueLocked();
        } finally {
            rqLock.unlock();
        }
    }

    // ------------------------------------------------------------------ posting

    @Override
    public void postSend(SendWorkRequest wr) throws RdmaException {
        QpState s = state;
        if (s == QpState.INIT) {
            throw new RdmaException("queue pair " + qpn + ": postSend in state INIT (expected: RTS; wait for"
                    + " ESTABLISHED before posting sends)");
        }
        if (s == QpState.DESTROYED) {
            throw new RdmaException("queue pair " + qpn + " is destroyed");
        }
        int n = wr.numSge();
        if (n > sSges.maxSge) {
            throw new RdmaException("numSge: " + n + " (expected: <= maxSendSge " + sSges.maxSge + ")");
        }
        int op = wr.opcode();
        long total = wr.totalLength();
        if (total > Integer.MAX_VALUE) {
            throw new RdmaException("length: " + total + " bytes (expected: <= " + Integer.MAX_VALUE
                    + " per work request)");
        }
        boolean inline = wr.isInline();
        if (inline) {
            if (op == WrOpcode.RDMA_READ) {
                throw new RdmaException("INLINE with RDMA_READ (expected: INLINE on SEND or RDMA_WRITE only)");
            }
            if (total > maxInline) {
                throw new RdmaException("inline length: " + total + " bytes (expected: <= maxInlineData "
                        + maxInline + ")");
            }
        }
        SoftLink l;
        sqLock.lock();
        try {
            long tail = sqTail;
            if (tail - sqHead >= sqDepth) {
                throw new RdmaException("queue pair " + qpn + ": send queue full with " + sqDepth
                        + " outstanding work requests (expected: at most maxSendWr; poll completions first)");
            }
            int i = sIndex(tail);
            sWrId[i] = wr.wrId();
            sOpcode[i] = op;
            sFlags[i] = wr.flags();
            sImm[i] = wr.immData();
            sRemote[i] = wr.remoteAddress();
            sRkey[i] = wr.rkey();
            sLength[i] = (int) total;
            sDone[i] = false;
            sRnrCount[i] = 0;
            long delay = engine.faults.sendDelayNanos();
            sDue[i] = delay == 0 ? 0 : (System.nanoTime() + delay) | 1;
            long completionDelay = engine.faults.sendCompletionDelayNanos();
            sCompletionDue[i] = completionDelay == 0 ? 0 : (System.nanoTime() + completionDelay) | 1;
            if (inline) {
                sSges.setNumSge(i, 0);
                int at = i * maxInline;
                for (int j = 0; j < n; j++) {
                    int len = wr.sgeLength(j);
                    DirectMemory.copyToArray(wr.sgeAddress(j), sInline, at, len);
                    at += len;
                }
                sStatus[i] = WcStatus.SUCCESS;
            } else {
                sSges.setNumSge(i, n);
                for (int j = 0; j < n; j++) {
                    sSges.set(i, j, wr.sgeAddress(j), wr.sgeLength(j), wr.sgeLkey(j));
                }
                sStatus[i] = checkLocal(i);
            }
            sqTail = tail + 1;
            if (state != QpState.RTS) {
                flushSendQueueLocked();
                return;
            }
            l = link;
        } finally {
            sqLock.unlock();
        }
        l.sendQueueReady(this);
    }

    @Override
    public void postRecv(RecvWorkRequest wr) throws RdmaException {
        if (state == QpState.DESTROYED) {
            throw new RdmaException("queue pair " + qpn + " is destroyed");
        }
        int n = wr.numSge();
        if (n > rSges.maxSge) {
            throw new RdmaException("numSge: " + n + " (expected: <= maxRecvSge " + rSges.maxSge + ")");
        }
        if (engine.faults.takeReceivePostFailure()) {
            throw new RdmaException("injected fault: receive post refused (SoftFaults.failReceivePosts)");
        }
        long tail = rqTail;
        if (tail - rqHead >= rqDepth) {
            throw new RdmaException("queue pair " + qpn + ": receive queue full with " + rqDepth
                    + " posted receives (expected: at most maxRecvWr)");
        }
        int i = rIndex(tail);
        rWrId[i] = wr.wrId();
        rSges.setNumSge(i, n);
        for (int j = 0; j < n; j++) {
            rSges.set(i, j, wr.sgeAddress(j), wr.sgeLength(j), wr.sgeLkey(j));
        }
        rLength[i] = wr.totalLength();
        rqTail = tail + 1;
        if (state == QpState.ERROR) {
            // Either the teardown's flush sees this receive or we do (state is written before it flushes).
            rqLock.lock();
            try {
                flushRecvQueueLocked();
            } finally {
                rqLock.unlock();
            }
            return;
        }
        SoftQueuePair waiter = rnrWaiter;
        if (waiter != null) {
            rnrWaiter = null;
            engine.kick(waiter.pumpTask);
        }
    }

    // ------------------------------------------------------------------ local memory

    /** {@link WcStatus#LOC_PROT_ERR} when a gather/scatter entry of send slot {@code i} is not ours to use. */
    int checkLocal(int i) {
        return sSges.check(i, engine.keys, pd, sOpcode[i] == WrOpcode.RDMA_READ ? Access.LOCAL_WRITE : 0);
    }

    /** {@link WcStatus#LOC_PROT_ERR} when a scatter entry of receive slot {@code r} is not writable by us. */
    int checkRecv(int r) {
        return rSges.check(r, engine.keys, pd, Access.LOCAL_WRITE);
    }

    /** Copies {@code len} bytes of send slot {@code i}'s payload, from {@code offset}, to native {@code dst}. */
    void gather(int i, long offset, long dst, int len) {
        if (len == 0) {
            return;
        }
        if ((sFlags[i] & SendWorkRequest.INLINE) != 0) {
            DirectMemory.copyFromArray(sInline, i * maxInline + (int) offset, dst, len);
            return;
        }
        sSges.gather(i, offset, dst, len);
    }

    /** Copies {@code len} bytes from native {@code src} into send slot {@code i}'s scatter list (RDMA READ). */
    void scatterRead(int i, long offset, long src, int len) {
        sSges.scatter(i, offset, src, len);
    }

    /** Copies {@code len} bytes from native {@code src} into receive slot {@code r} at {@code offset}. */
    void scatterRecv(int r, long offset, long src, int len) {
        rSges.scatter(r, offset, src, len);
    }

    /**
     * Whether {@code rkey} names a live region of this queue pair's domain that grants {@code access} to
     * {@code [addr, addr + len)}.
     */
    boolean remotePermits(int rkey, long addr, long len, int access) {
        return engine.keys.permits(rkey, pd, addr, len, access);
    }

    /** A peer's RDMA WRITE or READ of our region {@code rkey}: see {@link MemoryKeyTable#beginRemoteAccess}. */
    SoftMemoryRegion beginRemoteAccess(int rkey, long addr, long len, int access) {
        return engine.keys.beginRemoteAccess(rkey, pd, addr, len, access);
    }

    // ------------------------------------------------------------------ completions

    /**
     * Frees send slot {@code head} (the oldest) and then publishes its completion, if it has one. The slot is read
     * before it is freed and freed before the completion is visible, so a caller that polls the completion can post
     * into the slot at once.
     */
    private void retireSlotLocked(long head, int status) {
        int i = sIndex(head);
        long id = sWrId[i];
        int op = sOpcode[i];
        boolean signaled = (sFlags[i] & SendWorkRequest.SIGNALED) != 0;
        int len = op == WrOpcode.RDMA_READ && status == WcStatus.SUCCESS ? sLength[i] : 0;
        sqHead = head + 1;
        if (state == QpState.DESTROYED || (status == WcStatus.SUCCESS && !signaled)) {
            return;
        }
        if (!sendCq.push(id, status, WrOpcode.completionOpcode(op), len, qpn, 0, 0, 0)) {
            overrun();
        }
    }

    /**
     * Consumes receive {@code seq} (the oldest) and publishes its completion; freed before the completion is visible,
     * as for sends. Caller holds {@code rqLock}.
     */
    void consumeRecvLocked(long seq, int status, int opcode, int len, boolean withImm, int imm) {
        long id = rWrId[rIndex(seq)];
        rqHead = seq + 1;
        if (state == QpState.DESTROYED) {
            return;
        }
        if (!recvCq.push(id, status, opcode, len, qpn, withImm ? WorkCompletions.WITH_IMM : 0, imm, 0)) {
            overrun();
        }
    }

    private void overrun() {
        SoftLink l = link;
        if (l != null && !l.torn.get()) {
            engine.kick(() -> l.drop("completion queue overrun on queue pair " + qpn));
        }
    }

    /**
     * Completes done slots from the head, in order. Returns {@code true} when a failed slot completed: the queue
     * pair is then in ERROR (before its completion is visible) and the caller tears the link down once it holds no
     * lock.
     */
    boolean retireLocked() {
        return retireLocked(false);
    }

    /**
     * As {@link #retireLocked()} when the caller has just failed the oldest slot that was not done: the acknowledged
     * slots before it complete successfully now, also those whose completion {@link SoftFaults#delaySendCompletions}
     * holds back (the flush that follows the failure would report them as flushed), then the failed one.
     */
    void retireFailingLocked() {
        retireLocked(true);
    }

    private boolean retireLocked(boolean failing) {
        long tail = sqTail;
        for (long head = sqHead; head < tail; head++) {
            int i = sIndex(head);
            int st = sStatus[i];
            if (st != WcStatus.SUCCESS) {
                markError();
                retireSlotLocked(head, st);
                return true;
            }
            if (!sDone[i]) {
                break;
            }
            long due = sCompletionDue[i];
            if (due != 0 && !failing) {
                long wait = due - System.nanoTime();
                if (wait > 0) {
                    if (!retireScheduled) {
                        retireScheduled = true;
                        engine.schedule(retireTask, wait);
                    }
                    break;
                }
            }
            retireSlotLocked(head, WcStatus.SUCCESS);
        }
        return false;
    }

    /** The timer's retire of completions {@link SoftFaults#delaySendCompletions} held back. */
    private void retireDelayed() {
        boolean failed;
        sqLock.lock();
        try {
            retireScheduled = false;
            failed = state == QpState.RTS && retireLocked();
        } finally {
            sqLock.unlock();
        }
        SoftLink l = link;
        if (failed && l != null) {
            l.drop("queue pair " + qpn + " failed a work request");
        }
    }

    void flushSendQueueLocked() {
        long tail = sqTail;
        for (long s = sqHead; s < tail; s++) {
            retireSlotLocked(s, WcStatus.WR_FLUSH_ERR);
        }
        sqSent = tail;
    }

    void flushRecvQueueLocked() {
        long tail = rqTail;
        for (long head = rqHead; head < tail; head++) {
            consumeRecvLocked(head, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0, false, 0);
        }
    }

    // ------------------------------------------------------------------ in-JVM execution

    private void pumpSendQueue() {
        SoftLink l = link;
        if (l != null) {
            l.sendQueueReady(this);
        }
    }

    /**
     * Executes the send queue against the in-JVM peer on the calling thread (posting thread, or the timer for
     * retries and delays), in order, until it is empty or a work request must wait.
     */
    void executeDirect(SoftQueuePair peer, DirectLink l) {
        boolean failed = false;
        sqLock.lock();
        try {
            while (state == QpState.RTS) {
                long seq = sqSent;
                if (seq == sqTail) {
                    break;
                }
                int i = sIndex(seq);
                if (sStatus[i] == WcStatus.SUCCESS) {
                    if (sRnrCount[i] > 0 && rnrUntil - System.nanoTime() > 0 && peer.rqHead == peer.rqTail) {
                        break; // the RNR timer is running and no receive arrived: new posts must not retry early
                    }
                    long due = sDue[i];
                    if (due != 0) {
                        long wait = due - System.nanoTime();
                        if (wait > 0) {
                            engine.schedule(pumpTask, wait);
                            break;
                        }
                    }
                    int r = checkLocal(i);
                    if (r == WcStatus.SUCCESS) {
                        r = peer.respondDirect(this, i);
                    }
                    if (r == RNR) {
                        int attempt = ++sRnrCount[i];
                        if (attempt > peerParams.rnrRetryCount()) {
                            sStatus[i] = WcStatus.RNR_RETRY_EXC_ERR;
                        } else {
                            peer.rnrWaiter = this;
                            if (peer.rqHead != peer.rqTail) {
                                // A receive landed after the attempt: retry now rather than after the timer.
                                peer.rnrWaiter = null;
                                continue;
                            }
                            long delay = RNR_TIMER_NANOS;
                            rnrUntil = System.nanoTime() + delay;
                            engine.schedule(pumpTask, delay);
                            break;
                        }
                    } else if (r != WcStatus.SUCCESS) {
                        sStatus[i] = r;
                    } else {
                        sDone[i] = true;
                    }
                }
                sqSent = seq + 1;
                if (retireLocked()) {
                    failed = true;
                    break;
                }
            }
        } finally {
            sqLock.unlock();
        }
        if (failed) {
            l.teardown("queue pair " + qpn + " failed a work request");
        }
    }

    /**
     * Executes send slot {@code i} of the in-JVM requester {@code req} against this queue pair's memory and receive
     * queue. Called with {@code req.sqLock} held.
     *
     * @return a {@link WcStatus} for the requester, or {@link #RNR} when no receive is posted
     */
    int respondDirect(SoftQueuePair req, int i) {
        rqLock.lock();
        try {
            if (state != QpState.RTS) {
                return WcStatus.WR_FLUSH_ERR;
            }
            int op = req.sOpcode[i];
            int len = req.sLength[i];
            switch (op) {
                case WrOpcode.SEND:
                case WrOpcode.SEND_WITH_IMM: {
                    long h = rqHead;
                    if (h == rqTail) {
                        return RNR;
                    }
                    int r = rIndex(h);
                    if (checkRecv(r) != WcStatus.SUCCESS) {
                        failRecvLocked(h, WcStatus.LOC_PROT_ERR);
                        return WcStatus.REM_OP_ERR;
                    }
                    if (len > rLength[r]) {
                        // ibv_poll_cq(3)'s pair, as mlx5 reports it (rxe: LOC_QP_OP_ERR / REM_OP_ERR; both allowed).
                        failRecvLocked(h, WcStatus.LOC_LEN_ERR);
                        return WcStatus.REM_INV_REQ_ERR;
                    }
                    long offset = 0;
                    for (int j = 0, n = rSges.numSge(r); offset < len && j < n; j++) {
                        int c = (int) Math.min(rSges.length(r, j), len - offset);
                        req.gather(i, offset, rSges.address(r, j), c);
                        offset += c;
                    }
                    boolean imm = op == WrOpcode.SEND_WITH_IMM;
                    consumeRecvLocked(h, WcStatus.SUCCESS, WcOpcode.RECV, len, imm, req.sImm[i]);
                    return WcStatus.SUCCESS;
                }
                case WrOpcode.RDMA_WRITE:
                case WrOpcode.RDMA_WRITE_WITH_IMM: {
                    boolean imm = op == WrOpcode.RDMA_WRITE_WITH_IMM;
                    long h = rqHead;
                    if (imm && h == rqTail) {
                        return RNR;
                    }
                    if (len > 0) {
                        long addr = req.sRemote[i];
                        SoftMemoryRegion target = beginRemoteAccess(req.sRkey[i], addr, len, Access.REMOTE_WRITE);
                        if (target == null) {
                            markError();
                            return WcStatus.REM_ACCESS_ERR;
                        }
                        try {
                            req.gather(i, 0, addr, len);
                        } finally {
                            target.endRemoteAccess();
                        }
                    }
                    if (imm) {
                        consumeRecvLocked(h, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, len, true, req.sImm[i]);
                    }
                    return WcStatus.SUCCESS;
                }
                case WrOpcode.RDMA_READ: {
                    if (len > 0) {
                        long addr = req.sRemote[i];
                        SoftMemoryRegion source = beginRemoteAccess(req.sRkey[i], addr, len, Access.REMOTE_READ);
                        if (source == null) {
                            markError();
                            return WcStatus.REM_ACCESS_ERR;
                        }
                        try {
                            req.scatterRead(i, 0, addr, len);
                        } finally {
                            source.endRemoteAccess();
                        }
                    }
                    return WcStatus.SUCCESS;
                }
                default:
                    return WcStatus.REM_INV_REQ_ERR;
            }
        } finally {
            rqLock.unlock();
        }
    }

    /** Moves to ERROR, then completes receive {@code seq} with an error; caller holds {@code rqLock}. */
    void failRecvLocked(long seq, int status) {
        markError();
        consumeRecvLocked(seq, status, WcOpcode.RECV, 0, false, 0);
    }

    // ------------------------------------------------------------------ QueuePair

    @Override
    public int qpNumber() {
        return qpn;
    }

    @Override
    public QpState state() {
        return state;
    }

    @Override
    public QpCapabilities capabilities() {
        return caps;
    }

    @Override
    public ProtectionDomain protectionDomain() {
        return pd;
    }

    @Override
    public CompletionQueue sendCompletionQueue() {
        return sendCq;
    }

    @Override
    public CompletionQueue recvCompletionQueue() {
        return recvCq;
    }

    @Override
    public void close() {
        for (;;) {
            QpState s = state;
            if (s == QpState.DESTROYED) {
                return;
            }
            if (STATE.compareAndSet(this, s, QpState.DESTROYED)) {
                withdrawShared();
                break;
            }
        }
        SoftLink l = link;
        if (l != null) {
            l.disconnect("queue pair " + qpn + " destroyed");
        }
        pd.queuePairGone();
        sendCq.users.decrementAndGet();
        recvCq.users.decrementAndGet();
        engine.usage.queuePairs(-1);
    }

    @Override
    public String toString() {
        return "SoftQueuePair{qpn=" + qpn + ", state=" + state + '}';
    }
}
