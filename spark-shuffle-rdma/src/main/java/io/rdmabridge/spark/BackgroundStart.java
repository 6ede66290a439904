package io.rdmabridge.spark;

import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.FutureTask;

/**
 * A start that runs once, on a thread of its own, whoever asks for it first; every caller waits for its result. A
 * caller interrupted while it waits leaves with {@link InterruptedException} and the start goes on: on Spark 3.5 an
 * executor's transport starts in its first shuffle task, which Spark interrupts to kill it (a speculative copy that
 * lost, a cancelled job), and an interrupted registration RPC made the executor fall back to Spark's own transport for
 * the rest of its life. The killed task ends at once; the next task takes the start's result. A start that throws is
 * run again by the next caller. Thread-safe.
 *
 * @param <T> what the start makes
 */
final class BackgroundStart<T> {
    private final String threadName;
    private final Callable<T> start;
    /** The start running or done; {@code null} before the first call and after a failed start. Guarded by this. */
    private FutureTask<T> task;

    BackgroundStart(String threadName, Callable<T> start) {
        this.threadName = threadName;
        this.start = start;
    }

    /**
     * The start's result, once it has ended; starts it on the first call.
     *
     * @throws InterruptedException when the caller is interrupted while it waits; the start goes on
     */
    T await() throws InterruptedException {
        FutureTask<T> t;
        synchronized (this) {
            t = task;
            if (t == null) {
                t = new FutureTask<>(start);
                Thread thread = new Thread(t, threadName);
                thread.setDaemon(true);
                thread.start();
                task = t;
            }
        }
        try {
            return t.get();
        } catch (ExecutionException e) {
            synchronized (this) {
                if (task == t) {
                    task = null;
                }
            }
            Throwable cause = e.getCause();
            if (cause instanceof RuntimeException r) {
                throw r;
            }
            if (cause instanceof Error error) {
                throw error;
            }
            throw new IllegalStateException(threadName + " failed: " + cause, cause);
        }
    }
}
