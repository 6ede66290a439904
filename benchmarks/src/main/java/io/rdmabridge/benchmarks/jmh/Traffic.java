package io.rdmabridge.benchmarks.jmh;

import org.openjdk.jmh.annotations.AuxCounters;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;

/**
 * What a throughput benchmark moved, reported by JMH as rates next to the primary score (batches per second):
 * {@code messages} (messages/s) and {@code bytes} (bytes/s).
 */
@State(Scope.Thread)
@AuxCounters(AuxCounters.Type.OPERATIONS)
public class Traffic {
    public long messages;
    public long bytes;

    @Setup(Level.Iteration)
    public void reset() {
        messages = 0;
        bytes = 0;
    }

    void add(int messageCount, int size) {
        messages += messageCount;
        bytes += (long) messageCount * size;
    }
}
