package io.rdmabridge.it.spark;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.count;
import static org.apache.spark.sql.functions.sum;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.SplittableRandom;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import scala.Tuple2;

/**
 * The shuffle jobs every configuration runs, each reduced to a digest small enough to compare on the driver: record
 * count, an order-independent hash sum, and for sorted output whether every partition is sorted and partitions follow
 * each other. Data is generated from seeds inside the tasks, so it costs no driver memory.
 */
final class ShuffleJobs {
    static final int MAP_PARTITIONS = 8;
    static final int REDUCE_PARTITIONS = 6;

    private ShuffleJobs() {
    }

    /** {@code megabytes} of (key, 100-character value) records; keys repeat so that groups and sums are non-trivial. */
    static JavaPairRDD<Long, String> records(JavaSparkContext sc, int megabytes) {
        long total = megabytes * 1024L * 1024L / 110;
        long perPartition = total / MAP_PARTITIONS;
        List<Integer> seeds = new ArrayList<>();
        for (int i = 0; i < MAP_PARTITIONS; i++) {
            seeds.add(i);
        }
        return sc.parallelize(seeds, MAP_PARTITIONS).flatMapToPair(seed -> new Iterator<Tuple2<Long, String>>() {
            private final SplittableRandom random = new SplittableRandom(seed);
            private long left = perPartition;

            @Override
            public boolean hasNext() {
                return left > 0;
            }

            @Override
            public Tuple2<Long, String> next() {
                left--;
                char[] value = new char[100];
                for (int i = 0; i < value.length; i++) {
                    value[i] = (char) ('a' + random.nextInt(26));
                }
                return new Tuple2<>(random.nextLong(total / 4), new String(value));
            }
        });
    }

    static String reduceByKey(JavaSparkContext sc, int megabytes) {
        return digestOf(records(sc, megabytes).mapValues(v -> (long) v.hashCode())
                .reduceByKey(Long::sum, REDUCE_PARTITIONS).map(t -> t._1() * 31 + t._2()));
    }

    static String groupByKey(JavaSparkContext sc, int megabytes) {
        return digestOf(records(sc, megabytes).groupByKey(REDUCE_PARTITIONS).map(t -> {
            long h = t._1();
            for (String v : t._2()) {
                h += v.hashCode();
            }
            return h;
        }));
    }

    static String sortByKey(JavaSparkContext sc, int megabytes) {
        List<String> parts = records(sc, megabytes).sortByKey(true, REDUCE_PARTITIONS)
                .mapPartitionsWithIndex((index, it) -> {
                    long n = 0;
                    long h = 0;
                    long first = Long.MIN_VALUE;
                    long previous = Long.MIN_VALUE;
                    boolean sorted = true;
                    while (it.hasNext()) {
                        Tuple2<Long, String> t = it.next();
                        if (n == 0) {
                            first = t._1();
                        }
                        sorted &= t._1() >= previous;
                        previous = t._1();
                        h += t._1() * 31 + t._2().hashCode();
                        n++;
                    }
                    return List.of(index + ":" + n + ":" + h + ":" + sorted + ":" + first + ":" + previous).iterator();
                }, true).collect();
        return String.join(",", parts);
    }

    static String join(JavaSparkContext sc, int megabytes) {
        JavaPairRDD<Long, String> left = records(sc, megabytes);
        JavaPairRDD<Long, Long> right = records(sc, megabytes / 4).mapValues(v -> (long) v.length())
                .reduceByKey(Long::sum);
        return digestOf(left.join(right, REDUCE_PARTITIONS).map(t -> t._1() * 31 + t._2()._1().hashCode()
                + t._2()._2()));
    }

    /** A DataFrame aggregation; the caller's session decides whether AQE is on. */
    static String dataFrameAggregation(SparkSession spark, int megabytes) {
        long rows = megabytes * 1024L * 1024L / 16;
        List<Row> result = spark.range(0, rows, 1, MAP_PARTITIONS)
                .withColumn("k", col("id").mod(1000))
                .groupBy("k").agg(sum("id").as("s"), count("id").as("c"))
                .orderBy("k").collectAsList();
        long h = 0;
        for (Row r : result) {
            h = h * 31 + r.getLong(0) * 7 + r.getLong(1) * 3 + r.getLong(2);
        }
        return result.size() + ":" + h;
    }

    static String digestOf(JavaRDD<Long> hashes) {
        Tuple2<Long, Long> countAndSum = hashes.map(h -> new Tuple2<>(1L, h))
                .reduce((a, b) -> new Tuple2<>(a._1() + b._1(), a._2() + b._2()));
        return countAndSum._1() + ":" + countAndSum._2();
    }
}
