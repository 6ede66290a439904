package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetSocketAddress;
import java.util.HashMap;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** Where the RDMA port is, and the clear errors of the keys that place it. */
class RdmaReplicationConfigTest {
    private static Map<String, String> broker(String... more) {
        Map<String, String> p = new HashMap<>(Map.of("node.id", "4", "listeners",
                "CLIENT://:9092,REPLICATION://10.0.0.4:9094", "inter.broker.listener.name", "REPLICATION",
                "listener.security.protocol.map", "CLIENT:PLAINTEXT,REPLICATION:SASL_SSL"));
        for (int i = 0; i < more.length; i += 2) {
            p.put(more[i], more[i + 1]);
        }
        return p;
    }

    @Test
    void shouldPutTheRdmaPortAtAFixedOffsetFromTheInterBrokerListener() {
        RdmaReplicationConfig c = RdmaReplicationConfig.parse(broker());
        assertEquals(10094, c.rdmaPort(), "9094 + the default offset 1000");
        assertEquals(10092, c.rdmaPortOf(new InetSocketAddress("10.0.0.5", 9092)), "a leader's, found the same way");
        assertTrue(c.interBrokerTls(), "SASL_SSL");
        RdmaReplicationConfig moved = RdmaReplicationConfig.parse(broker("rdma.port.offset", "-2",
                "listener.security.protocol.map", "REPLICATION:SASL_PLAINTEXT"));
        assertEquals(9092, moved.rdmaPort());
        assertFalse(moved.interBrokerTls());
        assertEquals(-1, moved.rdmaPortOf(new InetSocketAddress("10.0.0.5", 1)), "no port below 1");
    }

    @Test
    void shouldRejectKeysThatCannotPlaceTheRdmaPort() {
        assertEquals("rdma.port: 40123 (no longer read: a broker's RDMA port is its inter-broker listener's port + "
                + "rdma.port.offset, default 1000, the same on every broker; remove rdma.port)",
                assertThrows(IllegalArgumentException.class,
                        () -> RdmaReplicationConfig.parse(broker("rdma.port", "40123"))).getMessage());
        assertEquals("rdma.port.offset: 60000 puts the RDMA port of listener REPLICATION (port 9094) at 69094 "
                + "(expected: 1..65535)", assertThrows(IllegalArgumentException.class,
                        () -> RdmaReplicationConfig.parse(broker("rdma.port.offset", "60000"))).getMessage());
        assertTrue(assertThrows(IllegalArgumentException.class,
                () -> RdmaReplicationConfig.parse(broker("rdma.port.offset", "0"))).getMessage()
                .startsWith("rdma.port.offset: 0 (expected: non-zero"));
    }

    /** A misspelled key is ignored by Kafka and by the plugin alike: the plugin names it, as Kafka does its own. */
    @Test
    void shouldListTheRdmaKeysItDoesNotRead() {
        assertEquals(java.util.List.of("rdma.max.connection", "rdma.replication.enabled"),
                RdmaReplicationConfig.unknownKeys(broker("rdma.replication.enabled", "true", "rdma.max.connection",
                        "5", "rdma.max.connections", "5", "replica.fetch.max.bytes", "1")));
    }
}
