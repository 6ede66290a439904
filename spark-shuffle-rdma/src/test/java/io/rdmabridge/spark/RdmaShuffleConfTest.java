package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.apache.spark.SparkConf;
import org.junit.jupiter.api.Test;

class RdmaShuffleConfTest {
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
}
