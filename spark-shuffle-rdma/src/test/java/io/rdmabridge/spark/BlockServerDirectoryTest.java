package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;

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

    @Test
    void shouldRefuseAMalformedReportNamingTheExpectedForm() {
        String expected = "malformed metrics report: expected metrics<TAB>executor<TAB>sequence<TAB>counters";
        assertEquals(expected, metrics("1", "x", "bytesFetched=1"));
        assertEquals(expected, metrics("1", "-5", "bytesFetched=1"));
        assertEquals(expected, driver.handle(new String[] {"metrics", "1", "bytesFetched=1"}));
        assertEquals(Map.of(), driver.metrics());
    }
}
