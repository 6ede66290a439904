package io.rdmabridge.it.spark;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.SplittableRandom;
import java.util.zip.CRC32;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import scala.Tuple2;

/**
 * A TeraSort-style job in the manner of Hadoop's TeraGen / TeraSort / TeraValidate: 100-byte records (a 10-character
 * printable ASCII key and 90 random bytes) generated from seeds inside the tasks, sorted with {@code sortByKey}, then
 * validated: every partition in order, partitions in order with each other, and the record count and checksum (sum of
 * each record's CRC32, so independent of order) equal to the input's.
 */
final class TeraSort {
    static final int RECORD_LENGTH = 100;
    static final int KEY_LENGTH = 10;
    static final int MAP_PARTITIONS = 8;
    static final int REDUCE_PARTITIONS = 8;
    /** Base of the polynomial hash over the output sequence (odd, so multiplying by it is invertible mod 2^64). */
    static final long SEQUENCE_BASE = 0x100000001B3L;

    private TeraSort() {
    }

    /** {@code megabytes} of records, the same on every run. */
    static JavaPairRDD<String, byte[]> generate(JavaSparkContext sc, int megabytes) {
        long perPartition = megabytes * 1024L * 1024L / RECORD_LENGTH / MAP_PARTITIONS;
        List<Integer> seeds = new ArrayList<>();
        for (int i = 0; i < MAP_PARTITIONS; i++) {
            seeds.add(i);
        }
        return sc.parallelize(seeds, MAP_PARTITIONS).flatMapToPair(seed -> new Iterator<Tuple2<String, byte[]>>() {
            private final SplittableRandom random = new SplittableRandom(0x7E7A5047L + seed);
            private long left = perPartition;

            @Override
            public boolean hasNext() {
                return left > 0;
            }

            @Override
            public Tuple2<String, byte[]> next() {
                left--;
                byte[] key = new byte[KEY_LENGTH];
                for (int i = 0; i < KEY_LENGTH; i++) {
                    key[i] = (byte) (' ' + random.nextInt(95));
                }
                byte[] value = new byte[RECORD_LENGTH - KEY_LENGTH];
                random.nextBytes(value);
                return new Tuple2<>(new String(key, StandardCharsets.US_ASCII), value);
            }
        });
    }

    /** Record count and checksum of the input, from a pass without a shuffle. */
    static Summary input(JavaSparkContext sc, int megabytes) {
        List<Summary> parts = generate(sc, megabytes).mapPartitionsWithIndex((index, it) -> {
            Summary s = summarize(index, it);
            return List.of(s).iterator();
        }, true).collect();
        long count = 0;
        long checksum = 0;
        for (Summary s : parts) {
            count += s.count;
            checksum += s.checksum;
        }
        return new Summary(-1, count, checksum, 0, true, null, null);
    }

    /** Sorts the input and summarizes each output partition. This is the timed part. */
    static List<Summary> sort(JavaSparkContext sc, int megabytes) {
        return generate(sc, megabytes).sortByKey(true, REDUCE_PARTITIONS)
                .mapPartitionsWithIndex((index, it) -> List.of(summarize(index, it)).iterator(), true).collect();
    }

    /** {@code null} when {@code output} is {@code input} sorted, otherwise what is wrong with it. */
    static String validate(Summary input, List<Summary> output) {
        long count = 0;
        long checksum = 0;
        Summary previous = null;
        for (Summary s : output) {
            if (!s.sorted) {
                return "partition " + s.index + " is not sorted";
            }
            if (s.count > 0) {
                if (previous != null && previous.last.compareTo(s.first) > 0) {
                    return "partition " + s.index + " starts before partition " + previous.index + " ends";
                }
                previous = s;
            }
            count += s.count;
            checksum += s.checksum;
        }
        if (count != input.count || checksum != input.checksum) {
            return "output: " + count + " records, checksum " + Long.toHexString(checksum) + " (expected: "
                    + input.count + " records, checksum " + Long.toHexString(input.checksum) + ")";
        }
        return null;
    }

    /**
     * A hash of the whole output in order, whatever the partition boundaries: the partitions' polynomial hashes
     * (mod 2^64) chained, {@code H(AB) = H(A) * BASE^|B| + H(B)}. Equal for two outputs that hold the same records in
     * the same order.
     */
    static String outputDigest(List<Summary> output) {
        long count = 0;
        long hash = 0;
        for (Summary s : output) {
            hash = hash * power(SEQUENCE_BASE, s.count) + s.sequenceHash;
            count += s.count;
        }
        return count + " records, sequence hash " + Long.toHexString(hash);
    }

    private static long power(long base, long exponent) {
        long result = 1;
        while (exponent > 0) {
            if ((exponent & 1) != 0) {
                result *= base;
            }
            base *= base;
            exponent >>= 1;
        }
        return result;
    }

    private static Summary summarize(int index, Iterator<Tuple2<String, byte[]>> it) {
        CRC32 crc = new CRC32();
        long count = 0;
        long checksum = 0;
        long sequenceHash = 0;
        boolean sorted = true;
        String first = null;
        String last = null;
        while (it.hasNext()) {
            Tuple2<String, byte[]> record = it.next();
            String key = record._1();
            if (first == null) {
                first = key;
            } else {
                sorted &= last.compareTo(key) <= 0;
            }
            last = key;
            crc.reset();
            crc.update(key.getBytes(StandardCharsets.US_ASCII));
            crc.update(record._2());
            checksum += crc.getValue();
            sequenceHash = sequenceHash * SEQUENCE_BASE + crc.getValue();
            count++;
        }
        return new Summary(index, count, checksum, sequenceHash, sorted, first, last);
    }

    /**
     * One partition's record count, checksum, order and key range ({@code first}/{@code last} null when empty). A class,
     * not a record: Spark's Kryo cannot serialize records.
     */
    static final class Summary implements Serializable {
        private static final long serialVersionUID = 1L;
        final int index;
        final long count;
        final long checksum;
        final long sequenceHash;
        final boolean sorted;
        final String first;
        final String last;

        Summary(int index, long count, long checksum, long sequenceHash, boolean sorted, String first, String last) {
            this.index = index;
            this.count = count;
            this.checksum = checksum;
            this.sequenceHash = sequenceHash;
            this.sorted = sorted;
            this.first = first;
            this.last = last;
        }

        @Override
        public String toString() {
            return index + ":" + count + ":" + Long.toHexString(checksum) + ":" + Long.toHexString(sequenceHash) + ":"
                    + sorted + ":" + first + ":" + last;
        }
    }
}
