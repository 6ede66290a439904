package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * What Kafka's dynamic broker configuration gets from the reporter (its keys, and a refusal to change them), and the
 * plugin's status and count of instances.
 */
class RdmaReplicationPluginTest {

    @Test
    void shouldWarnOfADynamicUpdateOfItsKeysItDoesNotApply() {
        Map<String, String> started = Map.of("node.id", "1", "listeners", "PLAINTEXT://:9092",
                "rdma.replication.enable", "false");
        RdmaReplicationPlugin plugin = new RdmaReplicationPlugin();
        plugin.configure(started);
        try {
            // Kafka tells a reporter of an update only of the keys it declares.
            assertEquals(RdmaReplicationConfig.KEYS, plugin.reconfigurableConfigs());
            Map<String, String> updated = Map.of("node.id", "1", "listeners", "PLAINTEXT://:9092",
                    "rdma.replication.enable", "true", "log.retention.ms", "5");
            plugin.validateReconfiguration(updated);
            assertEquals(List.of("rdma.replication.enable was updated dynamically to true, which the RDMA replication "
                    + "plugin does not apply: it reads rdma.replication.enable when the broker starts and goes on with "
                    + "false; set it in the broker's server.properties and restart the broker, and remove the dynamic "
                    + "value (kafka-configs --alter --delete-config rdma.replication.enable)"),
                    RdmaReplication.get().dynamicUpdate(updated));
            assertEquals(List.of(), RdmaReplication.get().dynamicUpdate(started), "nothing changed");
        } finally {
            plugin.close();
        }
    }

    /**
     * Without node.id or broker.id the plugin has no id to send: every leader would reject its HELLO, and its followers
     * would be told that rdma.port.offset differs. It used to go active as broker -1.
     */
    @Test
    void shouldStayInactiveNamingTheKeysWhenTheBrokerHasNoId() {
        RdmaReplication r = RdmaReplication.get();
        r.agentInstalled();
        String status = r.configure(Map.of("listeners", "REPLICATION://127.0.0.1:9094", "inter.broker.listener.name",
                "REPLICATION", "rdma.replication.enable", "true"),
                RdmaStreamTransport.unavailable(-1, "test: not opened"));
        try {
            assertEquals("RDMA replication inactive: neither node.id nor broker.id is set to an id of 0 or more "
                    + "(node.id=absent, broker.id=absent), and other brokers' plugins refuse a preamble without one; "
                    + "set node.id", status);
            assertFalse(r.isActive());
        } finally {
            r.pluginClosed();
        }
    }

    /**
     * Kafka closes a reporter whose configure threw, and that close releases nothing: so that configure must count no
     * plugin. It used to, and the last plugin's close then left the plugin configured with the closed one's keys.
     */
    @Test
    void shouldNotCountAPluginWhoseConfigureFailed() {
        RdmaReplicationPlugin failed = new RdmaReplicationPlugin();
        assertThrows(IllegalArgumentException.class, () -> failed.configure(Map.of("node.id", "1", "listeners",
                "PLAINTEXT://:9092", "rdma.replication.enable", "true", "rdma.port", "40123")));
        failed.close();
        RdmaReplicationPlugin off = new RdmaReplicationPlugin();
        off.configure(Map.of("node.id", "1", "listeners", "PLAINTEXT://:9092", "rdma.replication.enable", "false"));
        off.close();
        // The only plugin configured has closed: the next configuration is applied, not the closed one's line.
        String status = RdmaReplication.get().configure(Map.of("node.id", "3000", "process.roles", "controller",
                "listeners", "CONTROLLER://:9093", "rdma.replication.enable", "true"));
        try {
            assertTrue(status.startsWith("RDMA replication inactive: this process is a KRaft controller only"),
                    status);
        } finally {
            RdmaReplication.get().pluginClosed();
            // Releases what a leaked count would still hold, so that no other test inherits it.
            RdmaReplication.get().pluginClosed();
        }
    }

    /** A KRaft controller-only process replicates no partitions: its line says so, rather than a listener problem. */
    @Test
    void shouldSayAControllerOnlyProcessHasNothingToDo() {
        String status = RdmaReplication.get().configure(Map.of("node.id", "3000", "process.roles", "controller",
                "listeners", "CONTROLLER://:9093", "rdma.replication.enable", "true"));
        try {
            assertEquals("RDMA replication inactive: this process is a KRaft controller only (process.roles="
                    + "controller), which replicates no partitions; brokers use the plugin", status);
        } finally {
            RdmaReplication.get().pluginClosed();
        }
    }
}
