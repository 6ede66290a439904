package io.rdmabridge.kafka;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
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
 *
 * <p>A leader learns its peers' ids from their bytes (preamble, request header), so anyone reaching the inter-broker
 * port can make ids up. The peer table holds at most {@link #MAX_PEERS} named peers, plus {@link #UNKNOWN_PEER}: each
 * connection holds its peer's entry ({@link #peer}) until it closes ({@link Peer#release()}), and when a new id finds
 * the table full, the entry that has had no connection for longest gives it its place, its beans unregistered (should
 * that peer come back, its counters start again from 0). Only while every entry has a connection open is a new id
 * counted as unknown.
 */
final class ReplicationMetrics implements AutoCloseable {
    static final String GROUP = "rdma-replication";
    /** The peer of inter-broker connections whose broker id is not known (see {@link #peer}). */
    static final String UNKNOWN_PEER = "unknown";
    /** Peer ids come from the network: at most this many named peers are kept (see the class comment). */
    static final int MAX_PEERS = 1024;

    /** {@code null} when {@link #detached()}. */
    private final Metrics metrics;
    /** Guarded by {@code this}: once set, no metric is added, which would register its bean again. */
    private boolean closed;
    /** Guarded by {@code this}: the named peers and {@link #UNKNOWN_PEER}. */
    private final Map<String, Peer> peers = new HashMap<>();
    /** Guarded by {@code this}: the named peers without an open connection, the longest without one first. */
    private final LinkedHashMap<String, Peer> idle = new LinkedHashMap<>();
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

    /** The metric's name, or {@code null} when closed (then nothing is published). */
    private synchronized MetricName gauge(String name, String doc, Map<String, String> tags, LongAdder adder) {
        if (closed) {
            // A JmxReporter closed with its Metrics still registers the bean of a metric added afterwards.
            return null;
        }
        MetricName mn = metrics.metricName(name, GROUP, doc, new LinkedHashMap<>(tags));
        metrics.addMetric(mn, (Measurable) (config, now) -> adder.sum());
        return mn;
    }

    /**
     * The counters of one peer broker, created on first use, for one connection, which gives them back with
     * {@link Peer#release()} when it closes; those of {@link #UNKNOWN_PEER} while the table is full of peers with a
     * connection open.
     */
    synchronized Peer peer(String id) {
        Peer p = peers.get(id);
        if (p == null) {
            if (!id.equals(UNKNOWN_PEER) && peers.size() - (peers.containsKey(UNKNOWN_PEER) ? 1 : 0) >= MAX_PEERS) {
                Iterator<Peer> oldest = idle.values().iterator();
                if (!oldest.hasNext()) {
                    return peer(UNKNOWN_PEER);
                }
                evict(oldest.next());
            }
            p = new Peer(id);
            peers.put(id, p);
        }
        p.connections++;
        idle.remove(id);
        return p;
    }

    private synchronized void release(Peer p) {
        if (--p.connections == 0 && !p.id.equals(UNKNOWN_PEER)) {
            idle.put(p.id, p);
        }
    }

    private synchronized void evict(Peer p) {
        peers.remove(p.id);
        idle.remove(p.id);
        if (!closed) {
            for (MetricName mn : p.metricNames) {
                metrics.removeMetric(mn);
            }
        }
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
        /** Guarded by the metrics' monitor: connections holding these counters. */
        private int connections;
        /** Empty when the metrics were closed before this peer was seen. */
        private final List<MetricName> metricNames = new ArrayList<>();
        final LongAdder rdmaSent = new LongAdder();
        final LongAdder rdmaReceived = new LongAdder();
        final LongAdder tcpSent = new LongAdder();
        final LongAdder tcpReceived = new LongAdder();
        final LongAdder copiedSent = new LongAdder();
        final LongAdder copiedReceived = new LongAdder();

        Peer(String id) {
            this.id = id;
            Map<String, String> tags = Map.of("peer", id);
            publish("rdma-bytes-sent-total", "Bytes sent to this peer over RDMA", tags, rdmaSent);
            publish("rdma-bytes-received-total", "Bytes received from this peer over RDMA", tags, rdmaReceived);
            publish("tcp-bytes-sent-total", "Bytes sent to this peer over TCP (as a leader on a plain listener: whole "
                    + "responses, sendfile included, counted as they start)", tags, tcpSent);
            publish("tcp-bytes-received-total", "Bytes received from this peer over TCP", tags, tcpReceived);
            publish("rdma-copied-bytes-sent-total", "Bytes the CPU copied into registered memory to send over RDMA",
                    tags, copiedSent);
            publish("rdma-copied-bytes-received-total", "Bytes the CPU copied out of registered memory on receipt",
                    tags, copiedReceived);
        }

        private void publish(String name, String doc, Map<String, String> tags, LongAdder adder) {
            MetricName mn = gauge(name, doc, tags, adder);
            if (mn != null) {
                metricNames.add(mn);
            }
        }

        String id() {
            return id;
        }

        /** Called once by the connection that took these counters, when it closes. */
        void release() {
            ReplicationMetrics.this.release(this);
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
