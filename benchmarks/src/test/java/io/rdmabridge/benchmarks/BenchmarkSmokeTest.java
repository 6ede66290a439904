package io.rdmabridge.benchmarks;

import io.rdmabridge.benchmarks.perf.PerfResult;
import io.rdmabridge.benchmarks.perf.RdmaPerf;
import io.rdmabridge.benchmarks.report.BenchmarkSuite;
import io.rdmabridge.verbs.RdmaProviders;
import io.rdmabridge.verbs.ResourceUsage;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.openjdk.jmh.results.Result;
import org.openjdk.jmh.results.RunResult;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Runs every benchmark in smoke mode so none rots: the whole JMH suite in this JVM (one size, one short iteration),
 * the cross-process RDMA rows on both soft paths (and the same-host ping-pong busy-polling, and file regions beside
 * epoll's), and every rdma-perf pattern in loopback with tiny sizes. Asserts that each produced a result, that
 * throughput and its CPU cost are non-zero, and that the registered path copied no byte.
 */
class BenchmarkSmokeTest {

    @AfterEach
    void resourcesReturned() throws InterruptedException {
        ResourceUsage usage = RdmaProviders.byName("soft").resourceUsage();
        // Queue pairs of closed channels are torn down on their event loops just after close() returns.
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        while (!usage.isZero() && System.nanoTime() < deadline) {
            Thread.sleep(20);
        }
        assertTrue(usage.isZero(), "leaked: " + usage);
    }

    @Test
    @Timeout(150)
    void shouldRunEveryJmhBenchmarkWithResults() throws Exception {
        List<RunResult> results = BenchmarkSuite.runAll(true, 0);
        Map<String, RunResult> byKey = new TreeMap<>();
        for (RunResult r : results) {
            String benchmark = r.getParams().getBenchmark();
            String transport = r.getParams().getParam("transport");
            String key = benchmark.substring(benchmark.lastIndexOf('.', benchmark.lastIndexOf('.') - 1) + 1) + " "
                    + (transport != null ? transport : r.getParams().getParam("payload"));
            // Cross-process RDMA runs once per soft path.
            if ("rdma".equals(transport) && r.getParams().getParam("sameHost") != null) {
                key += "/" + r.getParams().getParam("sameHost");
                // And the same-host ping-pong once more with busy-polling event loops.
                String busyPoll = r.getParams().getParam("busyPollNanos");
                if (busyPoll != null && !"0".equals(busyPoll)) {
                    key += "/busy-poll";
                }
            }
            // And the cross-process throughput once more writing file regions.
            if (benchmark.endsWith("CrossProcessChannelBenchmark.throughput")
                    && "file".equals(r.getParams().getParam("payload"))) {
                key += "/file";
            }
            assertNull(byKey.put(key, r), "two results for " + key);
        }
        for (String t : List.of("rdma", "local")) {
            assertThroughput(byKey.get("InJvmChannelBenchmark.throughput " + t));
            assertLatency(byKey.get("InJvmChannelBenchmark.latency " + t));
        }
        for (String t : List.of("rdma/shm", "rdma/tcp", "epoll", "nio")) {
            assertThroughput(byKey.get("CrossProcessChannelBenchmark.throughput " + t));
            assertLatency(byKey.get("CrossProcessChannelBenchmark.latency " + t));
        }
        assertLatency(byKey.get("CrossProcessChannelBenchmark.latency rdma/shm/busy-poll"));
        for (String t : List.of("rdma/shm/file", "epoll/file")) {
            assertThroughput(byKey.get("CrossProcessChannelBenchmark.throughput " + t));
        }
        RunResult allocator = byKey.get("CopiedBytesBenchmark.write allocator");
        assertNotNull(allocator, "no result for the allocator payload: " + byKey.keySet());
        assertTrue(secondary(allocator, "payloadBytes") > 0);
        assertEquals(0, secondary(allocator, "copiedBytes"), "registered buffers were copied");
        RunResult heap = byKey.get("CopiedBytesBenchmark.write heap");
        assertTrue(secondary(heap, "payloadBytes") > 0);
        assertEquals(secondary(heap, "payloadBytes"), secondary(heap, "copiedBytes"),
                "a heap buffer is copied exactly once into registered memory");
        RunResult file = byKey.get("CopiedBytesBenchmark.write file");
        assertTrue(secondary(file, "payloadBytes") > 0);
        assertEquals(0, secondary(file, "copiedBytes"), "file regions go from mapped, registered chunks");
    }

    private static void assertThroughput(RunResult r) {
        assertNotNull(r, "missing throughput result");
        assertTrue(r.getPrimaryResult().getScore() > 0, r.getParams().getBenchmark() + ": zero batches/s");
        assertTrue(secondary(r, "bytes") > 0, r.getParams().getBenchmark() + ": zero bytes/s");
        assertTrue(secondary(r, "messages") > 0, r.getParams().getBenchmark() + ": zero messages/s");
        // CPU per GB: the CPU time of the processes taking part, over the bytes moved in that window.
        assertTrue(secondary(r, "cpuNanos") > 0, r.getParams().getBenchmark() + ": no CPU time");
        assertTrue(secondary(r, "cpuBytes") > 0, r.getParams().getBenchmark() + ": no bytes in the CPU window");
    }

    private static void assertLatency(RunResult r) {
        assertNotNull(r, "missing latency result");
        assertTrue(r.getPrimaryResult().getStatistics().getN() > 0, "no latency samples");
        assertTrue(r.getPrimaryResult().getStatistics().getPercentile(50) > 0, "zero p50");
    }

    private static double secondary(RunResult r, String name) {
        Result<?> result = r.getSecondaryResults().get(name);
        assertNotNull(result, "no secondary result '" + name + "' in " + r.getSecondaryResults().keySet());
        return result.getScore();
    }

    @ParameterizedTest
    @ValueSource(strings = {"send_lat", "send_bw", "write_bw", "read_bw", "send_lat --api netty",
        "send_bw --api netty", "send_lat --baseline tcp", "send_bw --baseline tcp"})
    @Timeout(60)
    void shouldMeasureInLoopback(String pattern) throws Exception {
        String[] args = (pattern + " --sizes 64,4096 --iterations 200").split(" ");
        List<PerfResult> rows = RdmaPerf.measure(args);
        assertEquals(2, rows.size());
        for (PerfResult r : rows) {
            assertEquals(pattern.split(" ")[0], r.test());
            assertTrue(r.gbPerSecond() > 0 && r.messagesPerSecond() > 0, "no throughput: " + r);
            assertEquals(!r.test().endsWith("_lat"), Double.isNaN(r.p50Micros()), "latency only for *_lat: " + r);
            if (r.test().endsWith("_lat")) {
                assertTrue(r.p50Micros() > 0 && r.p50Micros() <= r.p99Micros() && r.p99Micros() <= r.p999Micros(),
                        "percentiles out of order: " + r);
            }
        }
    }

    @Test
    void shouldRefuseOneSidedPatternsOnTheChannel() {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        int status = RdmaPerf.run(new String[] {"write_bw", "--api", "netty"}, new PrintStream(out, true,
                StandardCharsets.UTF_8));
        assertEquals(2, status);
        String text = out.toString(StandardCharsets.UTF_8);
        assertTrue(text.contains("write_bw is a one-sided verbs pattern"), text);
        assertFalse(text.contains("Exception"), text);
    }

    @Test
    void shouldPrintATablePerRun() {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        int status = RdmaPerf.run(new String[] {"write_bw", "--size", "1024", "--iterations", "100"},
                new PrintStream(out, true, StandardCharsets.UTF_8));
        String text = out.toString(StandardCharsets.UTF_8);
        assertEquals(0, status, text);
        assertTrue(text.contains("rdma-perf write_bw  path=verbs/soft"), text);
        assertTrue(text.matches("(?s).*\\n\\s+1024\\s+100\\s+\\d+\\.\\d+.*"), text);
    }
}
