package io.rdmabridge.benchmarks.perf;

import io.netty.channel.EventLoopGroup;
import io.rdmabridge.benchmarks.Bench;
import io.rdmabridge.benchmarks.Payload;
import io.rdmabridge.benchmarks.PerfClient;
import io.rdmabridge.benchmarks.Transport;
import io.rdmabridge.verbs.RdmaProvider;

import java.net.SocketAddress;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * {@code send_lat} and {@code send_bw} over a Netty channel (the RDMA channel, or epoll/NIO for the TCP baseline)
 * against a {@link io.rdmabridge.benchmarks.PerfServer}: a ping-pong driven by the client's event loop, and a stream of
 * messages from the channel's allocator acknowledged per 4 MiB batch. One connection per message size. Not
 * thread-safe.
 */
final class ChannelPerf {
    private static final int BATCH_BYTES = 4 << 20;

    private ChannelPerf() {
    }

    static List<PerfResult> runClient(Transport transport, RdmaProvider provider, SocketAddress server, PerfTest test,
                                      int[] sizes, long iterationsOverride, String path) throws Exception {
        if (test.isOneSided()) {
            throw new IllegalArgumentException(test.id() + " is a one-sided verbs pattern; a Netty channel has no"
                    + " RDMA WRITE/READ of its own (expected: --api verbs, or send_lat / send_bw)");
        }
        List<PerfResult> rows = new ArrayList<>();
        EventLoopGroup group = transport.newGroup(1, provider);
        try {
            for (int size : sizes) {
                long iterations = iterationsOverride > 0 ? iterationsOverride
                        : VerbsPerf.defaultIterations(test, size);
                rows.add(test.isLatency() ? latency(transport, group, server, size, (int) iterations, path)
                        : bandwidth(transport, group, server, size, iterations, path));
            }
        } finally {
            group.shutdownGracefully(0, 5, TimeUnit.SECONDS).syncUninterruptibly();
        }
        return rows;
    }

    private static PerfResult latency(Transport transport, EventLoopGroup group, SocketAddress server, int size,
                                      int iterations, String path) throws Exception {
        try (PerfClient client = PerfClient.echo(transport, group, server, size)) {
            client.roundTripsOnEventLoop(Math.max(1, iterations / 10));
            long cpu0 = CpuClock.processNanos();
            long start = System.nanoTime();
            long[] rtt = client.roundTripsOnEventLoop(iterations);
            long nanos = System.nanoTime() - start;
            long cpu = CpuClock.processNanos() - cpu0;
            Arrays.sort(rtt);
            return PerfResult.of(PerfTest.SEND_LAT.id(), path, size, iterations, nanos, 2L * size * iterations, rtt,
                    cpu, -1);
        }
    }

    private static PerfResult bandwidth(Transport transport, EventLoopGroup group, SocketAddress server, int size,
                                        long iterations, String path) throws Exception {
        int perBatch = Bench.messagesPerBatch(size, BATCH_BYTES);
        long batches = Math.max(1, (iterations + perBatch - 1) / perBatch);
        try (PerfClient client = PerfClient.sink(transport, group, server, size, perBatch, Payload.ALLOCATOR)) {
            for (long b = 0; b < Math.max(1, batches / 10); b++) {
                client.streamBatch();
            }
            client.drain();
            long cpu0 = CpuClock.processNanos();
            long start = System.nanoTime();
            for (long b = 0; b < batches; b++) {
                client.streamBatch();
            }
            client.drain();
            long nanos = System.nanoTime() - start;
            long cpu = CpuClock.processNanos() - cpu0;
            long messages = batches * perBatch;
            return PerfResult.of(PerfTest.SEND_BW.id(), path, size, messages, nanos, messages * size, null, cpu, -1);
        }
    }
}
