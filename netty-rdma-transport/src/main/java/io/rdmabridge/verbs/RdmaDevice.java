package io.rdmabridge.verbs;

import java.util.List;

/**
 * An opened RDMA device ({@code ibv_context}). Owned by its provider; thread-safe.
 */
public interface RdmaDevice {

    RdmaProvider provider();

    /** The device name, e.g. {@code mlx5_0} or {@code soft0}. */
    String name();

    /** The device's limits ({@code ibv_query_device}). */
    DeviceAttributes attributes();

    /** Its ports ({@code ibv_query_port}). */
    List<PortAttributes> ports();

    /** Allocates a protection domain ({@code ibv_alloc_pd}). */
    ProtectionDomain allocProtectionDomain() throws RdmaException;

    /**
     * Creates a completion queue ({@code ibv_create_cq}).
     *
     * @param entries  at least the number of completions that can be outstanding at once; at most
     *                 {@link DeviceAttributes#maxCqe()}
     * @param notifier signalled when the queue is armed with {@link CompletionQueue#requestNotify()} and a completion
     *                 arrives (the {@code ibv_comp_channel} of this SPI); may be {@code null} for pure polling
     */
    CompletionQueue createCompletionQueue(int entries, EventNotifier notifier) throws RdmaException;
}
