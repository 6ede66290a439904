package io.rdmabridge.benchmarks.jmh;

import io.rdmabridge.benchmarks.Bench;
import io.rdmabridge.benchmarks.Payload;
import io.rdmabridge.benchmarks.RdmaTuning;
import io.rdmabridge.benchmarks.Transport;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Warmup;

/**
 * Client here, server in a child JVM on loopback (started in the trial setup from this class path, killed in the
 * teardown): the RDMA channel on the soft provider (whose queue pairs then talk over TCP) against Netty epoll and NIO.
 * Same operations as {@link InJvmChannelBenchmark}, from {@link ChannelBenchmark}.
 *
 * <p>{@code sameHost} = {@code tcp} puts the soft provider on its TCP link at both ends (by default, {@code shm}, both
 * take its same-host shared-memory path).
 * {@code rendezvousThreshold} and {@code receiveBufferSize} (0: the channel's defaults) override those RDMA options
 * at both ends ({@link RdmaTuning}), so candidate defaults can be measured against each other in one run;
 * {@code busyPollNanos} (0: off) sets {@link io.rdmabridge.netty.RdmaChannelOption#BUSY_POLL_BUDGET_NANOS} at both
 * ends and {@code ringSpinMicros} the soft engine's ring polling ({@code rdmabridge.soft.ringSpinMicros}), for the
 * busy-polling latency target; epoll and NIO ignore both.
 *
 * <p>Warm-up is 6 x 2 s, longer than in one JVM: two JVMs compile at once on the cores that also move the bytes, and
 * the RDMA rows, whose path is Java code where epoll's is the kernel's, kept climbing through 10 s of it (C2 still
 * compiling in the client at 10 s; 4 MiB batches/s 133, 215, 257, 342, 503, 750 over the first six 2-s iterations)
 * while epoll's were flat after 4 s. Measured after a short warm-up they showed the ramp, not the path.
 */
@Warmup(iterations = 6, time = 2)
public class CrossProcessChannelBenchmark extends ChannelBenchmark {
    @Param({"rdma", "epoll", "nio"})
    public String transport;

    @Param("0")
    public int rendezvousThreshold;

    @Param("0")
    public int receiveBufferSize;

    /**
     * The soft provider's path between the two processes ({@code rdmabridge.soft.sameHost}), both ends alike:
     * {@code shm} (the provider's default: frames through shared-memory rings, WRITE and READ one-sided) or {@code tcp}
     * (its TCP link, the path between hosts).
     */
    @Param("shm")
    public String sameHost;

    /** The event loops' busy-poll budget at both ends, in nanoseconds (RDMA only; 0: off, the default). */
    @Param("0")
    public long busyPollNanos;

    /** The soft engine's ring polling after the last frame at both ends, in microseconds (RDMA only; 0: default). */
    @Param("0")
    public int ringSpinMicros;

    /**
     * {@link io.rdmabridge.netty.RdmaChannelOption#SEND_COMPLETION_POLL_NANOS} at both ends (RDMA only; -1: the
     * channel's default, 0: off).
     */
    @Param("-1")
    public long sendCompletionPollNanos;

    /**
     * The soft provider's held acknowledgements at both ends ({@code rdmabridge.soft.holdAcknowledgements}; RDMA
     * only): {@code true} (the default) lets a poller's answer carry the acknowledgement of what it answers.
     */
    @Param("true")
    public String holdAcknowledgements;

    /**
     * The soft provider's copy helper at both ends ({@code rdmabridge.soft.copyHelper}): {@code true} (the default)
     * shares large one-sided copies between the requester's drainer and a second thread, {@code false} leaves them to
     * the drainer alone.
     */
    @Param("true")
    public String copyHelper;

    /**
     * What {@code throughput} writes ({@link io.rdmabridge.benchmarks.Payload}): {@code allocator} (buffers from the
     * channel's allocator, the default) or {@code file} ({@code DefaultFileRegion}s of a temporary file, one per
     * message, as Spark's block server sends shuffle blocks; epoll and NIO send them with {@code sendfile}).
     */
    @Param("allocator")
    public String payload;

    /**
     * The soft provider's links to mapped files at both ends ({@code rdmabridge.soft.fileLinks}; RDMA only):
     * {@code true} (the default) lets the same-host peer READ a file region's rendezvous from the file itself,
     * {@code false} has the sender's provider serve it from its mapping.
     */
    @Param("true")
    public String fileLinks;

    @Override
    Bench open(boolean echo) throws Exception {
        // Each parameter combination runs in its own forked JVM, so the properties only reach this trial.
        if (rendezvousThreshold > 0) {
            System.setProperty(RdmaTuning.RENDEZVOUS_THRESHOLD, Integer.toString(rendezvousThreshold));
        }
        if (receiveBufferSize > 0) {
            System.setProperty(RdmaTuning.RECEIVE_BUFFER_SIZE, Integer.toString(receiveBufferSize));
        }
        if (busyPollNanos > 0) {
            System.setProperty(RdmaTuning.BUSY_POLL_NANOS, Long.toString(busyPollNanos));
        }
        if (ringSpinMicros > 0) {
            System.setProperty(RdmaTuning.RING_SPIN_MICROS, Integer.toString(ringSpinMicros));
        }
        System.setProperty(RdmaTuning.SAME_HOST, sameHost);
        System.setProperty(RdmaTuning.COPY_HELPER, copyHelper);
        System.setProperty(RdmaTuning.HOLD_ACKNOWLEDGEMENTS, holdAcknowledgements);
        System.setProperty(RdmaTuning.FILE_LINKS, fileLinks);
        if (sendCompletionPollNanos >= 0) {
            System.setProperty(RdmaTuning.SEND_COMPLETION_POLL_NANOS, Long.toString(sendCompletionPollNanos));
        }
        return Bench.crossProcess(Transport.of(transport), echo, size, batchBytes, Payload.of(payload));
    }
}
