package io.rdmabridge.benchmarks.report;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.benchmarks.jmh.CrossProcessChannelBenchmark;
import io.rdmabridge.benchmarks.jmh.InJvmChannelBenchmark;
import io.rdmabridge.benchmarks.report.RunBenchmarks.Channels;
import io.rdmabridge.benchmarks.report.RunBenchmarks.Miss;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The parts of RESULTS.md built from channel results, from fixed rows: issue 13's targets (the same-host path against
 * epoll, Kafka and Spark), the cross-process table with both soft paths and the CPU column, and the replacement of the
 * Kafka and Spark target rows when those steps run alone.
 */
class ResultsPageTest {
    private static final int[] SIZES = {64, 1024, 65536, 1 << 20};

    /** Throughput GB/s, p50 us and CPU s/GB per size (64 B, 1 KiB, 64 KiB, 1 MiB) of each row. */
    private static Channels cross() {
        Channels c = new Channels();
        rows(c, Channels.RDMA_SHM, new double[] {0.1, 1.0, 5.0, 3.0}, new double[] {30, 40, 150, 300},
                new double[] {9, 2, 0.4, 0.9});
        rows(c, Channels.RDMA_TCP, new double[] {0.05, 0.5, 1.0, 1.5}, new double[] {90, 80, 200, 1200},
                new double[] {20, 4, 1.5, 1.2});
        rows(c, "epoll", new double[] {0.3, 2.0, 2.0, 2.0}, new double[] {20, 20, 100, 600},
                new double[] {6, 1, 0.5, 0.6});
        rows(c, "nio", new double[] {0.3, 1.8, 1.9, 1.8}, new double[] {25, 25, 110, 650},
                new double[] {7, 1.1, 0.6, 0.7});
        // Busy-polling: the 64 B ping-pong alone.
        c.put(Channels.RDMA_SHM_BUSY_POLL, 64, Channels.P50, new double[] {8, 16, 24, 1000});
        return c;
    }

    private static void rows(Channels c, String transport, double[] gbPerSecond, double[] p50, double[] cpu) {
        for (int i = 0; i < SIZES.length; i++) {
            c.put(transport, SIZES[i], Channels.MESSAGES, new double[] {gbPerSecond[i] * 1e9 / SIZES[i], 0});
            c.put(transport, SIZES[i], Channels.BYTES, new double[] {gbPerSecond[i] * 1e9, 0.1e9});
            c.put(transport, SIZES[i], Channels.P50, new double[] {p50[i], p50[i] * 2, p50[i] * 3, 1000});
            c.put(transport, SIZES[i], Channels.CPU, new double[] {cpu[i]});
        }
    }

    private static Channels inJvm() {
        Channels c = new Channels();
        for (int size : new int[] {1024, 65536}) {
            c.put("rdma", size, Channels.BYTES, new double[] {1e9, 0});
            c.put("local", size, Channels.BYTES, new double[] {4e9, 0});
        }
        return c;
    }

    private static KafkaReport kafka(Path dir) throws IOException {
        return KafkaReport.read(Files.writeString(dir.resolve("kafka.properties"), String.join("\n",
                "records=2000", "record.size=1024", "rounds=2", "schedule=on,off",
                "on.throughput.records_per_s=2200", "off.throughput.records_per_s=2000",
                "on.loaded.p50_ms=40", "off.loaded.p50_ms=50", "on.serial.p50_ms=10", "off.serial.p50_ms=8",
                "on.replication.rdma_bytes=6600000", "off.replication.rdma_bytes=0", "")));
    }

    @Test
    void shouldCheckIssue13TargetsOnTheSameHostPath(@TempDir Path dir) throws IOException {
        List<Miss> misses = new ArrayList<>();
        String md = RunBenchmarks.targets(inJvm(), cross(), List.of(new double[] {1024, 0, 5e9}), kafka(dir),
                new double[] {1.75, 0.37}, misses);
        assertTrue(md.startsWith("## Targets\n\n| target | size | measured | met |\n|---|---:|---:|:---:|\n"), md);
        List<String> expected = List.of(
                "| in-JVM throughput RDMA / LocalChannel >= 1.0 | 1 KiB | 0.25x | **no** |",
                "| in-JVM throughput RDMA / LocalChannel >= 1.0 | 64 KiB | 0.25x | **no** |",
                "| cross-process throughput RDMA same-host / epoll >= 1.0 | 1 KiB | 0.50x | **no** |",
                "| cross-process throughput RDMA same-host / epoll >= 2.0 | 64 KiB | 2.50x | yes |",
                "| cross-process throughput RDMA same-host / epoll >= 2.0 | 1 MiB | 1.50x | **no** |",
                "| cross-process p50 latency RDMA same-host / epoll <= 1.0 | 64 B | 1.50x | **no** |",
                "| cross-process p50 latency RDMA same-host busy-polling 100 us / epoll <= 0.5 | 64 B | 0.40x | yes |",
                "| cross-process CPU per GB RDMA same-host / epoll <= 1.0 | 64 KiB | 0.80x | yes |",
                "| cross-process CPU per GB RDMA same-host / epoll <= 1.0 | 1 MiB | 1.50x | **no** |",
                "| CPU-copied bytes on the registered path = 0 | 1 KiB | 0 of 5000000000 B | yes |",
                "| Kafka acks=all RF 3 throughput, records/s, plugin on / off >= 1.0 | 1 KiB records | 1.10x | yes |",
                "| Kafka acks=all RF 3 p50 latency under load, plugin on / off <= 1.0 | 1 KiB records | 0.80x | yes |",
                "| Kafka acks=all RF 3 p50 latency one at a time, plugin on / off <= 1.0 | 1 KiB records | 1.25x"
                        + " | **no** |",
                "| Spark TeraSort-style job time RDMA / SortShuffleManager <= 1.0 | 200 MB | 1.75x | **no** |",
                "| Spark TeraSort-style fetch wait RDMA / SortShuffleManager <= 0.5 | 200 MB | 0.37x | yes |");
        assertEquals(expected, md.lines().filter(l -> l.startsWith("| ") && !l.startsWith("| target")).toList());
        // Missed Kafka/Spark targets are said not to be profiled here.
        assertTrue(md.contains("The Kafka and Spark targets are not profiled here"), md);
        // Each missed channel target is profiled on its benchmark method, on the same-host path (RunBenchmarks).
        assertEquals(List.of(
                new Miss("in-JVM throughput RDMA / LocalChannel >= 1.0", 1024, InJvmChannelBenchmark.class,
                        "throughput"),
                new Miss("in-JVM throughput RDMA / LocalChannel >= 1.0", 65536, InJvmChannelBenchmark.class,
                        "throughput"),
                new Miss("cross-process throughput RDMA same-host / epoll >= 1.0", 1024,
                        CrossProcessChannelBenchmark.class, "throughput"),
                new Miss("cross-process throughput RDMA same-host / epoll >= 2.0", 1 << 20,
                        CrossProcessChannelBenchmark.class, "throughput"),
                new Miss("cross-process p50 latency RDMA same-host / epoll <= 1.0", 64,
                        CrossProcessChannelBenchmark.class, "latency"),
                new Miss("cross-process CPU per GB RDMA same-host / epoll <= 1.0", 1 << 20,
                        CrossProcessChannelBenchmark.class, "throughput")), misses);
    }

    @Test
    void shouldSayWhichTargetsThisRunDidNotMeasure() {
        List<Miss> misses = new ArrayList<>();
        Channels smoke = new Channels();
        for (String t : List.of(Channels.RDMA_SHM, "epoll")) {
            smoke.put(t, 1024, Channels.BYTES, new double[] {1e9, 0});
        }
        String md = RunBenchmarks.targets(new Channels(), smoke, List.of(), null, null, misses);
        assertTrue(md.contains("| cross-process throughput RDMA same-host / epoll >= 1.0 | 1 KiB | 1.00x | yes |\n"),
                md);
        assertTrue(md.contains("| cross-process throughput RDMA same-host / epoll >= 2.0 | 64 KiB | - | not measured"
                + " |\n"), md);
        assertTrue(md.contains("| cross-process CPU per GB RDMA same-host / epoll <= 1.0 | 1 MiB | - | not measured"
                + " |\n"), md);
        assertTrue(md.contains("| Kafka acks=all RF 3 throughput, records/s, plugin on / off >= 1.0 | - | - | not in"
                + " this run |\n"), md);
        assertTrue(md.contains("| Spark TeraSort-style fetch wait RDMA / SortShuffleManager <= 0.5 | 200 MB | - | not"
                + " in this run |\n"), md);
        assertFalse(md.contains("**no**") || md.contains("not profiled"), md);
        assertEquals(List.of(), misses);
    }

    @Test
    void shouldShowBothSoftPathsWithTheirCpuPerGb() {
        List<String> rows = RunBenchmarks.channelTable(cross()).lines().toList();
        assertEquals("| transport | size | messages/s | ± | GB/s | ± | CPU s/GB | p50 us | p99 us | p99.9 us | samples |",
                rows.get(0));
        // A row per transport and size, but the busy-polling ping-pong only at the size it was measured at.
        assertEquals(3 + 4 * SIZES.length, rows.size(), String.join("\n", rows));
        // Same-host path first (busy-polling after it), then the TCP path, then the baselines; every row has its CPU
        // figure.
        assertEquals("| rdma (same-host shm) | 64 KiB | 76294 | 0.000 | 5.000 | 0.100 | 0.400 | 150.000 | 300.000 | 450.000"
                + " | 1000 |", rows.get(4));
        assertEquals("| rdma (same-host shm, busy-poll 100 us) | 64 B | - | - | - | - | - | 8.000 | 16.000 | 24.000"
                + " | 1000 |", rows.get(6));
        assertEquals("| rdma (TCP path) | 1 MiB | 1431 | 0.000 | 1.500 | 0.100 | 1.200 | 1200 | 2400 | 3600 | 1000 |",
                rows.get(10));
        assertEquals("| epoll | 64 B | 4687500 | 0.000 | 0.300 | 0.100 | 6.000 | 20.000 | 40.000 | 60.000 | 1000 |",
                rows.get(11));
        assertTrue(rows.get(18).startsWith("| nio | 1 MiB |"), rows.get(18));
    }

    @Test
    void shouldNameRdmaRowsByTheirSoftPath() {
        assertEquals(Channels.RDMA_SHM, Channels.label("rdma", "shm", "0", "allocator"));
        assertEquals(Channels.RDMA_TCP, Channels.label("rdma", "tcp", "0", "allocator"));
        assertEquals("epoll", Channels.label("epoll", "shm", null, "allocator"));
        assertEquals(Channels.RDMA_SHM_BUSY_POLL, Channels.label("rdma", "shm", "100000", "allocator"));
        // In one JVM there is no sameHost parameter.
        assertEquals("rdma", Channels.label("rdma", null, null, "allocator"));
        assertEquals("rdma (same-host shm), file regions", Channels.label("rdma", "shm", "0", "file"));
        assertEquals("epoll, file regions", Channels.label("epoll", "shm", "0", "file"));
    }

    @Test
    void shouldReplaceOnlyTheKafkaRowsOfTheTargets() {
        String page = "# r\n\n## Targets\n\n| target | size | measured | met |\n|---|---:|---:|:---:|\n| a | 1 | 1x | yes |\n"
                + "| Kafka old 1 |\n| Kafka old 2 |\n| Spark s |\n\n## Kafka\n\n| Kafka not a target |\n";
        assertEquals("# r\n\n## Targets\n\n| target | size | measured | met |\n|---|---:|---:|:---:|\n| a | 1 | 1x | yes |\n"
                + "| Kafka new |\n| Spark s |\n\n## Kafka\n\n| Kafka not a target |\n",
                PageSections.replaceTargetRows(page, RunBenchmarks.KAFKA_ROW, "| Kafka new |\n"));
        // No such rows yet (a page from before them): they go at the end of the table.
        String older = "## Targets\n\n| target |\n|---|\n| a |\n\n## Next\n";
        assertEquals("## Targets\n\n| target |\n|---|\n| a |\n| Spark new |\n\n## Next\n",
                PageSections.replaceTargetRows(older, RunBenchmarks.SPARK_ROW, "| Spark new |\n"));
        assertEquals("no table\n", PageSections.replaceTargetRows("no table\n", RunBenchmarks.KAFKA_ROW, "| x |\n"));
    }

    @Test
    void shouldReadTheSparkRatiosFromTheDemoTable() {
        String section = "## Spark\n\n| | RdmaShuffleManager | SortShuffleManager | ratio RDMA / Spark |\n"
                + "|---|---:|---:|---:|\n| job time | 13.49 s | 7.68 s | 1.75 |\n"
                + "| shuffle fetch wait (sum over tasks) | 0.01 s | 0.00 s | - |\n";
        double[] ratios = SparkSection.ratios(section);
        assertEquals(1.75, ratios[0]);
        assertTrue(Double.isNaN(ratios[1]));
        assertArrayEquals(new double[] {Double.NaN, Double.NaN}, SparkSection.ratios("**failed**\n"));
    }
}
