package io.rdmabridge.spark;

import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.FutureTask;
import java.util.function.Consumer;

/**
 * A start that runs once, on a thread of its own, whoever asks for it first; every caller waits for its result. A
 * caller interrupted while it waits leaves with {@link InterruptedException} and the start goes on: on Spark 3.5 an
 * executor's transport starts in its first shuffle task, which Spark interrupts to kill it (a speculative copy that
 * lost, a cancelled job), and an interrupted registration RPC made the executor fall back to Spark's own transport for
 * the rest of its life. The killed task ends at once; the next task takes the start's result. A start that throws is
 * run again by the next caller. {@link #close} disposes of the result, also of one that a start still running makes
 * later (an executor stopped while its start waits for the driver), and refuses later calls. Thread-safe.
 *
 * @param <T> what the start makes
 */
final class BackgroundStart<T> {
    private final String threadName;
    private final Callable<T> start;
    /** The start running or done; {@code null} before the first call and after a failed start. Guarded by this. */
    private FutureTask<T> task;
    // Guarded by this: set by close(); whether the result was handed to the closer (by close() or by the start's
    // thread, whichever sees both the close and the start's end first).
    private Consumer<? super T> closer;
    private boolean resultClosed;

    BackgroundStart(String threadName, Callable<T> start) {
        this.threadName = threadName;
        this.start = start;
    }

    /**
     * The start's result, once it has ended; starts it on the first call.
     *
     * @throws InterruptedException when the caller is interrupted while it waits; the start goes on
     * @throws IllegalStateException once {@link #close} ran
     */
    T await() throws InterruptedException {
        FutureTask<T> t;
        synchronized (this) {
            if (closer != null) {
                throw new IllegalStateException(threadName + ": closed (the shuffle manager was stopped)");
            }
            t = task;
            if (t == null) {
                FutureTask<T> started = new FutureTask<>(start);
                Thread thread = new Thread(() -> {
                    started.run();
                    closeIfClosed(started);
                }, threadName);
                thread.setDaemon(true);
                thread.start();
                task = started;
                t = started;
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

    /**
     * Hands the start's result to {@code closer}: now when the start has ended, else when it ends. A start that
     * failed, or made {@code null}, leaves nothing to close. Once; later calls do nothing.
     */
    void close(Consumer<? super T> closer) {
        FutureTask<T> t;
        synchronized (this) {
            if (this.closer != null) {
                return;
            }
            this.closer = closer;
            t = task;
            if (t == null || !t.isDone() || resultClosed) {
                return; // nothing started, or the start's thread closes its result when it ends
            }
            resultClosed = true;
        }
        closeResult(t, closer);
    }

    /** On the start's thread, once it ended: closes the result when {@link #close} came first. */
    private void closeIfClosed(FutureTask<T> t) {
        Consumer<? super T> c;
        synchronized (this) {
            if (closer == null || resultClosed || task != t) {
                return;
            }
            resultClosed = true;
            c = closer;
        }
        closeResult(t, c);
    }

    private static <T> void closeResult(FutureTask<T> t, Consumer<? super T> closer) {
        T result;
        try {
            result = t.get();
        } catch (ExecutionException | InterruptedException e) {
            return; // a failed start made nothing (get() does not wait: the task is done)
        }
        if (result != null) {
            closer.accept(result);
        }
    }
}
