package io.rdmabridge.verbs.soft;

import java.util.concurrent.atomic.AtomicBoolean;

/**
 * The connection under a pair of queue pairs: {@link DirectLink} inside one JVM, {@link TcpLink} across processes.
 * Thread-safe.
 */
abstract class SoftLink {
    final SoftEngine engine;
    /** Set once, when the link starts tearing down. */
    final AtomicBoolean torn = new AtomicBoolean();

    SoftLink(SoftEngine engine) {
        this.engine = engine;
    }

    /** {@code qp} has new work on its send queue, or a delayed or receiver-not-ready work request is due. */
    abstract void sendQueueReady(SoftQueuePair qp);

    /** A local, orderly {@code rdma_disconnect}: both sides flush and see {@code DISCONNECTED}. */
    abstract void disconnect(String reason);

    /** Cuts the link abruptly, as if the peer died: both sides flush and see {@code DISCONNECTED}. */
    abstract void drop(String reason);
}
