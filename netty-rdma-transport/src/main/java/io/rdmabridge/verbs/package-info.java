/**
 * The verbs SPI: a small, completion-based mirror of ibverbs and the RDMA connection manager.
 *
 * <h2>Object graph</h2>
 * <pre>
 * RdmaProvider ──createEventChannel──▶ RdmaEventChannel ──createId──▶ RdmaCmId
 *      │                                      │ poll(CmEvent)            │ listen / resolve / connect / accept
 *      └──devices──▶ RdmaDevice ◀──device()───────────────────────────────┘ createQueuePair ──▶ QueuePair
 *                      │ allocProtectionDomain ──▶ ProtectionDomain ──register──▶ MemoryRegion
 *                      └ createCompletionQueue ──▶ CompletionQueue ──poll──▶ WorkCompletions
 * </pre>
 *
 * <h2>Rules every provider keeps</h2>
 * <ul>
 *   <li>Providers are found with {@link java.util.ServiceLoader} and chosen by {@link io.rdmabridge.verbs.RdmaProviders}.
 *       A provider never throws from a static initializer; {@link io.rdmabridge.verbs.RdmaProvider#isAvailable()}
 *       and {@link io.rdmabridge.verbs.RdmaProvider#unavailabilityCause()} say whether it can be used and why not.</li>
 *   <li>The hot path allocates nothing: {@link io.rdmabridge.verbs.SendWorkRequest},
 *       {@link io.rdmabridge.verbs.RecvWorkRequest} and {@link io.rdmabridge.verbs.WorkCompletions} are preallocated
 *       and reused by the caller; {@code wr_id} is a caller-packed 64-bit tag.</li>
 *   <li>Reliable-connected semantics: send-queue completions of one queue pair arrive in posting order; a signaled
 *       completion implies every earlier work request of that queue has completed; errors always complete, signaled
 *       or not; an error moves the queue pair to {@link io.rdmabridge.verbs.QpState#ERROR} and flushes every
 *       outstanding work request with {@link io.rdmabridge.verbs.WcStatus#WR_FLUSH_ERR}.</li>
 *   <li>Every resource is counted in {@link io.rdmabridge.verbs.ResourceUsage}; tests assert it returns to zero.</li>
 * </ul>
 *
 * <h2>Threading</h2>
 * A queue pair, its completion queues and the event channel it was created from are owned by one thread (an event
 * loop); only {@link io.rdmabridge.verbs.EventNotifier#signal()} and the resource counters may be used from any thread.
 * Providers do their own work (the soft provider's engine, DiSNI's event threads) on threads of their own and
 * hand results over through completion queues, CM events and the notifier.
 */
package io.rdmabridge.verbs;
