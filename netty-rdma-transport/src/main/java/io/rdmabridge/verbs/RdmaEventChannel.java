package io.rdmabridge.verbs;

/**
 * A connection-manager event channel ({@code rdma_event_channel}): ids created on it report their events here.
 * Owned by one thread (an event loop); the provider signals the channel's {@link EventNotifier} when events wait.
 */
public interface RdmaEventChannel extends AutoCloseable {

    RdmaProvider provider();

    /** Creates a communication identifier ({@code rdma_create_id}, port space TCP). */
    RdmaCmId createId() throws RdmaException;

    /**
     * Takes the next event, if any, without blocking ({@code rdma_get_cm_event} + {@code rdma_ack_cm_event}).
     *
     * @return whether {@code event} was filled
     */
    boolean poll(CmEvent event);

    /**
     * Whether events have arrived that {@link #poll} has not taken yet. Cheap (no system call), for the owner to
     * ask before acting on state an unread event may already contradict: a peer's disconnect is known to the device
     * as soon as its event is queued, but a queue pair still looks healthy until the owner polls it.
     */
    boolean hasPendingEvents();

    /**
     * Destroys the channel. Ids still alive on it are closed.
     */
    @Override
    void close();
}
