package io.rdmabridge.it.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.function.Function;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * The acceptance jobs on two executor JVMs: each result under {@code RdmaShuffleManager} equals the result under
 * Spark's {@code SortShuffleManager}, and the block transport's byte counter equals Spark's remote shuffle bytes.
 * {@code -Dit.shuffle.mb} sets the data size (default 200).
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class RdmaShuffleJobsTest {
    static final int MB = Integer.getInteger("it.shuffle.mb", 200);

    /** Settings both runs share: spills forced early, host-local disk reads off so same-host blocks go remote. */
    static Map<String, String> common() {
        Map<String, String> s = new HashMap<>();
        s.put("spark.shuffle.readHostLocalDisk", "false");
        // Half a map task's records: every map task and every sorting reducer spills at least once.
        s.put("spark.shuffle.spill.numElementsForceSpillThreshold",
                String.valueOf(MB * 1024L * 1024L / 110 / ShuffleJobs.MAP_PARTITIONS / 2));
        s.put("spark.sql.adaptive.enabled", "true");
        return s;
    }

    static Map<String, String> rdma() {
        Map<String, String> s = common();
        s.put("spark.shuffle.manager", "io.rdmabridge.spark.RdmaShuffleManager");
        // The provider under test: soft unless the disni profile says otherwise.
        s.put("spark.shuffle.rdma.provider", System.getProperty("rdmabridge.provider", "soft"));
        return s;
    }

    private final Map<String, Function<SparkSession, String>> jobs = new LinkedHashMap<>();
    private final Map<String, String> expected = new HashMap<>();
    private SparkSession spark;
    private ShuffleCounters counters;

    RdmaShuffleJobsTest() {
        jobs.put("reduceByKey", s -> ShuffleJobs.reduceByKey(sc(s), MB));
        jobs.put("groupByKey", s -> ShuffleJobs.groupByKey(sc(s), MB));
        jobs.put("sortByKey", s -> ShuffleJobs.sortByKey(sc(s), MB));
        jobs.put("join", s -> ShuffleJobs.join(sc(s), MB / 4));
        jobs.put("dataFrameAggregation", s -> ShuffleJobs.dataFrameAggregation(s, MB / 4));
    }

    @BeforeAll
    void runUnderSortShuffleManagerThenStartRdma() {
        SparkSession baseline = LocalCluster.start("baseline", common());
        try {
            jobs.forEach((name, job) -> expected.put(name, job.apply(baseline)));
        } finally {
            baseline.stop();
        }
        spark = LocalCluster.start("rdma", rdma());
        counters = ShuffleCounters.install(spark);
    }

    @AfterAll
    void stop() {
        if (spark != null) {
            spark.stop();
        }
    }

    private static JavaSparkContext sc(SparkSession s) {
        return JavaSparkContext.fromSparkContext(s.sparkContext());
    }

    @Test
    @Order(2)
    void shouldRegisterABlockServerOnEveryExecutor() throws InterruptedException {
        // After the first job, which ran shuffle tasks on every executor: on Spark 3.5 an executor starts its block
        // server at its first shuffle task (on 4.x when its shuffle manager is built, once its block manager is).
        long deadline = System.nanoTime() + 30_000_000_000L;
        while (ShuffleCounters.manager().blockServers().size() < LocalCluster.EXECUTORS
                && System.nanoTime() < deadline) {
            Thread.sleep(100);
        }
        assertEquals(LocalCluster.EXECUTORS, ShuffleCounters.manager().blockServers().size(),
                "block servers: " + ShuffleCounters.manager().blockServers() + ", fallbacks: "
                        + ShuffleCounters.manager().fallbacks());
    }

    @Test
    @Order(1)
    void shouldReduceByKeyAsSortShuffleManagerDoes() {
        assertEquals(expected.get("reduceByKey"), jobs.get("reduceByKey").apply(spark));
    }

    @Test
    @Order(3)
    void shouldGroupByKeyAsSortShuffleManagerDoes() {
        assertEquals(expected.get("groupByKey"), jobs.get("groupByKey").apply(spark));
    }

    @Test
    @Order(4)
    void shouldSortByKeyAsSortShuffleManagerDoes() {
        String sorted = jobs.get("sortByKey").apply(spark);
        assertEquals(expected.get("sortByKey"), sorted);
        assertTrue(!sorted.contains("false"), "every partition sorted: " + sorted);
    }

    @Test
    @Order(5)
    void shouldJoinAsSortShuffleManagerDoes() {
        assertEquals(expected.get("join"), jobs.get("join").apply(spark));
    }

    @Test
    @Order(6)
    void shouldAggregateDataFrameWithAqeAsSortShuffleManagerDoes() {
        assertEquals("true", spark.conf().get("spark.sql.adaptive.enabled"));
        assertEquals(expected.get("dataFrameAggregation"), jobs.get("dataFrameAggregation").apply(spark));
    }

    @Test
    @Order(7)
    void shouldFetchEveryRemoteByteOverTheBlockTransport() throws InterruptedException {
        ShuffleCounters.drain(spark);
        long remote = counters.remoteBytesRead.get();
        assertTrue(remote > MB * 1024L * 1024L / 4, "remote shuffle bytes: " + remote);
        assertTrue(counters.diskBytesSpilled.get() > 0, "the jobs spilled: " + counters.diskBytesSpilled.get());
        // Executors report after each reduce task, asynchronously: wait for the last reports to land.
        long deadline = System.nanoTime() + 20_000_000_000L;
        while (ShuffleCounters.rdmaCounter("bytesFetched") != remote && System.nanoTime() < deadline) {
            Thread.sleep(100);
        }
        System.out.println("remote shuffle bytes read (Spark task metrics): " + remote + ", fetched over RDMA: "
                + ShuffleCounters.rdmaCounter("bytesFetched") + " in " + ShuffleCounters.rdmaCounter("blocksFetched")
                + " blocks; executors: " + ShuffleCounters.rdmaMetrics());
        assertEquals(remote, ShuffleCounters.rdmaCounter("bytesFetched"), "executors: "
                + ShuffleCounters.rdmaMetrics());
        // No fetch failed and was retried: every remote block of the five jobs arrived on its first fetch.
        assertEquals(0, counters.fetchFailures.get(), "fetch failures");
        assertEquals(0, ShuffleCounters.rdmaCounter("fetchFailures"), "executors: " + ShuffleCounters.rdmaMetrics());
        assertEquals(0, ShuffleCounters.rdmaCounter("blocksFetchedByFallback"));
        assertTrue(ShuffleCounters.rdmaCounter("blocksFetched") > 0);
        // Servers report after their own reduce tasks, which may end before they finish serving a peer: no equality.
        assertTrue(ShuffleCounters.rdmaCounter("bytesServed") > 0);
    }

    @Test
    @Order(8)
    void shouldFinishAJobWhoseExecutorDiesMidJob() {
        String before = ShuffleJobs.reduceByKey(sc(spark), 20);
        int removed = counters.executorsRemoved.get();
        String after = digestWithExecutorKill(sc(spark));
        ShuffleCounters.drain(spark);
        assertEquals(before, after);
        assertTrue(counters.executorsRemoved.get() > removed, "an executor died");
    }

    /** The 20 MB reduceByKey whose first reduce task halts its executor JVM (as kill -9 would) on its first try. */
    private static String digestWithExecutorKill(JavaSparkContext sc) {
        return ShuffleJobs.digestOf(ShuffleJobs.records(sc, 20).mapValues(v -> (long) v.hashCode())
                .reduceByKey(Long::sum, ShuffleJobs.REDUCE_PARTITIONS).mapPartitions(it -> {
                    TaskContext ctx = TaskContext.get();
                    if (ctx.partitionId() == 0 && ctx.attemptNumber() == 0 && ctx.stageAttemptNumber() == 0) {
                        Runtime.getRuntime().halt(137);
                    }
                    return it;
                }).map(t -> t._1() * 31 + t._2()));
    }
}
