package io.rdmabridge.verbs.disni;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.rdmabridge.internal.LinuxEpoll;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The provider's one thread for every completion channel, with eventfds standing in for the channels (a completion
 * channel is, to epoll, a descriptor that is readable while an event waits). Runs in the surefire execution that opens
 * {@code sun.nio.ch} (the module's pom); the DiSNI conformance suite runs it with real channels in the rxe stage.
 */
class CompletionEventThreadTest {
    private static final String NAME = "test-cq-events";
    /** Short linger, so that each test sees its thread end. */
    private final CompletionEventThread events = new CompletionEventThread(NAME, 50);
    private final List<Channel> channels = new ArrayList<>();

    @BeforeAll
    static void needsTheJdkEpoll() {
        // The jdk-epoll execution opens sun.nio.ch and says so; there the test must run. Elsewhere (a -Dtest run,
        // which the default execution does not exclude it from) nothing opens it.
        if (!Boolean.getBoolean("rdmabridge.test.jdkEpoll")) {
            assumeTrue(LinuxEpoll.unavailabilityCause() == null, "sun.nio.ch is not opened to this JVM: the module's"
                    + " jdk-epoll execution runs this test");
        }
    }

    @AfterEach
    void removeAll() throws InterruptedException {
        for (Channel c : channels) {
            if (!c.removed) {
                c.removed = true;
                events.remove(c);
            }
        }
        await(() -> channels.stream().allMatch(c -> c.releasedOn.get() != null), "every channel released");
        await(() -> !events.isRunning(), "the thread ended with its last channel");
    }

    @Test
    void shouldTellOnlyTheChannelWhoseDescriptorIsReadable() throws Exception {
        for (int i = 0; i < 8; i++) {
            add(new Channel());
        }
        channels.get(5).fire();
        await(() -> channels.get(5).readable.get() == 1, "channel 5 took its event");
        channels.get(2).fire();
        channels.get(7).fire();
        await(() -> channels.get(2).readable.get() == 1 && channels.get(7).readable.get() == 1,
                "channels 2 and 7 took their events");
        Thread.sleep(100); // a level-triggered set would report a channel again until its event is taken
        for (int i = 0; i < channels.size(); i++) {
            assertEquals(i == 2 || i == 5 || i == 7 ? 1 : 0, channels.get(i).readable.get(), "events of channel " + i);
        }
    }

    @Test
    void shouldWaitForManyChannelsOnOneThreadThatEndsWithTheLast() throws Exception {
        for (int i = 0; i < 100; i++) {
            add(new Channel());
        }
        assertEquals(1, threadsNamed(NAME), "threads waiting for 100 channels");
        for (Channel c : channels) {
            c.removed = true;
            events.remove(c);
        }
        await(() -> channels.stream().allMatch(c -> c.releasedOn.get() != null), "every channel released");
        for (Channel c : channels) {
            // Released by the thread, after it took the descriptor out of its set.
            assertEquals(NAME, c.releasedOn.get(), "thread that released a channel");
        }
        await(() -> !events.isRunning() && threadsNamed(NAME) == 0, "the thread ended with its last channel");

        Channel later = add(new Channel());
        later.fire();
        await(() -> later.readable.get() == 1, "a channel added later took its event (a new thread started)");
        assertEquals(1, threadsNamed(NAME));
    }

    @Test
    void shouldTakeOutOnlyTheChannelWhoseEventFails() throws Exception {
        Channel broken = add(new Channel());
        Channel healthy = add(new Channel());
        broken.failWith = new IOException("ibv_get_cq_event failed: Bad file descriptor");
        broken.fire();
        await(() -> broken.failedWith.get() != null, "the failing channel told why");
        assertSame(broken.failWith, broken.failedWith.get());
        broken.failWith = null;
        broken.fire(); // still readable: a set that kept it would report it again
        healthy.fire();
        await(() -> healthy.readable.get() == 1, "the other channel took its event");
        Thread.sleep(100);
        assertEquals(1, broken.readable.get(), "events reported for the channel taken out");

        broken.removed = true;
        events.remove(broken);
        await(() -> broken.releasedOn.get() != null, "the failed channel released at its removal");
    }

    @Test
    void shouldReleaseOnTheCallerOnceNoThreadRuns() throws Exception {
        Channel c = add(new Channel());
        c.removed = true;
        events.remove(c);
        await(() -> !events.isRunning(), "the thread ended");
        Channel late = new Channel();
        channels.add(late);
        late.removed = true;
        events.remove(late); // never added, and no thread: released at once
        assertEquals(Thread.currentThread().getName(), late.releasedOn.get());
        assertFalse(events.isRunning());
        assertNull(c.failedWith.get());
    }

    @Test
    void shouldKeepItsThreadForAChannelThatComesSoonAfterTheLastLeft() throws Exception {
        // A peer that connects and closes, over and over, on an otherwise idle server: not a thread per connection.
        CompletionEventThread lingering = new CompletionEventThread("test-cq-linger", 10_000);
        Channel first = new Channel();
        lingering.add(first);
        Thread thread = threadNamed("test-cq-linger");
        lingering.remove(first);
        await(() -> first.releasedOn.get() != null, "the first channel released");
        Channel second = new Channel();
        lingering.add(second);
        second.fire();
        await(() -> second.readable.get() == 1, "the second channel took its event");
        assertTrue(thread.isAlive() && lingering.isRunning(), "the thread ended between the channels");
        assertSame(thread, threadNamed("test-cq-linger"), "a new thread for the second channel");
        lingering.remove(second);
        await(() -> second.releasedOn.get() != null, "the second channel released");
    }

    /**
     * An Error on the thread (out of memory, say) ends it, but not silently: every channel is told, waiting removals
     * are released, and the next channel gets a thread that works.
     */
    @Test
    void shouldTellEveryChannelAndStartAfreshWhenTheThreadMeetsAnError() throws Exception {
        Channel victim = add(new Channel());
        Channel bystander = add(new Channel());
        victim.errorWith = new OutOfMemoryError("injected: Java heap space");
        victim.fire();
        await(() -> victim.failedWith.get() != null && bystander.failedWith.get() != null, "both channels told");
        assertSame(victim.errorWith, bystander.failedWith.get());
        await(() -> !events.isRunning(), "the thread ended");

        Channel later = add(new Channel());
        later.fire();
        await(() -> later.readable.get() == 1, "a channel added after the error took its event");
        bystander.removed = true;
        events.remove(bystander); // left the set with the error: released at once by whoever removes it
        await(() -> bystander.releasedOn.get() != null, "a channel of the failed thread released");
    }

    private static Thread threadNamed(String name) {
        return Thread.getAllStackTraces().keySet().stream().filter(t -> t.getName().equals(name)).findFirst()
                .orElseThrow(() -> new AssertionError("no thread named " + name));
    }

    private Channel add(Channel c) throws IOException {
        channels.add(c);
        events.add(c);
        return c;
    }

    private static long threadsNamed(String name) {
        return Thread.getAllStackTraces().keySet().stream().filter(t -> t.getName().equals(name)).count();
    }

    private static void await(BooleanSupplier condition, String what) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!condition.getAsBoolean()) {
            assertTrue(System.nanoTime() < deadline, "not within 10 s: " + what);
            Thread.sleep(5);
        }
    }

    /** An eventfd as a completion channel: {@link #fire()} makes an event wait, {@link #readable()} takes it. */
    private static final class Channel implements CompletionEventThread.Watched {
        final LinuxEpoll.EventFd fd = LinuxEpoll.newEventFd();
        final AtomicInteger readable = new AtomicInteger();
        final AtomicReference<Throwable> failedWith = new AtomicReference<>();
        final AtomicReference<String> releasedOn = new AtomicReference<>();
        volatile IOException failWith;
        volatile Error errorWith;
        boolean removed;

        Channel() throws IOException {
        }

        void fire() throws IOException {
            fd.set();
        }

        @Override
        public int fd() {
            return fd.fd();
        }

        @Override
        public void readable() throws IOException {
            readable.incrementAndGet();
            Error error = errorWith;
            if (error != null) {
                throw error;
            }
            IOException e = failWith;
            if (e != null) {
                throw e; // the event stays: only leaving the set stops the reports
            }
            fd.reset();
        }

        @Override
        public void failed(Throwable cause) {
            failedWith.set(cause);
        }

        @Override
        public void released() {
            assertTrue(releasedOn.compareAndSet(null, Thread.currentThread().getName()), "released twice");
            fd.close();
        }
    }
}
