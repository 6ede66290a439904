package io.rdmabridge.it.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;
import scala.Tuple2;

class LocalClusterHarnessTest {

    @Test
    void shouldShuffleAcrossTwoExecutorJvms() {
        SparkSession spark = LocalCluster.start("harness", Map.of());
        try {
            JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
            List<Integer> numbers = new ArrayList<>();
            for (int i = 0; i < 10_000; i++) {
                numbers.add(i);
            }
            JavaPairRDD<Integer, Long> counts = sc.parallelize(numbers, 4)
                    .mapToPair(i -> new Tuple2<>(i % 10, 1L))
                    .reduceByKey(Long::sum, 4);
            Map<Integer, Long> result = counts.collectAsMap();
            assertEquals(10, result.size());
            result.values().forEach(v -> assertEquals(1000L, v));

            // The map tasks ran in both executor JVMs, so half the reduce input crossed processes.
            Set<String> executors = new TreeSet<>(sc.parallelize(numbers, 4)
                    .map(i -> org.apache.spark.SparkEnv.get().executorId()).distinct().collect());
            assertTrue(executors.size() == 2, "executors that ran tasks: " + executors);
        } finally {
            spark.stop();
        }
    }
}
