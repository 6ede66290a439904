package io.rdmabridge.kafka;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Places under one of the plugin's caps, shared by source address: at most {@code max} held at a time, and at most half
 * of them (at least one) from one source address. It bounds the handshakes in progress
 * ({@code rdma.handshake.max.in.progress}, on the inter-broker listener and on the RDMA port) and the upgraded
 * connections open ({@code rdma.max.connections}). The upgrade comes before Kafka authenticates anything, so anyone who
 * reaches the inter-broker or the RDMA port can take a place, for the handshake timeout or for as long as the
 * connection it upgraded stays open; the share per address keeps one host that holds places from refusing every other
 * broker's upgrades. Addresses count one by one, so a host with many addresses (an IPv6 host may use any of its /64)
 * takes a share with each: a flood from many addresses, like a host with many brokers, needs the key raised or the
 * port allowed only to the brokers' hosts. Connections whose address is not known share one share.
 *
 * <p>Thread-safe.
 */
final class SourceAdmission {
    /** Where a caller that knows no source address counts. */
    static final InetAddress UNKNOWN_SOURCE = new InetSocketAddress(0).getAddress();

    private final int max;
    private final int maxPerSource;
    private final String key;
    private final String what;
    private final String totalFix;
    private final AtomicInteger held = new AtomicInteger();
    /** Places held by source address; an address leaves the map with its last place. */
    private final Map<InetAddress, Integer> bySource = new ConcurrentHashMap<>();

    /**
     * @param max      the key's value
     * @param key      the configuration key that sets {@code max}, named in the reasons
     * @param what     what the places are for, in the reasons ("RDMA handshakes in progress", say)
     * @param totalFix when to raise the key, in the reason of a refusal by the total ("raise it if ...")
     */
    SourceAdmission(int max, String key, String what, String totalFix) {
        if (max < 1) {
            throw new IllegalArgumentException(key + ": " + max + " (expected: 1 or more)");
        }
        this.max = max;
        this.maxPerSource = Math.max(1, max / 2);
        this.key = key;
        this.what = what;
        this.totalFix = totalFix;
    }

    /** Places for handshakes in progress, under {@code rdma.handshake.max.in.progress}. */
    static SourceAdmission handshakes(int max, String what) {
        return new SourceAdmission(max, RdmaReplicationConfig.MAX_HANDSHAKES, what,
                "raise it if this many brokers reconnect at once");
    }

    /**
     * Takes a place for {@code source}.
     *
     * @return {@code null} when it took one, to be given back with {@link #release}; otherwise why not, naming the key
     */
    String admit(InetAddress source) {
        // The address's share first: a host at its share must not take, even for a moment, a place of the total.
        if (bySource.merge(source, 1, Integer::sum) > maxPerSource) {
            leave(source);
            return "more than " + maxPerSource + " " + what + " from " + source.getHostAddress() + " (one address may "
                    + "hold " + maxPerSource + " of " + key + "=" + max + "; raise it if that host runs many brokers, or "
                    + "allow only the brokers' hosts to reach the port)";
        }
        if (held.incrementAndGet() > max) {
            held.decrementAndGet();
            leave(source);
            return "more than " + max + " " + what + " (" + key + "; " + totalFix + ", or allow only the brokers' "
                    + "hosts to reach the port)";
        }
        return null;
    }

    /** Gives back a place {@link #admit} took for {@code source}. */
    void release(InetAddress source) {
        leave(source);
        held.decrementAndGet();
    }

    private void leave(InetAddress source) {
        bySource.computeIfPresent(source, (a, n) -> n == 1 ? null : n - 1);
    }

    /** Places held now. */
    int held() {
        return held.get();
    }
}
