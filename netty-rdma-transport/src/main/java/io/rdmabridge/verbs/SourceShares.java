package io.rdmabridge.verbs;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Places under a cap that peers take by connecting (handshakes in progress, connections open), shared by source
 * address: at most {@code max} held at a time, and at most half of them (at least one) by one source address, so that
 * one host that holds places cannot refuse every other peer. Addresses count one by one, so a host with many addresses
 * (an IPv6 host may use any of its /64) takes a share with each; only a cap raised, or a port that only the expected
 * hosts reach, stops a flood from many. Peers whose address is not known share one share.
 *
 * <p>Thread-safe. A place costs one map entry per address that holds any, gone with its last place.
 */
public final class SourceShares {
    /** Where a peer whose address is not known counts. */
    public static final InetAddress UNKNOWN_SOURCE = new InetSocketAddress(0).getAddress();

    /** Why {@link #admit} took no place. */
    public enum Refusal {
        /** The source address holds {@link #maxPerSource()} places already. */
        SHARE,
        /** {@link #max()} places are held already. */
        TOTAL
    }

    private final int max;
    private final int maxPerSource;
    private final AtomicInteger held = new AtomicInteger();
    /** Places held by source address; an address leaves the map with its last place. */
    private final Map<InetAddress, Integer> bySource = new ConcurrentHashMap<>();

    /**
     * @param max the cap, 1 or more (callers check it first, naming their setting)
     */
    public SourceShares(int max) {
        if (max < 1) {
            throw new IllegalArgumentException("max: " + max + " (expected: 1 or more)");
        }
        this.max = max;
        this.maxPerSource = Math.max(1, max / 2);
    }

    /** The source address of a peer at {@code remote}, or {@link #UNKNOWN_SOURCE}. */
    public static InetAddress sourceOf(SocketAddress remote) {
        return remote instanceof InetSocketAddress a && a.getAddress() != null ? a.getAddress() : UNKNOWN_SOURCE;
    }

    /** {@code source} for a refusal's reason: its address, or what {@link #UNKNOWN_SOURCE} stands for. */
    public static String describe(InetAddress source) {
        return source.equals(UNKNOWN_SOURCE) ? "peers whose address is not known" : source.getHostAddress();
    }

    /**
     * Takes a place for {@code source}.
     *
     * @return {@code null} when it took one, to be given back with {@link #release}; otherwise why not
     */
    public Refusal admit(InetAddress source) {
        // The address's share first: a host at its share must not take, even for a moment, a place of the total.
        if (bySource.merge(source, 1, Integer::sum) > maxPerSource) {
            leave(source);
            return Refusal.SHARE;
        }
        if (held.incrementAndGet() > max) {
            held.decrementAndGet();
            leave(source);
            return Refusal.TOTAL;
        }
        return null;
    }

    /**
     * Gives back a place {@link #admit} took for {@code source}.
     *
     * @throws IllegalStateException when {@code source} holds no place: a release without its admission, which would
     *                               otherwise give away a place that others hold
     */
    public void release(InetAddress source) {
        if (!leave(source)) {
            throw new IllegalStateException("no place held by " + source + " to release: a release without its admit");
        }
        held.decrementAndGet();
    }

    /** Drops one of {@code source}'s places from its count; {@code false} when it held none. */
    private boolean leave(InetAddress source) {
        boolean[] found = new boolean[1];
        bySource.computeIfPresent(source, (a, n) -> {
            found[0] = true;
            return n == 1 ? null : n - 1;
        });
        return found[0];
    }

    /** Places held now. */
    public int held() {
        return held.get();
    }

    /** The cap. */
    public int max() {
        return max;
    }

    /** The places one source address may hold: half of {@link #max()}, at least one. */
    public int maxPerSource() {
        return maxPerSource;
    }
}
