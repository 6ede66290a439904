package io.rdmabridge.kafka;

import io.rdmabridge.verbs.RdmaProviders;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.TreeSet;

/**
 * The plugin's broker configuration, read from {@code server.properties} by {@link RdmaReplicationPlugin}: its own
 * {@code rdma.*} keys (documented in docs/kafka.md) and the Kafka keys that locate the inter-broker listener and
 * name its security protocol.
 *
 * <p>A broker's RDMA port is its inter-broker listener's port plus {@code rdma.port.offset}. It is derived rather than
 * set per broker because a follower must know its leader's RDMA port before it sends the leader anything: it looks
 * for the leader's plugin there (see {@link RdmaStreamTransport#probe}), and a leader without one (stock Kafka) never
 * sees a byte it cannot parse. The port is fixed across restarts (firewalls can allow it), and brokers sharing a host
 * get distinct ones.
 */
record RdmaReplicationConfig(boolean enabled, String provider, int handshakeTimeoutMs, int sendQueueDepth,
                             int receiveQueueDepth, int maxHandshakes, int maxConnections, int brokerId,
                             String interBrokerListener,
                             String interBrokerHost, int interBrokerPort, int rdmaPortOffset,
                             boolean interBrokerTls) {

    static final String ENABLE = "rdma.replication.enable";
    static final String PROVIDER = "rdma.provider";
    static final String HANDSHAKE_TIMEOUT_MS = "rdma.handshake.timeout.ms";
    static final String SEND_QUEUE_DEPTH = "rdma.send.queue.depth";
    static final String RECEIVE_QUEUE_DEPTH = "rdma.receive.queue.depth";
    static final String MAX_HANDSHAKES = "rdma.handshake.max.in.progress";
    static final String MAX_CONNECTIONS = "rdma.max.connections";
    static final String RDMA_PORT_OFFSET = "rdma.port.offset";
    /** The key that set an absolute, per-broker RDMA port before followers had to find it on their own. */
    static final String REMOVED_RDMA_PORT = "rdma.port";
    /** Every key the plugin reads, sorted; others under {@code rdma.} are misspellings, warned about as Kafka does. */
    static final Set<String> KEYS = Collections.unmodifiableSortedSet(new TreeSet<>(List.of(ENABLE, PROVIDER,
            HANDSHAKE_TIMEOUT_MS, SEND_QUEUE_DEPTH, RECEIVE_QUEUE_DEPTH, MAX_HANDSHAKES, MAX_CONNECTIONS,
            RDMA_PORT_OFFSET)));

    static final int DEFAULT_HANDSHAKE_TIMEOUT_MS = 5000;
    static final int DEFAULT_QUEUE_DEPTH = 64;
    static final int DEFAULT_MAX_HANDSHAKES = 16;
    /** Leader side: 128 connections of about 4.5 MiB of registered memory each (at the default queue depths). */
    static final int DEFAULT_MAX_CONNECTIONS = 128;
    /** Kafka's default listener port 9092 puts the RDMA port at 10092. */
    static final int DEFAULT_RDMA_PORT_OFFSET = 1000;

    /**
     * Parses the broker's configuration.
     *
     * @throws IllegalArgumentException naming the key, the value and what is expected
     */
    static RdmaReplicationConfig parse(Map<String, ?> props) {
        return parse(props, true);
    }

    /**
     * As {@link #parse(Map)}, except that with {@code rdma.replication.enable} not true nothing else is read unless
     * {@code strict}: a broker with the plugin switched off starts as stock Kafka whatever its other keys say.
     */
    static RdmaReplicationConfig parse(Map<String, ?> props, boolean strict) {
        if (!strict && !bool(props, ENABLE)) {
            return new RdmaReplicationConfig(false, "auto", DEFAULT_HANDSHAKE_TIMEOUT_MS, DEFAULT_QUEUE_DEPTH,
                    DEFAULT_QUEUE_DEPTH, DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_CONNECTIONS, -1, "PLAINTEXT", null, -1,
                    DEFAULT_RDMA_PORT_OFFSET, false);
        }
        boolean enabled = bool(props, ENABLE);
        // Not checked here: a provider that is unknown or unusable leaves the broker on TCP with a WARN naming it.
        String provider = string(props, PROVIDER, RdmaProviders.AUTO);
        int timeout = integer(props, HANDSHAKE_TIMEOUT_MS, DEFAULT_HANDSHAKE_TIMEOUT_MS, 1, 600_000);
        int sendDepth = integer(props, SEND_QUEUE_DEPTH, DEFAULT_QUEUE_DEPTH, 1, 16384);
        int receiveDepth = integer(props, RECEIVE_QUEUE_DEPTH, DEFAULT_QUEUE_DEPTH, 1, 16384);
        int maxHandshakes = integer(props, MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES, 1, 4096);
        int maxConnections = integer(props, MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS, 1, 65536);
        if (props.get(REMOVED_RDMA_PORT) != null) {
            throw new IllegalArgumentException(REMOVED_RDMA_PORT + ": " + props.get(REMOVED_RDMA_PORT) + " (no longer "
                    + "read: a broker's RDMA port is its inter-broker listener's port + " + RDMA_PORT_OFFSET + ", "
                    + "default " + DEFAULT_RDMA_PORT_OFFSET + ", the same on every broker; remove " + REMOVED_RDMA_PORT
                    + ")");
        }
        int offset = integer(props, RDMA_PORT_OFFSET, DEFAULT_RDMA_PORT_OFFSET, -65534, 65534);
        if (offset == 0) {
            throw new IllegalArgumentException(RDMA_PORT_OFFSET + ": 0 (expected: non-zero; the RDMA port cannot be "
                    + "the inter-broker listener's own port)");
        }
        String idText = string(props, "node.id", string(props, "broker.id", "-1"));
        int brokerId;
        try {
            brokerId = Integer.parseInt(idText.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("node.id: " + idText + " (expected: an integer)");
        }
        String listener = string(props, "inter.broker.listener.name", null);
        if (listener == null) {
            listener = string(props, "security.inter.broker.protocol", "PLAINTEXT");
        }
        listener = listener.trim().toUpperCase(Locale.ROOT);
        String host = null;
        int port = -1;
        for (String entry : string(props, "listeners", "").split(",")) {
            String e = entry.trim();
            int sep = e.indexOf("://");
            if (sep < 0 || !e.substring(0, sep).trim().toUpperCase(Locale.ROOT).equals(listener)) {
                continue;
            }
            String hostPort = e.substring(sep + 3);
            int colon = hostPort.lastIndexOf(':');
            if (colon < 0) {
                throw new IllegalArgumentException("listeners: " + e + " (expected: NAME://host:port)");
            }
            host = hostPort.substring(0, colon).replace("[", "").replace("]", "");
            try {
                port = Integer.parseInt(hostPort.substring(colon + 1));
            } catch (NumberFormatException ex) {
                throw new IllegalArgumentException("listeners: " + e + " (expected: NAME://host:port)");
            }
        }
        if (port > 0 && !validPort(port + offset)) {
            throw new IllegalArgumentException(RDMA_PORT_OFFSET + ": " + offset + " puts the RDMA port of listener "
                    + listener + " (port " + port + ") at " + (port + offset) + " (expected: 1..65535)");
        }
        String protocol = listener;
        for (String entry : string(props, "listener.security.protocol.map", "").split(",")) {
            int colon = entry.indexOf(':');
            if (colon > 0 && entry.substring(0, colon).trim().toUpperCase(Locale.ROOT).equals(listener)) {
                protocol = entry.substring(colon + 1).trim().toUpperCase(Locale.ROOT);
            }
        }
        boolean tls = protocol.equals("SSL") || protocol.equals("SASL_SSL");
        return new RdmaReplicationConfig(enabled, provider, timeout, sendDepth, receiveDepth, maxHandshakes,
                maxConnections, brokerId, listener, host, port, offset, tls);
    }

    /**
     * The keys of {@code props} under {@code rdma.} that the plugin does not read, sorted: most likely misspelled
     * ({@code rdma.replication.enabled}), and silently ignored otherwise, since Kafka passes unknown keys on.
     */
    static List<String> unknownKeys(Map<String, ?> props) {
        List<String> unknown = new ArrayList<>();
        for (String key : props.keySet()) {
            if (key.startsWith("rdma.") && !KEYS.contains(key) && !key.equals(REMOVED_RDMA_PORT)) {
                unknown.add(key);
            }
        }
        Collections.sort(unknown);
        return unknown;
    }

    /**
     * What a dynamic update ({@code kafka-configs --alter}) changes among the keys the plugin reads: one line per key,
     * saying that the change is not applied and what to do instead. The plugin applies its configuration when the
     * broker starts, so such a change is stored and shown by {@code --describe} without taking effect. It is not
     * refused: a refusal would also make Kafka drop every other key of the update, and of each update after it, when
     * the value came in some other way (written by a broker without the plugin, or through a controller).
     *
     * @param applied the broker's configuration the plugin was started with
     */
    static List<String> ignoredUpdates(Map<String, ?> applied, Map<String, ?> updated) {
        List<String> lines = new ArrayList<>();
        for (String key : KEYS) {
            String before = applied.get(key) == null ? null : applied.get(key).toString().trim();
            String after = updated.get(key) == null ? null : updated.get(key).toString().trim();
            if (!Objects.equals(before, after)) {
                lines.add(key + " was updated dynamically to " + after + ", which the RDMA replication plugin does not"
                        + " apply: it reads " + key + " when the broker starts and goes on with " + before + "; set it"
                        + " in the broker's server.properties and restart the broker, and remove the dynamic value"
                        + " (kafka-configs --alter --delete-config " + key + ")");
            }
        }
        return lines;
    }

    /** This broker's RDMA listen port: its inter-broker listener's port + {@code rdma.port.offset}. */
    int rdmaPort() {
        return interBrokerPort + rdmaPortOffset;
    }

    /** Where a leader whose inter-broker listener is {@code leader} listens for RDMA, or -1 outside 1..65535. */
    int rdmaPortOf(InetSocketAddress leader) {
        int p = leader.getPort() + rdmaPortOffset;
        return validPort(p) ? p : -1;
    }

    private static boolean validPort(int p) {
        return p >= 1 && p <= 65535;
    }

    private static String string(Map<String, ?> props, String key, String dflt) {
        Object v = props.get(key);
        return v == null ? dflt : v.toString();
    }

    private static boolean bool(Map<String, ?> props, String key) {
        Object v = props.get(key);
        if (v == null) {
            return false;
        }
        String s = v.toString().trim();
        if (s.equalsIgnoreCase("true")) {
            return true;
        }
        if (s.equalsIgnoreCase("false")) {
            return false;
        }
        throw new IllegalArgumentException(key + ": " + s + " (expected: true or false)");
    }

    private static int integer(Map<String, ?> props, String key, int dflt, int min, int max) {
        Object v = props.get(key);
        if (v == null) {
            return dflt;
        }
        int n;
        try {
            n = Integer.parseInt(v.toString().trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(key + ": " + v + " (expected: an integer in " + min + ".." + max + ")");
        }
        if (n < min || n > max) {
            throw new IllegalArgumentException(key + ": " + n + " (expected: " + min + ".." + max + ")");
        }
        return n;
    }
}
