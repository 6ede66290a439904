package io.rdmabridge.spark;

import com.codahale.metrics.Counter;
import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import java.util.function.LongSupplier;
import org.apache.spark.metrics.source.Source;

/**
 * Counters of the RDMA shuffle in one JVM, published as the Spark metrics source {@code rdmaShuffle} (so every
 * configured sink sees them) and reported to the driver after each reduce task. Thread-safe.
 */
final class RdmaShuffleMetrics implements Source {
    private final MetricRegistry registry = new MetricRegistry();

    /** Bytes of remote shuffle blocks received over the block transport. */
    final Counter bytesFetched = registry.counter("bytesFetched");
    final Counter blocksFetched = registry.counter("blocksFetched");
    /** Sum over fetched blocks of the time from request to arrival. */
    final Counter fetchWaitNanos = registry.counter("fetchWaitNanos");
    final Counter fetchFailures = registry.counter("fetchFailures");
    /** Remote blocks fetched through Spark's own transport because this executor or the peer has no block server. */
    final Counter blocksFetchedByFallback = registry.counter("blocksFetchedByFallback");
    /** 1 when this executor could not start its block transport and runs on Spark's transport. */
    final Counter transportFallbacks = registry.counter("transportFallbacks");
    final Counter bytesServed = registry.counter("bytesServed");
    final Counter blocksServed = registry.counter("blocksServed");
    /**
     * Connections closed because the peer failed the secret challenge (a server's count) or the server's proof (a
     * client's), or the two sides disagree on {@code spark.authenticate}.
     */
    final Counter authFailures = registry.counter("authFailures");
    /** Connections a block server refused at once: it had {@code maxConnections} open, or the address its share. */
    final Counter connectionsRefused = registry.counter("connectionsRefused");
    /** Block server connections closed by {@code authTimeout}, {@code idleTimeout} or {@code writeTimeout}. */
    final Counter connectionsTimedOut = registry.counter("connectionsTimedOut");

    /**
     * Publishes the transport's copy counters as gauges {@code bytesCopiedOnSend} (bytes this executor wrote that the
     * CPU first copied into registered memory) and {@code bytesCopiedOnReceive} (bytes it received and copied out of
     * a receive buffer). Everything else crossed without a CPU copy. Called once, when the transport starts.
     */
    void watchCopies(LongSupplier onSend, LongSupplier onReceive) {
        registry.register("bytesCopiedOnSend", (Gauge<Long>) onSend::getAsLong);
        registry.register("bytesCopiedOnReceive", (Gauge<Long>) onReceive::getAsLong);
    }

    /**
     * Publishes gauge {@code sameHostConnections}: the connections of this executor's provider that took the soft
     * provider's same-host path (shared memory) rather than its TCP link or a device. Called once, when the transport
     * starts.
     */
    void watchPath(LongSupplier sameHostConnections) {
        registry.register("sameHostConnections", (Gauge<Long>) sameHostConnections::getAsLong);
    }

    @Override
    public String sourceName() {
        return "rdmaShuffle";
    }

    @Override
    public MetricRegistry metricRegistry() {
        return registry;
    }

    /** The counters as {@code name=value} pairs separated by spaces, for the driver's report. */
    String snapshot() {
        StringBuilder sb = new StringBuilder();
        registry.getCounters().forEach((name, c) -> sb.append(sb.length() == 0 ? "" : " ").append(name).append('=')
                .append(c.getCount()));
        registry.getGauges().forEach((name, g) -> sb.append(sb.length() == 0 ? "" : " ").append(name).append('=')
                .append(g.getValue()));
        return sb.toString();
    }
}
