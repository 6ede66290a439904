package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;
import org.apache.kafka.common.config.ConfigException;
import org.junit.jupiter.api.Test;

/** What Kafka's dynamic broker configuration gets from the reporter: its keys, and a refusal to change them. */
class RdmaReplicationPluginTest {

    @Test
    void shouldRefuseADynamicUpdateOfItsKeysAfterTheBrokerStarted() {
        Map<String, String> started = Map.of("node.id", "1", "listeners", "PLAINTEXT://:9092",
                "rdma.replication.enable", "false");
        RdmaReplicationPlugin plugin = new RdmaReplicationPlugin();
        plugin.configure(started);
        try {
            // Kafka asks a reporter to validate an update only of the keys it declares.
            assertEquals(RdmaReplicationConfig.KEYS, plugin.reconfigurableConfigs());
            plugin.validateReconfiguration(Map.of("node.id", "1", "listeners", "PLAINTEXT://:9092",
                    "rdma.replication.enable", "false", "log.retention.ms", "5"));
            ConfigException e = assertThrows(ConfigException.class, () -> plugin.validateReconfiguration(Map.of(
                    "node.id", "1", "listeners", "PLAINTEXT://:9092", "rdma.replication.enable", "true")));
            assertTrue(e.getMessage().startsWith("Invalid value true for configuration rdma.replication.enable"),
                    e::getMessage);
        } finally {
            plugin.close();
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
