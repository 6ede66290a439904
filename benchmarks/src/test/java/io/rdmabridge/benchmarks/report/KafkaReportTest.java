package io.rdmabridge.benchmarks.report;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import javax.imageio.ImageIO;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The Kafka section of RESULTS.md from a results file in the format {@code ReplicationBenchmarkIT} writes (the cluster
 * run itself is not part of {@code mvn verify}; see docs/benchmarks.md).
 */
class KafkaReportTest {
    private static final String RESULTS = String.join("\n",
            "records=1000", "warmup=1000", "latency.records=100", "rounds=4", "order=on,off",
            "schedule=on,off,off,on", "record.size=1024", "partitions=3", "cores=2",
            "load.average.start=1.5", "load.average.end=2.5",
            "on.throughput.records_per_s=3000", "off.throughput.records_per_s=2000",
            "on.throughput.mb_per_s=3.072", "off.throughput.mb_per_s=2.048",
            "on.loaded.p50_ms=40", "off.loaded.p50_ms=50", "on.loaded.p99_ms=80", "off.loaded.p99_ms=100",
            "on.loaded.p999_ms=90", "off.loaded.p999_ms=110", "on.loaded.samples=2000",
            "on.serial.p50_ms=10", "off.serial.p50_ms=8", "on.serial.p99_ms=20", "off.serial.p99_ms=16",
            "on.serial.p999_ms=30", "off.serial.p999_ms=24", "on.serial.samples=200",
            "on.broker.cpu_s_per_gb=300", "off.broker.cpu_s_per_gb=200",
            "on.replication.rdma_bytes=6600000", "off.replication.rdma_bytes=0", "on.replication.tcp_bytes=0",
            "off.replication.beans=0", "on.read.records=3200", "off.read.records=3200",
            "on.cluster.start_s=20", "off.cluster.start_s=15",
            "on.throughput.records_per_s.min=2500", "on.throughput.records_per_s.max=3500",
            "off.throughput.records_per_s.min=1900", "off.throughput.records_per_s.max=2100",
            "pairs.throughput.records_per_s.ratio.min=1.2", "pairs.throughput.records_per_s.ratio.median=1.5",
            "pairs.throughput.records_per_s.ratio.max=1.8", "pairs.serial.p50_ms.ratio.min=0.9",
            "pairs.serial.p50_ms.ratio.median=1.25", "pairs.serial.p50_ms.ratio.max=1.3", "");

    @Test
    void shouldWriteTheTableWithRatiosAndTheChart(@TempDir Path dir) throws IOException {
        Path file = Files.writeString(dir.resolve("kafka.properties"), RESULTS);
        String md = KafkaReport.read(file).section(dir, "Measured in this run.", "bin/run-benchmarks --kafka");
        assertTrue(md.startsWith(KafkaReport.BEGIN) && md.endsWith(KafkaReport.END + "\n"), md);
        assertTrue(md.contains("| producer throughput, records/s | 3,000 | 2,000 | 1.50x |"), md);
        assertTrue(md.contains("| end-to-end latency one at a time, p50 ms | 10.00 | 8.00 | 1.25x |"), md);
        assertTrue(md.contains("| producer throughput, slowest / fastest round, records/s | 2,500 / 3,500 | 1,900 /"
                + " 2,100 | - |"), md);
        assertTrue(md.contains("2 rounds, taken in pairs that alternate between the clusters with the order flipped"
                + " each pair (on, off, off, on, ...)"), md);
        // Pair ratios: those the run wrote, and "-" for one it did not (latency under load here).
        assertTrue(md.contains("throughput 1.20x-1.80x (median 1.50x); latency under load, p50 -; one at a time,"
                + " p50 0.90x-1.30x (median 1.25x)."), md);
        assertTrue(md.contains("| replication bytes over RDMA (followers' JMX counters) | 6,600,000 | 0 | - |"), md);
        // 6,600,000 RDMA bytes for 3,200 records of 1 KiB.
        assertTrue(md.contains("fetched 2.01 bytes over RDMA per record byte produced"), md);
        assertTrue(md.contains("![kafka-ratios.png](kafka-ratios.png)"), md);
        assertEquals(900, ImageIO.read(dir.resolve(KafkaReport.CHART).toFile()).getWidth());
    }

    @Test
    void shouldRefuseAnIncompleteResultsFile(@TempDir Path dir) throws IOException {
        Path file = Files.writeString(dir.resolve("kafka.properties"), "records=10\n");
        IOException e = assertThrows(IOException.class, () -> KafkaReport.read(file));
        assertEquals("kafka benchmark results: " + file + " has no on.throughput.records_per_s (expected: a complete"
                + " ReplicationBenchmarkIT run)", e.getMessage());
    }

    @Test
    void shouldReplaceOnlyTheKafkaSection() {
        String page = "# results\n\n## A\n\n" + KafkaReport.BEGIN + "\nold\n" + KafkaReport.END + "\n## Commands\n";
        String section = KafkaReport.BEGIN + "\nnew\n" + KafkaReport.END + "\n";
        assertEquals("# results\n\n## A\n\n" + section + "## Commands\n", KafkaReport.splice(page, section));
        // No section yet: it goes before the commands, or at the end of a page without them.
        assertEquals("# results\n" + section + "\n## Commands\n", KafkaReport.splice("# results\n## Commands\n",
                section));
        assertEquals("# results\n\n" + section, KafkaReport.splice("# results\n", section));
    }
}
