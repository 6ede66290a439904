package io.rdmabridge.it.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.network.TransportContext;
import org.apache.spark.network.server.TransportServer;
import org.apache.spark.network.shuffle.ExternalBlockHandler;
import org.apache.spark.network.util.MapConfigProvider;
import org.apache.spark.network.util.TransportConf;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;

/**
 * With Spark's external shuffle service ({@code spark.shuffle.service.enabled}), map outputs outlive the executor that
 * wrote them: Spark keeps them when the executor goes (dynamic allocation removes idle ones) and fetches them from the
 * service. Under {@code RdmaShuffleManager} the blocks of live executors still cross the block transport, and those of
 * a removed executor come from the service, with no fetch failure and no map stage run again. The service runs in this
 * (the driver's) JVM, as Spark's own {@code ExternalShuffleServiceSuite} runs it, since {@code local-cluster} workers
 * start none.
 */
class RdmaShuffleExternalServiceTest {

    @Test
    void shouldFetchTheBlocksOfARemovedExecutorFromTheExternalShuffleService() throws Exception {
        TransportConf transportConf = new TransportConf("shuffle", MapConfigProvider.EMPTY);
        ExternalBlockHandler handler = new ExternalBlockHandler(transportConf, null);
        TransportContext context = new TransportContext(transportConf, handler, true);
        TransportServer service = context.createServer(0, List.of());
        Map<String, String> settings = RdmaShuffleJobsTest.rdma();
        settings.put("spark.shuffle.service.enabled", "true");
        settings.put("spark.shuffle.service.port", String.valueOf(service.getPort()));
        SparkSession spark = LocalCluster.start("external-shuffle-service", settings);
        try {
            JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
            ShuffleCounters counters = ShuffleCounters.install(spark);
            JavaPairRDD<Long, Long> sums = ShuffleJobs.records(sc, 20).mapValues(v -> (long) v.hashCode())
                    .reduceByKey(Long::sum, ShuffleJobs.REDUCE_PARTITIONS);
            String first = ShuffleJobs.digestOf(sums.map(t -> t._1() * 31 + t._2()));
            assertTrue(awaitCounter("blocksFetched"),
                    "the first job fetched over the block transport: " + ShuffleCounters.rdmaMetrics());

            Map<String, ?> servers = ShuffleCounters.manager().blockServers();
            assertEquals(LocalCluster.EXECUTORS, servers.size(), "block servers: " + servers);
            String victim = servers.keySet().iterator().next();
            int removed = counters.executorsRemoved.get();
            assertTrue(spark.sparkContext().killExecutor(victim), "killExecutor(" + victim + ")");
            long deadline = System.nanoTime() + LocalCluster.scaledSeconds(60) * 1_000_000_000L;
            while ((counters.executorsRemoved.get() == removed
                    || ShuffleCounters.manager().blockServers().containsKey(victim)) && System.nanoTime() < deadline) {
                Thread.sleep(100);
            }
            assertTrue(counters.executorsRemoved.get() > removed, "executor " + victim + " was not removed");
            assertFalse(ShuffleCounters.manager().blockServers().containsKey(victim),
                    "the driver still lists the removed executor's block server");

            // The same shuffle again: its map outputs, the removed executor's included, are still registered.
            String second = ShuffleJobs.digestOf(sums.map(t -> t._1() * 31 + t._2()));
            ShuffleCounters.drain(spark);
            assertEquals(first, second);
            assertEquals(0, counters.fetchFailures.get(), "fetch failures (each runs map tasks again)");
            assertTrue(awaitCounter("blocksFetchedByFallback"),
                    "the removed executor's blocks came from the service: " + ShuffleCounters.rdmaMetrics());
            assertEquals(0, ShuffleCounters.rdmaCounter("fetchFailures"), "executors: "
                    + ShuffleCounters.rdmaMetrics());
        } finally {
            spark.stop();
            service.close();
            context.close();
            handler.close();
        }
    }

    /** Executors report after each reduce task, asynchronously: waits for a counter to leave zero. */
    private static boolean awaitCounter(String name) throws InterruptedException {
        long deadline = System.nanoTime() + 20_000_000_000L;
        while (ShuffleCounters.rdmaCounter(name) == 0 && System.nanoTime() < deadline) {
            Thread.sleep(100);
        }
        return ShuffleCounters.rdmaCounter(name) > 0;
    }
}
