package io.rdmabridge.it.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.net.Socket;
import java.net.SocketException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.common.config.ConfigResource;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * One controller and three brokers: 1 and 2 with the agent and {@code rdma.replication.enable=true}, 3 stock. One
 * cluster life, several claims: records produced with {@code acks=all} come back exactly (count, sequences,
 * checksum) with ISR 3; the plugin's JMX counters show RDMA bytes both ways between brokers 1 and 2, TCP only on
 * every link with broker 3 (named by its broker id, sendfile's bytes counted), and at most one CPU copy per replicated
 * byte on each side; broker 3's socket server and selectors log no warning or error, and it never logs an invalid
 * receive, before and after broker 2's kill and restart; hostile preambles on a real
 * replication port are cut off (at once, or at the handshake timeout) with a log line naming the cause while
 * replication carries on; a SIGKILLed broker
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

                String log3 = cluster.log(3);
                assertTrue(log3.contains("RDMA replication inactive: rdma.replication.enable is not true"),
                        "broker 3 names why it is inactive");
                // The plugin brokers started (and probed broker 3's RDMA port, where nothing listens) and replicated
                // from and to it: broker 3, stock, warned about none of its connections.
                System.out.println("broker 3 WARN/ERROR lines: " + warningsAndErrors(log3));
                assertEquals(List.of(), causedByConnections(log3), "broker 3's log; whole log:\n"
                        + StockClusterIT.tail(log3));

                for (int id : new int[] {1, 2}) {
                    String log = cluster.log(id);
                    assertTrue(log.contains("RDMA replication agent installed its NIO provider"),
                            "broker " + id + " agent; log:\n" + StockClusterIT.tail(log));
                    Map<String, Map<String, Double>> m = cluster.rdmaMetrics(id);
                    System.out.println("broker " + id + " rdma-replication metrics: " + m);
                    String other = id == 1 ? "2" : "1";
                    assertTrue(m.get("all").get("upgrades-succeeded-total") > 0, "broker " + id + " upgraded: " + m);
                    // The link with the other RDMA broker, both directions: what this broker fetched from it as a
                    // follower, and what it sent to it as a leader (each broker leads one partition).
                    assertTrue(received(m, other, "rdma") > 0, "broker " + id + " fetched from broker " + other
                            + " over RDMA: " + m);
                    assertEquals(0.0, received(m, other, "tcp"), "broker " + id + " fetched nothing from broker "
                            + other + " over TCP: " + m);
                    assertTrue(sent(m, other, "rdma") > 0, "broker " + id + " served broker " + other
                            + " over RDMA: " + m);
                    // Every link with the stock broker 3 is TCP, and named by its broker id both ways: as a follower
                    // (the fetcher thread names its leader) and as a leader (broker 3's fetcher names itself in its
                    // first request's client id).
                    assertTrue(received(m, "3", "tcp") > 0, "broker " + id + " fetched from broker 3 over TCP: " + m);
                    assertEquals(0.0, received(m, "3", "rdma") + sent(m, "3", "rdma"), "no RDMA with broker 3: " + m);
                    assertFalse(m.containsKey("unknown"), "every replication peer named by its broker id: " + m);
                    // Broker 3 fetches what broker 2 fetches from this leader; most of it goes by sendfile, which
                    // must be counted too (write() alone carries only the responses' headers).
                    assertTrue(sent(m, "3", "tcp") >= 0.5 * sent(m, other, "rdma"), "broker " + id + " counts what "
                            + "sendfile sent broker 3: " + m);
                    // Copies per replicated byte on the RDMA path: at most one on each side.
                    double leaderCopies = m.get(other).get("rdma-copied-bytes-sent-total") / sent(m, other, "rdma");
                    double followerCopies = m.get(other).get("rdma-copied-bytes-received-total")
                            / received(m, other, "rdma");
                    System.out.printf("broker %d <-> broker %s: RDMA bytes sent %.0f, received %.0f; copies per byte "
                            + "as leader %.4f, as follower %.4f%n", id, other, sent(m, other, "rdma"),
                            received(m, other, "rdma"), leaderCopies, followerCopies);
                    assertTrue(leaderCopies <= 1.0, "leader copies per byte: " + leaderCopies);
                    assertTrue(followerCopies <= 1.0, "follower copies per byte: " + followerCopies);
                }

                // A dynamic update of a key the plugin reads at start is stored by Kafka and not applied: broker 1's
                // plugin says so in a WARN naming the key and what to do (a refusal would make Kafka drop every
                // other key of the update, and of later ones, when such a value came in another way).
                ConfigResource broker1 = new ConfigResource(ConfigResource.Type.BROKER, "1");
                ConfigEntry off = new ConfigEntry("rdma.replication.enable", "false");
                admin.incrementalAlterConfigs(Map.of(broker1, List.of(new AlterConfigOp(off,
                        AlterConfigOp.OpType.SET)))).all().get(60, TimeUnit.SECONDS);
                String ignored = "rdma.replication.enable was updated dynamically to false, which the RDMA replication"
                        + " plugin does not apply";
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
                while (!cluster.log(1).contains(ignored) && System.nanoTime() < deadline) {
                    Thread.sleep(200);
                }
                assertTrue(cluster.log(1).contains(ignored), "broker 1 warns of the update it does not apply");
                admin.incrementalAlterConfigs(Map.of(broker1, List.of(new AlterConfigOp(off,
                        AlterConfigOp.OpType.DELETE)))).all().get(60, TimeUnit.SECONDS);

                // Hostile peers on broker 1's replication port: a HELLO with non-zero flags is cut off at once, a
                // truncated one when the handshake timeout (5 s) runs out; replication carries on meanwhile.
                int port = cluster.broker(1).replicationPort;
                byte[] badFlags = {'R', 'D', 'M', 'A', 1, (byte) 0xff, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0};
                long cutOff = closedAfterMillis(port, badFlags, Duration.ofSeconds(20));
                long stalled = closedAfterMillis(port, new byte[] {'R', 'D', 'M'}, Duration.ofSeconds(20));
                System.out.printf("hostile handshakes: bad flags closed after %d ms, truncated after %d ms%n", cutOff,
                        stalled);
                assertTrue(cutOff < 4000, "a bad preamble is rejected without waiting for the timeout: " + cutOff);
                assertTrue(stalled >= 4000, "a truncated preamble is held until the timeout: " + stalled);
                String log1 = cluster.log(1);
                assertTrue(log1.contains("Closing connection: RDMA handshake from /" + KafkaCluster.REPLICATION_HOST + ":")
                        && log1.contains("rejected: invalid RDMA preamble: flags/reserved=0xff/0x0/0x0 (expected: 0)")
                        && log1.contains("rejected: RDMA handshake did not complete within 5000 ms"),
                        "broker 1 names why it cut each one off; log:\n" + StockClusterIT.tail(log1));
                assertEquals(2.0, cluster.rdmaMetrics(1).get("all").get("handshakes-rejected-total"));
                Records.produce(cluster.bootstrap(), TOPIC, RECORDS, MORE_RECORDS / 2, acked);
                Records.awaitIsr(admin, TOPIC, 3, Duration.ofSeconds(60));

                // kill -9 broker 2, keep producing (min.insync.replicas=2 holds with brokers 1 and 3), restart it
                // with its provider forced unavailable: it must catch up over TCP.
                cluster.kill(2);
                Records.produce(cluster.bootstrap(), TOPIC, RECORDS + MORE_RECORDS / 2, MORE_RECORDS / 2, acked);
                cluster.broker(2).extra.put("rdma.provider", "no-such-provider");
                cluster.restart(2);
                Records.awaitIsr(admin, TOPIC, 3, Duration.ofSeconds(120));
                Records.Acked all = Records.consumeAll(cluster.bootstrap(), TOPIC, PARTITIONS, acked.count);
                assertEquals(RECORDS + MORE_RECORDS, acked.count);
                assertEquals(acked.count, all.count, "no acknowledged record lost, none duplicated");
                assertEquals(acked.sequences, all.sequences);
                assertEquals(acked.checksum, all.checksum);
                // Through broker 2's kill and restart as well, broker 3's socket server and selectors warned about
                // none of its connections, and it never received a byte it could not parse.
                String log3After = cluster.log(3);
                System.out.println("broker 3 WARN/ERROR lines after broker 2's restart: "
                        + warningsAndErrors(log3After));
                assertEquals(List.of(), causedByConnections(log3After), "broker 3's log after broker 2's restart; "
                        + "whole log:\n" + StockClusterIT.tail(log3After));
                String log2 = cluster.log(2);
                assertTrue(log2.contains("RDMA replication enabled but RDMA is unavailable, so replication stays on "
                        + "TCP: unknown RDMA provider 'no-such-provider' (expected: auto or one of [disni, soft]; set "
                        + "rdma.provider accordingly)"),
                        "restarted broker 2 names the cause; log:\n" + StockClusterIT.tail(log2));
                Map<String, Map<String, Double>> m2 = cluster.rdmaMetrics(2);
                System.out.println("broker 2 after restart: " + m2);
                assertTrue(received(m2, "1", "tcp") > 0 && received(m2, "1", "rdma") == 0,
                        "restarted broker 2 fetches from broker 1 over TCP only: " + m2);
            }
        }
    }

    /** Sends {@code bytes} to the port and waits for the broker to close the connection: the milliseconds it took. */
    static long closedAfterMillis(int port, byte[] bytes, Duration timeout) throws IOException {
        long start = System.nanoTime();
        try (Socket s = new Socket(KafkaCluster.REPLICATION_HOST, port)) {
            s.setSoTimeout((int) timeout.toMillis());
            s.getOutputStream().write(bytes);
            s.getOutputStream().flush();
            try {
                assertEquals(-1, s.getInputStream().read(), "the broker answered a hostile preamble");
            } catch (SocketException e) {
                // A reset is a close too.
            }
        }
        return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
    }

    /** The WARN and ERROR lines of a broker's log (Kafka's level follows the time stamp and the thread). */
    static List<String> warningsAndErrors(String log) {
        return log.lines().filter(l -> l.contains(" WARN ") || l.contains(" ERROR ")).collect(Collectors.toList());
    }

    /**
     * The lines another broker's plugin could cause in a stock broker's log: WARN and ERROR lines of the loggers that
     * handle its inbound connections (the socket server and its selectors: a preamble was logged there as "Unexpected
     * error from /...; closing connection" with an InvalidReceiveException), and any line naming an invalid receive
     * (or, at WARN or ERROR, RDMA). Other warnings (a controller not up yet, a deprecated setting) are the cluster's,
     * not the plugin's.
     */
    static List<String> causedByConnections(String log) {
        return log.lines().filter(l -> l.contains("InvalidReceiveException") || l.contains("Invalid receive")
                || (l.contains(" WARN ") || l.contains(" ERROR ")) && (l.contains("org.apache.kafka.common.network.")
                || l.contains("kafka.network.") || l.contains("SocketServer")
                || l.toLowerCase(Locale.ROOT).contains("rdma"))).collect(Collectors.toList());
    }

    static double sent(Map<String, Map<String, Double>> m, String peer, String transport) {
        Map<String, Double> p = m.get(peer);
        return p == null ? 0 : p.getOrDefault(transport + "-bytes-sent-total", 0.0);
    }

    static double received(Map<String, Map<String, Double>> m, String peer, String transport) {
        Map<String, Double> p = m.get(peer);
        return p == null ? 0 : p.getOrDefault(transport + "-bytes-received-total", 0.0);
    }
}
