package io.rdmabridge.kafka;

import io.rdmabridge.verbs.SourceShares;
import java.net.InetAddress;

/**
 * Places under one of the plugin's caps, shared by source address: at most {@code max} held at a time, and at most half
 * of them (at least one) from one source address. It bounds the handshakes in progress
 * ({@code rdma.handshake.max.in.progress}, on the inter-broker listener and on the RDMA port) and the upgraded
 * connections open ({@code rdma.max.connections}). The upgrade comes before Kafka authenticates anything, so anyone who
 * reaches the inter-broker or the RDMA port can take a place, for the handshake timeout or for as long as the
 * connection it upgraded stays open; the share per address keeps one host that holds places from refusing every other
 * broker's upgrades. A flood from many addresses, like a host with many brokers, needs the key raised or the port
 * allowed only to the brokers' hosts ({@link SourceShares} counts, and says how).
 *
 * <p>Thread-safe.
 */
final class SourceAdmission {
    private final SourceShares shares;
    private final String key;
    private final String what;
    private final String shareFix;
    private final String totalFix;

    /**
     * @param max      the key's value
     * @param key      the configuration key that sets {@code max}, named in the reasons
     * @param what     what the places are for, in the reasons ("RDMA handshakes in progress", say)
     * @param shareFix when to raise the key, in the reason of a refusal by an address's share ("raise it if ...")
     * @param totalFix when to raise the key, in the reason of a refusal by the total ("raise it if ...")
     */
    private SourceAdmission(int max, String key, String what, String shareFix, String totalFix) {
        if (max < 1) {
            throw new IllegalArgumentException(key + ": " + max + " (expected: 1 or more)");
        }
        this.shares = new SourceShares(max);
        this.key = key;
        this.what = what;
        this.shareFix = shareFix;
        this.totalFix = totalFix;
    }

    /** Places for handshakes in progress, under {@code rdma.handshake.max.in.progress}. */
    static SourceAdmission handshakes(int max, String what) {
        return new SourceAdmission(max, RdmaReplicationConfig.MAX_HANDSHAKES, what,
                "raise it if that host runs many brokers", "raise it if this many brokers reconnect at once");
    }

    /** Places for upgraded connections open on the leader side, under {@code rdma.max.connections}. */
    static SourceAdmission connections(int max) {
        return new SourceAdmission(max, RdmaReplicationConfig.MAX_CONNECTIONS, "RDMA connections open",
                "raise it to at least twice num.replica.fetchers times the brokers on that host",
                "raise it if this broker has that many follower connections");
    }

    /**
     * Takes a place for {@code source}.
     *
     * @return {@code null} when it took one, to be given back with {@link #release}; otherwise why not, naming the key
     */
    String admit(InetAddress source) {
        SourceShares.Refusal refusal = shares.admit(source);
        if (refusal == null) {
            return null;
        }
        int share = shares.maxPerSource();
        int max = shares.max();
        return refusal == SourceShares.Refusal.SHARE
                ? "more than " + share + " " + what + " from " + SourceShares.describe(source)
                        + " (one address may hold " + share + " of " + key + "=" + max + "; " + shareFix
                        + ", or allow only the brokers' hosts to reach the port)"
                : "more than " + max + " " + what + " (" + key + "; " + totalFix + ", or allow only the brokers' "
                        + "hosts to reach the port)";
    }

    /** Gives back a place {@link #admit} took for {@code source}. */
    void release(InetAddress source) {
        shares.release(source);
    }

    /** Places held now. */
    int held() {
        return shares.held();
    }
}
