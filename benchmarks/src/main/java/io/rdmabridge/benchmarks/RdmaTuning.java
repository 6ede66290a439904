package io.rdmabridge.benchmarks;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.ChannelOption;
import io.rdmabridge.netty.RdmaChannelOption;

import java.util.ArrayList;
import java.util.List;
import java.util.function.BiConsumer;

/**
 * RDMA channel options a benchmark run may override, for measuring candidate defaults: system properties
 * {@value #RENDEZVOUS_THRESHOLD} (the sender's threshold), {@value #RECEIVE_BUFFER_SIZE} (each side's posted
 * receive size), {@value #BUSY_POLL_NANOS} (each side's event-loop busy-poll budget; bootstraps only) and
 * {@value #SEND_COMPLETION_POLL_NANOS} (each side's polling for a send's completion; bootstraps only), read by
 * {@link PerfClient}, {@link PerfServer} and the gRPC streaming benchmark and passed on to a {@link ChildServer}.
 * Unset or 0: the channel's default. Thread-safe (reads system properties only).
 */
public final class RdmaTuning {
    /** System property: {@link RdmaChannelOption#RENDEZVOUS_THRESHOLD} of benchmark channels. */
    public static final String RENDEZVOUS_THRESHOLD = "rdmabridge.bench.rendezvousThreshold";
    /** System property: {@link RdmaChannelOption#RECEIVE_BUFFER_SIZE} of benchmark channels. */
    public static final String RECEIVE_BUFFER_SIZE = "rdmabridge.bench.receiveBufferSize";
    /** System property: {@link RdmaChannelOption#BUSY_POLL_BUDGET_NANOS} of benchmark channels (both ends). */
    public static final String BUSY_POLL_NANOS = "rdmabridge.bench.busyPollNanos";
    /**
     * System property: {@link RdmaChannelOption#SEND_COMPLETION_POLL_NANOS} of benchmark channels (both ends); unset
     * or negative: the channel's default, {@code 0}: off.
     */
    public static final String SEND_COMPLETION_POLL_NANOS = "rdmabridge.bench.sendCompletionPollNanos";
    /** The soft provider's same-host path ({@code shm} or {@code tcp}), passed on to the child as it is. */
    public static final String SAME_HOST = "rdmabridge.soft.sameHost";
    /** The soft provider's same-host rings ({@code true}, the default, or {@code false}); passed to the child JVM. */
    public static final String RINGS = "rdmabridge.soft.rings";
    /** The soft engine's busy-poll window on same-host rings, in microseconds; passed to the child JVM. */
    public static final String RING_SPIN_MICROS = "rdmabridge.soft.ringSpinMicros";
    /** The soft provider's copy helper for large one-sided copies ({@code true} or {@code false}); to the child JVM. */
    public static final String COPY_HELPER = "rdmabridge.soft.copyHelper";
    /** Whether the soft provider holds acknowledgements for the answer ({@code true}, the default); to the child. */
    public static final String HOLD_ACKNOWLEDGEMENTS = "rdmabridge.soft.holdAcknowledgements";
    /** The soft provider's links to mapped files for same-host peers ({@code rdmabridge.soft.fileLinks}). */
    public static final String FILE_LINKS = "rdmabridge.soft.fileLinks";

    private RdmaTuning() {
    }

    /** Sets the overridden options on a client bootstrap of the RDMA channel. */
    static void apply(Bootstrap b) {
        forEach(b::option);
        busyPoll(b::option);
    }

    /** Sets the overridden options on the accepted channels of an RDMA server bootstrap. */
    static void apply(ServerBootstrap b) {
        forEach(b::childOption);
        busyPoll(b::childOption);
    }

    /** Hands the overridden busy-poll budget and send-completion polling, if any, to {@code set}. */
    private static void busyPoll(BiConsumer<ChannelOption<Long>, Long> set) {
        long budget = Long.getLong(BUSY_POLL_NANOS, 0);
        if (budget > 0) {
            set.accept(RdmaChannelOption.BUSY_POLL_BUDGET_NANOS, budget);
        }
        long window = Long.getLong(SEND_COMPLETION_POLL_NANOS, -1);
        if (window >= 0) {
            set.accept(RdmaChannelOption.SEND_COMPLETION_POLL_NANOS, window);
        }
    }

    /** Hands each overridden option and its value to {@code set} (a bootstrap's, or a gRPC builder's). */
    public static void forEach(BiConsumer<ChannelOption<Integer>, Integer> set) {
        int threshold = Integer.getInteger(RENDEZVOUS_THRESHOLD, 0);
        int receive = Integer.getInteger(RECEIVE_BUFFER_SIZE, 0);
        if (threshold > 0) {
            set.accept(RdmaChannelOption.RENDEZVOUS_THRESHOLD, threshold);
        }
        if (receive > 0) {
            set.accept(RdmaChannelOption.RECEIVE_BUFFER_SIZE, receive);
        }
    }

    /** The {@code -D} options that give a child JVM this JVM's overrides. */
    static List<String> jvmOptions() {
        List<String> options = new ArrayList<>();
        for (String name : new String[] {RENDEZVOUS_THRESHOLD, RECEIVE_BUFFER_SIZE, BUSY_POLL_NANOS,
                SEND_COMPLETION_POLL_NANOS, SAME_HOST, RINGS, RING_SPIN_MICROS, COPY_HELPER, HOLD_ACKNOWLEDGEMENTS,
                FILE_LINKS}) {
            String value = System.getProperty(name);
            if (value != null) {
                options.add("-D" + name + "=" + value);
            }
        }
        return options;
    }
}
