package io.rdmabridge.benchmarks.jmh;

import io.rdmabridge.benchmarks.Bench;
import io.rdmabridge.benchmarks.Payload;
import io.rdmabridge.benchmarks.PerfClient;
import io.rdmabridge.benchmarks.Transport;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

import java.util.concurrent.TimeUnit;

/**
 * CPU-copied bytes per payload byte on the RDMA channel (in-JVM, soft provider), read from the channel's own
 * counters: buffers from the channel's allocator (registered: expected 0), heap buffers (copied once: expected 1)
 * and file regions (mapped, registered chunks). Each invocation writes one batch and waits for its acknowledgement,
 * so the counters are exact per invocation. The primary score (batches/s) is secondary here.
 */
@State(Scope.Benchmark)
@Fork(value = 1, jvmArgsAppend = {"-Xmx1g", "-XX:MaxDirectMemorySize=2g", "-Dio.netty.leakDetection.level=disabled",
        "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED"})
@Warmup(iterations = 1, time = 1)
@Measurement(iterations = 2, time = 1)
@BenchmarkMode(Mode.Throughput)
@OutputTimeUnit(TimeUnit.SECONDS)
public class CopiedBytesBenchmark {
    @Param({"allocator", "heap", "file"})
    public String payload;

    @Param({"1024", "65536"})
    public int size;

    @Param("1048576")
    public int batchBytes;

    private Bench bench;
    private PerfClient client;

    @Setup(Level.Trial)
    public void setUp() throws Exception {
        bench = Bench.inJvm(Transport.RDMA, false, size, batchBytes, Payload.of(payload));
        client = bench.client();
    }

    @TearDown(Level.Trial)
    public void tearDown() throws Exception {
        bench.close();
    }

    @Benchmark
    public void write(Copies copies) {
        long before = client.copiedBytes();
        client.streamBatch();
        client.drain();
        copies.copiedBytes += client.copiedBytes() - before;
        copies.payloadBytes += (long) client.messagesPerBatch() * size;
    }
}
