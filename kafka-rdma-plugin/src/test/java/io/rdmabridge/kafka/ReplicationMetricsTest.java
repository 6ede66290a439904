package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.management.ManagementFactory;
import java.util.List;
import javax.management.MBeanServer;
import javax.management.ObjectName;
import org.apache.kafka.common.metrics.JmxReporter;
import org.apache.kafka.common.metrics.KafkaMetricsContext;
import org.apache.kafka.common.metrics.Measurable;
import org.apache.kafka.common.metrics.MetricConfig;
import org.apache.kafka.common.metrics.Metrics;
import org.apache.kafka.common.utils.Time;
import org.junit.jupiter.api.Test;

/** The plugin's metrics live beside the broker's in JMX, in its domain, and never take over a bean of the broker's. */
class ReplicationMetricsTest {

    @Test
    void shouldLeaveTheBrokersMetricCountBeanToTheBroker() throws Exception {
        MBeanServer server = ManagementFactory.getPlatformMBeanServer();
        ObjectName count = new ObjectName("kafka.server:type=kafka-metrics-count");
        // As the broker's own Metrics registers it: kafka.server context, JMX reporter, its metrics counted.
        try (Metrics broker = new Metrics(new MetricConfig(), List.of(new JmxReporter()), Time.SYSTEM,
                new KafkaMetricsContext("kafka.server"))) {
            for (int i = 0; i < 40; i++) {
                broker.addMetric(broker.metricName("m" + i, "broker-group"), (Measurable) (c, now) -> 1);
            }
            double brokers = ((Number) server.getAttribute(count, "count")).doubleValue();
            assertTrue(brokers >= 40, "the broker's count: " + brokers);
            ReplicationMetrics plugin = new ReplicationMetrics();
            try {
                assertEquals(brokers, ((Number) server.getAttribute(count, "count")).doubleValue(),
                        "kafka-metrics-count while the plugin's metrics exist");
                // The plugin's own counters are beans of the broker's domain, where operators look for them.
                plugin.upgradeAttempted();
                assertEquals(1.0, ((Number) server.getAttribute(new ObjectName("kafka.server:type=rdma-replication"),
                        "upgrades-attempted-total")).doubleValue());
            } finally {
                plugin.close();
            }
            assertTrue(server.isRegistered(count), "the broker's bean was unregistered with the plugin's metrics");
            assertEquals(brokers, ((Number) server.getAttribute(count, "count")).doubleValue());
        }
    }
}
