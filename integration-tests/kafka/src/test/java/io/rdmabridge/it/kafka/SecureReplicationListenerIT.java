package io.rdmabridge.it.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Security protocols on the inter-broker listener, on top of whichever byte stream a replication connection ends up
 * with: brokers 1 and 2 carry TLS records (SSL) or SASL-authenticated Kafka bytes (SASL_PLAINTEXT with PLAIN) over
 * RDMA between them, every link with the stock broker 3 carries them over TCP. Keystores are generated here with the
 * JDK's keytool (a self-signed certificate for 127.0.0.1, trusted by every broker).
 */
class SecureReplicationListenerIT {
    static final int RECORDS = 30_000;
    static final int PARTITIONS = 3;
    static final String PASSWORD = "rdma-bridge-test";
    static final String PREFIX = "listener.name.replication.";

    @Test
    void shouldReplicateOverTlsOnTopOfRdma(@TempDir Path dir) throws Exception {
        Path keystore = dir.resolve("broker.p12");
        Path truststore = dir.resolve("trust.p12");
        Path cert = dir.resolve("broker.pem");
        keytool("-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-validity", "2",
                "-dname", "CN=127.0.0.1", "-ext", "SAN=IP:127.0.0.1,DNS:localhost", "-storetype", "PKCS12",
                "-keystore", keystore.toString(), "-storepass", PASSWORD, "-keypass", PASSWORD);
        keytool("-exportcert", "-rfc", "-alias", "broker", "-keystore", keystore.toString(), "-storepass", PASSWORD,
                "-file", cert.toString());
        keytool("-importcert", "-noprompt", "-alias", "broker", "-file", cert.toString(), "-storetype", "PKCS12",
                "-keystore", truststore.toString(), "-storepass", PASSWORD);
        Map<String, String> ssl = new HashMap<>();
        ssl.put("listener.security.protocol.map", "CONTROLLER:PLAINTEXT,CLIENT:PLAINTEXT,REPLICATION:SSL");
        ssl.put(PREFIX + "ssl.keystore.location", keystore.toString());
        ssl.put(PREFIX + "ssl.keystore.type", "PKCS12");
        ssl.put(PREFIX + "ssl.keystore.password", PASSWORD);
        ssl.put(PREFIX + "ssl.key.password", PASSWORD);
        ssl.put(PREFIX + "ssl.truststore.location", truststore.toString());
        ssl.put(PREFIX + "ssl.truststore.type", "PKCS12");
        ssl.put(PREFIX + "ssl.truststore.password", PASSWORD);

        replicateAcrossMixedBrokers(dir, ssl, "replicated-over-tls", "SSL");
    }

    @Test
    void shouldReplicateOverSaslOnTopOfRdma(@TempDir Path dir) throws Exception {
        Map<String, String> sasl = new HashMap<>();
        sasl.put("listener.security.protocol.map", "CONTROLLER:PLAINTEXT,CLIENT:PLAINTEXT,REPLICATION:SASL_PLAINTEXT");
        sasl.put("sasl.mechanism.inter.broker.protocol", "PLAIN");
        sasl.put(PREFIX + "sasl.enabled.mechanisms", "PLAIN");
        sasl.put(PREFIX + "plain.sasl.jaas.config", "org.apache.kafka.common.security.plain.PlainLoginModule required"
                + " username=\"broker\" password=\"" + PASSWORD + "\" user_broker=\"" + PASSWORD + "\";");

        replicateAcrossMixedBrokers(dir, sasl, "replicated-over-sasl", "SASL_PLAINTEXT");
    }

    /**
     * Brokers 1 and 2 with the plugin and {@code security} on the replication listener, broker 3 stock with the same
     * listener settings: every acknowledged record reads back, the ISR is full, and the bytes between 1 and 2 went over
     * RDMA only while every link with 3 stayed on TCP.
     */
    private static void replicateAcrossMixedBrokers(Path dir, Map<String, String> security, String topic,
                                                    String protocol) throws Exception {
        try (KafkaCluster cluster = new KafkaCluster(dir.resolve("cluster"), 3)) {
            Map<String, String> rdma = new HashMap<>(security);
            rdma.put("rdma.provider", "soft");
            cluster.rdma(1, rdma).rdma(2, rdma);
            cluster.broker(3).extra.putAll(security);
            cluster.start();
            try (Admin admin = cluster.admin()) {
                Records.createTopic(admin, topic, PARTITIONS);
                Records.Acked acked = new Records.Acked();
                Records.produce(cluster.bootstrap(), topic, 0, RECORDS, acked);
                Records.Acked read = Records.consumeAll(cluster.bootstrap(), topic, PARTITIONS, acked.count);
                assertEquals(acked.count, read.count, "records read back");
                assertEquals(acked.sequences, read.sequences, "sequence numbers read back");
                assertEquals(acked.checksum, read.checksum, "checksum of keys and values");
                Records.awaitIsr(admin, topic, 3, Duration.ofSeconds(60));

                for (int id : new int[] {1, 2}) {
                    Map<String, Map<String, Double>> m = cluster.rdmaMetrics(id);
                    System.out.println("broker " + id + " rdma-replication metrics (" + protocol + "): " + m);
                    String other = id == 1 ? "2" : "1";
                    assertTrue(MixedClusterIT.received(m, other, "rdma") > 0, "broker " + id + ": " + m);
                    assertEquals(0.0, MixedClusterIT.received(m, other, "tcp"), "broker " + id + ": " + m);
                    assertTrue(MixedClusterIT.sent(m, other, "rdma") > 0, "broker " + id + ": " + m);
                    assertTrue(MixedClusterIT.received(m, "3", "tcp") > 0, "broker " + id + ": " + m);
                    assertEquals(0.0, MixedClusterIT.received(m, "3", "rdma"), "broker " + id + ": " + m);
                    String log = cluster.log(id);
                    assertTrue(log.contains("upgraded to RDMA"), "broker " + id + " log:\n" + StockClusterIT.tail(log));
                }
            }
        }
    }

    private static void keytool(String... args) throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "keytool").toString());
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        assertTrue(p.waitFor(60, TimeUnit.SECONDS), "keytool did not finish");
        assertEquals(0, p.exitValue(), "keytool " + String.join(" ", args) + ":\n" + out);
    }
}
