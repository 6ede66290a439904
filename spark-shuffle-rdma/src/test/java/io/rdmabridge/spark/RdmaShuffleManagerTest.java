package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * How an executor's transport starts: {@link RdmaShuffleManager#callUninterruptibly}, which keeps a task's interrupt
 * (Spark's way of killing a task, on Spark 3.5 possibly the task that starts the transport) out of the start.
 */
class RdmaShuffleManagerTest {

    /**
     * Initializes the class (its logger) on a thread that is not interrupted, as Spark does when it builds the
     * manager: log4j's start-up waits for a lock interruptibly.
     */
    @BeforeAll
    static void initialize() throws ClassNotFoundException {
        Class.forName(RdmaShuffleManager.class.getName());
    }

    @AfterEach
    void clearInterrupt() {
        Thread.interrupted();
    }

    @Test
    void shouldStartOnItsOwnThreadWhenTheCallerIsAlreadyInterrupted() {
        Thread caller = Thread.currentThread();
        caller.interrupt();
        String result = RdmaShuffleManager.callUninterruptibly("start", () -> {
            assertNotEquals(caller, Thread.currentThread(), "the start ran on the caller's thread");
            // Blocks as the registration's RPC does: on an interrupted thread this would throw at once.
            Thread.sleep(50);
            return "started";
        });
        assertEquals("started", result);
        assertTrue(Thread.interrupted(), "the caller's interrupt status was not restored");
    }

    @Test
    void shouldFinishTheStartWhenTheCallerIsInterruptedWhileItWaits() throws Exception {
        Thread caller = Thread.currentThread();
        CountDownLatch running = new CountDownLatch(1);
        CountDownLatch interrupted = new CountDownLatch(1);
        Thread killer = new Thread(() -> {
            try {
                running.await();
                caller.interrupt();
                interrupted.countDown();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        killer.start();
        String result = RdmaShuffleManager.callUninterruptibly("start", () -> {
            running.countDown();
            assertTrue(interrupted.await(10, TimeUnit.SECONDS), "the caller was not interrupted");
            Thread.sleep(20);
            return "started";
        });
        killer.join();
        assertEquals("started", result);
        assertTrue(Thread.interrupted(), "the caller's interrupt status was not restored");
    }

    @Test
    void shouldRethrowWhatTheStartThrows() {
        IllegalArgumentException thrown = new IllegalArgumentException("bad key");
        assertSame(thrown, assertThrows(IllegalArgumentException.class,
                () -> RdmaShuffleManager.callUninterruptibly("start", () -> {
                    throw thrown;
                })));
        IllegalStateException wrapped = assertThrows(IllegalStateException.class,
                () -> RdmaShuffleManager.callUninterruptibly("start", () -> {
                    throw new java.io.IOException("no device");
                }));
        assertTrue(wrapped.getMessage().contains("no device"), wrapped.getMessage());
        assertTrue(!Thread.currentThread().isInterrupted(), "an interrupt status the caller never had");
    }
}
