package io.rdmabridge.kafka;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Places for handshakes in progress ({@code rdma.handshake.max.in.progress}): at most {@code max} at a time, and at
 * most half of them (at least one) held from one source address. Anyone who reaches the inter-broker or the RDMA port
 * can take a place until the handshake timeout, before anything proves it a broker; the share per address keeps one
 * host that holds places from refusing every other broker's handshakes. Addresses count one by one, so a host with
 * many addresses (an IPv6 host may use any of its /64) takes a share with each: a flood from many addresses, like a
 * host with many brokers, needs the key raised or the port allowed only to the brokers' hosts. Connections whose
 * address is not known share one share.
 *
 * <p>Thread-safe.
 */
final class HandshakeAdmission {
    /** Where a caller that knows no source address counts. */
    static final InetAddress UNKNOWN_SOURCE = new InetSocketAddress(0).getAddress();

    private final int max;
    private final int maxPerSource;
    private final String what;
    private final AtomicInteger inProgress = new AtomicInteger();
    /** Places held by source address; an address leaves the map with its last place. */
    private final Map<InetAddress, Integer> bySource = new ConcurrentHashMap<>();

    /**
     * @param max  the key's value
     * @param what what a place is for, in the reasons ("RDMA handshakes", say)
     */
    HandshakeAdmission(int max, String what) {
        if (max < 1) {
            throw new IllegalArgumentException(RdmaReplicationConfig.MAX_HANDSHAKES + ": " + max
                    + " (expected: 1 or more)");
        }
        this.max = max;
        this.maxPerSource = Math.max(1, max / 2);
        this.what = what;
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
            return "more than " + maxPerSource + " " + what + " in progress from " + source.getHostAddress()
                    + " (one address may hold " + maxPerSource + " of " + RdmaReplicationConfig.MAX_HANDSHAKES + "="
                    + max + "; raise it if that host runs many brokers, or allow only the brokers' hosts to reach the "
                    + "port)";
        }
        if (inProgress.incrementAndGet() > max) {
            inProgress.decrementAndGet();
            leave(source);
            return "more than " + max + " " + what + " in progress (" + RdmaReplicationConfig.MAX_HANDSHAKES
                    + "; raise it if this many brokers reconnect at once, or allow only the brokers' hosts to reach the "
                    + "port)";
        }
        return null;
    }

    /** Gives back a place {@link #admit} took for {@code source}. */
    void release(InetAddress source) {
        leave(source);
        inProgress.decrementAndGet();
    }

    private void leave(InetAddress source) {
        bySource.computeIfPresent(source, (a, n) -> n == 1 ? null : n - 1);
    }

    /** Places held now. */
    int inProgress() {
        return inProgress.get();
    }
}
