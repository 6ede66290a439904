package io.rdmabridge.benchmarks.jmh;

import io.rdmabridge.benchmarks.Bench;
import io.rdmabridge.benchmarks.Transport;
import org.openjdk.jmh.annotations.Param;

/**
 * Client here, server in a child JVM on loopback (started in the trial setup from this class path, killed in the
 * teardown): the RDMA channel on the soft provider (whose queue pairs then talk over TCP) against Netty epoll and NIO.
 * Same operations as {@link InJvmChannelBenchmark}, from {@link ChannelBenchmark}.
 */
public class CrossProcessChannelBenchmark extends ChannelBenchmark {
    @Param({"rdma", "epoll", "nio"})
    public String transport;

    @Override
    Bench open(boolean echo) throws Exception {
        return Bench.crossProcess(Transport.of(transport), echo, size, batchBytes);
    }
}
