package io.rdmabridge.verbs;

/**
 * A device's limits, the subset of {@code ibv_device_attr} this project sizes its queues and registrations by.
 *
 * @param name            device name
 * @param transport       what carries the bytes, e.g. {@code InfiniBand}, {@code RoCE}, {@code iWARP},
 *                        {@code software (TCP / in-JVM)}
 * @param maxQp           queue pairs per device
 * @param maxQpWr         work requests per send or receive queue
 * @param maxSge          scatter/gather entries per work request
 * @param maxCqe          entries per completion queue
 * @param maxInlineData   bytes a SEND or WRITE may carry inline (copied at post time; the buffer is free at once)
 * @param maxMrSize       bytes in one memory region
 * @param maxMr           memory regions per device
 * @param maxQpRdAtom     RDMA READs one queue pair may have outstanding as initiator
 */
public record DeviceAttributes(
        String name,
        String transport,
        int maxQp,
        int maxQpWr,
        int maxSge,
        int maxCqe,
        int maxInlineData,
        long maxMrSize,
        int maxMr,
        int maxQpRdAtom) {
}
