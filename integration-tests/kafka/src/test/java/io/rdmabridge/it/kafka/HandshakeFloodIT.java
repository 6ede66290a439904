package io.rdmabridge.it.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.DataInputStream;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.kafka.clients.admin.Admin;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A host that reaches the brokers' inter-broker listener, before Kafka authenticates anything, opens as many RDMA
 * upgrades on each broker as {@code rdma.handshake.max.in.progress} allows and leaves them hanging. It used to hold
 * every place, so each follower's upgrade was declined as busy and its replication connection stayed on TCP for its
 * lifetime. Now one address holds at most half of the places: the flood's second half is declined, naming the share
 * and the key, and the brokers' own connections, made while the flood holds its half, all go over RDMA.
 *
 * <p>Two plugin brokers and a topic they each lead a partition of, created after the flood, so that every follower
 * connects while it lasts. The flood comes from 127.0.0.2, the brokers from 127.0.0.1 (Linux routes all of 127/8 to
 * loopback).
 */
class HandshakeFloodIT {
    static final int RECORDS = 5_000;
    static final int PARTITIONS = 2;
    static final String TOPIC = "flooded";
    /** The plugin's default {@code rdma.handshake.max.in.progress}. */
    static final int MAX_HANDSHAKES = 16;
    static final String FLOOD_HOST = "127.0.0.2";
    /** Held past the whole test: the flood never has to open its connections again. */
    static final Duration HANDSHAKE_TIMEOUT = Duration.ofMinutes(5);
    /** The preamble's layout (the plugin's {@code Preamble}): HELLO and REPLY lengths, the REPLY's status. */
    static final int HELLO_LENGTH = 16;
    static final int REPLY_LENGTH = 24;
    static final int REPLY_STATUS_OFFSET = 5;
    static final byte STATUS_ACCEPT = 0;
    static final byte STATUS_DECLINE_BUSY = 3;

    @Test
    void shouldUpgradeTheBrokersConnectionsWhileOneHostHoldsItsHalfOfTheHandshakePlaces(@TempDir Path dir)
            throws Exception {
        try (KafkaCluster cluster = new KafkaCluster(dir, 2)) {
            Map<String, String> rdma = Map.of("rdma.provider", "soft", "rdma.handshake.timeout.ms",
                    Long.toString(HANDSHAKE_TIMEOUT.toMillis()));
            cluster.rdma(1, rdma).rdma(2, rdma);
            cluster.start();
            List<Socket> flood = new ArrayList<>();
            try (Admin admin = cluster.admin()) {
                for (int id : new int[] {1, 2}) {
                    int accepted = 0;
                    int busy = 0;
                    for (int i = 0; i < MAX_HANDSHAKES; i++) {
                        Socket s = new Socket();
                        flood.add(s);
                        s.bind(new InetSocketAddress(InetAddress.getByName(FLOOD_HOST), 0));
                        s.connect(new InetSocketAddress(KafkaCluster.REPLICATION_HOST,
                                cluster.broker(id).replicationPort), 10_000);
                        s.setSoTimeout(30_000);
                        s.getOutputStream().write(hello(99));
                        byte status = readReply(s).get(REPLY_STATUS_OFFSET);
                        if (status == STATUS_ACCEPT) {
                            accepted++; // holds its place: it never sends its decision
                        } else {
                            assertEquals(STATUS_DECLINE_BUSY, status, "broker " + id + "'s reply to the flood");
                            busy++;
                        }
                    }
                    assertEquals(MAX_HANDSHAKES / 2, accepted, "upgrades broker " + id + " took from " + FLOOD_HOST);
                    assertEquals(MAX_HANDSHAKES / 2, busy, "upgrades broker " + id + " declined as busy");
                }

                Records.createTopic(admin, TOPIC, PARTITIONS, 2);
                Records.Acked acked = new Records.Acked();
                Records.produce(cluster.bootstrap(), TOPIC, 0, RECORDS, acked);
                Records.Acked read = Records.consumeAll(cluster.bootstrap(), TOPIC, PARTITIONS, acked.count);
                assertEquals(acked.count, read.count, "records read back");
                assertEquals(acked.checksum, read.checksum, "checksum of keys and values");
                Records.awaitIsr(admin, TOPIC, 2, KafkaCluster.scaled(Duration.ofSeconds(60)));
            } finally {
                for (Socket s : flood) {
                    s.close();
                }
            }
            for (int id : new int[] {1, 2}) {
                String log = cluster.log(id);
                Map<String, Map<String, Double>> m = cluster.rdmaMetrics(id);
                String other = id == 1 ? "2" : "1";
                String why = m + "; log:\n" + StockClusterIT.tail(log);
                assertTrue(MixedClusterIT.received(m, other, "rdma") > 0, "broker " + id + " fetched from broker "
                        + other + " over RDMA while the flood held its places: " + why);
                assertEquals(0.0, MixedClusterIT.received(m, other, "tcp"), "broker " + id + " fetched nothing from "
                        + "broker " + other + " over TCP: " + why);
                String share = "more than " + MAX_HANDSHAKES / 2 + " RDMA handshakes in progress from " + FLOOD_HOST
                        + " (one address may hold " + MAX_HANDSHAKES / 2 + " of rdma.handshake.max.in.progress="
                        + MAX_HANDSHAKES;
                assertTrue(log.contains(share), "broker " + id + " names the share it declined the flood by; log:\n"
                        + StockClusterIT.tail(log));
            }
        }
    }

    /** A version-2 HELLO, as a follower sends it (magic "RDMA", version, flags, reserved, broker id, reserved). */
    private static byte[] hello(int brokerId) {
        return ByteBuffer.allocate(HELLO_LENGTH).putInt(0x52444D41).put((byte) 2).put((byte) 0).putShort((short) 0)
                .putInt(brokerId).putInt(0).array();
    }

    private static ByteBuffer readReply(Socket s) throws IOException {
        byte[] reply = new byte[REPLY_LENGTH];
        new DataInputStream(s.getInputStream()).readFully(reply);
        return ByteBuffer.wrap(reply);
    }
}
