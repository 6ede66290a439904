package io.rdmabridge.benchmarks.report;

import io.rdmabridge.benchmarks.RdmaTuning;
import io.rdmabridge.benchmarks.Transport;
import io.rdmabridge.benchmarks.grpc.GrpcStreamingBenchmark;
import io.rdmabridge.benchmarks.grpc.GrpcStreamingBenchmark.Config;
import io.rdmabridge.benchmarks.grpc.GrpcStreamingBenchmark.Trial;

import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.nio.file.Path;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.function.ToDoubleFunction;

/**
 * The "gRPC streaming" section of the results page: {@link GrpcStreamingBenchmark} (client streaming across
 * processes, RDMA vs NIO), each round's RDMA / NIO ratios and their median and range. Sizes: 256 MiB timed per trial,
 * 3 rounds ({@code -Dbenchmarks.grpc.mib}, {@code -Dbenchmarks.grpc.rounds}); smoke mode 16 MiB, 1 round.
 */
final class GrpcSection {
    static final String TITLE = "## gRPC streaming across processes: RDMA vs NIO";

    private GrpcSection() {
    }

    /** Runs the benchmark and returns the section's markdown; {@code commands} gets how to rerun it. */
    static String measure(boolean smoke, List<String> commands) throws Exception {
        long mib = Long.getLong("benchmarks.grpc.mib", smoke ? 16 : 256);
        int rounds = Integer.getInteger("benchmarks.grpc.rounds", smoke ? 1 : 3);
        Config config = new Config(mib << 20, mib << 20, 1 << 20, rounds, true);
        commands.add("bin/run-benchmarks --grpc" + (smoke ? " --smoke" : "") + "   # or: java -cp ..."
                + " io.rdmabridge.benchmarks.grpc.GrpcStreamingBenchmark " + mib + " " + rounds);
        double loadBefore = load();
        Instant start = Instant.now();
        List<Trial> trials = GrpcStreamingBenchmark.run(config);
        return section(config, trials, start, loadBefore, load());
    }

    /** The soft provider's path between the two processes, as {@code rdmabridge.soft.sameHost} chose it. */
    private static String softPath() {
        return "tcp".equalsIgnoreCase(System.getProperty(RdmaTuning.SAME_HOST, "shm").trim())
                ? "queue pairs over its TCP link between the processes, `rdmabridge.soft.sameHost=tcp`"
                : "its same-host path between the processes: frames through shared-memory rings, the default";
    }

    static String section(Config config, List<Trial> trials, Instant start, double loadBefore, double loadAfter) {
        StringBuilder md = new StringBuilder(TITLE).append("\n\n");
        md.append(String.format(Locale.ROOT, "Measured on %s on %d cores shared with other work (load average %.1f"
                + " before, %.1f after), so absolute rates move between runs: read the ratios. One gRPC"
                + " client-streaming call of %d MiB in %d KiB messages per trial, after an untimed %d MiB call on the"
                + " same connection; the server is a child JVM on loopback, client and server each on one event loop with gRPC's direct"
                + " executor. RDMA = `RdmaSocketChannel` on the soft provider (%s), twice: with `REGISTERED_ALLOCATOR`"
                + " at both ends (gRPC's buffers in registered memory, sent by reference) and without it (gRPC's own"
                + " buffers, which the channel copies into registered memory; their writes complete once the copy"
                + " is posted, the channel's default); NIO = Netty's `NioSocketChannel`. They"
                + " alternate, the order swapping every round. CPU = process CPU time (all threads) per GiB streamed;"
                + " copied/byte = CPU-copied bytes of the client's RDMA channel per byte streamed"
                + " (`RdmaChannelMetrics`). \"without engine\" leaves out the soft provider's engine thread, which"
                + " does in software what a NIC does in hardware (moving frames between the queue pairs, completions);"
                + " the copy into the ring, done by the posting thread, stays counted. The untimed call is as long as"
                + " the timed one, so that the JIT compiles both paths before the clock starts.%n%n", start.truncatedTo(ChronoUnit.SECONDS),
                Runtime.getRuntime().availableProcessors(), loadBefore, loadAfter,
                config.bytes() >> 20, config.messageBytes() >> 10, config.warmupBytes() >> 20, softPath()));
        md.append("| round | transport | MiB/s | client CPU s/GiB | server CPU s/GiB | client, without engine"
                + " | server, without engine | copied/byte |\n|---:|---|---:|---:|---:|---:|---:|---:|\n");
        for (Trial t : trials) {
            md.append(String.format(Locale.ROOT, "| %d | %s | %.1f | %.2f | %.2f | %.2f | %.2f | %s |%n",
                    t.round(), t.label(), t.mibPerSecond(), t.clientCpuSecondsPerGib(),
                    t.serverCpuSecondsPerGib(), t.clientHostCpuSecondsPerGib(), t.serverHostCpuSecondsPerGib(),
                    Double.isNaN(t.copiedPerByte()) ? "-" : String.format(Locale.ROOT, "%.4f", t.copiedPerByte())));
        }
        for (boolean registered : new boolean[] {true, false}) {
            List<Trial[]> pairs = pairs(trials, registered);
            if (pairs.isEmpty()) {
                continue;
            }
            md.append("\n| RDMA (").append(registered ? "registered allocator" : "gRPC's allocator")
                    .append(") / NIO, same round | median | range |\n|---|---:|---:|\n");
            ratioRow(md, "throughput (MiB/s)", pairs, Trial::mibPerSecond);
            ratioRow(md, "client CPU per GiB", pairs, Trial::clientCpuSecondsPerGib);
            ratioRow(md, "server CPU per GiB", pairs, Trial::serverCpuSecondsPerGib);
            ratioRow(md, "client CPU per GiB, without the soft engine thread", pairs,
                    Trial::clientHostCpuSecondsPerGib);
            ratioRow(md, "server CPU per GiB, without the soft engine thread", pairs,
                    Trial::serverHostCpuSecondsPerGib);
        }
        return md.append("\n").toString();
    }

    /** Puts a fresh section into {@code results} in place of the old one. */
    static void splice(Path results, String section) throws IOException {
        PageSections.splice(results, TITLE, section);
    }

    private static List<Trial[]> pairs(List<Trial> trials, boolean registered) {
        List<Trial[]> pairs = new ArrayList<>();
        for (Trial r : trials) {
            if (r.transport() != Transport.RDMA || r.registered() != registered) {
                continue;
            }
            for (Trial n : trials) {
                if (n.transport() == Transport.NIO && n.round() == r.round()) {
                    pairs.add(new Trial[] {r, n});
                }
            }
        }
        return pairs;
    }

    private static void ratioRow(StringBuilder md, String what, List<Trial[]> pairs, ToDoubleFunction<Trial> f) {
        double[] ratios = new double[pairs.size()];
        for (int i = 0; i < ratios.length; i++) {
            ratios[i] = f.applyAsDouble(pairs.get(i)[0]) / f.applyAsDouble(pairs.get(i)[1]);
        }
        double min = Double.POSITIVE_INFINITY;
        double max = Double.NEGATIVE_INFINITY;
        for (double r : ratios) {
            min = Math.min(min, r);
            max = Math.max(max, r);
        }
        md.append(String.format(Locale.ROOT, "| %s | %.2fx | %.2f–%.2f |%n", what,
                ratios.length == 0 ? Double.NaN : GrpcStreamingBenchmark.median(ratios), min, max));
    }

    private static double load() {
        return ManagementFactory.getOperatingSystemMXBean().getSystemLoadAverage();
    }
}
