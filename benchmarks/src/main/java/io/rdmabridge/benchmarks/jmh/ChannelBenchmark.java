package io.rdmabridge.benchmarks.jmh;

import io.rdmabridge.benchmarks.Bench;
import io.rdmabridge.benchmarks.PerfClient;
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
import org.openjdk.jmh.infra.BenchmarkParams;

import java.util.concurrent.TimeUnit;

/**
 * The two operations every channel benchmark measures, on the client and server a subclass opens for its
 * {@code transport} parameter (JMH runs each subclass under its own name).
 * {@code throughput}: batches of {@code batchBytes} of {@code size}-byte messages from the channel's allocator, one
 * batch in flight behind the one being written (messages/s and bytes/s in the secondary results, and the CPU time of
 * both ends with the bytes moved meanwhile: {@link CpuCost}).
 * {@code latency}: one ping-pong of {@code size} bytes, timed from the benchmark thread (so it includes the hand-off
 * to and from the event loop, the same for every transport).
 */
@State(Scope.Benchmark)
@Fork(value = 1, jvmArgsAppend = {"-Xmx1g", "-XX:MaxDirectMemorySize=2g", "-Dio.netty.leakDetection.level=disabled",
        "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED"})
@Warmup(iterations = 2, time = 1)
@Measurement(iterations = 3, time = 2)
public abstract class ChannelBenchmark {
    @Param({"64", "1024", "65536", "1048576", "4194304"})
    public int size;

    @Param("4194304")
    public int batchBytes;

    private Bench bench;
    private PerfClient client;

    /** Starts the server and connects the client; {@code echo}: the server answers each message (latency). */
    abstract Bench open(boolean echo) throws Exception;

    @Setup(Level.Trial)
    public void setUp(BenchmarkParams params) throws Exception {
        bench = open(params.getBenchmark().endsWith(".latency"));
        client = bench.client();
    }

    @TearDown(Level.Trial)
    public void tearDown() throws Exception {
        bench.close();
    }

    @Benchmark
    @BenchmarkMode(Mode.Throughput)
    @OutputTimeUnit(TimeUnit.SECONDS)
    public void throughput(Traffic traffic, CpuCost cpu) {
        cpu.open(bench);
        client.streamBatch();
        int messages = client.messagesPerBatch();
        traffic.add(messages, size);
        cpu.add((long) messages * size);
    }

    @Benchmark
    @BenchmarkMode(Mode.SampleTime)
    @OutputTimeUnit(TimeUnit.MICROSECONDS)
    public void latency() {
        client.roundTrip();
    }
}
