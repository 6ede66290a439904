package io.rdmabridge.it.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.spark.BlockServerProbe;
import java.net.InetSocketAddress;
import java.util.Map;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;

/** With {@code spark.authenticate=true}, jobs run over the block transport and a peer without the secret gets nothing. */
class RdmaShuffleAuthTest {

    @Test
    void shouldServeOnlyPeersHoldingTheApplicationSecret() throws Exception {
        Map<String, String> settings = RdmaShuffleJobsTest.rdma();
        settings.put("spark.authenticate", "true");
        String secret = "it-secret-" + System.nanoTime();
        settings.put("spark.authenticate.secret", secret);
        SparkSession spark = LocalCluster.start("auth", settings);
        try {
            JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
            String digest = ShuffleJobs.reduceByKey(sc, 10);

            Map.Entry<String, InetSocketAddress> first = ShuffleCounters.manager().blockServers().entrySet()
                    .iterator().next();
            String executor = first.getKey();
            InetSocketAddress server = first.getValue();
            // Map output 0 of the job above exists on one of the executors; a peer with the secret gets the block
            // (or, from the other executor, a clean "cannot serve"), a peer without it gets nothing at all.
            String withoutSecret = BlockServerProbe.fetch(server.getHostString(), server.getPort(), executor,
                    "shuffle_0_0_0", "soft", null);
            assertTrue(withoutSecret.startsWith("failed: ") && withoutSecret.contains("requires authentication"),
                    withoutSecret);
            String wrongSecret = BlockServerProbe.fetch(server.getHostString(), server.getPort(), executor,
                    "shuffle_0_0_0", "soft", "not-the-secret");
            assertTrue(wrongSecret.startsWith("failed: ") && wrongSecret.contains("authentication failed"),
                    wrongSecret);
            String rightSecret = BlockServerProbe.fetch(server.getHostString(), server.getPort(), executor,
                    "shuffle_0_0_0", "soft", secret);
            assertTrue(rightSecret.startsWith("fetched ") || rightSecret.contains("cannot serve shuffle_0_0_0"),
                    rightSecret);

            // The authenticated executors still shuffle over the block transport.
            assertEquals(digest, ShuffleJobs.reduceByKey(sc, 10));
            long deadline = System.nanoTime() + 20_000_000_000L;
            while (ShuffleCounters.rdmaCounter("authFailures") < 1 && System.nanoTime() < deadline) {
                Thread.sleep(100);
            }
            assertEquals(1, ShuffleCounters.rdmaCounter("authFailures"));
            assertTrue(ShuffleCounters.rdmaCounter("bytesFetched") > 0);
            assertEquals(0, ShuffleCounters.rdmaCounter("blocksFetchedByFallback"));
        } finally {
            spark.stop();
        }
    }
}
