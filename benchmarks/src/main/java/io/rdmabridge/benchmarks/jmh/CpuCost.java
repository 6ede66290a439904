package io.rdmabridge.benchmarks.jmh;

import io.rdmabridge.benchmarks.Bench;
import org.openjdk.jmh.annotations.AuxCounters;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;

/**
 * CPU cost of a throughput benchmark, reported by JMH as secondary results summed over the measured iterations:
 * {@code cpuNanos}, the CPU time of every process taking part ({@link Bench#cpuNanos()}: the benchmark JVM and, across
 * processes, the child server), and {@code cpuBytes}, the payload bytes moved in the same window. Their quotient is
 * CPU seconds per GB (10^9 bytes). The window opens at the first operation of an iteration and closes at its end.
 */
@State(Scope.Thread)
@AuxCounters(AuxCounters.Type.EVENTS)
public class CpuCost {
    public long cpuNanos;
    public long cpuBytes;

    // Not counters (JMH zeroes public counter fields after each iteration's setup).
    private Bench bench;
    private long startNanos;

    /** Opens the window on {@code bench} unless this iteration's is open already. */
    void open(Bench bench) {
        if (this.bench == null) {
            this.bench = bench;
            startNanos = bench.cpuNanos();
        }
    }

    /** Counts {@code bytes} moved in the window. */
    void add(long bytes) {
        cpuBytes += bytes;
    }

    /** Runs before JMH reads the counters, and before the trial's teardown stops the child server. */
    @TearDown(Level.Iteration)
    public void close() {
        if (bench != null) {
            long end = bench.cpuNanos();
            // Left at 0 (no figure) where a process's CPU time cannot be read.
            if (startNanos >= 0 && end >= 0) {
                cpuNanos = end - startNanos;
            }
            bench = null;
        }
    }
}
