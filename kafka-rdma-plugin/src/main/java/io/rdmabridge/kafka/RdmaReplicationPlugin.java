package io.rdmabridge.kafka;

import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.MetricsReporter;

/**
 * Turns RDMA replication on for a broker. Kafka has no transport plugin point, but it builds every
 * {@code metric.reporters} class with the broker's configuration before the replica fetchers start, which is all
 * this plugin needs: it reads {@code rdma.replication.enable} and the optional {@code rdma.*} keys, finds the
 * inter-broker listener, and tells the NIO provider installed by the agent ({@code -javaagent} of this jar) which
 * connections to upgrade. It logs one line saying whether it is active, and why not.
 *
 * <pre>
 * metric.reporters=io.rdmabridge.kafka.RdmaReplicationPlugin
 * rdma.replication.enable=true
 * KAFKA_OPTS="-javaagent:/opt/kafka/libs/kafka-rdma-plugin.jar"
 * </pre>
 *
 * It reports no Kafka metrics itself: its own counters are published under {@code kafka.server:type=rdma-replication}.
 */
public final class RdmaReplicationPlugin implements MetricsReporter {
    private boolean configured;

    /** Public no-argument constructor, as Kafka requires of a reporter. */
    public RdmaReplicationPlugin() {
    }

    @Override
    public void configure(Map<String, ?> configs) {
        RdmaReplication.get().configure(configs);
        configured = true;
    }

    /**
     * The plugin's own keys, so that Kafka tells this reporter of a dynamic update of one ({@link #reconfigure}),
     * which it would otherwise store without a word.
     */
    @Override
    public Set<String> reconfigurableConfigs() {
        return RdmaReplicationConfig.KEYS;
    }

    /**
     * Accepts every update: a refusal would make Kafka drop the update's other keys too, and every later update's,
     * where the value came in another way ({@link RdmaReplicationConfig#ignoredUpdates}).
     */
    @Override
    public void validateReconfiguration(Map<String, ?> configs) {
    }

    /** Warns, naming each changed key, that the plugin does not apply it, and what to do instead. */
    @Override
    public void reconfigure(Map<String, ?> configs) {
        RdmaReplication.get().dynamicUpdate(configs);
    }

    @Override
    public void init(List<KafkaMetric> metrics) {
    }

    @Override
    public void metricChange(KafkaMetric metric) {
    }

    @Override
    public void metricRemoval(KafkaMetric metric) {
    }

    @Override
    public void close() {
        if (configured) {
            configured = false;
            RdmaReplication.get().pluginClosed();
        }
    }
}
