package io.rdmabridge.verbs.disni;

import com.ibm.disni.verbs.IbvQP;
import com.ibm.disni.verbs.IbvRecvWR;
import com.ibm.disni.verbs.IbvSendWR;
import com.ibm.disni.verbs.IbvSge;
import com.ibm.disni.verbs.SVCPostRecv;
import com.ibm.disni.verbs.SVCPostSend;
import com.ibm.disni.verbs.impl.NatIbvRecvWR;
import com.ibm.disni.verbs.impl.NatIbvSendWR;
import com.ibm.disni.verbs.impl.NatIbvSge;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.QpCapabilities;
import io.rdmabridge.verbs.QpState;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RecvWorkRequest;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WcOpcode;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WrOpcode;
import java.io.IOException;
import java.nio.ByteOrder;
import java.util.LinkedList;
import java.util.List;

/**
 * A reliable-connected queue pair created with {@code rdma_create_qp} through DiSNI.
 *
 * <h2>Posting without allocation</h2>
 * Each queue pair owns one {@link SVCPostSend} and one {@link SVCPostRecv}, serialized once with as many
 * scatter/gather entries as the capabilities allow, and rewrites them for every post: {@code wr_id}, flags, remote
 * address, rkey and the entries through DiSNI's {@code SendWRMod}/{@code SgeMod} setters; opcode, entry count and
 * immediate (for which DiSNI 2.1 has no setter) and every field of the receive request (DiSNI's {@code RecvWRMod}
 * has no setter at all) are written at their {@code struct ibv_send_wr} / {@code ibv_recv_wr} offsets in the
 * serialized request, whose address the request's own scatter/gather pointer gives away. The layout is checked once
 * at creation.
 *
 * <h2>Queue depth</h2>
 * DiSNI does not report the capabilities the device granted, so the queue pair enforces those requested: it counts
 * outstanding work requests and refuses a post beyond the depth with {@link RdmaException}. Sends are kept in a ring
 * of their signaled flags; a successful send completion retires every send up to the first signaled one (what an RC
 * completion means). Once the queue pair is in {@link QpState#ERROR} the device flushes everything and the count is
 * dropped.
 *
 * <h2>Flush in ERROR</h2>
 * The SPI promises a {@link WcStatus#WR_FLUSH_ERR} completion for every work request outstanding in ERROR and for
 * every one posted later. Devices keep the first promise, not always the second (rxe never flushes a receive posted
 * in ERROR). So when this queue pair learns that it is in ERROR (an error completion, a failed or ended connection),
 * and after every post while it is in ERROR, it asks for the transition to ERROR again through
 * {@link DisniCmId#shutdown()}; the device then flushes, in posting order, what it holds.
 *
 * <p>Threading: owned by one thread, which also polls its completion queues.
 */
final class DisniQueuePair implements QueuePair {
    // struct ibv_send_wr / ibv_recv_wr (libibverbs, LP64): fields DiSNI 2.1 has no setter for.
    private static final int WR_ID = 0;
    private static final int WR_SG_LIST = 16;
    private static final int WR_NUM_SGE = 24;
    private static final int SEND_WR_OPCODE = 28;
    private static final int SEND_WR_IMM_DATA = 36;
    private static final int SGE_ADDR = 0;
    private static final int SGE_LENGTH = 8;
    private static final int SGE_LKEY = 12;
    /** The SPI's flags have the values of {@code enum ibv_send_flags}; other bits are not passed on. */
    private static final int SEND_FLAGS = SendWorkRequest.FENCE | SendWorkRequest.SIGNALED
            | SendWorkRequest.SOLICITED | SendWorkRequest.INLINE;
    private static final long LAYOUT_PROBE = 0x5EED_D15C_0DE5_1A7EL;
    private static final boolean LITTLE_ENDIAN = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN;

    private final DisniCmId cmId;
    private final IbvQP qp;
    private final int qpNumber;
    private final DisniProtectionDomain pd;
    private final DisniCompletionQueue sendCq;
    private final DisniCompletionQueue recvCq;
    private final QpCapabilities capabilities;

    private final SVCPostSend sendCall;
    private final SVCPostSend.SendWRMod sendWr;
    private final SVCPostSend.RdmaMod sendRdma;
    private final SVCPostSend.SgeMod[] sendSges;
    private final long sendWrAddress;
    private final SVCPostRecv recvCall;
    private final long recvWrAddress;
    private final long recvSgeAddress;

    private final boolean[] sendSignaled;
    private int sendHead;
    private int sendOutstanding;
    private int recvOutstanding;
    private volatile QpState state = QpState.INIT;

    DisniQueuePair(DisniCmId cmId, IbvQP qp, DisniProtectionDomain pd, DisniCompletionQueue sendCq,
                   DisniCompletionQueue recvCq, QpCapabilities capabilities) throws IOException {
        this.cmId = cmId;
        this.qp = qp;
        this.qpNumber = qp.getQp_num();
        this.pd = pd;
        this.sendCq = sendCq;
        this.recvCq = recvCq;
        this.capabilities = capabilities;
        this.sendSignaled = new boolean[capabilities.maxSendWr()];

        IbvSendWR send = new IbvSendWR();
        send.setWr_id(LAYOUT_PROBE);
        send.setOpcode(IbvSendWR.IBV_WR_SEND);
        send.setSg_list(emptySges(capabilities.maxSendSge()));
        sendCall = qp.postSend(List.of(send), null);
        SVCPostSend.SendWRMod wr = sendCall.getWrMod(0);
        sendWr = wr;
        sendRdma = wr.getRdmaMod();
        sendSges = new SVCPostSend.SgeMod[capabilities.maxSendSge()];
        for (int i = 0; i < sendSges.length; i++) {
            sendSges[i] = wr.getSgeMod(i);
        }
        // A single serialized request is followed by its entries: the entry pointer minus the request size.
        long sendSgeAddress = ((NatIbvSendWR) wr).getPtr_sge_list();
        sendWrAddress = sendSgeAddress - NatIbvSendWR.CSIZE;

        IbvRecvWR recv = new IbvRecvWR();
        recv.setWr_id(LAYOUT_PROBE);
        recv.setSg_list(emptySges(capabilities.maxRecvSge()));
        try {
            recvCall = qp.postRecv(List.of(recv), null);
        } catch (IOException | RuntimeException | Error e) {
            sendCall.free();
            throw e;
        }
        recvSgeAddress = ((NatIbvRecvWR) recvCall.getWrMod(0)).getPtr_sge_list();
        recvWrAddress = recvSgeAddress - NatIbvRecvWR.CSIZE;

        if (NativeWords.getLong(sendWrAddress + WR_ID) != LAYOUT_PROBE
                || NativeWords.getLong(sendWrAddress + WR_SG_LIST) != sendSgeAddress
                || NativeWords.getInt(sendWrAddress + WR_NUM_SGE) != capabilities.maxSendSge()
                || NativeWords.getLong(recvWrAddress + WR_ID) != LAYOUT_PROBE
                || NativeWords.getLong(recvWrAddress + WR_SG_LIST) != recvSgeAddress
                || NativeWords.getInt(recvWrAddress + WR_NUM_SGE) != capabilities.maxRecvSge()) {
            sendCall.free();
            recvCall.free();
            throw new RdmaException("DiSNI's serialized work requests do not have the layout of DiSNI 2.1 on LP64"
                    + " Linux (expected: com.ibm.disni:disni:2.1 with its own libdisni on x86_64 or aarch64)");
        }
    }

    private static LinkedList<IbvSge> emptySges(int count) {
        LinkedList<IbvSge> sges = new LinkedList<>();
        for (int i = 0; i < count; i++) {
            sges.add(new IbvSge());
        }
        return sges;
    }

    DisniCmId cmId() {
        return cmId;
    }

    @Override
    public int qpNumber() {
        return qpNumber;
    }

    @Override
    public QpState state() {
        return state;
    }

    @Override
    public QpCapabilities capabilities() {
        return capabilities;
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

    /** The connection is up (CM thread's event, handed over through the owner's poll). */
    void established() {
        if (state == QpState.INIT) {
            state = QpState.RTS;
        }
    }

    /**
     * rdma_cm moved the queue pair to the error state (disconnect, reject, unreachable) or a completion failed. On
     * the first notice the queue pair is moved to ERROR explicitly, which flushes receives posted since the device
     * failed it and tells the peer with a DREQ: an RC connection whose queue pair failed is over.
     */
    void failed() {
        if (state != QpState.DESTROYED && state != QpState.ERROR) {
            state = QpState.ERROR;
            sendOutstanding = 0;
            recvOutstanding = 0;
            cmId.shutdown();
        }
    }

    /** A completion of this queue pair was polled; {@code opcode} is only meaningful on success. */
    void completed(int status, int opcode) {
        if (status != WcStatus.SUCCESS) {
            failed();
            return;
        }
        if (state == QpState.ERROR || state == QpState.DESTROYED) {
            return;
        }
        if (opcode == WcOpcode.RECV || opcode == WcOpcode.RECV_RDMA_WITH_IMM) {
            if (recvOutstanding > 0) {
                recvOutstanding--;
            }
            return;
        }
        // RC: a successful completion covers every earlier unsignaled send up to this signaled one.
        while (sendOutstanding > 0) {
            boolean signaled = sendSignaled[sendHead];
            sendHead = (sendHead + 1) % sendSignaled.length;
            sendOutstanding--;
            if (signaled) {
                break;
            }
        }
    }

    @Override
    public void postSend(SendWorkRequest wr) throws RdmaException {
        QpState s = state;
        if (s == QpState.INIT || s == QpState.DESTROYED) {
            throw new RdmaException("postSend: queue pair " + qpNumber + " is " + s
                    + " (expected: RTS, after the ESTABLISHED event)");
        }
        int numSge = wr.numSge();
        if (numSge > capabilities.maxSendSge()) {
            throw new RdmaException("postSend: " + numSge + " scatter/gather entries (expected: at most maxSendSge="
                    + capabilities.maxSendSge() + ")");
        }
        int opcode = wr.opcode();
        boolean rdma = opcode == WrOpcode.RDMA_WRITE || opcode == WrOpcode.RDMA_WRITE_WITH_IMM
                || opcode == WrOpcode.RDMA_READ;
        if (wr.isInline()) {
            if (opcode == WrOpcode.RDMA_READ) {
                throw new RdmaException("postSend: INLINE with RDMA_READ (expected: INLINE on SEND or WRITE only)");
            }
            long total = wr.totalLength();
            if (total > capabilities.maxInlineData()) {
                throw new RdmaException("postSend: " + total + " inline bytes (expected: at most maxInlineData="
                        + capabilities.maxInlineData() + ")");
            }
        }
        if (s != QpState.ERROR && sendOutstanding == sendSignaled.length) {
            throw new RdmaException("postSend: send queue of queue pair " + qpNumber + " is full with "
                    + sendOutstanding + " work requests (expected: at most maxSendWr=" + sendSignaled.length
                    + " outstanding; poll the send completion queue, and signal at least every maxSendWr-th send)");
        }
        sendWr.setWr_id(wr.wrId());
        sendWr.setSend_flags(wr.flags() & SEND_FLAGS);
        NativeWords.putInt(sendWrAddress + SEND_WR_OPCODE, opcode);
        NativeWords.putInt(sendWrAddress + WR_NUM_SGE, numSge);
        int imm = wr.immData();
        NativeWords.putInt(sendWrAddress + SEND_WR_IMM_DATA, LITTLE_ENDIAN ? Integer.reverseBytes(imm) : imm);
        if (rdma) {
            sendRdma.setRemote_addr(wr.remoteAddress());
            sendRdma.setRkey(wr.rkey());
        }
        for (int i = 0; i < numSge; i++) {
            SVCPostSend.SgeMod sge = sendSges[i];
            sge.setAddr(wr.sgeAddress(i));
            sge.setLength(wr.sgeLength(i));
            sge.setLkey(wr.sgeLkey(i));
        }
        try {
            sendCall.execute();
        } catch (IOException e) {
            throw new RdmaException("ibv_post_send on queue pair " + qpNumber + " failed: " + DisniErrors.clean(e)
                    + " (" + wr + ")", e);
        }
        if (s != QpState.ERROR) {
            sendSignaled[(sendHead + sendOutstanding) % sendSignaled.length] = wr.isSignaled();
            sendOutstanding++;
        } else {
            cmId.shutdown();
        }
    }

    @Override
    public void postRecv(RecvWorkRequest wr) throws RdmaException {
        QpState s = state;
        if (s == QpState.DESTROYED) {
            throw new RdmaException("postRecv: queue pair " + qpNumber + " is DESTROYED");
        }
        int numSge = wr.numSge();
        if (numSge > capabilities.maxRecvSge()) {
            throw new RdmaException("postRecv: " + numSge + " scatter entries (expected: at most maxRecvSge="
                    + capabilities.maxRecvSge() + ")");
        }
        if (s != QpState.ERROR && recvOutstanding == capabilities.maxRecvWr()) {
            throw new RdmaException("postRecv: receive queue of queue pair " + qpNumber + " is full with "
                    + recvOutstanding + " work requests (expected: at most maxRecvWr=" + capabilities.maxRecvWr()
                    + " outstanding)");
        }
        NativeWords.putLong(recvWrAddress + WR_ID, wr.wrId());
        NativeWords.putInt(recvWrAddress + WR_NUM_SGE, numSge);
        int sgeSize = NatIbvSge.CSIZE;
        for (int i = 0; i < numSge; i++) {
            long sge = recvSgeAddress + (long) i * sgeSize;
            NativeWords.putLong(sge + SGE_ADDR, wr.sgeAddress(i));
            NativeWords.putInt(sge + SGE_LENGTH, wr.sgeLength(i));
            NativeWords.putInt(sge + SGE_LKEY, wr.sgeLkey(i));
        }
        try {
            recvCall.execute();
        } catch (IOException e) {
            throw new RdmaException("ibv_post_recv on queue pair " + qpNumber + " failed: " + DisniErrors.clean(e),
                    e);
        }
        if (s != QpState.ERROR) {
            recvOutstanding++;
        } else {
            cmId.shutdown();
        }
    }

    /** Destroys the queue pair ({@code rdma_destroy_qp}); idempotent. */
    @Override
    public void close() {
        if (state == QpState.DESTROYED) {
            return;
        }
        state = QpState.DESTROYED;
        sendCq.detach(this);
        if (recvCq != sendCq) {
            recvCq.detach(this);
        }
        try {
            cmId.destroyQueuePair();
        } finally {
            sendCall.free();
            recvCall.free();
            pd.queuePairClosed();
            pd.device().provider().resourceUsage().queuePairs(-1);
        }
    }

    @Override
    public String toString() {
        return "DisniQueuePair{qp=" + qpNumber + ", " + state + '}';
    }
}
