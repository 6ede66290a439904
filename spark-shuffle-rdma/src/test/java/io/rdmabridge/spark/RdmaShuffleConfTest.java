package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.apache.spark.SparkConf;
import org.junit.jupiter.api.Test;

class RdmaShuffleConfTest {
    @Test
    void shouldKeepBlocksOnSparksTransportWhenTheApplicationAsksForEncryptionNamingTheKey() {
        assertNull(RdmaShuffleConf.encryptionRequested(new SparkConf(false)));
        assertNull(RdmaShuffleConf.encryptionRequested(new SparkConf(false)
                .set("spark.network.crypto.enabled", "false")));
        for (String key : new String[] {"spark.network.crypto.enabled", "spark.authenticate.enableSaslEncryption",
                "spark.ssl.rpc.enabled"}) {
            String why = RdmaShuffleConf.encryptionRequested(new SparkConf(false).set(key, "true"));
            assertTrue(why != null && why.startsWith(key + "=true asks for encrypted block transfers")
                    && why.contains("set " + key + "=false to use RDMA"), key + ": " + why);
        }
    }

    @Test
    void shouldDefaultTheQueueDepthsToTheChannels() {
        RdmaShuffleConf conf = new RdmaShuffleConf(new SparkConf(false));
        assertEquals(128, conf.sendQueueDepth);
        assertEquals(32, conf.recvQueueDepth);
        assertEquals(256L << 20, conf.pinnedMemoryCap);
    }

    @Test
    void shouldReadTheQueueDepthKeys() {
        RdmaShuffleConf conf = new RdmaShuffleConf(new SparkConf(false)
                .set("spark.shuffle.rdma.sendQueueDepth", "512").set("spark.shuffle.rdma.recvQueueDepth", "100"));
        assertEquals(512, conf.sendQueueDepth);
        assertEquals(100, conf.recvQueueDepth);
    }

    @Test
    void shouldRejectQueueDepthsTheChannelCannotUseNamingTheKey() {
        IllegalArgumentException send = assertThrows(IllegalArgumentException.class, () -> new RdmaShuffleConf(
                new SparkConf(false).set("spark.shuffle.rdma.sendQueueDepth", "100")));
        assertEquals("spark.shuffle.rdma.sendQueueDepth: 100 (expected: a power of 2, 8-32768)", send.getMessage());
        IllegalArgumentException recv = assertThrows(IllegalArgumentException.class, () -> new RdmaShuffleConf(
                new SparkConf(false).set("spark.shuffle.rdma.recvQueueDepth", "0")));
        assertEquals("spark.shuffle.rdma.recvQueueDepth: 0 (expected: 1-65535)", recv.getMessage());
    }

    @Test
    void shouldDefaultTheBlockServerLimits() {
        RdmaShuffleConf conf = new RdmaShuffleConf(new SparkConf(false));
        assertEquals(10_000, conf.authTimeoutMillis);
        assertEquals(120_000, conf.idleTimeoutMillis);
        assertEquals(60_000, conf.writeTimeoutMillis);
        assertEquals(512, conf.maxConnections);
        assertEquals(256, conf.maxRequestsPerConnection);
        assertEquals(64L << 20, conf.pinnedMemoryPerConnection);
        assertEquals(10_000, conf.warnIntervalMillis);
        // The share follows the cap unless set.
        assertEquals(8L << 20, new RdmaShuffleConf(new SparkConf(false)
                .set("spark.shuffle.rdma.pinnedMemoryCap", "32m")).pinnedMemoryPerConnection);
    }

    @Test
    void shouldTakeTheLargestBlockSparkFetchesIntoMemory() {
        assertEquals(200L << 20, maxLength(new SparkConf(false), "shuffle_0_1_2"));
        assertEquals(300L << 20, maxLength(new SparkConf(false).set("spark.shuffle.accurateBlockThreshold", "300m"),
                "shuffle_0_1_2"));
        assertEquals(10L << 20, maxLength(new SparkConf(false).set("spark.shuffle.accurateBlockThreshold", "5m")
                .set("spark.network.maxRemoteBlockSizeFetchToMem", "10m"), "shuffle_0_1_2"));
        // Spark reads the key's old name too.
        assertEquals(400L << 20, maxLength(new SparkConf(false).set("spark.maxRemoteBlockSizeFetchToMem", "400m"),
                "shuffle_0_1_2"));
        assertEquals(BlockFrame.MAX_BLOCK_LENGTH, maxLength(new SparkConf(false)
                .set("spark.shuffle.accurateBlockThreshold", "8g"), "shuffle_0_1_2"));
        // A batch of partitions 2, 3 and 4 of map output 1: a threshold more for each partition after the first.
        assertEquals(400L << 20, maxLength(new SparkConf(false), "shuffle_0_1_2_5"));
        assertEquals(BlockFrame.MAX_BLOCK_LENGTH, maxLength(new SparkConf(false), "shuffle_0_1_0_2000000000"));
        assertEquals(BlockFrame.MAX_BLOCK_LENGTH, maxLength(new SparkConf(false)
                .set("spark.shuffle.accurateBlockThreshold", "8g"), "shuffle_0_1_0_2000000000"));
        // Without the threshold, every report is accurate: a batch is at most what fetch-to-mem lets through.
        assertEquals(10L << 20, maxLength(new SparkConf(false).set("spark.shuffle.accurateBlockThreshold", "0")
                .set("spark.network.maxRemoteBlockSizeFetchToMem", "10m"), "shuffle_0_1_2_5"));
    }

    /** The fetched-bytes budget is off unless set, and then at least one byte. */
    @Test
    void shouldBudgetFetchedBytesOnlyWhenAsked() {
        // Off unless set: a pause would stall legitimate jobs whose holdings the client cannot bound.
        assertEquals(Long.MAX_VALUE, new RdmaShuffleConf(new SparkConf(false).set("spark.executor.cores", "16"))
                .maxFetchedBytesPerConnection);
        assertEquals(1L << 20, new RdmaShuffleConf(new SparkConf(false)
                .set("spark.shuffle.rdma.maxFetchedBytesPerConnection", "1m")).maxFetchedBytesPerConnection);
        IllegalArgumentException zero = assertThrows(IllegalArgumentException.class, () -> new RdmaShuffleConf(
                new SparkConf(false).set("spark.shuffle.rdma.maxFetchedBytesPerConnection", "0")));
        assertEquals("spark.shuffle.rdma.maxFetchedBytesPerConnection: 0 (expected: > 0)", zero.getMessage());
    }

    private static long maxLength(SparkConf conf, String blockId) {
        return new RdmaShuffleConf(conf).maxFetchedBlockLength(blockId);
    }

    @Test
    void shouldRejectAShareLargerThanTheCapNamingBothKeys() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> new RdmaShuffleConf(
                new SparkConf(false).set("spark.shuffle.rdma.pinnedMemoryCap", "1m")
                        .set("spark.shuffle.rdma.pinnedMemoryPerConnection", "2m")));
        assertEquals("spark.shuffle.rdma.pinnedMemoryPerConnection: 2097152 (expected: 1-1048576, at most "
                + "spark.shuffle.rdma.pinnedMemoryCap)", e.getMessage());
        IllegalArgumentException zero = assertThrows(IllegalArgumentException.class, () -> new RdmaShuffleConf(
                new SparkConf(false).set("spark.shuffle.rdma.maxRequestsPerConnection", "0")));
        assertEquals("spark.shuffle.rdma.maxRequestsPerConnection: 0 (expected: >= 1)", zero.getMessage());
    }
}
