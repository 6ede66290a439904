package io.rdmabridge.benchmarks.jmh;

import org.openjdk.jmh.annotations.AuxCounters;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;

/**
 * Bytes written and bytes the RDMA channel copied with the CPU before sending them, summed per iteration; their
 * quotient is the CPU-copied bytes per payload byte.
 */
@State(Scope.Thread)
@AuxCounters(AuxCounters.Type.EVENTS)
public class Copies {
    public long payloadBytes;
    public long copiedBytes;

    @Setup(Level.Iteration)
    public void reset() {
        payloadBytes = 0;
        copiedBytes = 0;
    }
}
