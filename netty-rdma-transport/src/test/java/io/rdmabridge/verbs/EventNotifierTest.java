package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

class EventNotifierTest {

    @Test
    void shouldRememberSignalThatArrivesBeforeAwait() {
        EventNotifier n = new EventNotifier();
        n.signal();

        assertTrue(n.await(0));
        assertFalse(n.await(0), "a signal is consumed once");
    }

    @Test
    void shouldTimeOutWithoutSignal() {
        EventNotifier n = new EventNotifier();

        assertFalse(n.await(TimeUnit.MILLISECONDS.toNanos(20)));
    }

    @Test
    void shouldWakeWaiterFromAnotherThread() throws Exception {
        EventNotifier n = new EventNotifier();
        CountDownLatch woke = new CountDownLatch(1);
        Thread waiter = new Thread(() -> {
            if (n.await(-1)) {
                woke.countDown();
            }
        });
        waiter.start();
        Thread.sleep(50);
        n.signal();

        assertTrue(woke.await(5, TimeUnit.SECONDS), "waiter was not woken");
        waiter.join(5000);
    }

    @Test
    void shouldNeverLoseSignalsUnderRace() throws Exception {
        EventNotifier n = new EventNotifier();
        int rounds = 20_000;
        AtomicInteger consumed = new AtomicInteger();
        CountDownLatch go = new CountDownLatch(1);
        Thread waiter = new Thread(() -> {
            for (int i = 0; i < rounds; i++) {
                if (n.await(TimeUnit.SECONDS.toNanos(5))) {
                    consumed.incrementAndGet();
                }
                go.countDown();
            }
        });
        waiter.start();
        // Every signal is followed by the waiter consuming one: a lost wake-up would surface as a 5 s timeout.
        for (int i = 0; i < rounds; i++) {
            while (consumed.get() < i) {
                Thread.onSpinWait();
            }
            n.signal();
        }
        waiter.join(30_000);

        assertFalse(waiter.isAlive());
        assertTrue(consumed.get() == rounds, "consumed " + consumed.get() + " of " + rounds);
    }
}
