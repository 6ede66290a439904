package io.rdmabridge.it.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;

/**
 * One sortByKey job on the provider and address under test (the rxe stage runs it with {@code -Pdisni,rxe}: DiSNI on
 * the guest's Soft-RoCE device), small enough for a slow machine: its result equals {@code SortShuffleManager}'s, every
 * executor's block server listens on {@code rdmabridge.test.address}, and every remote shuffle byte crossed the block
 * transport, none through Spark's own. Executors reach the provider through {@code rdmabridge.test.childJvmOptions}
 * (libdisni's directory, DiSNI's module export) and bind where Spark does: {@code SPARK_LOCAL_IP}, set by the POM to
 * the same address. {@code -Dit.device.mb} sets the data size (default 16).
 */
class RdmaShuffleDeviceJobTest {
    static final int MB = Integer.getInteger("it.device.mb", 16);

    @Test
    void shouldSortAsSortShuffleManagerDoesWithEveryRemoteByteOverRdma() throws InterruptedException {
        String expected;
        SparkSession baseline = LocalCluster.start("device-baseline", RdmaShuffleJobsTest.common());
        try {
            expected = ShuffleJobs.sortByKey(JavaSparkContext.fromSparkContext(baseline.sparkContext()), MB);
        } finally {
            baseline.stop();
        }

        long start = System.nanoTime();
        Map<String, String> settings = RdmaShuffleJobsTest.rdma();
        // The first connection of an executor opens the device and loads the provider: slow on a slow machine.
        settings.put("spark.shuffle.rdma.connectTimeout", LocalCluster.scaledSeconds(10) + "s");
        // So is the first answer to a block server's challenge (the client's first registration and HMAC).
        settings.put("spark.shuffle.rdma.authTimeout", LocalCluster.scaledSeconds(10) + "s");
        SparkSession spark = LocalCluster.start("device-rdma", settings);
        try {
            ShuffleCounters counters = ShuffleCounters.install(spark);
            // An executor registers its block manager first, then builds its shuffle manager: give the latter time.
            long deadline = System.nanoTime() + LocalCluster.scaledSeconds(30) * 1_000_000_000L;
            while (ShuffleCounters.manager().blockServers().size() < LocalCluster.EXECUTORS
                    && ShuffleCounters.manager().fallbacks().isEmpty() && System.nanoTime() < deadline) {
                Thread.sleep(100);
            }
            Map<String, InetSocketAddress> servers = ShuffleCounters.manager().blockServers();
            assertEquals(LocalCluster.EXECUTORS, servers.size(), "block servers: " + servers + ", fallbacks: "
                    + ShuffleCounters.manager().fallbacks());
            String address = System.getProperty("rdmabridge.test.address", "127.0.0.1");
            servers.values().forEach(server -> assertEquals(address, server.getHostString(),
                    "block server " + server + " (expected: on rdmabridge.test.address)"));

            String sorted = ShuffleJobs.sortByKey(JavaSparkContext.fromSparkContext(spark.sparkContext()), MB);
            assertEquals(expected, sorted, "sortByKey under RdmaShuffleManager vs SortShuffleManager");
            assertTrue(!sorted.contains("false"), "every partition sorted: " + sorted);

            ShuffleCounters.drain(spark);
            long remote = counters.remoteBytesRead.get();
            assertTrue(remote > MB * 1024L * 1024L / 4, "remote shuffle bytes: " + remote);
            // Executors report after each reduce task, asynchronously: wait for the last reports to land.
            deadline = System.nanoTime() + LocalCluster.scaledSeconds(20) * 1_000_000_000L;
            while (ShuffleCounters.rdmaCounter("bytesFetched") != remote && System.nanoTime() < deadline) {
                Thread.sleep(100);
            }
            System.out.println("sortByKey of " + MB + " MB on " + spark.conf().get("spark.shuffle.rdma.provider")
                    + " at " + servers + ": remote shuffle bytes read (Spark task metrics) " + remote
                    + ", fetched over RDMA " + ShuffleCounters.rdmaCounter("bytesFetched") + " in "
                    + ShuffleCounters.rdmaCounter("blocksFetched") + " blocks, by fallback "
                    + ShuffleCounters.rdmaCounter("blocksFetchedByFallback") + "; " + (System.nanoTime() - start)
                    / 1_000_000 + " ms; executors: " + ShuffleCounters.rdmaMetrics());
            assertEquals(remote, ShuffleCounters.rdmaCounter("bytesFetched"), "executors: "
                    + ShuffleCounters.rdmaMetrics());
            assertEquals(0, ShuffleCounters.rdmaCounter("blocksFetchedByFallback"), "blocks fetched by Spark");
            assertEquals(0, counters.fetchFailures.get(), "fetch failures");
            assertEquals(0, ShuffleCounters.rdmaCounter("fetchFailures"), "executors: "
                    + ShuffleCounters.rdmaMetrics());
        } catch (AssertionError | RuntimeException e) {
            // The executors' own words (why a block server closed a connection, say) vanish with their work dirs.
            String appId = spark.sparkContext().applicationId();
            List<String> logged = new ArrayList<>(ExecutorLogs.linesContaining(appId, " WARN "));
            logged.addAll(ExecutorLogs.linesContaining(appId, " ERROR "));
            logged.addAll(ExecutorLogs.linesContaining(appId, "Exception"));
            e.addSuppressed(new AssertionError("executors' warnings and errors (" + logged.size() + "):\n"
                    + String.join("\n", logged.subList(0, Math.min(200, logged.size())))));
            throw e;
        } finally {
            spark.stop();
        }
    }
}
