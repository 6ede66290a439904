package io.rdmabridge.verbs.soft;

/**
 * Two queue pairs of one JVM joined without a socket: the requester's posting thread executes each work request
 * straight against the peer's registered memory and receive queue and writes both sides' completions, so the fast
 * path has no thread hop and no copy beyond the one RDMA itself implies. The timer thread takes over only for
 * receiver-not-ready retries and injected delays. Thread-safe.
 */
final class DirectLink extends SoftLink {
    final SoftQueuePair active;
    final SoftQueuePair passive;

    DirectLink(SoftEngine engine, SoftQueuePair active, SoftQueuePair passive) {
        super(engine);
        this.active = active;
        this.passive = passive;
        engine.links.add(this);
    }

    @Override
    void sendQueueReady(SoftQueuePair qp) {
        qp.executeDirect(qp == active ? passive : active, this);
    }

    /** Both queue pairs to ERROR, both flushed, both ids DISCONNECTED; once. Call with no queue-pair lock held. */
    void teardown(String reason) {
        if (!torn.compareAndSet(false, true)) {
            return;
        }
        SoftEngine.logger.debug("soft0: the connection of {} ends: {}", this, reason);
        engine.links.remove(this);
        active.enterError();
        passive.enterError();
        active.cmId.onDisconnected(reason);
        passive.cmId.onDisconnected(reason);
    }

    @Override
    void disconnect(String reason) {
        teardown(reason);
    }

    @Override
    void drop(String reason) {
        teardown(reason);
    }

    @Override
    public String toString() {
        return "DirectLink{qp " + active.qpn + " <-> qp " + passive.qpn + '}';
    }
}
