package io.rdmabridge.verbs;

/**
 * A reliable-connected queue pair ({@code ibv_qp} of type {@code IBV_QPT_RC}), created on an {@link RdmaCmId} and
 * connected through it. Owned by one thread: posting happens there only.
 *
 * <h2>Semantics every provider keeps</h2>
 * <ul>
 *   <li>Receives may be posted from {@link QpState#INIT} on; sends only in {@link QpState#RTS}
 *       (earlier: {@link RdmaException}).</li>
 *   <li>Send completions arrive in posting order; receive completions in the order the peer's SENDs were posted.</li>
 *   <li>A SEND that finds no posted receive is retried up to the {@link ConnectionParameters#rnrRetryCount()} that
 *       the responder gave when it connected or accepted, then completes with
 *       {@link WcStatus#RNR_RETRY_EXC_ERR}; later work requests wait behind it (RC order).</li>
 *   <li>An RDMA READ or WRITE naming an unknown or dead rkey, bytes outside the region, or a region without the
 *       needed access completes with {@link WcStatus#REM_ACCESS_ERR} at the initiator and moves both queue pairs to
 *       {@link QpState#ERROR}. Nothing is written outside a registered region.</li>
 *   <li>A bad local lkey or range completes with {@link WcStatus#LOC_PROT_ERR}; a SEND larger than the receive
 *       buffer completes with {@link WcStatus#LOC_LEN_ERR} at the receiver and {@link WcStatus#REM_INV_REQ_ERR}
 *       at the sender.</li>
 *   <li>In {@link QpState#ERROR} every outstanding work request, signaled or not, and every newly posted one,
 *       completes with {@link WcStatus#WR_FLUSH_ERR}.</li>
 *   <li>Posting beyond the queue depth fixed in {@link QpCapabilities} throws {@link RdmaException}
 *       ({@code ENOMEM} from {@code ibv_post_send}); callers count their own outstanding work requests.</li>
 * </ul>
 */
public interface QueuePair extends AutoCloseable {

    /** The queue pair number, unique per device while alive. */
    int qpNumber();

    QpState state();

    /** The capabilities granted at creation (may exceed those requested). */
    QpCapabilities capabilities();

    ProtectionDomain protectionDomain();

    CompletionQueue sendCompletionQueue();

    CompletionQueue recvCompletionQueue();

    /**
     * Posts a send work request ({@code ibv_post_send}). Allocates nothing. The request object may be reused when
     * this returns; for {@link SendWorkRequest#INLINE} the payload memory may be reused too.
     *
     * @throws RdmaException when the queue pair is not yet connected, the send queue is full, or the request is
     *                       malformed (too many entries, inline too large); nothing was posted
     */
    void postSend(SendWorkRequest wr) throws RdmaException;

    /**
     * Posts a receive work request ({@code ibv_post_recv}). Allocates nothing.
     *
     * @throws RdmaException when the receive queue is full or the request is malformed; nothing was posted
     */
    void postRecv(RecvWorkRequest wr) throws RdmaException;

    /**
     * Destroys the queue pair ({@code ibv_destroy_qp}). Outstanding work requests are dropped without completions:
     * disconnect and drain the flush completions first when their buffers matter. Idempotent.
     */
    @Override
    void close();
}
