package io.rdmabridge.kafka;

import io.rdmabridge.verbs.ProviderSelection;
import io.rdmabridge.verbs.RdmaProviders;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Process-wide state of RDMA replication, shared by the agent (which installs the NIO provider at JVM start) and the
 * {@link RdmaReplicationPlugin} (which Kafka configures with the broker's properties a little later).
 *
 * <p>Active means: the agent installed its provider, {@code rdma.replication.enable=true}, and the inter-broker
 * listener was found. An active broker with no usable RDMA provider opens no RDMA port and sends no preamble, so its
 * followers' probes find no plugin and every replication connection stays on TCP, with the cause logged once.
 * Thread-safe.
 */
final class RdmaReplication {
    private static final Logger LOG = LoggerFactory.getLogger(RdmaReplication.class);
    private static final RdmaReplication INSTANCE = new RdmaReplication();
    /** How long a leader that answered without RDMA is left alone before the next attempt. */
    static final long PLAIN_PEER_RETRY_MS = TimeUnit.MINUTES.toMillis(5);
    /**
     * How long a leader whose plugin did not answer the probes of one connection, asked again for a while, is left on
     * TCP: it has the plugin, and is busy with handshakes (perhaps a flood of them) or closing, so it is asked again
     * much sooner than one without it.
     */
    static final long REFUSED_PEER_RETRY_MS = TimeUnit.SECONDS.toMillis(30);

    private volatile boolean agentInstalled;
    private volatile String agentProblem;
    private volatile boolean configured;
    private volatile boolean active;
    private volatile String status;
    private volatile RdmaReplicationConfig config;
    /** The broker configuration the plugin was configured with, against which dynamic updates are checked. */
    private volatile Map<String, ?> applied = Map.of();
    private volatile RdmaStreamTransport transport = RdmaStreamTransport.unavailable(-1, "not configured");
    /**
     * {@code null} until first configured; then kept after the plugin closes (its reporter removed from
     * {@code metric.reporters} at runtime, or the broker stopping), so that a connection made just before still
     * counts, into metrics that publish nothing. Read through {@link #metrics()}, never null.
     */
    private volatile ReplicationMetrics metrics;
    private volatile SourceAdmission admission = newAdmission(RdmaReplicationConfig.DEFAULT_MAX_HANDSHAKES);
    private volatile SourceAdmission connections = SourceAdmission.connections(
            RdmaReplicationConfig.DEFAULT_MAX_CONNECTIONS);
    private volatile ScheduledExecutorService scheduler;
    /** What is known of each leader's plugin, by address; as many as the brokers this one has followed. */
    private final Map<InetSocketAddress, LeaderPlugin> leaders = new ConcurrentHashMap<>();
    private int plugins;

    static RdmaReplication get() {
        return INSTANCE;
    }

    // ---- agent ---------------------------------------------------------------------------------------------------

    void agentInstalled() {
        agentInstalled = true;
        agentProblem = null;
    }

    void agentFailed(String why) {
        agentInstalled = false;
        agentProblem = why;
    }

    boolean isAgentInstalled() {
        return agentInstalled;
    }

    // ---- plugin --------------------------------------------------------------------------------------------------

    /**
     * Applies the broker's configuration once (Kafka may build the reporter more than once; later calls only count)
     * and returns the one status line it logged.
     */
    String configure(Map<String, ?> props) {
        return configure(props, null);
    }

    /**
     * As {@link #configure(Map)}; a non-null {@code transport} replaces the one the configuration would open. Counts
     * the plugin only when it returns: a plugin whose configure threw never calls {@link #pluginClosed}.
     */
    synchronized String configure(Map<String, ?> props, RdmaStreamTransport transport) {
        if (configured) {
            plugins++;
            return status;
        }
        for (String key : RdmaReplicationConfig.unknownKeys(props)) {
            // As Kafka's own warning for a key no configuration defines.
            LOG.warn("The configuration '{}' was supplied but isn't a known config of the RDMA replication plugin "
                    + "(known: {})", key, RdmaReplicationConfig.KEYS);
        }
        RdmaReplicationConfig c = RdmaReplicationConfig.parse(props, false);
        config = c;
        applied = new HashMap<>(props);
        configured = true;
        if (!c.enabled()) {
            status = "RDMA replication inactive: " + RdmaReplicationConfig.ENABLE + " is not true; the broker behaves "
                    + "as stock Kafka";
        } else if (controllerOnly(props)) {
            status = "RDMA replication inactive: this process is a KRaft controller only (process.roles="
                    + props.get("process.roles") + "), which replicates no partitions; brokers use the plugin";
        } else if (!agentInstalled) {
            status = "RDMA replication inactive: " + (agentProblem != null
                    ? "the agent could not install its NIO provider: " + agentProblem
                    : "the JVM was started without the agent; add -javaagent:<path to kafka-rdma-plugin.jar> to "
                    + "KAFKA_OPTS");
        } else if (c.brokerId() < 0) {
            // Active, it would send every leader a HELLO that leader rejects, and answer probes for no broker.
            status = "RDMA replication inactive: neither node.id nor broker.id is set to an id of 0 or more (node.id="
                    + Objects.toString(props.get("node.id"), "absent") + ", broker.id="
                    + Objects.toString(props.get("broker.id"), "absent") + "), and other brokers' plugins refuse a "
                    + "preamble without one; set node.id";
        } else if (c.interBrokerPort() <= 0) {
            status = "RDMA replication inactive: inter-broker listener " + c.interBrokerListener() + " has no fixed "
                    + "port in listeners (expected: " + c.interBrokerListener() + "://host:port with port > 0)";
        } else {
            metrics = new ReplicationMetrics();
            admission = newAdmission(c.maxHandshakes());
            connections = SourceAdmission.connections(c.maxConnections());
            ScheduledThreadPoolExecutor timer = new ScheduledThreadPoolExecutor(1, r -> {
                Thread t = Executors.defaultThreadFactory().newThread(r);
                t.setName("rdma-replication-timer");
                t.setDaemon(true);
                return t;
            });
            timer.setRemoveOnCancelPolicy(true);
            scheduler = timer;
            this.transport = transport != null ? transport : openTransport(c);
            active = true;
            RdmaStreamTransport t = this.transport;
            if (t.isAvailable()) {
                status = "RDMA replication active on inter-broker listener " + c.interBrokerListener() + " ("
                        + c.interBrokerHost() + ":" + c.interBrokerPort() + "), broker " + c.brokerId() + ", provider "
                        + t.providerName() + ", RDMA port " + t.listenPort();
            } else {
                status = "RDMA replication enabled but RDMA is unavailable, so replication stays on TCP: "
                        + t.unavailabilityCause();
            }
        }
        if (active && !this.transport.isAvailable()) {
            LOG.warn(status);
        } else {
            LOG.info(status);
        }
        plugins++;
        return status;
    }

    /** Whether {@code process.roles} is set and names no {@code broker} role. */
    private static boolean controllerOnly(Map<String, ?> props) {
        Object roles = props.get("process.roles");
        if (roles == null || roles.toString().isBlank()) {
            return false;
        }
        for (String role : roles.toString().split(",")) {
            if (role.trim().equalsIgnoreCase("broker")) {
                return false;
            }
        }
        return true;
    }

    private static RdmaStreamTransport openTransport(RdmaReplicationConfig c) {
        ProviderSelection selection = RdmaProviders.select(c.provider(), RdmaReplicationConfig.PROVIDER);
        if (!selection.isAvailable()) {
            // The reason names rdma.provider and its value.
            return RdmaStreamTransport.unavailable(c.brokerId(), selection.reason());
        }
        try {
            return RdmaChannelTransport.open(selection.provider(), c.brokerId(), c.interBrokerHost(), c.rdmaPort(),
                    c.handshakeTimeoutMs(), c.sendQueueDepth(), c.receiveQueueDepth(), c.maxHandshakes());
        } catch (IOException | RuntimeException e) {
            return RdmaStreamTransport.unavailable(c.brokerId(), "RDMA provider " + selection.provider().name() + " ("
                    + RdmaReplicationConfig.PROVIDER + "=" + c.provider() + "): " + e.getMessage());
        }
    }

    /** Warns of each key a dynamic update changed, which the plugin does not apply; returns the lines, for tests. */
    List<String> dynamicUpdate(Map<String, ?> updated) {
        List<String> lines = RdmaReplicationConfig.ignoredUpdates(applied, updated);
        lines.forEach(LOG::warn);
        return lines;
    }

    /** Called by each plugin instance's close(); the last one releases everything. */
    synchronized void pluginClosed() {
        // Never below 0: a close without its configure (Kafka closes a reporter whose configure failed) counts none.
        plugins = Math.max(0, plugins - 1);
        if (plugins > 0) {
            return;
        }
        active = false;
        transport.close();
        transport = RdmaStreamTransport.unavailable(config == null ? -1 : config.brokerId(), "closed");
        // Kept, closed: connections that outlive the plugin go on counting into it, unpublished.
        if (metrics != null) {
            metrics.close();
        }
        if (scheduler != null) {
            // Not shutdownNow(): the deadlines already set still fire, so that a handshake in progress when the
            // plugin closes stays bounded by rdma.handshake.timeout.ms; then the timer's thread ends.
            scheduler.shutdown();
            scheduler = null;
        }
        configured = false;
    }

    boolean isActive() {
        return active;
    }

    /** True when no replication connection can be upgraded in this JVM: server sockets need no wrapping. */
    boolean isKnownInactive() {
        return !agentInstalled || (configured && !active);
    }

    String status() {
        return status;
    }

    RdmaReplicationConfig config() {
        return config;
    }

    RdmaStreamTransport transport() {
        return transport;
    }

    /** The plugin's counters; once it has closed, counters that publish nothing. Never null. */
    ReplicationMetrics metrics() {
        ReplicationMetrics m = metrics;
        return m != null ? m : Unconfigured.METRICS;
    }

    /**
     * Counters for connections made before the plugin was first configured. Loaded only then: the agent loads this
     * class at the JVM's start, where Kafka's metrics classes need not be on the class path yet.
     */
    private static final class Unconfigured {
        static final ReplicationMetrics METRICS = ReplicationMetrics.detached();
    }

    /** Places for preambles in progress on the inter-broker listener ({@code rdma.handshake.max.in.progress}). */
    SourceAdmission handshakeAdmission() {
        return admission;
    }

    private static SourceAdmission newAdmission(int max) {
        return SourceAdmission.handshakes(max, "RDMA handshakes in progress");
    }

    /** Places for RDMA connections open on the leader side ({@code rdma.max.connections}), held until they close. */
    SourceAdmission connectionAdmission() {
        return connections;
    }

    /** The handshake timer; {@code null} before the plugin is active and after it has closed. */
    ScheduledExecutorService scheduler() {
        return scheduler;
    }

    int brokerId() {
        return config.brokerId();
    }

    int interBrokerPort() {
        return config == null ? -1 : config.interBrokerPort();
    }

    /** Why a follower connection to {@code leader} should not even try the upgrade, or {@code null}. */
    String followerSkipReason(InetSocketAddress leader) {
        RdmaStreamTransport t = transport;
        if (!t.isAvailable()) {
            return t.unavailabilityCause();
        }
        LeaderPlugin known = leaders.get(leader);
        long until = known == null ? LeaderPlugin.NOT_PLAIN : known.plainUntil.get();
        if (until != LeaderPlugin.NOT_PLAIN) {
            if (System.currentTimeMillis() < until) {
                return "the last RDMA attempt to leader " + leader + " did not upgrade (the line logged then says why)";
            }
            known.plainUntil.compareAndSet(until, LeaderPlugin.NOT_PLAIN);
        }
        return null;
    }

    /**
     * Leaves {@code leader} on TCP for {@code retryMs}, saying why once: at INFO when it is a broker without the
     * plugin (expected in a mixed cluster), at WARN when {@code unexpected} (its plugin answered, then the upgrade
     * broke, or it refused the probes).
     */
    void rememberPlainPeer(InetSocketAddress leader, String reason, boolean unexpected, long retryMs) {
        long previous = known(leader).plainUntil.getAndSet(System.currentTimeMillis() + retryMs);
        if (previous == LeaderPlugin.NOT_PLAIN) {
            String format = "Replication connections to {} stay on TCP (next RDMA attempt in {} s): {}";
            if (unexpected) {
                LOG.warn(format, leader, retryMs / 1000, reason);
            } else {
                LOG.info(format, leader, retryMs / 1000, reason);
            }
        }
    }

    /** Notes that {@code leader}'s plugin answered a probe: a probe it fails later is taken for a busy plugin. */
    void answered(InetSocketAddress leader) {
        known(leader).answered = true;
    }

    /** Whether {@code leader}'s plugin answered a probe since it last failed every probe of one connection. */
    boolean answeredBefore(InetSocketAddress leader) {
        LeaderPlugin known = leaders.get(leader);
        return known != null && known.answered;
    }

    void forgetAnswer(InetSocketAddress leader) {
        LeaderPlugin known = leaders.get(leader);
        if (known != null) {
            known.answered = false;
        }
    }

    /** When {@code leader} is tried over RDMA again ({@link System#currentTimeMillis()}), or {@code null}. */
    Long plainPeerRetryAt(InetSocketAddress leader) {
        LeaderPlugin known = leaders.get(leader);
        long until = known == null ? LeaderPlugin.NOT_PLAIN : known.plainUntil.get();
        return until == LeaderPlugin.NOT_PLAIN ? null : until;
    }

    private LeaderPlugin known(InetSocketAddress leader) {
        return leaders.computeIfAbsent(leader, a -> new LeaderPlugin());
    }

    /** What a follower knows of one leader's plugin. Thread-safe: fetcher threads of one leader share it. */
    private static final class LeaderPlugin {
        /** {@link #plainUntil} when the leader is not left on TCP. */
        static final long NOT_PLAIN = 0;
        /** Until when ({@link System#currentTimeMillis()}) the leader's connections stay on TCP without asking. */
        final AtomicLong plainUntil = new AtomicLong(NOT_PLAIN);
        /** Whether its plugin answered a probe since it last failed every probe of one connection. */
        volatile boolean answered;
    }
}
