package io.rdmabridge.it.spark;

import java.io.File;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.sql.SparkSession;

/**
 * Starts Spark on {@code local-cluster[N,1,1024]}: a master, N workers and N executor JVMs that inherit this test's
 * class path, so shuffle blocks really cross processes. {@code local[*]} would never exercise a shuffle transport.
 * Executors get {@code rdmabridge.test.childJvmOptions} (the disni profile's library path and module export); time
 * limits grow with {@code rdmabridge.test.slowdown}.
 */
final class LocalCluster {
    static final int EXECUTORS = 2;

    private LocalCluster() {
    }

    /** A session with {@code EXECUTORS} executor JVMs and the given extra settings; waits until all have joined. */
    static SparkSession start(String appName, Map<String, String> settings) {
        SparkConf conf = new SparkConf()
                .setMaster("local-cluster[" + EXECUTORS + ",1,1024]")
                .setAppName(appName)
                // The Scala line of the Spark under test, set by the POM (2.12 or 2.13).
                .set("spark.executorEnv.SPARK_SCALA_VERSION", scalaBinaryVersion())
                .set("spark.ui.enabled", "false")
                .set("spark.sql.shuffle.partitions", "8")
                .set("spark.executor.extraJavaOptions", ("-XX:+UseSerialGC -XX:TieredStopAtLevel=1 "
                        + System.getProperty("rdmabridge.test.childJvmOptions", "")).trim());
        new File(System.getProperty("spark.test.home", "target/spark-home")).mkdirs();
        settings.forEach(conf::set);
        SparkSession spark = SparkSession.builder().config(conf).getOrCreate();
        awaitExecutors(spark);
        return spark;
    }

    private static String scalaBinaryVersion() {
        String version = System.getenv("SPARK_SCALA_VERSION");
        if (version == null) {
            throw new IllegalStateException("SPARK_SCALA_VERSION is not set: run the Spark tests through Maven, whose "
                    + "Surefire configuration (integration-tests/spark-parent) sets it, or set it to 2.12 or 2.13");
        }
        return version;
    }

    /** {@code seconds} on the host, times {@code rdmabridge.test.slowdown} (10 in the rxe guest). */
    static long scaledSeconds(long seconds) {
        return seconds * Long.getLong("rdmabridge.test.slowdown", 1);
    }

    private static void awaitExecutors(SparkSession spark) {
        long limit = scaledSeconds(120);
        long deadline = System.nanoTime() + limit * 1_000_000_000L;
        // The driver counts itself among the block managers.
        while (spark.sparkContext().getExecutorMemoryStatus().size() < EXECUTORS + 1) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("executors: " + (spark.sparkContext().getExecutorMemoryStatus().size()
                        - 1) + " joined within " + limit + " s (expected: " + EXECUTORS + ")");
            }
            try {
                Thread.sleep(100);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException(e);
            }
        }
    }
}
