package io.rdmabridge.kafka;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.metrics.JmxReporter;
import org.apache.kafka.common.metrics.KafkaMetricsContext;
import org.apache.kafka.common.metrics.Measurable;
import org.apache.kafka.common.metrics.MetricConfig;
import org.apache.kafka.common.metrics.Metrics;
import org.apache.kafka.common.utils.Time;

/**
 * The plugin's counters, published through Kafka's metrics library and its JMX reporter as
 * {@code kafka.server:type=rdma-replication} (upgrade counters) and
 * {@code kafka.server:type=rdma-replication,peer=<broker id>} (bytes per peer broker).
 *
 * <p>Counting is lock-free ({@link LongAdder}); Kafka reads the adders when JMX asks. Once {@link #close() closed}
 * (the plugin closed, as when its reporter is removed from {@code metric.reporters} at runtime), the counters still
 * count, for connections that outlive the plugin, but publish nothing: no bean is registered again. Thread-safe.
 */
final class ReplicationMetrics implements AutoCloseable {
    static final String GROUP = "rdma-replication";
    /** The peer of inter-broker connections whose broker id is not known (see {@link #peer}). */
    static final String UNKNOWN_PEER = "unknown";
    /** Peer ids come from the network: beyond this many, new ones are counted as {@link #UNKNOWN_PEER}. */
    static final int MAX_PEERS = 1024;

    /** {@code null} when {@link #detached()}. */
    private final Metrics metrics;
    /** Guarded by {@code this}: once set, no metric is added, which would register its bean again. */
    private boolean closed;
    private final ConcurrentHashMap<String, Peer> peers = new ConcurrentHashMap<>();
    private final LongAdder attempted = new LongAdder();
    private final LongAdder succeeded = new LongAdder();
    private final LongAdder fellBack = new LongAdder();
    private final LongAdder rejected = new LongAdder();

    /** Counters published in JMX until {@link #close()}. */
    ReplicationMetrics() {
        this(true);
    }

    private ReplicationMetrics(boolean publish) {
        if (!publish) {
            metrics = null;
            closed = true;
            return;
        }
        KafkaMetricsContext context = new KafkaMetricsContext("kafka.server");
        metrics = new Metrics(new MetricConfig(), new ArrayList<>(), Time.SYSTEM, context);
        // Every Metrics counts its metrics as kafka.server:type=kafka-metrics-count, the broker's own bean, which a
        // JmxReporter re-registers as its own: removed before the reporter sees it, the broker's bean stays.
        metrics.removeMetric(metrics.metricName("count", "kafka-metrics-count"));
        JmxReporter jmx = new JmxReporter();
        // addReporter() does not pass the context on, and the context names the beans' domain.
        jmx.contextChange(context);
        metrics.addReporter(jmx);
        gauge("upgrades-attempted-total", "Replication connections that tried the RDMA upgrade", Map.of(), attempted);
        gauge("upgrades-succeeded-total", "Replication connections now carried over RDMA", Map.of(), succeeded);
        gauge("upgrades-fallen-back-total", "Upgrade attempts that left the connection on TCP", Map.of(), fellBack);
        gauge("handshakes-rejected-total", "Connections cut off for a broken, hostile or slow RDMA handshake",
                Map.of(), rejected);
    }

    /** Counters that publish nothing: what {@link RdmaReplication#metrics()} gives before the plugin is configured. */
    static ReplicationMetrics detached() {
        return new ReplicationMetrics(false);
    }

    private synchronized void gauge(String name, String doc, Map<String, String> tags, LongAdder adder) {
        if (closed) {
            // A JmxReporter closed with its Metrics still registers the bean of a metric added afterwards.
            return;
        }
        MetricName mn = metrics.metricName(name, GROUP, doc, new LinkedHashMap<>(tags));
        metrics.addMetric(mn, (Measurable) (config, now) -> adder.sum());
    }

    /**
     * The counters of one peer broker, created on first use. The ids a leader learns come from its followers' bytes
     * (preamble, request header), so their number is capped at {@link #MAX_PEERS}.
     */
    Peer peer(String id) {
        Peer p = peers.get(id);
        if (p != null) {
            return p;
        }
        return peers.computeIfAbsent(peers.size() < MAX_PEERS ? id : UNKNOWN_PEER, Peer::new);
    }

    void upgradeAttempted() {
        attempted.increment();
    }

    void upgradeSucceeded() {
        succeeded.increment();
    }

    void upgradeFellBack() {
        fellBack.increment();
    }

    void handshakeRejected() {
        rejected.increment();
    }

    long attempted() {
        return attempted.sum();
    }

    long succeeded() {
        return succeeded.sum();
    }

    long fellBack() {
        return fellBack.sum();
    }

    long rejected() {
        return rejected.sum();
    }

    /** Unregisters the beans; counting goes on unpublished. Idempotent. */
    @Override
    public synchronized void close() {
        if (!closed) {
            closed = true;
            metrics.close();
        }
    }

    /** Byte counters of the replication connections with one peer broker, or with unidentified ones. */
    final class Peer {
        private final String id;
        final LongAdder rdmaSent = new LongAdder();
        final LongAdder rdmaReceived = new LongAdder();
        final LongAdder tcpSent = new LongAdder();
        final LongAdder tcpReceived = new LongAdder();
        final LongAdder copiedSent = new LongAdder();
        final LongAdder copiedReceived = new LongAdder();

        Peer(String id) {
            this.id = id;
            Map<String, String> tags = Map.of("peer", id);
            gauge("rdma-bytes-sent-total", "Bytes sent to this peer over RDMA", tags, rdmaSent);
            gauge("rdma-bytes-received-total", "Bytes received from this peer over RDMA", tags, rdmaReceived);
            gauge("tcp-bytes-sent-total", "Bytes sent to this peer over TCP (as a leader on a plain listener: whole "
                    + "responses, sendfile included, counted as they start)", tags, tcpSent);
            gauge("tcp-bytes-received-total", "Bytes received from this peer over TCP", tags, tcpReceived);
            gauge("rdma-copied-bytes-sent-total", "Bytes the CPU copied into registered memory to send over RDMA",
                    tags, copiedSent);
            gauge("rdma-copied-bytes-received-total", "Bytes the CPU copied out of registered memory on receipt",
                    tags, copiedReceived);
        }

        String id() {
            return id;
        }

        void rdmaSent(long n, long copied) {
            rdmaSent.add(n);
            copiedSent.add(copied);
        }

        void rdmaReceived(long n, long copied) {
            rdmaReceived.add(n);
            copiedReceived.add(copied);
        }

        void tcpSent(long n) {
            if (n > 0) {
                tcpSent.add(n);
            }
        }

        void tcpReceived(long n) {
            if (n > 0) {
                tcpReceived.add(n);
            }
        }
    }
}
