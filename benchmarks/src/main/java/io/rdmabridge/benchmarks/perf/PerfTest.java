package io.rdmabridge.benchmarks.perf;

import java.util.Locale;

/** The perftest patterns {@code rdma-perf} runs. */
enum PerfTest {
    /** SEND/RECV ping-pong: latency. */
    SEND_LAT,
    /** A stream of SENDs into pre-posted receives, flow-controlled by credits: bandwidth. */
    SEND_BW,
    /** One-sided RDMA WRITEs into the peer's registered buffer: bandwidth. */
    WRITE_BW,
    /** One-sided RDMA READs from the peer's registered buffer: bandwidth. */
    READ_BW;

    static PerfTest of(String name) {
        try {
            return valueOf(name.trim().toUpperCase(Locale.ROOT));
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException("test: " + name + " (expected: send_lat, send_bw, write_bw or read_bw)");
        }
    }

    String id() {
        return name().toLowerCase(Locale.ROOT);
    }

    boolean isLatency() {
        return this == SEND_LAT;
    }

    /** Whether the pattern is one-sided (RDMA WRITE/READ), which only the verbs API has. */
    boolean isOneSided() {
        return this == WRITE_BW || this == READ_BW;
    }
}
