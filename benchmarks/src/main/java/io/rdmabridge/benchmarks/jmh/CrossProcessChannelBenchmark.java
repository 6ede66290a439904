package io.rdmabridge.benchmarks.jmh;

import io.rdmabridge.benchmarks.Bench;
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
import org.openjdk.jmh.infra.BenchmarkParams;

import java.util.concurrent.TimeUnit;

/**
 * Client here, server in a child JVM on loopback (started in the trial setup from this class path, killed in the
 * teardown): the RDMA channel on the soft provider (whose queue pairs then talk over TCP) against Netty epoll and NIO.
 * Same operations as {@link InJvmChannelBenchmark}.
 */
@State(Scope.Benchmark)
@Fork(value = 1, jvmArgsAppend = {"-Xmx1g", "-XX:MaxDirectMemorySize=2g", "-Dio.netty.leakDetection.level=disabled",
        "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED"})
@Warmup(iterations = 2, time = 1)
@Measurement(iterations = 3, time = 2)
public class CrossProcessChannelBenchmark {
    @Param({"rdma", "epoll", "nio"})
    public String transport;

    @Param({"64", "1024", "65536", "1048576", "4194304"})
    public int size;

    @Param("4194304")
    public int batchBytes;

    private Bench bench;
    private PerfClient client;

    @Setup(Level.Trial)
    public void setUp(BenchmarkParams params) throws Exception {
        boolean echo = params.getBenchmark().endsWith(".latency");
        bench = Bench.crossProcess(Transport.of(transport), echo, size, batchBytes);
        client = bench.client();
    }

    @TearDown(Level.Trial)
    public void tearDown() throws Exception {
        bench.close();
    }

    @Benchmark
    @BenchmarkMode(Mode.Throughput)
    @OutputTimeUnit(TimeUnit.SECONDS)
    public void throughput(Traffic traffic) {
        client.streamBatch();
        traffic.add(client.messagesPerBatch(), size);
    }

    @Benchmark
    @BenchmarkMode(Mode.SampleTime)
    @OutputTimeUnit(TimeUnit.MICROSECONDS)
    public void latency() {
        client.roundTrip();
    }
}
