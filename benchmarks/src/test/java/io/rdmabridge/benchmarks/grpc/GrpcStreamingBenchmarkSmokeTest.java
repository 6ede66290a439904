package io.rdmabridge.benchmarks.grpc;

import io.rdmabridge.benchmarks.Transport;
import io.rdmabridge.benchmarks.grpc.GrpcStreamingBenchmark.Config;
import io.rdmabridge.benchmarks.grpc.GrpcStreamingBenchmark.Trial;
import io.rdmabridge.verbs.RdmaProviders;
import io.rdmabridge.verbs.ResourceUsage;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The gRPC streaming benchmark at a tiny size, so that it cannot rot: one round of RDMA and NIO across processes,
 * every byte counted by the server, figures present (the soft engine thread's CPU on RDMA only), RDMA writes from registered memory with few copies, and the
 * client's soft-provider resources back to zero.
 */
class GrpcStreamingBenchmarkSmokeTest {

    @Test
    @Timeout(60)
    void shouldStreamOverRdmaAndNioAcrossProcesses() throws Exception {
        long bytes = 8L << 20;
        List<Trial> trials = GrpcStreamingBenchmark.run(new Config(bytes, 2L << 20, 1 << 20, 1));
        assertEquals(List.of(Transport.RDMA, Transport.NIO), trials.stream().map(Trial::transport).toList());
        for (Trial t : trials) {
            assertEquals(bytes, t.bytes(), "bytes the server counted over " + t.transport());
            assertTrue(t.mibPerSecond() > 0, GrpcStreamingBenchmark.format(t));
            assertTrue(t.clientCpuNanos() > 0 && t.serverCpuNanos() > 0, GrpcStreamingBenchmark.format(t));
        }
        // The soft provider's engine thread is found at both ends on RDMA (its name is what CpuClock looks for) and
        // is part of each process's CPU; NIO has none.
        Trial rdma = trials.get(0);
        assertTrue(rdma.clientEngineCpuNanos() > 0 && rdma.clientEngineCpuNanos() < rdma.clientCpuNanos(),
                GrpcStreamingBenchmark.format(rdma));
        assertTrue(rdma.serverEngineCpuNanos() > 0 && rdma.serverEngineCpuNanos() < rdma.serverCpuNanos(),
                GrpcStreamingBenchmark.format(rdma));
        assertEquals(0, trials.get(1).clientEngineCpuNanos());
        assertEquals(0, trials.get(1).serverEngineCpuNanos());
        // REGISTERED_ALLOCATOR: gRPC's buffers are registered memory, so little of the stream is copied.
        assertTrue(trials.get(0).copiedPerByte() < 0.1, GrpcStreamingBenchmark.format(trials.get(0)));
        assertTrue(Double.isNaN(trials.get(1).copiedPerByte()), "NIO has no RDMA channel to count copies on");

        ResourceUsage usage = RdmaProviders.byName("soft").resourceUsage();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        while (!usage.isZero() && System.nanoTime() < deadline) {
            Thread.sleep(20);
        }
        assertTrue(usage.isZero(), "leaked: " + usage);
    }
}
