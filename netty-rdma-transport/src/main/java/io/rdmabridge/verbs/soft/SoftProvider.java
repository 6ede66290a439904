package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.ResourceUsage;
import java.util.List;

/**
 * The software RDMA provider: a user-space RDMA device ({@code soft0}) in the spirit of the kernel's soft-RoCE and
 * siw. Queue pairs connect across processes over TCP and inside one JVM through a direct in-memory path; its
 * semantics are those of reliable-connected hardware (one-sided READ/WRITE checked by the target, receiver-not-ready
 * retries, flush on error or disconnect, unguessable rkeys).
 *
 * <p>Every instance drives the same JVM-wide device: memory regions, listeners, queue pairs, the
 * {@link ResourceUsage} and the {@link SoftFaults} are shared, so instances created by different
 * {@link java.util.ServiceLoader}s see one device.
 *
 * <p>System properties: {@code rdmabridge.soft.loopback} = {@code direct} (default) or {@code tcp} forces the TCP
 * wire path even between queue pairs of one JVM; {@code rdmabridge.soft.handshakeTimeoutMillis} (default 10000)
 * bounds how long an accepted socket may take to send its connect request. Thread-safe.
 */
public final class SoftProvider implements RdmaProvider {
    /** The name users choose it by: {@code rdmabridge.provider=soft}. */
    public static final String NAME = "soft";

    /** Creates a handle on the JVM-wide software device; cheap, opens nothing. */
    public SoftProvider() {
    }

    @Override
    public String name() {
        return NAME;
    }

    @Override
    public boolean isHardware() {
        return false;
    }

    @Override
    public int priority() {
        return 0;
    }

    @Override
    public boolean isAvailable() {
        return DirectMemory.unavailabilityCause() == null;
    }

    @Override
    public Throwable unavailabilityCause() {
        Throwable cause = DirectMemory.unavailabilityCause();
        if (cause == null) {
            return null;
        }
        return new IllegalStateException("the soft RDMA provider moves registered memory with sun.misc.Unsafe, which"
                + " is not accessible here (" + cause + "): run on a JDK that ships the jdk.unsupported module", cause);
    }

    private SoftEngine engine() throws RdmaException {
        Throwable cause = unavailabilityCause();
        if (cause != null) {
            throw new RdmaException(cause.getMessage(), cause);
        }
        return SoftEngine.get(this);
    }

    @Override
    public List<RdmaDevice> devices() throws RdmaException {
        return List.of(engine().device);
    }

    @Override
    public RdmaEventChannel createEventChannel(EventNotifier notifier) throws RdmaException {
        return new SoftEventChannel(this, engine(), notifier);
    }

    @Override
    public ResourceUsage resourceUsage() {
        return SoftEngine.get(this).usage;
    }

    /** The fault-injection hooks of the JVM-wide software device, for tests; never {@code null}. */
    public SoftFaults faults() {
        return SoftEngine.get(this).faults;
    }

    @Override
    public String toString() {
        return "SoftProvider{soft0}";
    }
}
