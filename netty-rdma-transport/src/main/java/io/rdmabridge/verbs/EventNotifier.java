package io.rdmabridge.verbs;

import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;

/**
 * The wake-up an event loop waits on: completion queues armed with {@link CompletionQueue#requestNotify()} and
 * connection-manager event channels signal it, and so may any thread that wants the loop to run (Netty's
 * {@code IoHandler.wakeup()}). It plays the role of {@code ibv_comp_channel} and the CM event fd under one epoll.
 *
 * <p>One thread waits ({@link #await(long)}); any thread signals. A signal that arrives while nobody waits is
 * remembered, so the standard "arm, poll once more, then wait" sequence never loses a wake-up. Signalling allocates
 * nothing and takes no lock.
 */
public final class EventNotifier {
    private static final int IDLE = 0;
    private static final int SIGNALLED = 1;
    private static final int WAITING = 2;

    private final AtomicInteger state = new AtomicInteger(IDLE);
    private volatile Thread waiter;

    /**
     * Waits until signalled or the timeout passes, then clears the signal.
     *
     * @param timeoutNanos how long to wait at most; {@code 0} returns at once, negative waits without limit
     * @return whether a signal was consumed
     */
    public boolean await(long timeoutNanos) {
        if (state.compareAndSet(SIGNALLED, IDLE)) {
            return true;
        }
        if (timeoutNanos == 0) {
            return false;
        }
        waiter = Thread.currentThread();
        if (!state.compareAndSet(IDLE, WAITING)) {
            // Signalled between the two checks.
            waiter = null;
            state.set(IDLE);
            return true;
        }
        long deadline = timeoutNanos > 0 ? System.nanoTime() + timeoutNanos : 0;
        try {
            while (state.get() == WAITING) {
                if (timeoutNanos < 0) {
                    LockSupport.park(this);
                } else {
                    long left = deadline - System.nanoTime();
                    if (left <= 0) {
                        break;
                    }
                    LockSupport.parkNanos(this, left);
                }
                if (Thread.interrupted()) {
                    Thread.currentThread().interrupt();
                    break;
                }
            }
        } finally {
            waiter = null;
        }
        // Either a signal moved us to SIGNALLED, or we timed out / were interrupted while still WAITING.
        return state.getAndSet(IDLE) == SIGNALLED;
    }

    /** Convenience for {@link #await(long)} with a unit. */
    public boolean await(long timeout, TimeUnit unit) {
        return await(unit.toNanos(timeout));
    }

    /** Wakes the waiter, or makes its next {@link #await(long)} return at once. Any thread; never blocks. */
    public void signal() {
        int previous = state.getAndSet(SIGNALLED);
        if (previous == WAITING) {
            Thread t = waiter;
            if (t != null) {
                LockSupport.unpark(t);
            }
        }
    }
}
