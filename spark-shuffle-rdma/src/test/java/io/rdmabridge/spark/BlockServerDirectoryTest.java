package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.net.InetSocketAddress;
import java.util.Map;
import org.junit.jupiter.api.Test;

class BlockServerDirectoryTest {
    private final BlockServerDirectory.Driver driver = new BlockServerDirectory.Driver(null);

    private String metrics(String executor, String seq, String counters) {
        return driver.handle(new String[] {"metrics", executor, seq, counters});
    }

    @Test
    void shouldKeepAnExecutorsNewestReportWhenAnOlderOneArrivesAfterIt() {
        assertEquals("", metrics("1", "2", "bytesFetched=200"));
        assertEquals("", metrics("1", "1", "bytesFetched=100"));
        assertEquals("", metrics("2", "1", "bytesFetched=7"));
        assertEquals(Map.of("1", "bytesFetched=200", "2", "bytesFetched=7"), driver.metrics());
        assertEquals("", metrics("1", "3", "bytesFetched=300"));
        assertEquals(Map.of("1", "bytesFetched=300", "2", "bytesFetched=7"), driver.metrics());
    }

    /**
     * An executor Spark removed (dynamic allocation, a lost executor) is looked up as having no block server: its
     * blocks, when an external shuffle service keeps them, are fetched from there. It used to stay listed for ever.
     */
    @Test
    void shouldForgetTheServerOfAnExecutorSparkRemoved() {
        assertEquals("", driver.handle(new String[] {"register", "1", "host-a", "7001"}));
        assertEquals("", driver.handle(new String[] {"register", "2", "host-b", "7002"}));
        assertEquals("", driver.handle(new String[] {"fallback", "3", "no device"}));
        assertEquals("host-a\t7001", driver.handle(new String[] {"lookup", "1"}));
        driver.executorRemoved("1");
        driver.executorRemoved("3");
        assertEquals("", driver.handle(new String[] {"lookup", "1"}));
        assertEquals("host-b\t7002", driver.handle(new String[] {"lookup", "2"}));
        assertEquals(Map.of("2", InetSocketAddress.createUnresolved("host-b", 7002)), driver.servers());
        assertEquals(Map.of(), driver.fallbacks());
    }

    /** A registration still in flight when Spark removed its executor must not list a server that is gone. */
    @Test
    void shouldRefuseTheRegistrationOfAnExecutorSparkAlreadyRemoved() {
        driver.executorRemoved("1");
        assertEquals("executor 1 was removed by Spark (it registered after its removal)",
                driver.handle(new String[] {"register", "1", "host-a", "7001"}));
        assertEquals("", driver.handle(new String[] {"lookup", "1"}));
        assertEquals(Map.of(), driver.servers());
        // The refused executor falls back and says so: a gone executor is not listed as running on Spark's transport.
        assertEquals("", driver.handle(new String[] {"fallback", "1", "the driver refused block server ..."}));
        assertEquals(Map.of(), driver.fallbacks());
        for (int i = 0; i < BlockServerDirectory.REMEMBERED_REMOVALS; i++) {
            driver.executorRemoved("gone-" + i);
        }
        // Only the latest removals are remembered; the oldest one's id may register again.
        assertEquals("", driver.handle(new String[] {"register", "1", "host-a", "7001"}));
        assertEquals("executor gone-0 was removed by Spark (it registered after its removal)",
                driver.handle(new String[] {"register", "gone-0", "host-a", "7001"}));
    }

    @Test
    void shouldRefuseAMalformedRegistrationNamingTheExpectedForm() {
        String expected = "malformed registration: expected register<TAB>executor<TAB>host<TAB>port (1-65535)";
        assertEquals(expected, driver.handle(new String[] {"register", "1", "host-a", "x"}));
        assertEquals(expected, driver.handle(new String[] {"register", "1", "host-a", "70000"}));
        assertEquals(expected, driver.handle(new String[] {"register", "1", "host-a"}));
        assertEquals(Map.of(), driver.servers());
    }

    @Test
    void shouldRefuseAMalformedReportNamingTheExpectedForm() {
        String expected = "malformed metrics report: expected metrics<TAB>executor<TAB>sequence<TAB>counters";
        assertEquals(expected, metrics("1", "x", "bytesFetched=1"));
        assertEquals(expected, metrics("1", "-5", "bytesFetched=1"));
        assertEquals(expected, driver.handle(new String[] {"metrics", "1", "bytesFetched=1"}));
        assertEquals(Map.of(), driver.metrics());
    }
}
