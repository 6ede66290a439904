package io.rdmabridge.benchmarks.jmh;

import io.rdmabridge.benchmarks.Bench;
import io.rdmabridge.benchmarks.Payload;
import io.rdmabridge.benchmarks.Transport;
import org.openjdk.jmh.annotations.Param;

/**
 * Client and server in one JVM: the RDMA channel on the soft provider's in-JVM path against Netty's LocalChannel.
 * The operations are {@link ChannelBenchmark}'s.
 */
public class InJvmChannelBenchmark extends ChannelBenchmark {
    @Param({"rdma", "local"})
    public String transport;

    @Override
    Bench open(boolean echo) throws Exception {
        return Bench.inJvm(Transport.of(transport), echo, size, batchBytes, Payload.ALLOCATOR);
    }
}
