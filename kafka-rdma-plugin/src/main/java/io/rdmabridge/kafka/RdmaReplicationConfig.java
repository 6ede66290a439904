package io.rdmabridge.kafka;

import java.util.Locale;
import java.util.Map;

/**
 * The plugin's broker configuration, read from {@code server.properties} by {@link RdmaReplicationPlugin}: its own
 * {@code rdma.*} keys (documented in docs/kafka.md) and the Kafka keys that locate the inter-broker listener.
 */
record RdmaReplicationConfig(boolean enabled, String provider, int handshakeTimeoutMs, int sendQueueDepth,
                             int receiveQueueDepth, int maxHandshakes, int brokerId, String interBrokerListener,
                             String interBrokerHost, int interBrokerPort, int rdmaPort) {

    static final String ENABLE = "rdma.replication.enable";
    static final String PROVIDER = "rdma.provider";
    static final String HANDSHAKE_TIMEOUT_MS = "rdma.handshake.timeout.ms";
    static final String SEND_QUEUE_DEPTH = "rdma.send.queue.depth";
    static final String RECEIVE_QUEUE_DEPTH = "rdma.receive.queue.depth";
    static final String MAX_HANDSHAKES = "rdma.handshake.max.in.progress";
    static final String RDMA_PORT = "rdma.port";

    static final int DEFAULT_HANDSHAKE_TIMEOUT_MS = 5000;
    static final int DEFAULT_QUEUE_DEPTH = 64;
    static final int DEFAULT_MAX_HANDSHAKES = 16;

    /**
     * Parses the broker's configuration.
     *
     * @throws IllegalArgumentException naming the key, the value and what is expected
     */
    static RdmaReplicationConfig parse(Map<String, ?> props) {
        boolean enabled = bool(props, ENABLE);
        String provider = string(props, PROVIDER, "auto");
        int timeout = integer(props, HANDSHAKE_TIMEOUT_MS, DEFAULT_HANDSHAKE_TIMEOUT_MS, 1, 600_000);
        int sendDepth = integer(props, SEND_QUEUE_DEPTH, DEFAULT_QUEUE_DEPTH, 1, 16384);
        int receiveDepth = integer(props, RECEIVE_QUEUE_DEPTH, DEFAULT_QUEUE_DEPTH, 1, 16384);
        int maxHandshakes = integer(props, MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES, 1, 4096);
        int rdmaPort = integer(props, RDMA_PORT, 0, 0, 65535);
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
        return new RdmaReplicationConfig(enabled, provider, timeout, sendDepth, receiveDepth, maxHandshakes, brokerId,
                listener, host, port, rdmaPort);
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
