package io.rdmabridge.benchmarks.report;

import io.rdmabridge.benchmarks.Bench;
import io.rdmabridge.benchmarks.jmh.CrossProcessChannelBenchmark;
import io.rdmabridge.benchmarks.jmh.InJvmChannelBenchmark;
import io.rdmabridge.benchmarks.perf.PerfResult;
import io.rdmabridge.benchmarks.perf.RdmaPerf;
import org.openjdk.jmh.results.Result;
import org.openjdk.jmh.results.RunResult;
import org.openjdk.jmh.runner.options.ChainedOptionsBuilder;
import org.openjdk.jmh.runner.options.OptionsBuilder;
import org.openjdk.jmh.runner.options.TimeValue;

import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * {@code bin/run-benchmarks [--smoke] [--kafka | --spark | --grpc] [--out DIR]}: runs the JMH suite
 * ({@link BenchmarkSuite}), the {@code rdma-perf} patterns in loopback and the gRPC streaming benchmark
 * ({@link GrpcSection}), compares the RDMA channel with its baselines measured in the same run (across processes on
 * both soft paths, same-host shm and TCP, with CPU per GB), checks issue 13's targets (the channel's same-host path
 * against epoll, Kafka and Spark), profiles (JFR) the channel configurations that miss a target, and writes {@code RESULTS.md} with PNG charts into
 * {@code DIR} (default {@code docs/results}; {@code benchmarks/target/results-smoke} in smoke mode).
 *
 * <p>The Kafka benchmark runs in Maven before this class starts (the script does it: it rebuilds jars this JVM has
 * open); its results arrive as {@code --kafka-results FILE} with the command that made them in
 * {@code --kafka-command}. With {@code --kafka} only that section of an existing {@code RESULTS.md} is replaced.
 */
public final class RunBenchmarks {
    static final String TARGETS = "## Targets";

    private final boolean smoke;
    private final Path out;
    private final Path kafkaResults;
    private final String kafkaCommand;
    private final StringBuilder md = new StringBuilder();
    private final List<String> commands = new ArrayList<>();

    private RunBenchmarks(boolean smoke, Path out, Path kafkaResults, String kafkaCommand) {
        this.smoke = smoke;
        this.out = out;
        this.kafkaResults = kafkaResults;
        this.kafkaCommand = kafkaCommand;
    }

    public static void main(String[] args) throws Exception {
        boolean smoke = false;
        boolean kafkaOnly = false;
        boolean sparkOnly = false;
        boolean grpcOnly = false;
        Path out = null;
        Path kafkaResults = null;
        String kafkaCommand = "bin/run-benchmarks --kafka";
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--smoke" -> smoke = true;
                case "--kafka" -> kafkaOnly = true;
                case "--out" -> out = Paths.get(args[++i]);
                case "--kafka-results" -> kafkaResults = Paths.get(args[++i]);
                case "--kafka-command" -> kafkaCommand = args[++i];
                case "--spark" -> sparkOnly = true;
                case "--grpc" -> grpcOnly = true;
                default -> {
                    System.err.println("usage: run-benchmarks [--smoke] [--kafka | --spark | --grpc] [--out DIR]");
                    System.exit(2);
                }
            }
        }
        if (out == null) {
            out = Paths.get(smoke ? "benchmarks/target/results-smoke" : "docs/results");
        }
        // rdma-perf alone defaults to auto (hardware first); the page measures the provider the JMH suite uses.
        System.setProperty(Bench.PROVIDER_PROPERTY, Bench.providerName());
        Files.createDirectories(out);
        if (sparkOnly) {
            // The Spark step alone, its section replacing the older one in the existing page.
            Path page = out.resolve("RESULTS.md");
            String section = SparkSection.measure(new ArrayList<>());
            SparkSection.splice(page, section);
            Files.writeString(page, PageSections.replaceTargetRows(Files.readString(page), SPARK_ROW,
                    sparkTargetRows(SparkSection.ratios(section))));
            log("wrote the Spark section of " + page + " and its rows of the targets");
            System.exit(0);
        }
        if (grpcOnly) {
            // The gRPC streaming benchmark alone, its section replacing the older one in the existing page.
            GrpcSection.splice(out.resolve("RESULTS.md"), GrpcSection.measure(smoke, new ArrayList<>()));
            log("wrote the gRPC section of " + out.resolve("RESULTS.md"));
            System.exit(0);
        }
        RunBenchmarks run = new RunBenchmarks(smoke, out, kafkaResults, kafkaCommand);
        if (kafkaOnly) {
            run.kafkaOnly();
        } else {
            run.run();
        }
        System.exit(0);
    }

    private void run() throws Exception {
        Instant start = Instant.now();
        String machine = machine();
        commands.add("bin/run-benchmarks" + (smoke ? " --smoke" : ""));
        log("JMH suite (" + (smoke ? "smoke" : "full") + ")");
        List<RunResult> jmh = BenchmarkSuite.runAll(smoke, 1);
        log("rdma-perf");
        Map<String, List<PerfResult>> perf = new TreeMap<>();
        String sizeArgs = smoke ? "--size 1024 --iterations 200" : "";
        String[][] perfRuns = {
            {"send_lat"}, {"send_bw"}, {"write_bw"}, {"read_bw"},
            {"send_lat", "--api", "netty"}, {"send_bw", "--api", "netty"},
            {"send_lat", "--baseline", "tcp"}, {"send_bw", "--baseline", "tcp"},
        };
        for (String[] a : perfRuns) {
            List<String> args = new ArrayList<>(List.of(a));
            if (!sizeArgs.isEmpty()) {
                args.addAll(List.of(sizeArgs.split(" ")));
            }
            commands.add("bin/rdma-perf " + String.join(" ", args));
            List<PerfResult> rows = RdmaPerf.measure(args.toArray(new String[0]));
            perf.put(rows.get(0).test() + " " + rows.get(0).path(), rows);
        }
        log("gRPC client streaming across processes, RDMA vs NIO");
        String grpc = GrpcSection.measure(smoke, commands);
        String spark = null;
        if (!smoke) {
            log("Spark TeraSort-style shuffle (bin/rdma-bridge-demo --terasort)");
            spark = SparkSection.measure(commands);
        }
        KafkaReport kafka = kafkaResults == null ? null : KafkaReport.read(kafkaResults);

        md.append("# rdma-bridge benchmark results\n\n");
        md.append("Generated by `bin/run-benchmarks").append(smoke ? " --smoke" : "").append("` on ")
                .append(start.truncatedTo(ChronoUnit.SECONDS)).append(" in ")
                .append(Math.round((Instant.now().toEpochMilli() - start.toEpochMilli()) / 60000.0))
                .append(" min.").append(smoke ? " **Smoke mode: one size, one short iteration; the figures only"
                        + " prove that every benchmark runs.**" : "").append("\n\n");
        md.append("## Machine\n\n").append(machine).append("\n");
        md.append("## How to read this\n\n"
                + "- Every ratio compares two transports measured in this same run on this machine. The RDMA channel"
                + " runs on the **soft provider** (no RDMA hardware here): in one JVM its queue pairs move bytes"
                + " with one memory copy per message (the RDMA semantics). Across processes it is measured on both"
                + " of its paths, as separate rows: **rdma (same-host shm)**, the provider's default between two"
                + " processes on one host, exchanges frames through shared-memory rings (its socket carries only"
                + " the handshake, doorbells and peer death) and does one-sided READ and WRITE with `pread`/`pwrite`"
                + " on the peer's memory files; **rdma (TCP path)**"
                + " (`rdmabridge.soft.sameHost=tcp`, the path between hosts) carries every frame over a TCP socket;"
                + " **rdma (same-host shm, busy-poll 100 us)** is the same-host ping-pong with both event loops"
                + " busy-polling for 100 us before they sleep (`RdmaChannelOption.BUSY_POLL_BUDGET_NANOS`), for the"
                + " busy-polling latency target (epoll, which has no such option, is its baseline);"
                + " **rdma (same-host shm), file regions** and **epoll, file regions** write a `DefaultFileRegion`"
                + " of a temporary file per message, as Spark's block server sends shuffle blocks: epoll sends it"
                + " with `sendfile`, the same-host peer reads a rendezvous from the file itself (through the"
                + " sender's link to it, `rdmabridge.soft.fileLinks`). Every RDMA row"
                + " runs the channel's defaults otherwise, among them"
                + " `RdmaChannelOption.SEND_COMPLETION_POLL_NANOS` (after a write, its loop polls for up to 50 us"
                + " while that send awaits its completion, rather than sleep) and, on the same-host path, the"
                + " provider's acknowledgement held for the answer (`rdmabridge.soft.holdAcknowledgements`)."
                + " Issue 13's cross-process targets apply to the same-host path. So these figures measure the"
                + " channel, protocol and provider overhead, not a fabric.\n"
                + "- JMH: forks=1, few iterations (2 shared cores: expect wide errors; the ± column is JMH's 99.9%"
                + " confidence half-width, NaN where only one iteration ran), 3 of 2 s after a warm-up of 2 x 1 s in"
                + " one JVM and 6 x 2 s across processes (two JVMs compiling on the cores that move the bytes; the"
                + " RDMA rows climb for about 10 s, `CrossProcessChannelBenchmark`'s javadoc). Throughput = batches"
                + " of 4 MiB (at least 4 messages) with one batch in flight behind the one being written; latency = one"
                + " ping-pong timed from the benchmark thread (includes the hand-off to the event loop). CPU s/GB ="
                + " process CPU time (user + system, all threads) of both processes, the benchmark JVM and, across"
                + " processes, its child server, over the throughput iterations, per 10^9 payload bytes moved.\n"
                + "- rdma-perf latency is one-way (round trip / 2), driven by the event loop or the polling thread,"
                + " as perftest reports it; CPU s/GB is process CPU time (both ends in loopback mode).\n\n");

        Channels inJvm = Channels.of(jmh, InJvmChannelBenchmark.class);
        Channels cross = Channels.of(jmh, CrossProcessChannelBenchmark.class);
        List<Miss> misses = new ArrayList<>();
        md.append(targets(inJvm, cross, Channels.copies(jmh, "allocator"), kafka,
                spark == null ? null : SparkSection.ratios(spark), misses));

        channelSection("In one JVM: RDMA channel (soft, in-JVM path) vs LocalChannel", inJvm, "injvm");
        channelSection("Across two processes on loopback: RDMA channel (soft, same-host shm path and TCP path) vs"
                + " epoll and NIO", cross, "cross");
        copiesSection(jmh);
        perfSection(perf);
        md.append(grpc);
        if (spark != null) {
            md.append(spark);
        }
        profiles(misses);
        if (kafka != null) {
            md.append(kafka.section(out, "Measured in this run.", kafkaCommand)).append('\n');
        }
        md.append("## Commands\n\n```\n").append(String.join("\n", commands)).append("\n```\n\n");
        if (kafkaResults == null) {
            md.append("The Kafka benchmark (plugin on vs off) is not part of smoke runs: its two 4-JVM clusters cost"
                    + " about a minute; `bin/run-benchmarks --smoke --kafka` runs it alone at a tiny size.\n");
        }
        if (smoke) {
            md.append("Smoke mode skips the Spark step (`bin/run-benchmarks --spark` runs it alone).\n");
        }
        Files.writeString(out.resolve("RESULTS.md"), md.toString());
        log("wrote " + out.resolve("RESULTS.md"));
    }

    /** Replaces (or adds) the Kafka section of {@code out/RESULTS.md}, leaving the rest of the page as it was. */
    private void kafkaOnly() throws IOException {
        if (kafkaResults == null) {
            throw new IllegalArgumentException("--kafka needs --kafka-results FILE (bin/run-benchmarks passes it)");
        }
        Path page = out.resolve("RESULTS.md");
        String existing = Files.exists(page) ? Files.readString(page) : "# rdma-bridge benchmark results\n\n";
        String origin = "Regenerated alone by `bin/run-benchmarks --kafka" + (smoke ? " --smoke" : "") + "` on "
                + Instant.now().truncatedTo(ChronoUnit.SECONDS) + "; the other sections of this page come from the"
                + " run named at its top.";
        KafkaReport kafka = KafkaReport.read(kafkaResults);
        String updated = KafkaReport.splice(existing, kafka.section(out, origin, kafkaCommand));
        Files.writeString(page, PageSections.replaceTargetRows(updated, KAFKA_ROW, kafkaTargetRows(kafka)));
        log("wrote the Kafka section of " + page + " and its rows of the targets");
    }

    /** First cell of the Kafka and the Spark rows of the targets table, which their steps alone replace. */
    static final String KAFKA_ROW = "| Kafka ";
    static final String SPARK_ROW = "| Spark ";

    /**
     * The "Targets" section: the in-JVM targets, issue 13's targets for the channel across processes (RDMA on the
     * soft provider's same-host path against epoll), zero copies on the registered path, and issue 13's Kafka and
     * Spark targets ({@code kafka}, {@code spark} null where this run did not measure them). {@code misses} gets the
     * channel targets missed, to be profiled.
     *
     * @param spark RDMA / Spark job time and fetch wait ({@link SparkSection#ratios})
     */
    static String targets(Channels inJvm, Channels cross, List<double[]> copies, KafkaReport kafka, double[] spark,
                          List<Miss> misses) {
        StringBuilder md = new StringBuilder(TARGETS).append("\n\n| target | size | measured | met |\n"
                + "|---|---:|---:|:---:|\n");
        for (int size : new int[] {1024, 65536}) {
            target(md, misses, "in-JVM throughput RDMA / LocalChannel >= 1.0", size,
                    inJvm.ratio("rdma", "local", size, Channels.BYTES), 1.0, true, InJvmChannelBenchmark.class,
                    "throughput");
        }
        // Issue 13: the same-host path against epoll, measured in the same run.
        String shm = Channels.RDMA_SHM;
        target(md, misses, "cross-process throughput RDMA same-host / epoll >= 1.0", 1024,
                cross.ratio(shm, "epoll", 1024, Channels.BYTES), 1.0, true, CrossProcessChannelBenchmark.class,
                "throughput");
        for (int size : new int[] {65536, 1 << 20}) {
            target(md, misses, "cross-process throughput RDMA same-host / epoll >= 2.0", size,
                    cross.ratio(shm, "epoll", size, Channels.BYTES), 2.0, true, CrossProcessChannelBenchmark.class,
                    "throughput");
        }
        target(md, misses, "cross-process p50 latency RDMA same-host / epoll <= 1.0", 64,
                cross.ratio(shm, "epoll", 64, Channels.P50), 1.0, false, CrossProcessChannelBenchmark.class,
                "latency");
        target(md, misses, "cross-process p50 latency RDMA same-host busy-polling 100 us / epoll <= 0.5", 64,
                cross.ratio(Channels.RDMA_SHM_BUSY_POLL, "epoll", 64, Channels.P50), 0.5, false,
                CrossProcessChannelBenchmark.class, "latency");
        for (int size : new int[] {65536, 1 << 20}) {
            target(md, misses, "cross-process CPU per GB RDMA same-host / epoll <= 1.0", size,
                    cross.ratio(shm, "epoll", size, Channels.CPU), 1.0, false, CrossProcessChannelBenchmark.class,
                    "throughput");
        }
        for (double[] c : copies) {
            boolean met = c[1] == 0;
            md.append(String.format(Locale.ROOT, "| CPU-copied bytes on the registered path = 0 | %s | %.0f of %.0f"
                    + " B | %s |%n", LineChart.formatSize(c[0]), c[1], c[2], met ? "yes" : "**no**"));
        }
        String frameworks = kafkaTargetRows(kafka) + sparkTargetRows(spark);
        md.append(frameworks).append("\n");
        if (frameworks.contains("**no**")) {
            md.append("The Kafka and Spark targets are not profiled here; their sections below say what they"
                    + " measure, and docs/kafka.md and docs/spark.md where their time goes.\n\n");
        }
        return md.toString();
    }

    /** Issue 13's Kafka rows of the targets table: plugin on / off, acks=all, replication factor 3. */
    static String kafkaTargetRows(KafkaReport kafka) {
        StringBuilder md = new StringBuilder();
        String size = kafka == null ? "-" : LineChart.formatSize(kafka.value("record.size")) + " records";
        String[][] rows = {
            {"throughput, records/s, plugin on / off >= 1.0", "throughput.records_per_s", "1.0", "true"},
            {"p50 latency under load, plugin on / off <= 1.0", "loaded.p50_ms", "1.0", "false"},
            {"p50 latency one at a time, plugin on / off <= 1.0", "serial.p50_ms", "1.0", "false"},
        };
        for (String[] r : rows) {
            row(md, KAFKA_ROW + "acks=all RF 3 " + r[0], size, kafka == null ? Double.NaN : kafka.ratio(r[1]),
                    Double.parseDouble(r[2]), Boolean.parseBoolean(r[3]), kafka == null);
        }
        return md.toString();
    }

    /** Issue 13's Spark rows of the targets table; {@code ratios} from {@link SparkSection#ratios}, or null. */
    static String sparkTargetRows(double[] ratios) {
        StringBuilder md = new StringBuilder();
        String size = SparkSection.MEGABYTES + " MB";
        row(md, SPARK_ROW + "TeraSort-style job time RDMA / SortShuffleManager <= 1.0", size,
                ratios == null ? Double.NaN : ratios[0], 1.0, false, ratios == null);
        row(md, SPARK_ROW + "TeraSort-style fetch wait RDMA / SortShuffleManager <= 0.5", size,
                ratios == null ? Double.NaN : ratios[1], 0.5, false, ratios == null);
        return md.toString();
    }

    private static void target(StringBuilder md, List<Miss> misses, String what, int size, double[] ratio,
                               double bound, boolean atLeast, Class<?> benchmark, String method) {
        double r = ratio == null ? Double.NaN : ratio[0];
        if (!row(md, "| " + what, LineChart.formatSize(size), r, bound, atLeast, false)) {
            misses.add(new Miss(what, size, benchmark, method));
        }
    }

    /**
     * Appends one row; returns false only for a missed target (not for one without a figure).
     *
     * @param notRun the step did not run at all (rather than leaving this figure out)
     */
    private static boolean row(StringBuilder md, String what, String size, double ratio, double bound,
                               boolean atLeast, boolean notRun) {
        if (Double.isNaN(ratio)) {
            md.append(String.format(Locale.ROOT, "%s | %s | - | %s |%n", what, size,
                    notRun ? "not in this run" : "not measured"));
            return true;
        }
        boolean met = atLeast ? ratio >= bound : ratio <= bound;
        md.append(String.format(Locale.ROOT, "%s | %s | %.2fx | %s |%n", what, size, ratio, met ? "yes" : "**no**"));
        return met;
    }

    private void channelSection(String title, Channels c, String file) throws IOException {
        md.append("## ").append(title).append("\n\n");
        md.append(channelTable(c)).append("\n");
        LineChart thr = new LineChart(title.replaceAll(":.*", "") + ": throughput", "GB/s", true);
        LineChart lat = new LineChart(title.replaceAll(":.*", "") + ": ping-pong p50", "microseconds", true);
        for (String t : c.transports()) {
            List<double[]> tp = new ArrayList<>();
            List<double[]> lp = new ArrayList<>();
            for (int size : c.sizes()) {
                double[] b = c.get(t, size, Channels.BYTES);
                double[] l = c.latency(t, size);
                if (b != null) {
                    tp.add(new double[] {size, b[0] / 1e9});
                }
                if (l != null) {
                    lp.add(new double[] {size, l[0]});
                }
            }
            thr.series(t, tp);
            lat.series(t, lp);
        }
        String baseline = c.transports().contains("local") ? "local" : "epoll";
        LineChart ratio = new LineChart(title.replaceAll(":.*", "") + ": RDMA / " + baseline, "ratio", false)
                .target(1.0, "parity");
        for (String rdma : c.transports()) {
            if (!rdma.startsWith("rdma")) {
                continue;
            }
            // One pair of series per RDMA path, short enough for the legend; a single path keeps the plain names.
            String path = rdma.equals(Channels.RDMA_SHM) ? "shm: " : rdma.equals(Channels.RDMA_TCP) ? "TCP path: "
                    : rdma.equals(Channels.RDMA_SHM_BUSY_POLL) ? "shm busy-poll: " : "";
            List<double[]> rt = new ArrayList<>();
            List<double[]> rl = new ArrayList<>();
            for (int size : c.sizes()) {
                double[] r = c.ratio(rdma, baseline, size, Channels.BYTES);
                double[] l = c.ratio(rdma, baseline, size, Channels.P50);
                if (r != null) {
                    rt.add(new double[] {size, r[0]});
                }
                if (l != null) {
                    rl.add(new double[] {size, l[0]});
                }
            }
            ratio.series(path + (path.isEmpty() ? "throughput ratio" : "throughput"), rt)
                    .series(path + (path.isEmpty() ? "p50 latency ratio" : "p50 latency"), rl);
        }
        chart(thr, file + "-throughput.png");
        chart(lat, file + "-latency.png");
        chart(ratio, file + "-ratios.png");
    }

    /** The markdown table of one channel benchmark: a row per transport (and RDMA path) and size. */
    static String channelTable(Channels c) {
        StringBuilder md = new StringBuilder("| transport | size | messages/s | ± | GB/s | ± | CPU s/GB | p50 us | p99 us"
                + " | p99.9 us | samples |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for (String t : c.transports()) {
            for (int size : c.sizes()) {
                double[] thr = c.get(t, size, Channels.MESSAGES);
                double[] bytes = c.get(t, size, Channels.BYTES);
                double[] lat = c.latency(t, size);
                if (thr == null && bytes == null && lat == null) {
                    continue; // a row measured at some sizes only (busy-polling latency)
                }
                md.append(String.format(Locale.ROOT, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |%n", t,
                        LineChart.formatSize(size), num(thr, 0, 0), num(thr, 1, 0), num(bytes, 0, 1e9),
                        num(bytes, 1, 1e9), num(c.get(t, size, Channels.CPU), 0, 1), num(lat, 0, 1), num(lat, 1, 1),
                        num(lat, 2, 1), lat == null ? "-" : String.format(Locale.ROOT, "%.0f", lat[3])));
            }
        }
        return md.toString();
    }

    private void chart(LineChart chart, String name) throws IOException {
        if (chart.isEmpty()) {
            return;
        }
        chart.write(out.resolve(name));
        md.append("![").append(name).append("](").append(name).append(")\n\n");
    }

    private void copiesSection(List<RunResult> jmh) {
        md.append("## CPU-copied bytes per payload byte (RDMA channel, in-JVM, from RdmaChannelMetrics)\n\n"
                + "| payload | size | copied bytes | payload bytes | copied / payload |\n|---|---:|---:|---:|---:|\n");
        for (String kind : List.of("allocator", "heap", "file")) {
            for (double[] c : Channels.copies(jmh, kind)) {
                md.append(String.format(Locale.ROOT, "| %s | %s | %.0f | %.0f | %.3f |%n", kind,
                        LineChart.formatSize(c[0]), c[1], c[2], c[2] == 0 ? Double.NaN : c[1] / c[2]));
            }
        }
        md.append("\n");
    }

    private void perfSection(Map<String, List<PerfResult>> perf) throws IOException {
        md.append("## rdma-perf (loopback, both ends in one process)\n\n"
                + "| test | path | size | iterations | GB/s | Mmsg/s | p50 us | p99 us | p99.9 us | CPU s/GB |\n"
                + "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        LineChart bw = new LineChart("rdma-perf bandwidth", "GB/s", true);
        LineChart lat = new LineChart("rdma-perf one-way latency p50", "microseconds", true);
        for (List<PerfResult> rows : perf.values()) {
            List<double[]> pts = new ArrayList<>();
            List<double[]> lpts = new ArrayList<>();
            for (PerfResult r : rows) {
                md.append(String.format(Locale.ROOT, "| %s | %s | %s | %d | %.3f | %.4f | %s | %s | %s | %.3f |%n",
                        r.test(), r.path(), LineChart.formatSize(r.size()), r.iterations(), r.gbPerSecond(),
                        r.messagesPerSecond() / 1e6, fmt(r.p50Micros()), fmt(r.p99Micros()), fmt(r.p999Micros()),
                        r.cpuSecondsPerGb()));
                pts.add(new double[] {r.size(), r.gbPerSecond()});
                lpts.add(new double[] {r.size(), r.p50Micros()});
            }
            String name = rows.get(0).test() + " " + rows.get(0).path();
            if (rows.get(0).test().endsWith("_lat")) {
                lat.series(name, lpts);
            } else {
                bw.series(name, pts);
            }
        }
        md.append("\n");
        chart(bw, "rdma-perf-bandwidth.png");
        chart(lat, "rdma-perf-latency.png");
    }

    private void profiles(List<Miss> misses) throws Exception {
        if (misses.isEmpty()) {
            return;
        }
        md.append("## Why targets were missed: JFR profiles of the RDMA side\n\n");
        // One profile per (benchmark, method): the first missed size stands for its row.
        TreeSet<String> done = new TreeSet<>();
        for (Miss m : misses) {
            String key = m.benchmark.getSimpleName() + "." + m.method;
            if (!done.add(key) || smoke && done.size() > 1) {
                continue;
            }
            Path jfr = out.resolve("profile-" + key + "-" + m.size + ".jfr").toAbsolutePath();
            log("profiling " + key + " size=" + m.size);
            // The measurement only, after the benchmark's own warm-up: the ramp through the JIT is not what the row
            // measured.
            ChainedOptionsBuilder o = new OptionsBuilder().include(BenchmarkSuite.regex(m.benchmark) + m.method + "$")
                    .param("transport", "rdma").param("size", String.valueOf(m.size)).forks(1)
                    .measurementIterations(1).measurementTime(TimeValue.seconds(smoke ? 1 : 4))
                    .shouldFailOnError(true).addProfiler(MeasurementRecording.class, jfr.toString());
            if (m.benchmark == CrossProcessChannelBenchmark.class) {
                // Issue 13's targets are the same-host path's.
                o.param("sameHost", "shm");
            }
            if (smoke) {
                o.param("batchBytes", "65536").warmupIterations(1).warmupTime(TimeValue.seconds(1));
            }
            BenchmarkSuite.run(o);
            md.append("### ").append(key).append(", ").append(LineChart.formatSize(m.size)).append(" (").append(m.what)
                    .append(")\n\nClient JVM (the JMH fork); for the cross-process case RDMA on the soft provider's"
                            + " same-host path, and the child server is not profiled.\n\n").append(HotMethods.summarize(jfr, 12)).append("\n");
            Files.deleteIfExists(jfr);
        }
    }

    private static String num(double[] v, int i, double scale) {
        if (v == null || Double.isNaN(v[i])) {
            return "-";
        }
        double x = scale == 0 ? v[i] : v[i] / scale;
        return String.format(Locale.ROOT, x >= 1000 ? "%.0f" : "%.3f", x);
    }

    private static String fmt(double v) {
        return Double.isNaN(v) ? "-" : String.format(Locale.ROOT, "%.2f", v);
    }

    private static String machine() {
        StringBuilder sb = new StringBuilder();
        String cpu = "unknown CPU";
        try {
            cpu = Files.readAllLines(Paths.get("/proc/cpuinfo")).stream().filter(l -> l.startsWith("model name"))
                    .findFirst().map(l -> l.substring(l.indexOf(':') + 1).trim()).orElse(cpu);
        } catch (IOException e) {
            // Not Linux: leave it unknown.
        }
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        sb.append("- CPU: ").append(cpu).append(", ").append(Runtime.getRuntime().availableProcessors())
                .append(" cores visible to the JVM\n");
        sb.append(String.format(Locale.ROOT, "- memory: %.1f GiB; load average at start: %.2f%n",
                os.getTotalMemorySize() / (double) (1L << 30), os.getSystemLoadAverage()));
        sb.append("- OS: ").append(System.getProperty("os.name")).append(' ').append(System.getProperty("os.version"))
                .append(' ').append(System.getProperty("os.arch")).append('\n');
        sb.append("- JDK: ").append(System.getProperty("java.vm.name")).append(' ')
                .append(System.getProperty("java.version")).append('\n');
        sb.append("- RDMA provider: ").append(Bench.providerName())
                .append(" (benchmarks set rdmabridge.provider; soft unless told otherwise)\n");
        return sb.toString();
    }

    private static void log(String s) {
        System.err.println("run-benchmarks: " + s);
    }

    /** A channel target missed: the benchmark method and size to profile. */
    record Miss(String what, int size, Class<?> benchmark, String method) {
    }

    /**
     * Channel benchmark results of one benchmark class, by transport and size. Across processes the RDMA rows are
     * told apart by the soft provider's path ({@code sameHost}): {@link #RDMA_SHM} and {@link #RDMA_TCP}.
     */
    static final class Channels {
        static final int MESSAGES = 0;
        static final int BYTES = 1;
        static final int P50 = 2;
        /** CPU seconds per GB of both processes ({@code CpuCost}), one value. */
        static final int CPU = 3;
        static final String RDMA_SHM = "rdma (same-host shm)";
        static final String RDMA_TCP = "rdma (TCP path)";
        static final String RDMA_SHM_BUSY_POLL = "rdma (same-host shm, busy-poll 100 us)";
        /** Appended to the row name of a transport writing file regions. */
        static final String FILE_REGIONS = ", file regions";
        private static final List<String> ORDER = List.of("rdma", RDMA_SHM, RDMA_SHM_BUSY_POLL,
                RDMA_SHM + FILE_REGIONS, RDMA_TCP);

        private final Map<String, Map<Integer, double[][]>> data = new TreeMap<>();

        static Channels of(List<RunResult> results, Class<?> benchmark) {
            Channels c = new Channels();
            for (RunResult r : results) {
                String name = r.getParams().getBenchmark();
                if (!name.startsWith(benchmark.getName() + ".")) {
                    continue;
                }
                String t = label(r.getParams().getParam("transport"), r.getParams().getParam("sameHost"),
                        r.getParams().getParam("busyPollNanos"), r.getParams().getParam("payload"));
                int size = Integer.parseInt(r.getParams().getParam("size"));
                if (name.endsWith(".throughput")) {
                    c.put(t, size, MESSAGES, scoreAndError(r.getSecondaryResults().get("messages")));
                    c.put(t, size, BYTES, scoreAndError(r.getSecondaryResults().get("bytes")));
                    Result<?> cpu = r.getSecondaryResults().get("cpuNanos");
                    Result<?> bytes = r.getSecondaryResults().get("cpuBytes");
                    if (cpu != null && bytes != null && cpu.getScore() > 0 && bytes.getScore() > 0) {
                        // Nanoseconds per byte = seconds per 10^9 bytes.
                        c.put(t, size, CPU, new double[] {cpu.getScore() / bytes.getScore()});
                    }
                } else {
                    var st = r.getPrimaryResult().getStatistics();
                    c.put(t, size, P50, new double[] {st.getPercentile(50), st.getPercentile(99),
                        st.getPercentile(99.9), st.getN()});
                }
            }
            return c;
        }

        /**
         * The row name of a transport: RDMA on the soft provider's TCP path apart from its same-host path, the
         * same-host path with busy-polling event loops ({@link BenchmarkSuite#busyPollOptions}) apart from both, and
         * any transport writing file regions ({@link BenchmarkSuite#fileRegionOptions}) apart from its buffers' row.
         */
        static String label(String transport, String sameHost, String busyPollNanos, String payload) {
            if ("file".equals(payload)) {
                return ("rdma".equals(transport) ? RDMA_SHM : transport) + FILE_REGIONS;
            }
            if (!"rdma".equals(transport) || sameHost == null) {
                return transport;
            }
            if ("tcp".equals(sameHost)) {
                return RDMA_TCP;
            }
            return busyPollNanos == null || "0".equals(busyPollNanos) ? RDMA_SHM : RDMA_SHM_BUSY_POLL;
        }

        /** Sets one figure ({@link #MESSAGES}, {@link #BYTES}, {@link #P50} or {@link #CPU}) of a row. */
        void put(String transport, int size, int what, double[] value) {
            data.computeIfAbsent(transport, k -> new TreeMap<>()).computeIfAbsent(size, k -> new double[4][])[what] =
                    value;
        }

        private static double[] scoreAndError(Result<?> r) {
            return r == null ? null : new double[] {r.getScore(), r.getScoreError()};
        }

        List<String> transports() {
            // RDMA rows first (same-host path before TCP path), then the baselines by name.
            List<String> t = new ArrayList<>(data.keySet());
            t.sort(Comparator.comparingInt((String a) -> ORDER.contains(a) ? ORDER.indexOf(a) : ORDER.size())
                    .thenComparing(Comparator.naturalOrder()));
            return t;
        }

        TreeSet<Integer> sizes() {
            TreeSet<Integer> s = new TreeSet<>();
            data.values().forEach(m -> s.addAll(m.keySet()));
            return s;
        }

        double[] get(String transport, int size, int what) {
            Map<Integer, double[][]> m = data.get(transport);
            return m == null || m.get(size) == null ? null : m.get(size)[what];
        }

        double[] latency(String transport, int size) {
            return get(transport, size, P50);
        }

        /** {@code a / b} of the score (throughput bytes/s, p50 or CPU per GB), or null when either is missing. */
        double[] ratio(String a, String b, int size, int what) {
            double[] x = get(a, size, what);
            double[] y = get(b, size, what);
            if (x == null || y == null || y[0] == 0) {
                return null;
            }
            return new double[] {x[0] / y[0]};
        }

        /** Per size: {size, copied bytes, payload bytes} of the copied-bytes benchmark for one payload kind. */
        static List<double[]> copies(List<RunResult> results, String payload) {
            List<double[]> rows = new ArrayList<>();
            for (RunResult r : results) {
                if (!r.getParams().getBenchmark().endsWith("CopiedBytesBenchmark.write")
                        || !payload.equals(r.getParams().getParam("payload"))) {
                    continue;
                }
                Result<?> copied = r.getSecondaryResults().get("copiedBytes");
                Result<?> bytes = r.getSecondaryResults().get("payloadBytes");
                rows.add(new double[] {Integer.parseInt(r.getParams().getParam("size")),
                    copied == null ? 0 : copied.getScore(), bytes == null ? 0 : bytes.getScore()});
            }
            return rows;
        }
    }
}
