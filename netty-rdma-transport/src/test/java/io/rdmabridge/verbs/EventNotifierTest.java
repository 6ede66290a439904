package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.DatagramChannel;
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
        Thread waiter = awaitInThread(n, woke);
        Thread.sleep(50);
        n.signal();

        assertTrue(woke.await(5, TimeUnit.SECONDS), "waiter was not woken");
        waiter.join(5000);
    }

    @Test
    void shouldNeverLoseSignalsUnderRace() throws Exception {
        neverLoseSignals(new EventNotifier());
    }

    @Test
    void shouldNeverLoseSignalsUnderRaceWhileWaitingOnItsWakeSocket() throws Exception {
        try (EventNotifier n = new EventNotifier()) {
            assertTrue(n.loopbackWakePort() > 0);
            neverLoseSignals(n);
        }
    }

    @Test
    void shouldWakeTheWaiterWithADatagramFromAnySocket() throws Exception {
        try (EventNotifier n = new EventNotifier(); DatagramChannel peer = DatagramChannel.open()) {
            int port = n.loopbackWakePort();
            assertTrue(port > 0, "port " + port);
            assertEquals(port, n.loopbackWakePort(), "one socket per notifier");
            CountDownLatch woke = new CountDownLatch(1);
            Thread waiter = awaitInThread(n, woke);
            Thread.sleep(50);
            assertEquals(1, woke.getCount(), "woken before the datagram");
            peer.send(ByteBuffer.wrap(new byte[] {7}), new InetSocketAddress(InetAddress.getLoopbackAddress(), port));

            assertTrue(woke.await(5, TimeUnit.SECONDS), "waiter was not woken by the datagram");
            waiter.join(5000);
            assertFalse(n.await(TimeUnit.MILLISECONDS.toNanos(20)), "the datagram was consumed once");
        }
    }

    @Test
    void shouldDrainAFloodOfDatagramsInBoundedStepsAndThenSleep() throws Exception {
        try (EventNotifier n = new EventNotifier(); DatagramChannel flood = DatagramChannel.open()) {
            InetSocketAddress to = new InetSocketAddress(InetAddress.getLoopbackAddress(), n.loopbackWakePort());
            ByteBuffer junk = ByteBuffer.allocate(1500);
            int sent = 1000;
            for (int i = 0; i < sent; i++) {
                junk.clear();
                flood.send(junk, to);
            }
            // Each wake-up reads at most MAX_DATAGRAMS_PER_WAKE (the kernel may have dropped some of the flood).
            int wakes = 0;
            while (n.await(TimeUnit.MILLISECONDS.toNanos(100))) {
                wakes++;
                assertTrue(wakes <= sent, "the waiter keeps waking: " + wakes);
            }
            assertTrue(wakes >= 1, "no wake-up from " + sent + " datagrams");
            assertTrue(wakes <= (sent + EventNotifier.MAX_DATAGRAMS_PER_WAKE - 1) / EventNotifier.MAX_DATAGRAMS_PER_WAKE,
                    "wake-ups for " + sent + " datagrams: " + wakes);
            assertFalse(n.await(TimeUnit.MILLISECONDS.toNanos(20)), "woken with the flood drained");
        }
    }

    @Test
    void shouldParkAgainOnceClosed() {
        EventNotifier n = new EventNotifier();
        assertTrue(n.loopbackWakePort() > 0);
        n.close();
        n.close();

        assertThrows(IllegalStateException.class, n::loopbackWakePort);
        assertFalse(n.await(TimeUnit.MILLISECONDS.toNanos(20)));
        n.signal();
        assertTrue(n.await(0));
    }

    /** A thread that waits on {@code n} without limit and counts {@code woke} down if the wait consumed a wake-up. */
    private static Thread awaitInThread(EventNotifier n, CountDownLatch woke) {
        Thread waiter = new Thread(() -> {
            if (n.await(-1)) {
                woke.countDown();
            }
        });
        waiter.start();
        return waiter;
    }

    private static void neverLoseSignals(EventNotifier n) throws Exception {
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
