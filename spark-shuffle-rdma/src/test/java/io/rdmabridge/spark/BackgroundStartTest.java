package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * How an executor's transport starts ({@link BackgroundStart}): once, off the calling task's thread, so that Spark
 * killing that task (an interrupt) ends the task but not the start.
 */
class BackgroundStartTest {
    private final AtomicInteger starts = new AtomicInteger();

    @AfterEach
    void clearInterrupt() {
        Thread.interrupted();
    }

    @Test
    void shouldStartOnItsOwnThreadAndLetAnInterruptedCallerGo() throws Exception {
        Thread caller = Thread.currentThread();
        CountDownLatch done = new CountDownLatch(1);
        BackgroundStart<String> start = new BackgroundStart<>("start", () -> {
            starts.incrementAndGet();
            assertNotEquals(caller, Thread.currentThread(), "the start ran on the caller's thread");
            // Blocks as the registration's RPC does: on the interrupted caller's thread this would throw at once.
            Thread.sleep(100);
            done.countDown();
            return "started";
        });
        caller.interrupt();
        assertThrows(InterruptedException.class, start::await);
        assertEquals(1, done.getCount(), "the interrupted caller waited for the start");
        assertEquals("started", start.await(), "the next caller takes the start's result");
        assertEquals(0, done.getCount());
        assertEquals(1, starts.get(), "starts");
    }

    @Test
    void shouldGoOnWithAStartWhoseCallerIsInterruptedWhileItWaits() throws Exception {
        Thread caller = Thread.currentThread();
        CountDownLatch running = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        BackgroundStart<String> start = new BackgroundStart<>("start", () -> {
            starts.incrementAndGet();
            running.countDown();
            assertTrue(release.await(10, TimeUnit.SECONDS), "not released");
            return "started";
        });
        Thread killer = new Thread(() -> {
            try {
                running.await();
                caller.interrupt();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        killer.start();
        assertThrows(InterruptedException.class, start::await);
        killer.join();
        release.countDown();
        assertEquals("started", start.await());
        assertEquals(1, starts.get(), "starts");
    }

    @Test
    void shouldStartOnceForConcurrentCallers() throws Exception {
        CountDownLatch release = new CountDownLatch(1);
        BackgroundStart<String> start = new BackgroundStart<>("start", () -> {
            starts.incrementAndGet();
            assertTrue(release.await(10, TimeUnit.SECONDS), "not released");
            return "started";
        });
        ExecutorService tasks = Executors.newFixedThreadPool(4);
        try {
            List<Future<String>> results = new ArrayList<>();
            for (int i = 0; i < 4; i++) {
                results.add(tasks.submit(start::await));
            }
            release.countDown();
            for (Future<String> r : results) {
                assertEquals("started", r.get(10, TimeUnit.SECONDS));
            }
        } finally {
            tasks.shutdownNow();
        }
        assertEquals(1, starts.get(), "starts");
    }

    @Test
    void shouldRethrowAFailedStartAndRunItAgainForTheNextCaller() throws Exception {
        IllegalArgumentException thrown = new IllegalArgumentException("bad key");
        BackgroundStart<String> start = new BackgroundStart<>("start", () -> {
            if (starts.incrementAndGet() == 1) {
                throw thrown;
            }
            return "started";
        });
        assertSame(thrown, assertThrows(IllegalArgumentException.class, start::await));
        assertEquals("started", start.await());
        assertEquals(2, starts.get(), "starts");

        BackgroundStart<String> checked = new BackgroundStart<>("start", () -> {
            throw new java.io.IOException("no device");
        });
        IllegalStateException wrapped = assertThrows(IllegalStateException.class, checked::await);
        assertTrue(wrapped.getMessage().contains("no device"), wrapped.getMessage());
    }

    /**
     * An executor stopped while its start still waits (on Spark 3.5 its first task was killed, so nothing took the
     * start's result yet): the transport the start makes afterwards is closed, once, when it is made.
     */
    @Test
    void shouldCloseWhatAStartStillRunningMakesAfterTheClose() throws Exception {
        CountDownLatch release = new CountDownLatch(1);
        BackgroundStart<String> start = new BackgroundStart<>("start", () -> {
            assertTrue(release.await(10, TimeUnit.SECONDS), "not released");
            return "transport";
        });
        Thread.currentThread().interrupt(); // the first task, killed while it waits
        assertThrows(InterruptedException.class, start::await);
        List<String> closed = new java.util.concurrent.CopyOnWriteArrayList<>();
        start.close(closed::add);
        assertEquals(List.of(), closed, "closed before the start made anything");
        release.countDown();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (closed.isEmpty() && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
        Thread.sleep(50); // a second close would come at once
        assertEquals(List.of("transport"), closed, "what the start made after the close");
        assertThrows(IllegalStateException.class, start::await, "a call after the close");
    }

    @Test
    void shouldCloseAStartedResultOnceAndNothingWhereTheStartMadeNothing() throws Exception {
        BackgroundStart<String> start = new BackgroundStart<>("start", () -> "transport");
        assertEquals("transport", start.await());
        List<String> closed = new ArrayList<>();
        start.close(closed::add);
        start.close(closed::add);
        assertEquals(List.of("transport"), closed);

        // An executor that fell back: its start made no transport (null), and one that never started.
        List<String> none = new ArrayList<>();
        BackgroundStart<String> fellBack = new BackgroundStart<>("start", () -> null);
        assertEquals(null, fellBack.await());
        fellBack.close(none::add);
        new BackgroundStart<String>("start", () -> "never").close(none::add);
        assertEquals(List.of(), none);
    }
}
