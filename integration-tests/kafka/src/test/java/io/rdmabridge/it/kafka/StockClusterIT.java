package io.rdmabridge.it.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.time.Duration;
import org.apache.kafka.clients.admin.Admin;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Baseline: one controller and three brokers with the plugin jar present and configured as a reporter, but the flag
 * off and no agent: the cluster must behave as stock Kafka and each broker must say in one line why the plugin is
 * inactive.
 */
class StockClusterIT {
    static final int RECORDS = 100_000;
    static final int PARTITIONS = 3;

    @Test
    void shouldReplicateAsStockKafkaWhenThePluginIsDisabled(@TempDir Path dir) throws Exception {
        long start = System.nanoTime();
        try (KafkaCluster cluster = new KafkaCluster(dir, 3)) {
            cluster.start();
            long started = System.nanoTime();
            try (Admin admin = cluster.admin()) {
                Records.createTopic(admin, "stock", PARTITIONS);
                Records.Acked acked = new Records.Acked();
                Records.produce(cluster.bootstrap(), "stock", 0, RECORDS, acked);
                assertEquals(RECORDS, acked.count);
                Records.Acked read = Records.consumeAll(cluster.bootstrap(), "stock", PARTITIONS, RECORDS);
                assertEquals(acked.count, read.count, "records read back");
                assertEquals(acked.sequences, read.sequences, "sequence numbers read back");
                assertEquals(acked.checksum, read.checksum, "checksum of keys and values");
                assertEquals(3, Records.minIsr(admin, "stock"), "smallest ISR");
            }
            for (int id = 1; id <= 3; id++) {
                String log = cluster.log(id);
                assertTrue(log.contains("RDMA replication inactive: rdma.replication.enable is not true"),
                        "broker " + id + " names why the plugin is inactive; log:\n" + tail(log));
            }
            System.out.printf("stock cluster: start %.1f s, workload %.1f s%n", (started - start) / 1e9,
                    (System.nanoTime() - started) / 1e9);
        }
    }

    static String tail(String log) {
        return log.length() > 4000 ? log.substring(log.length() - 4000) : log;
    }
}
