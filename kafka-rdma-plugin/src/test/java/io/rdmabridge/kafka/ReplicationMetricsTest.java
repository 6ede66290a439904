package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.management.ManagementFactory;
import java.util.ArrayList;
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

/**
 * The plugin's metrics live beside the broker's in JMX, in its domain, and never take over a bean of the broker's; the
 * peers a leader names from its followers' bytes take bounded room.
 */
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

    /**
     * Peer ids come from the network (a HELLO, a client id): 1,024 made-up ids, each from a connection closed since,
     * used to fill the table for good, six beans each, and every broker seen after them was counted as unknown.
     */
    @Test
    void shouldGiveThePlaceOfAPeerWithoutAConnectionToABrokerSeenLater() throws Exception {
        MBeanServer server = ManagementFactory.getPlatformMBeanServer();
        ReplicationMetrics metrics = new ReplicationMetrics();
        try {
            for (int i = 0; i < ReplicationMetrics.MAX_PEERS; i++) {
                metrics.peer("made-up-" + i).release();
            }
            ReplicationMetrics.Peer seven = metrics.peer("7");
            assertEquals("7", seven.id(), "a broker seen after 1,024 made-up ids has counters of its own");
            seven.tcpReceived(5);
            assertEquals(5.0, ((Number) server.getAttribute(new ObjectName("kafka.server:type=rdma-replication,peer=7"),
                    "tcp-bytes-received-total")).doubleValue());
            assertFalse(server.isRegistered(new ObjectName("kafka.server:type=rdma-replication,peer=made-up-0")),
                    "the beans of the peer that gave its place");
            assertEquals(ReplicationMetrics.MAX_PEERS, peerBeans(server));
        } finally {
            metrics.close();
        }
    }

    /** While every place has a connection open, a new id is counted as unknown; a connection's close frees one. */
    @Test
    void shouldCountANewIdAsUnknownOnlyWhileEveryPeerHasAConnectionOpen() throws Exception {
        MBeanServer server = ManagementFactory.getPlatformMBeanServer();
        ReplicationMetrics metrics = new ReplicationMetrics();
        try {
            List<ReplicationMetrics.Peer> held = new ArrayList<>();
            for (int i = 0; i < ReplicationMetrics.MAX_PEERS; i++) {
                held.add(metrics.peer("held-" + i));
            }
            assertEquals(ReplicationMetrics.UNKNOWN_PEER, metrics.peer("7").id());
            assertEquals(ReplicationMetrics.MAX_PEERS + 1, peerBeans(server), "named peers and unknown");
            held.get(0).release();
            assertEquals("8", metrics.peer("8").id(), "the place of the connection just closed");
            assertEquals("held-1", metrics.peer("held-1").id(), "a peer with a connection open keeps its place");
            assertEquals(ReplicationMetrics.MAX_PEERS + 1, peerBeans(server));
        } finally {
            metrics.close();
        }
    }

    private static int peerBeans(MBeanServer server) throws Exception {
        return server.queryNames(new ObjectName("kafka.server:type=rdma-replication,peer=*"), null).size();
    }
}
