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
 * One controller and three brokers: 1 and 2 with the agent and {@code rdma.replication.enable=true}, 3 stock. One
 * cluster life, several claims: records produced with {@code acks=all} come back exactly (count, sequences,
 * checksum) with ISR 3; the plugin's JMX counters show replication bytes per peer on every link; a SIGKILLed broker
 * restarted with its RDMA provider forced unavailable catches up over TCP, with the cause in one WARN line, and no
 * acknowledged record is lost.
 */
class MixedClusterIT {
    static final int RECORDS = 100_000;
    static final int MORE_RECORDS = 20_000;
    static final int PARTITIONS = 3;
    static final String TOPIC = "replicated";

    @Test
    void shouldReplicateAcrossAMixedClusterAndSurviveAKilledBroker(@TempDir Path dir) throws Exception {
        try (KafkaCluster cluster = new KafkaCluster(dir, 3)) {
            cluster.rdma(1, Map.of("rdma.provider", "soft")).rdma(2, Map.of("rdma.provider", "soft"));
            cluster.start();
            try (Admin admin = cluster.admin()) {
                Records.createTopic(admin, TOPIC, PARTITIONS);
                Records.Acked acked = new Records.Acked();
                Records.produce(cluster.bootstrap(), TOPIC, 0, RECORDS, acked);
                Records.Acked read = Records.consumeAll(cluster.bootstrap(), TOPIC, PARTITIONS, acked.count);
                assertEquals(acked.count, read.count, "records read back");
                assertEquals(acked.sequences, read.sequences, "sequence numbers read back");
                assertEquals(acked.checksum, read.checksum, "checksum of keys and values");
                Records.awaitIsr(admin, TOPIC, 3, Duration.ofSeconds(60));

                for (int id : new int[] {1, 2}) {
                    String log = cluster.log(id);
                    assertTrue(log.contains("RDMA replication agent installed its NIO provider"),
                            "broker " + id + " agent; log:\n" + StockClusterIT.tail(log));
                    Map<String, Map<String, Double>> m = cluster.rdmaMetrics(id);
                    System.out.println("broker " + id + " rdma-replication metrics: " + m);
                    int other = id == 1 ? 2 : 1;
                    // Follower-side counters: what this broker fetched from each leader.
                    assertTrue(received(m, "3", "tcp") > 0, "broker " + id + " fetched from broker 3 over TCP: " + m);
                    assertTrue(received(m, Integer.toString(other), "tcp") + received(m, Integer.toString(other),
                            "rdma") > 0, "broker " + id + " fetched from broker " + other + ": " + m);
                }
                assertTrue(cluster.log(3).contains("RDMA replication inactive: rdma.replication.enable is not true"),
                        "broker 3 names why it is inactive");

                // kill -9 broker 2, keep producing (min.insync.replicas=2 holds with brokers 1 and 3), restart it
                // with its provider forced unavailable: it must catch up over TCP.
                cluster.kill(2);
                Records.produce(cluster.bootstrap(), TOPIC, RECORDS, MORE_RECORDS, acked);
                cluster.broker(2).extra.put("rdma.provider", "no-such-provider");
                cluster.restart(2);
                Records.awaitIsr(admin, TOPIC, 3, Duration.ofSeconds(120));
                Records.Acked all = Records.consumeAll(cluster.bootstrap(), TOPIC, PARTITIONS, acked.count);
                assertEquals(RECORDS + MORE_RECORDS, acked.count);
                assertEquals(acked.count, all.count, "no acknowledged record lost, none duplicated");
                assertEquals(acked.sequences, all.sequences);
                assertEquals(acked.checksum, all.checksum);
                String log2 = cluster.log(2);
                assertTrue(log2.contains("RDMA replication enabled but RDMA is unavailable, so replication stays on "
                        + "TCP: RDMA provider (rdma.provider=no-such-provider): unknown RDMA provider 'no-such-provider'"),
                        "restarted broker 2 names the cause; log:\n" + StockClusterIT.tail(log2));
                Map<String, Map<String, Double>> m2 = cluster.rdmaMetrics(2);
                System.out.println("broker 2 after restart: " + m2);
                assertTrue(received(m2, "1", "tcp") > 0 && received(m2, "1", "rdma") == 0,
                        "restarted broker 2 fetches from broker 1 over TCP only: " + m2);
            }
        }
    }

    static double received(Map<String, Map<String, Double>> m, String peer, String transport) {
        Map<String, Double> p = m.get(peer);
        return p == null ? 0 : p.getOrDefault(transport + "-bytes-received-total", 0.0);
    }
}
