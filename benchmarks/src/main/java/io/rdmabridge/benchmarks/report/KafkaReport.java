package io.rdmabridge.benchmarks.report;

import java.io.IOException;
import java.io.Reader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Locale;
import java.util.Properties;

/**
 * The "Kafka replication: plugin on vs off" section of RESULTS.md, from the properties file that
 * {@code integration-tests/kafka}'s {@code ReplicationBenchmarkIT} writes (keys {@code on.*} and {@code off.*}; see
 * that class for what each phase measures). Draws one PNG chart of the on/off ratios. The section sits between two
 * HTML comment markers so that {@code bin/run-benchmarks --kafka} can replace it alone in an existing page.
 * Not thread-safe.
 */
final class KafkaReport {
    static final String BEGIN = "<!-- kafka-benchmark:begin -->";
    static final String END = "<!-- kafka-benchmark:end -->";
    static final String CHART = "kafka-ratios.png";

    private final Properties p;

    private KafkaReport(Properties p) {
        this.p = p;
    }

    static KafkaReport read(Path file) throws IOException {
        if (!Files.isRegularFile(file)) {
            throw new IOException("kafka benchmark results: " + file + " (expected: the properties file written by "
                    + "ReplicationBenchmarkIT; run bin/run-benchmarks --kafka)");
        }
        Properties p = new Properties();
        try (Reader r = Files.newBufferedReader(file)) {
            p.load(r);
        }
        for (String key : new String[] {"on.throughput.records_per_s", "off.throughput.records_per_s",
            "on.replication.rdma_bytes", "off.replication.rdma_bytes", "records", "record.size", "rounds",
            "schedule"}) {
            if (p.getProperty(key) == null) {
                throw new IOException("kafka benchmark results: " + file + " has no " + key
                        + " (expected: a complete ReplicationBenchmarkIT run)");
            }
        }
        return new KafkaReport(p);
    }

    double value(String key) {
        String v = p.getProperty(key);
        return v == null ? Double.NaN : Double.parseDouble(v);
    }

    /** on / off of {@code key} (without the mode prefix); NaN when either is missing or off is zero. */
    double ratio(String key) {
        double on = value("on." + key);
        double off = value("off." + key);
        return off == 0 ? Double.NaN : on / off;
    }

    /**
     * The section's markdown, markers included; writes the chart into {@code out}. {@code origin} says which
     * command produced it and when.
     */
    String section(Path out, String origin, String command) throws IOException {
        StringBuilder md = new StringBuilder();
        md.append(BEGIN).append("\n## Kafka replication: plugin on vs off\n\n");
        md.append(origin).append(String.format(Locale.ROOT, " Load average %.2f at its start, %.2f at its end, %.0f"
                + " cores.%n%n", value("load.average.start"), value("load.average.end"), value("cores")));
        int rounds = (int) value("rounds");
        md.append(String.format(Locale.ROOT, "Setup: `ReplicationBenchmarkIT` starts two clusters side by side, each"
                + " one controller and three brokers as child JVMs on 127.0.0.1 (`-Xmx384m`, serial GC, C1 only,"
                + " `num.network.threads=1`, `num.io.threads=2`): **on** = every broker with the agent,"
                + " `rdma.replication.enable=true` and `rdma.provider=soft`; **off** = plain Kafka (the plugin jar"
                + " present, flag off, no agent). Topic: %.0f partitions, replication factor 3,"
                + " `min.insync.replicas=2`. Producer: `acks=all`, idempotent, `linger.ms=5`, `batch.size=65536`;"
                + " records of %s. On each cluster a warm-up of %,.0f records, then %d rounds, taken in pairs that"
                + " alternate between the clusters with the order flipped each pair (%s, ...), while the other"
                + " cluster idles. A round: %,.0f records sent unthrottled (throughput: first send to last"
                + " acknowledgement), then %,.0f records one at a time (each sent when the consumer received the one"
                + " before). Throughput is the median of a cluster's rounds; latency percentiles are over all its"
                + " rounds' samples. End-to-end latency: `System.nanoTime()` at `send()`, carried in the record, to"
                + " the consumer's receipt in the same JVM; a consumer sees a record only after the in-sync followers"
                + " fetched it, so replication is on that path.%n%n", value("partitions"),
                LineChart.formatSize(value("record.size")), value("warmup"), rounds / 2, schedule(),
                value("records"), value("latency.records")));
        md.append("| metric | plugin on (RDMA, soft) | plugin off (TCP) | on / off |\n|---|---:|---:|---:|\n");
        row(md, "producer throughput, records/s", "throughput.records_per_s", "%,.0f");
        md.append(String.format(Locale.ROOT, "| producer throughput, slowest / fastest round, records/s | %s / %s |"
                + " %s / %s | - |%n", fmt("%,.0f", value("on.throughput.records_per_s.min")),
                fmt("%,.0f", value("on.throughput.records_per_s.max")),
                fmt("%,.0f", value("off.throughput.records_per_s.min")),
                fmt("%,.0f", value("off.throughput.records_per_s.max"))));
        row(md, "producer throughput, MB/s", "throughput.mb_per_s", "%.2f");
        row(md, "end-to-end latency under load, p50 ms", "loaded.p50_ms", "%.1f");
        row(md, "end-to-end latency under load, p99 ms", "loaded.p99_ms", "%.1f");
        row(md, "end-to-end latency under load, p99.9 ms", "loaded.p999_ms", "%.1f");
        row(md, "end-to-end latency one at a time, p50 ms", "serial.p50_ms", "%.2f");
        row(md, "end-to-end latency one at a time, p99 ms", "serial.p99_ms", "%.2f");
        row(md, "end-to-end latency one at a time, p99.9 ms", "serial.p999_ms", "%.2f");
        row(md, "broker CPU seconds per GB produced (3 brokers)", "broker.cpu_s_per_gb", "%.1f");
        md.append(String.format(Locale.ROOT, "| replication bytes over RDMA (followers' JMX counters) | %,.0f | %,.0f"
                + " | - |%n", value("on.replication.rdma_bytes"), value("off.replication.rdma_bytes")));
        md.append(String.format(Locale.ROOT, "| replication bytes over TCP seen by the plugin | %,.0f | - (plugin"
                + " inactive: %.0f rdma-replication MBeans) | - |%n", value("on.replication.tcp_bytes"),
                value("off.replication.beans")));
        md.append(String.format(Locale.ROOT, "| records read back | %,.0f | %,.0f | - |%n",
                value("on.read.records"), value("off.read.records")));
        row(md, "cluster start, s", "cluster.start_s", "%.1f");
        double produced = (value("warmup") + rounds / 2 * (value("records") + value("latency.records")))
                * value("record.size");
        md.append(String.format(Locale.ROOT, "%nOn / off per pair of adjacent rounds (lowest, median, highest):"
                + " throughput %s; latency under load, p50 %s; one at a time, p50 %s. A ratio whose pairs fall on"
                + " both sides of 1.0 is not resolved by this run: the machine's noise reaches that far.%n%n",
                spread("pairs.throughput.records_per_s"), spread("pairs.loaded.p50_ms"),
                spread("pairs.serial.p50_ms")));
        md.append(String.format(Locale.ROOT, "With the plugin on, the followers fetched %.2f bytes over RDMA per"
                + " record byte produced (replication factor 3: two followers per partition, plus Kafka's fetch"
                + " framing), and none over TCP. Samples per cluster: %,.0f under load, %,.0f one at a time (p99.9 of"
                + " fewer than 1,000 samples is the maximum). Under load the latency is mostly the wait in the"
                + " producer's 32 MiB `buffer.memory`, which the unthrottled sender keeps full, so it follows"
                + " throughput; the one-at-a-time figures are the replication round trip. The soft provider moves"
                + " RDMA between two processes on one host over its same-host path by default (shared-memory rings;"
                + " `rdmabridge.soft.sameHost=tcp` puts it on a TCP socket, as between hosts), so **on** measures the"
                + " plugin's, the channel's and the provider's overhead, not a fabric.%n%n",
                value("on.replication.rdma_bytes") / produced, value("on.loaded.samples"),
                value("on.serial.samples")));
        BarChart chart = new BarChart("Kafka acks=all, RF 3: plugin on / plugin off (same run)", "ratio on / off")
                .reference(1.0, "parity");
        chart.bar("throughput, records/s", ratio("throughput.records_per_s"))
                .bar("latency under load p50", ratio("loaded.p50_ms"))
                .bar("latency under load p99", ratio("loaded.p99_ms"))
                .bar("latency one at a time p50", ratio("serial.p50_ms"))
                .bar("latency one at a time p99", ratio("serial.p99_ms"))
                .bar("latency one at a time p99.9", ratio("serial.p999_ms"))
                .bar("broker CPU per GB", ratio("broker.cpu_s_per_gb"));
        if (!chart.isEmpty()) {
            chart.write(out.resolve(CHART));
            md.append("![").append(CHART).append("](").append(CHART).append(")\n\n");
        }
        md.append("Command:\n\n```\n").append(command).append("\n```\n").append(END).append('\n');
        return md.toString();
    }

    /** The first rounds' order as the run wrote it ({@code schedule}), enough to show the pattern. */
    private String schedule() {
        String[] rounds = p.getProperty("schedule", "").split(",");
        return String.join(", ", Arrays.copyOf(rounds, Math.min(rounds.length, 4)));
    }

    /** "min-max (median m)" of a pair ratio, or "-" when the run did not write it. */
    private String spread(String key) {
        double min = value(key + ".ratio.min");
        double median = value(key + ".ratio.median");
        double max = value(key + ".ratio.max");
        if (Double.isNaN(min) || Double.isNaN(median) || Double.isNaN(max)) {
            return "-";
        }
        return String.format(Locale.ROOT, "%.2fx-%.2fx (median %.2fx)", min, max, median);
    }

    private void row(StringBuilder md, String label, String key, String format) {
        md.append("| ").append(label).append(" | ").append(fmt(format, value("on." + key))).append(" | ")
                .append(fmt(format, value("off." + key))).append(" | ")
                .append(fmt("%.2fx", ratio(key))).append(" |\n");
    }

    private static String fmt(String format, double v) {
        return Double.isNaN(v) ? "-" : String.format(Locale.ROOT, format, v);
    }

    /**
     * {@code page} with its Kafka section replaced by {@code section}; without one, the section goes before
     * "## Commands", or at the end.
     */
    static String splice(String page, String section) {
        int begin = page.indexOf(BEGIN);
        int end = page.indexOf(END);
        if (begin >= 0 && end > begin) {
            int after = end + END.length();
            if (after < page.length() && page.charAt(after) == '\n') {
                after++;
            }
            return page.substring(0, begin) + section + page.substring(after);
        }
        int commands = page.indexOf("## Commands");
        if (commands >= 0) {
            return page.substring(0, commands) + section + "\n" + page.substring(commands);
        }
        return page + (page.endsWith("\n") ? "\n" : "\n\n") + section;
    }
}
