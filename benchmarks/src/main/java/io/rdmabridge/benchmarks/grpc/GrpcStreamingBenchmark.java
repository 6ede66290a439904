package io.rdmabridge.benchmarks.grpc;

import io.grpc.CallOptions;
import io.grpc.ClientCall;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.netty.NettyChannelBuilder;
import io.netty.channel.Channel;
import io.netty.channel.EventLoopGroup;
import io.rdmabridge.benchmarks.Bench;
import io.rdmabridge.benchmarks.ChildServer;
import io.rdmabridge.benchmarks.RdmaTuning;
import io.rdmabridge.benchmarks.Transport;
import io.rdmabridge.benchmarks.perf.CpuClock;
import io.rdmabridge.netty.RdmaChannelOption;
import io.rdmabridge.netty.RdmaSocketChannel;
import io.rdmabridge.verbs.RdmaProvider;

import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

/**
 * gRPC client streaming across processes, the RDMA channel (soft provider,
 * {@link RdmaChannelOption#REGISTERED_ALLOCATOR} at both ends, and with {@link Config#copiedToo()} also gRPC's own
 * allocator) against NIO: the client here, the server ({@link GrpcStreamServer}) in a child JVM on loopback. Each
 * trial starts a fresh server and client, streams an untimed warm-up call, then one timed call of {@code bytes} in
 * {@code messageBytes} messages (sent while the call is ready, so gRPC's flow control paces it). Transports alternate
 * within a round and swap order every round, so that both see the same machine load.
 *
 * <p>Per trial: MiB/s from the first message to the server's answer; process CPU seconds per GiB at the client (this
 * JVM) and at the server (the child reports its own); CPU-copied bytes per byte on the client's RDMA channel.
 * Not thread-safe: one run at a time from one thread.
 */
public final class GrpcStreamingBenchmark {
    /**
     * The channel's switch for copied writes ({@code RdmaChannelOutbound}; on by default: their promises complete once
     * the copy is posted). When set for this JVM, the child server of every trial gets the same value.
     */
    static final String COMPLETE_COPIES_ON_POST = "rdmabridge.channel.completeCopiesOnPost";

    private static final long TIMEOUT_NANOS = TimeUnit.SECONDS.toNanos(120);

    private GrpcStreamingBenchmark() {
    }

    /**
     * What to run.
     *
     * @param bytes        bytes of each timed call
     * @param warmupBytes  bytes of the untimed call before it
     * @param messageBytes bytes per gRPC message
     * @param rounds       trials per transport
     * @param copiedToo    whether each round also runs RDMA without {@link RdmaChannelOption#REGISTERED_ALLOCATOR}
     *                     (gRPC's own buffers, copied into registered memory by the channel)
     */
    public record Config(long bytes, long warmupBytes, int messageBytes, int rounds, boolean copiedToo) {
        public Config {
            if (bytes < messageBytes || warmupBytes < 0 || messageBytes <= 0 || rounds <= 0) {
                throw new IllegalArgumentException(this + " (expected: bytes >= messageBytes > 0, warmupBytes >= 0,"
                        + " rounds > 0)");
            }
        }

        /** RDMA with {@link RdmaChannelOption#REGISTERED_ALLOCATOR} only. */
        public Config(long bytes, long warmupBytes, int messageBytes, int rounds) {
            this(bytes, warmupBytes, messageBytes, rounds, false);
        }
    }

    /**
     * One timed call.
     *
     * @param transport       the transport of both ends
     * @param round           1-based round
     * @param bytes           request bytes the server counted
     * @param nanos           wall time from the first message to the answer
     * @param clientCpuNanos  this process's CPU time over the call
     * @param serverCpuNanos  the server process's CPU time between its answers to the warm-up and the timed call
     * @param clientEngineCpuNanos of {@code clientCpuNanos}, the soft provider's engine thread's (0 for NIO)
     * @param serverEngineCpuNanos of {@code serverCpuNanos}, the soft provider's engine thread's (0 for NIO)
     * @param copiedBytes     bytes the client's RDMA channel copied with the CPU during the call; -1 for NIO
     * @param registered      RDMA: whether both ends used {@link RdmaChannelOption#REGISTERED_ALLOCATOR}
     */
    public record Trial(Transport transport, int round, long bytes, long nanos, long clientCpuNanos,
                        long serverCpuNanos, long clientEngineCpuNanos, long serverEngineCpuNanos,
                        long copiedBytes, boolean registered) {
        /** The transport, and for RDMA whose buffers it sent. */
        public String label() {
            return transport != Transport.RDMA ? transport.id()
                    : registered ? "rdma, registered allocator" : "rdma, gRPC's allocator";
        }

        public double mibPerSecond() {
            return bytes / (1024.0 * 1024.0) / (nanos / 1e9);
        }

        public double clientCpuSecondsPerGib() {
            return clientCpuNanos / 1e9 / (bytes / (double) (1L << 30));
        }

        public double serverCpuSecondsPerGib() {
            return serverCpuNanos / 1e9 / (bytes / (double) (1L << 30));
        }

        /** Client CPU per GiB without the soft provider's engine thread: what would be left with a NIC. */
        public double clientHostCpuSecondsPerGib() {
            return (clientCpuNanos - clientEngineCpuNanos) / 1e9 / (bytes / (double) (1L << 30));
        }

        /** Server CPU per GiB without the soft provider's engine thread: what would be left with a NIC. */
        public double serverHostCpuSecondsPerGib() {
            return (serverCpuNanos - serverEngineCpuNanos) / 1e9 / (bytes / (double) (1L << 30));
        }

        public double copiedPerByte() {
            return copiedBytes < 0 ? Double.NaN : copiedBytes / (double) bytes;
        }
    }

    /** Runs {@code config.rounds()} trials of RDMA and of NIO, alternating; returns them in the order run. */
    public static List<Trial> run(Config config) throws Exception {
        List<Trial> trials = new ArrayList<>();
        for (int round = 1; round <= config.rounds(); round++) {
            Transport[] order = round % 2 == 1 ? new Transport[] {Transport.RDMA, Transport.NIO}
                    : new Transport[] {Transport.NIO, Transport.RDMA};
            for (Transport t : order) {
                trials.add(trial(t, round, config, true));
                if (t == Transport.RDMA && config.copiedToo()) {
                    trials.add(trial(t, round, config, false));
                }
            }
        }
        return trials;
    }

    private static Trial trial(Transport transport, int round, Config config, boolean registered) throws Exception {
        RdmaProvider provider = transport == Transport.RDMA ? Transport.provider(Bench.providerName()) : null;
        byte[] message = new byte[config.messageBytes()];
        ThreadLocalRandom.current().nextBytes(message);
        List<Channel> channels = new ArrayList<>();
        List<String> jvmOptions = new ArrayList<>();
        if (!registered) {
            jvmOptions.add("-D" + GrpcStreamServer.COPIED_PROPERTY + "=true");
        }
        if (System.getProperty(COMPLETE_COPIES_ON_POST) != null) {
            jvmOptions.add("-D" + COMPLETE_COPIES_ON_POST + "=" + System.getProperty(COMPLETE_COPIES_ON_POST));
        }
        try (ChildServer server = ChildServer.start(GrpcStreamServer.class, transport, Bench.providerName(),
                jvmOptions)) {
            EventLoopGroup group = transport.newGroup(1, provider);
            NettyChannelBuilder b = NettyChannelBuilder.forAddress(server.address())
                    .channelFactory(() -> {
                        Channel ch = newChannel(transport);
                        channels.add(ch);
                        return ch;
                    }, InetSocketAddress.class)
                    .eventLoopGroup(group).directExecutor().usePlaintext();
            if (transport == Transport.RDMA) {
                b.withOption(RdmaChannelOption.REGISTERED_ALLOCATOR, registered);
                RdmaTuning.forEach(b::withOption);
            }
            ManagedChannel channel = b.build();
            try {
                UploadMethod.Reply warm = upload(channel, message, config.warmupBytes());
                long copied0 = copied(channels);
                long cpu0 = CpuClock.processNanos();
                // NIO uses no soft provider; an engine left from an earlier RDMA trial in this JVM is not its cost.
                boolean rdma = transport == Transport.RDMA;
                long engine0 = rdma ? CpuClock.threadNanos(CpuClock.SOFT_ENGINE_THREAD) : 0;
                long t0 = System.nanoTime();
                UploadMethod.Reply timed = upload(channel, message, config.bytes());
                long nanos = System.nanoTime() - t0;
                long cpu = CpuClock.processNanos() - cpu0;
                long engine = rdma ? CpuClock.threadNanos(CpuClock.SOFT_ENGINE_THREAD) - engine0 : 0;
                long copied = transport == Transport.RDMA ? copied(channels) - copied0 : -1;
                return new Trial(transport, round, timed.bytes(), nanos, cpu, timed.cpuNanos() - warm.cpuNanos(),
                        engine, timed.engineCpuNanos() - warm.engineCpuNanos(), copied, rdma && registered);
            } finally {
                channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
                group.shutdownGracefully(0, 5, TimeUnit.SECONDS).syncUninterruptibly();
            }
        }
    }

    private static Channel newChannel(Transport transport) {
        try {
            return transport.channelClass().getConstructor().newInstance();
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException("cannot create a " + transport.id() + " channel", e);
        }
    }

    private static long copied(List<Channel> channels) {
        long copied = 0;
        for (Channel ch : channels) {
            if (ch instanceof RdmaSocketChannel) {
                copied += ((RdmaSocketChannel) ch).metrics().copiedBytes();
            }
        }
        return copied;
    }

    /**
     * One client-streaming call of {@code bytes} (whole messages, at least one), each message sent once the call is
     * ready for it; returns the server's answer after checking that it counted every byte.
     */
    private static UploadMethod.Reply upload(ManagedChannel channel, byte[] message, long bytes) {
        long messages = Math.max(1, bytes / message.length);
        ClientCall<byte[], UploadMethod.Reply> call = channel.newCall(UploadMethod.CLIENT, CallOptions.DEFAULT);
        CompletableFuture<UploadMethod.Reply> done = new CompletableFuture<>();
        Thread sender = Thread.currentThread();
        call.start(new ClientCall.Listener<>() {
            private UploadMethod.Reply reply;

            @Override
            public void onMessage(UploadMethod.Reply message) {
                reply = message;
            }

            @Override
            public void onReady() {
                LockSupport.unpark(sender);
            }

            @Override
            public void onClose(Status status, Metadata trailers) {
                if (status.isOk() && reply != null) {
                    done.complete(reply);
                } else {
                    done.completeExceptionally(status.withDescription("upload ended without an answer: "
                            + status.getDescription()).asRuntimeException());
                }
                LockSupport.unpark(sender);
            }
        }, new Metadata());
        call.request(1);
        long deadline = System.nanoTime() + TIMEOUT_NANOS;
        for (long i = 0; i < messages; i++) {
            while (!call.isReady()) {
                if (done.isDone() || System.nanoTime() - deadline > 0) {
                    call.cancel("benchmark gave up", null);
                    throw new IllegalStateException("upload stopped after " + i + " of " + messages + " messages"
                            + (done.isDone() ? ": " + done.handle((r, e) -> e).join() : " (no progress in 120 s)"));
                }
                // onReady unparks; the timeout only bounds a missed wake-up.
                LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(10));
            }
            call.sendMessage(message);
        }
        call.halfClose();
        UploadMethod.Reply reply = done.orTimeout(120, TimeUnit.SECONDS).join();
        if (reply.bytes() != messages * message.length) {
            throw new IllegalStateException("server counted " + reply.bytes() + " bytes (expected: "
                    + messages * message.length + ")");
        }
        return reply;
    }

    /** Median of {@code values}. */
    public static double median(double[] values) {
        double[] v = values.clone();
        Arrays.sort(v);
        return v.length % 2 == 1 ? v[v.length / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
    }

    /**
     * {@code GrpcStreamingBenchmark [MiB [rounds [messageBytes]]]} (defaults 256, 3, 1 MiB; warm-up as many bytes):
     * prints one line per trial.
     */
    public static void main(String[] args) throws Exception {
        long mib = args.length > 0 ? Long.parseLong(args[0]) : 256;
        int rounds = args.length > 1 ? Integer.parseInt(args[1]) : 3;
        int messageBytes = args.length > 2 ? Integer.parseInt(args[2]) : 1 << 20;
        for (Trial t : run(new Config(mib << 20, mib << 20, messageBytes, rounds, true))) {
            System.out.println(format(t));
        }
        System.exit(0);
    }

    /** One trial as a line of text. */
    public static String format(Trial t) {
        return String.format(Locale.ROOT, "round %d %-26s %8.1f MiB/s  CPU s/GiB client %.2f server %.2f"
                + " (without the soft engine thread: %.2f, %.2f)  copied/byte %.4f", t.round(), t.label(),
                t.mibPerSecond(), t.clientCpuSecondsPerGib(), t.serverCpuSecondsPerGib(),
                t.clientHostCpuSecondsPerGib(), t.serverHostCpuSecondsPerGib(), t.copiedPerByte());
    }
}
