package io.rdmabridge.it.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;

/**
 * With {@code provider=auto} on a machine without RDMA hardware (this one; CI's), or a provider that is not usable,
 * every executor falls back to Spark's transport with one WARN naming the cause, and jobs succeed.
 */
class RdmaShuffleFallbackTest {

    @Test
    void shouldRunOverSparkTransportAndNameTheCauseWhenNoProviderIsUsable() throws InterruptedException {
        Map<String, String> settings = RdmaShuffleJobsTest.rdma();
        // auto finds no RDMA hardware provider here (no device, no libdisni): the forced-unavailable case.
        settings.put("spark.shuffle.rdma.provider", "auto");
        SparkSession spark = LocalCluster.start("fallback", settings);
        try {
            JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
            ShuffleCounters counters = ShuffleCounters.install(spark);
            String first = ShuffleJobs.reduceByKey(sc, 10);
            assertEquals(first, ShuffleJobs.reduceByKey(sc, 10), "the same job twice gives the same digest");

            Map<String, String> fallbacks = ShuffleCounters.manager().fallbacks();
            long deadline = System.nanoTime() + 30_000_000_000L;
            while (fallbacks.size() < LocalCluster.EXECUTORS && System.nanoTime() < deadline) {
                Thread.sleep(100);
                fallbacks = ShuffleCounters.manager().fallbacks();
            }
            assertEquals(LocalCluster.EXECUTORS, fallbacks.size(), "fallbacks: " + fallbacks);
            fallbacks.values().forEach(cause -> assertTrue(cause.contains("no RDMA hardware provider is usable"),
                    cause));
            assertEquals(Map.of(), ShuffleCounters.manager().blockServers());

            ShuffleCounters.drain(spark);
            assertTrue(counters.remoteBytesRead.get() > 0, "blocks crossed executors over Spark's transport");
            assertEquals(0, ShuffleCounters.rdmaCounter("bytesFetched"));

            List<String> warns = ExecutorLogs.linesContaining(spark.sparkContext().applicationId(),
                    "RDMA shuffle unavailable on executor");
            assertEquals(LocalCluster.EXECUTORS, warns.size(), "one WARN per executor: " + warns);
            warns.forEach(line -> {
                assertTrue(line.contains("WARN"), line);
                assertTrue(line.contains("no RDMA hardware provider is usable"), line);
            });
        } finally {
            spark.stop();
        }
    }
}
