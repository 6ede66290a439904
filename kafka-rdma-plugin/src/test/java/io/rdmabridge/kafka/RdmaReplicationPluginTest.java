package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** What Kafka's dynamic broker configuration gets from the reporter: its keys, and a refusal to change them. */
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
