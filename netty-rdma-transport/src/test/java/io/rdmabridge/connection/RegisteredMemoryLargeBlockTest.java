package io.rdmabridge.connection;

import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.ResourceUsage;
import io.rdmabridge.verbs.soft.SoftProvider;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Allocations above the pooled sizes get a registration of their own; a freed one is kept for the next allocation it
 * fits, so a stream of multi-MiB rendezvous targets stops paying a registration (on the soft provider: a shared file
 * created, committed and deleted) per message. Measured before: 4 MiB messages across processes spent 68 % of the
 * receiving loop making and freeing them. The cache is bounded, trimmed when idle and emptied at close.
 */
class RegisteredMemoryLargeBlockTest {
    private static final long PERIOD_MILLIS = 1000;
    private static final long PERIOD = PERIOD_MILLIS * 1_000_000L;
    private static final int MIB = 1024 * 1024;

    private final SoftProvider provider = new SoftProvider();
    private ProtectionDomain pd;
    private RegisteredMemory memory;

    @BeforeEach
    void setUp() throws Exception {
        pd = provider.devices().get(0).allocProtectionDomain();
        memory = new RegisteredMemory(pd, PERIOD_MILLIS, 16L * MIB);
    }

    @AfterEach
    void tearDown() {
        memory.close();
        assertTrue(memory.isReleased(), "dedicated bytes left after close: " + memory.dedicatedBytes());
        pd.close();
        assertTrue(provider.resourceUsage().isZero(), "leaked: " + provider.resourceUsage());
    }

    private long registrations() {
        return provider.resourceUsage().memoryRegions();
    }

    @Test
    void shouldReuseAFreedLargeBlockWithoutRegisteringAgain() throws Exception {
        RegisteredMemory.Block first = memory.allocate(4 * MIB);
        long regions = registrations();
        first.free();
        assertEquals(4L * MIB, memory.dedicatedBytes(), "a freed large block is kept registered for reuse");
        assertEquals(regions, registrations());

        for (int i = 0; i < 100; i++) {
            RegisteredMemory.Block again = memory.allocate(4 * MIB - i);
            assertSame(first, again, "allocation " + i + " did not reuse the kept block");
            assertEquals(regions, registrations(), "allocation " + i + " registered memory again");
            again.free();
        }
    }

    @Test
    void shouldNotServeABlockMoreThanTwiceTheSize() throws Exception {
        RegisteredMemory.Block big = memory.allocate(8 * MIB);
        big.free();
        RegisteredMemory.Block small = memory.allocate(2 * MIB);
        assertNotSame(big, small, "a 2 MiB allocation took the kept 8 MiB block");
        assertEquals(10L * MIB, memory.dedicatedBytes());
        small.free();
        RegisteredMemory.Block fits = memory.allocate(5 * MIB);
        assertSame(big, fits, "a 5 MiB allocation did not take the kept 8 MiB block");
        fits.free();
    }

    @Test
    void shouldKeepNoMoreThanTheBudget() throws Exception {
        List<RegisteredMemory.Block> blocks = new ArrayList<>();
        for (int i = 0; i < 6; i++) {
            blocks.add(memory.allocate(4 * MIB));
        }
        assertEquals(24L * MIB, memory.dedicatedBytes());
        blocks.forEach(RegisteredMemory.Block::free);
        assertEquals(16L * MIB, memory.dedicatedBytes(), "kept beyond the 16 MiB budget");
        assertEquals(16L * MIB, provider.resourceUsage().registeredBytes());

        RegisteredMemory none = new RegisteredMemory(pd, PERIOD_MILLIS, 0);
        try {
            none.allocate(2 * MIB).free();
            assertEquals(0, none.dedicatedBytes(), "kept with a budget of 0");
        } finally {
            none.close();
        }
    }

    @Test
    void shouldReleaseKeptBlocksIdleForAPeriod() throws Exception {
        long now = System.nanoTime();
        memory.allocate(4 * MIB).free();
        assertTrue(memory.nanosUntilTrim(now) <= PERIOD, "a sleeping loop would never trim the kept block");
        assertEquals(0, memory.trimIdle(now + PERIOD + 1), "released in the period it was kept");
        assertEquals(4L * MIB, memory.trimIdle(now + 2 * PERIOD + 2), "an idle kept block was not released");
        assertEquals(0, memory.dedicatedBytes());
        assertEquals(0, provider.resourceUsage().registeredBytes());
    }

    @Test
    void shouldReleaseABlockFreedAfterClose() throws Exception {
        RegisteredMemory.Block b = memory.allocate(4 * MIB);
        memory.close();
        b.free();
        assertEquals(0, memory.dedicatedBytes(), "a block freed after close was kept");
    }

    @Test
    void shouldHandOutEachKeptBlockOnceUnderConcurrency() throws Exception {
        int threads = 4;
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        try {
            CountDownLatch start = new CountDownLatch(1);
            List<Future<?>> futures = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                long owner = t + 1;
                futures.add(pool.submit(() -> {
                    start.await();
                    for (int i = 0; i < 500; i++) {
                        RegisteredMemory.Block b = memory.allocate(2 * MIB);
                        // A block handed to two owners at once would see the other's mark.
                        long mark = owner * 1_000_000L + i;
                        b.buffer().putLong(0, mark);
                        Thread.onSpinWait();
                        assertEquals(mark, b.buffer().getLong(0), "a kept block was handed out twice");
                        b.free();
                    }
                    return null;
                }));
            }
            start.countDown();
            for (Future<?> f : futures) {
                f.get(60, TimeUnit.SECONDS);
            }
        } finally {
            pool.shutdownNow();
        }
        ResourceUsage usage = provider.resourceUsage();
        assertTrue(memory.dedicatedBytes() <= 16L * MIB, "kept beyond the budget: " + memory.dedicatedBytes());
        assertEquals(memory.dedicatedBytes(), usage.registeredBytes());
    }
}
