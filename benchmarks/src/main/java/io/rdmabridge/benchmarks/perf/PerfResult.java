package io.rdmabridge.benchmarks.perf;

import java.io.PrintStream;
import java.util.List;
import java.util.Locale;

/**
 * One row of an {@code rdma-perf} table: a test at one message size.
 *
 * @param test          {@code send_lat}, {@code send_bw}, {@code write_bw} or {@code read_bw}
 * @param path          what carried it, e.g. {@code verbs/soft}, {@code netty-rdma/soft}, {@code netty-epoll}
 * @param size          message size in bytes
 * @param iterations    measured messages (round trips for latency tests)
 * @param seconds       measured wall time
 * @param gbPerSecond   payload bandwidth in GB/s (10^9 bytes; both directions for latency tests)
 * @param messagesPerSecond messages (round trips) per second
 * @param p50Micros     one-way latency (round trip / 2) percentiles in microseconds; NaN for bandwidth tests
 * @param p99Micros     see {@code p50Micros}
 * @param p999Micros    see {@code p50Micros}
 * @param cpuSecondsPerGb process CPU seconds per GB moved, this process (both ends in loopback mode)
 * @param peerCpuSecondsPerGb the server's CPU seconds per GB when it runs elsewhere; NaN otherwise
 */
public record PerfResult(String test, String path, int size, long iterations, double seconds, double gbPerSecond,
                         double messagesPerSecond, double p50Micros, double p99Micros, double p999Micros,
                         double cpuSecondsPerGb, double peerCpuSecondsPerGb) {

    /** Builds a row from raw measurements; {@code sortedRoundTripNanos} is null for bandwidth tests. */
    static PerfResult of(String test, String path, int size, long iterations, long nanos, long bytes,
                         long[] sortedRoundTripNanos, long cpuNanos, long peerCpuNanos) {
        double seconds = nanos / 1e9;
        double gb = bytes / 1e9;
        double p50 = Double.NaN;
        double p99 = Double.NaN;
        double p999 = Double.NaN;
        if (sortedRoundTripNanos != null && sortedRoundTripNanos.length > 0) {
            p50 = percentile(sortedRoundTripNanos, 0.50) / 2e3;
            p99 = percentile(sortedRoundTripNanos, 0.99) / 2e3;
            p999 = percentile(sortedRoundTripNanos, 0.999) / 2e3;
        }
        return new PerfResult(test, path, size, iterations, seconds, gb / seconds, iterations / seconds, p50, p99,
                p999, cpuNanos / 1e9 / gb, peerCpuNanos < 0 ? Double.NaN : peerCpuNanos / 1e9 / gb);
    }

    private static long percentile(long[] sorted, double p) {
        int index = (int) Math.ceil(p * sorted.length) - 1;
        return sorted[Math.max(0, Math.min(sorted.length - 1, index))];
    }

    /** Prints rows as a perftest-style table. */
    static void print(PrintStream out, String title, List<PerfResult> rows) {
        out.println(title);
        boolean peer = rows.stream().anyMatch(r -> !Double.isNaN(r.peerCpuSecondsPerGb));
        out.println("-".repeat(peer ? 118 : 104));
        out.printf(Locale.ROOT, "%10s %10s %10s %12s %10s %10s %10s %14s%s%n", "#bytes", "#iters", "BW [GB/s]",
                "MsgRate[M/s]", "p50 [us]", "p99 [us]", "p99.9 [us]", "CPU [s/GB]", peer ? "  peer CPU[s/GB]" : "");
        for (PerfResult r : rows) {
            out.printf(Locale.ROOT, "%10d %10d %10.3f %12.4f %10s %10s %10s %14.3f%s%n", r.size, r.iterations,
                    r.gbPerSecond, r.messagesPerSecond / 1e6, micros(r.p50Micros), micros(r.p99Micros),
                    micros(r.p999Micros), r.cpuSecondsPerGb,
                    peer ? String.format(Locale.ROOT, "  %14.3f", r.peerCpuSecondsPerGb) : "");
        }
        out.println("-".repeat(peer ? 118 : 104));
    }

    private static String micros(double v) {
        return Double.isNaN(v) ? "-" : String.format(Locale.ROOT, "%.2f", v);
    }
}
