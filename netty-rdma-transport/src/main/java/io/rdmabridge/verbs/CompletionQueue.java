package io.rdmabridge.verbs;

/**
 * A completion queue ({@code ibv_cq}). Owned by one thread: {@link #poll(WorkCompletions)} and
 * {@link #requestNotify()} are called from it alone; providers deliver into it from their own threads.
 *
 * <p>Waiting without losing a completion:
 * <pre>
 * while (running) {
 *     int n = cq.poll(wc);
 *     if (n == 0) {
 *         cq.requestNotify();          // arm
 *         n = cq.poll(wc);             // a completion may have landed before the arm
 *         if (n == 0) {
 *             notifier.await(timeout); // the provider signals once a completion arrives on an armed queue
 *             continue;
 *         }
 *     }
 *     handle(wc, n);
 * }
 * </pre>
 */
public interface CompletionQueue extends AutoCloseable {

    RdmaDevice device();

    /** How many completions it can hold; a provider that would overflow it moves the affected QPs to ERROR. */
    int capacity();

    /**
     * Moves up to {@code out.capacity()} completions into {@code out}, starting at index 0 ({@code ibv_poll_cq}).
     * Allocates nothing.
     *
     * @return how many entries of {@code out} were filled
     */
    int poll(WorkCompletions out);

    /**
     * Arms the queue ({@code ibv_req_notify_cq}): the next completion that arrives signals the queue's
     * {@link EventNotifier} once. Completions already queued do not signal; poll again after arming.
     */
    void requestNotify();

    /**
     * Destroys the queue ({@code ibv_destroy_cq}). Returns without waiting for a thread of the provider that waits for
     * the queue's events: that thread may finish the destroy shortly after, and {@link ResourceUsage} counts the queue
     * until then.
     *
     * @throws IllegalStateException when queue pairs still use it
     */
    @Override
    void close();
}
