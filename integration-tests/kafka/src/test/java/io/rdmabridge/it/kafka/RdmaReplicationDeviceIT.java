package io.rdmabridge.it.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.time.Duration;
import java.util.Map;
import org.apache.kafka.clients.admin.Admin;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Replication between two plugin brokers on the provider and address under test (the rxe stage runs it with
 * {@code -Pdisni,rxe}: DiSNI on the guest's Soft-RoCE device, the inter-broker listeners on its 10.77.0.1), small
 * enough for a slow machine: one controller, brokers 1 and 2 both with the agent and {@code rdma.provider} set to
 * {@code rdmabridge.provider} (soft by default), a topic of two partitions with two replicas, so each broker leads
 * one and follows the other. The records produced with {@code acks=all} come back exactly, both replicas stay in sync, each
 * broker says where its RDMA listener is, and the JMX counters show RDMA bytes both ways between the two brokers and no
 * replication byte over TCP. {@code -Dit.device.records} sets the record count (default 5,000).
 */
class RdmaReplicationDeviceIT {
    static final int RECORDS = Integer.getInteger("it.device.records", 5_000);
    static final int PARTITIONS = 2;
    static final String TOPIC = "device";

    @Test
    void shouldReplicateBetweenTwoRdmaBrokersOnTheProviderUnderTest(@TempDir Path dir) throws Exception {
        String provider = System.getProperty("rdmabridge.provider", "soft");
        long start = System.nanoTime();
        try (KafkaCluster cluster = new KafkaCluster(dir, 2)) {
            cluster.rdma(1, Map.of("rdma.provider", provider)).rdma(2, Map.of("rdma.provider", provider));
            cluster.start();
            long started = System.nanoTime();
            try (Admin admin = cluster.admin()) {
                Records.createTopic(admin, TOPIC, PARTITIONS, 2);
                Records.Acked acked = new Records.Acked();
                Records.produce(cluster.bootstrap(), TOPIC, 0, RECORDS, acked);
                assertEquals(RECORDS, acked.count, "records acknowledged");
                Records.Acked read = Records.consumeAll(cluster.bootstrap(), TOPIC, PARTITIONS, acked.count);
                assertEquals(acked.count, read.count, "records read back");
                assertEquals(acked.sequences, read.sequences, "sequence numbers read back");
                assertEquals(acked.checksum, read.checksum, "checksum of keys and values");
                Records.awaitIsr(admin, TOPIC, 2, KafkaCluster.scaled(Duration.ofSeconds(60)));
            }
            for (int id : new int[] {1, 2}) {
                String log = cluster.log(id);
                String active = "RDMA replication active on inter-broker listener REPLICATION ("
                        + KafkaCluster.REPLICATION_HOST + ":" + cluster.broker(id).replicationPort + "), broker " + id
                        + ", provider " + provider;
                assertTrue(log.contains(active), "broker " + id + " says: " + active + "; log:\n"
                        + StockClusterIT.tail(log));
                Map<String, Map<String, Double>> m = cluster.rdmaMetrics(id);
                String other = id == 1 ? "2" : "1";
                double fetched = MixedClusterIT.received(m, other, "rdma");
                double served = MixedClusterIT.sent(m, other, "rdma");
                System.out.printf("broker %d <-> broker %s over %s at %s: RDMA bytes received %.0f, sent %.0f; TCP "
                        + "bytes received %.0f, sent %.0f; metrics: %s%n", id, other, provider,
                        KafkaCluster.REPLICATION_HOST, fetched, served, MixedClusterIT.received(m, other, "tcp"),
                        MixedClusterIT.sent(m, other, "tcp"), m);
                assertTrue(m.get("all").get("upgrades-succeeded-total") > 0, "broker " + id + " upgraded: " + m);
                // Each broker follows the partition the other leads, and leads the one the other follows.
                assertTrue(fetched > 0, "broker " + id + " fetched from broker " + other + " over RDMA: " + m);
                assertTrue(served > 0, "broker " + id + " served broker " + other + " over RDMA: " + m);
                assertEquals(0.0, MixedClusterIT.received(m, other, "tcp"), "broker " + id + " fetched nothing from "
                        + "broker " + other + " over TCP: " + m);
            }
            System.out.printf("kafka replication on %s: %d records produced and read back; cluster start %.1f s, "
                    + "workload %.1f s%n", provider, RECORDS, (started - start) / 1e9,
                    (System.nanoTime() - started) / 1e9);
        }
    }
}
