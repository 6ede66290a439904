package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.ResourceUsage;
import java.util.List;
import java.util.Locale;

/**
 * The software RDMA provider: a user-space RDMA device ({@code soft0}) in the spirit of the kernel's soft-RoCE and
 * siw. Queue pairs connect across processes over TCP and inside one JVM through a direct in-memory path; its
 * semantics are those of reliable-connected hardware (one-sided READ/WRITE checked by the target, receiver-not-ready
 * retries, flush on error or disconnect, unguessable rkeys).
 *
 * <p>Every instance drives the same JVM-wide device: memory regions, listeners, queue pairs, the
 * {@link ResourceUsage} and the {@link SoftFaults} are shared, so instances created by different
 * {@link java.util.ServiceLoader}s see one device. Each instance has its own {@link RdmaDevice} object, whose
 * {@link RdmaDevice#provider()} is that instance.
 *
 * <h2>Connection-manager private data</h2>
 * An instance either delivers private data as rdma_cm does ({@link PrivateDataMode#DELIVER}, the default) or behaves
 * like DiSNI 2.1, which delivers none ({@link PrivateDataMode#NONE}): {@link #deliversPrivateData()} is then false,
 * every {@link io.rdmabridge.verbs.CmEvent#privateData()} of its event channels is empty,
 * {@link io.rdmabridge.verbs.RdmaCmId#peerParameters()} is {@code null}, {@code accept} with private data is refused
 * with an {@link RdmaException}, and {@code reject} sends its private data nowhere. Connect still sends its private
 * data on the wire, as DiSNI does; a peer in {@code deliver} mode receives it. The mode lets everything above the
 * verbs SPI be tested without private data, on any machine. It is fixed when the instance is created: by
 * {@link #SoftProvider(PrivateDataMode)}, or by the zero-argument constructor (the one {@link java.util.ServiceLoader}
 * calls) from the system property {@value #PRIVATE_DATA_PROPERTY} = {@code deliver} (default) or {@code none}, read
 * at that moment. Instances in both modes can live in one JVM and connect to each other.
 *
 * <p>Other system properties: {@code rdmabridge.soft.loopback} = {@code direct} (default) or {@code tcp} forces the
 * TCP wire path even between queue pairs of one JVM; {@code rdmabridge.soft.sameHost} = {@code shm} (default) or
 * {@code tcp}: whether processes on one host move their frames through shared-memory rings and run RDMA WRITE and
 * READ one-sided (see the package javadoc); {@code rdmabridge.soft.handshakeTimeoutMillis} (default 10000)
 * bounds how long an accepted socket may take to send its connect request;
 * {@code rdmabridge.soft.transportTimeoutMillis} (default 30000, 0 off) how long a connection between hosts may have
 * work requests waiting without a sign of the peer before they fail with {@code RETRY_EXC_ERR}, as a NIC's do once
 * its transport retries run out. Thread-safe.
 */
public final class SoftProvider implements RdmaProvider {
    /** The name users choose it by: {@code rdmabridge.provider=soft}. */
    public static final String NAME = "soft";
    /**
     * System property read by {@link #SoftProvider()}: {@code deliver} (default) or {@code none}, see
     * {@link PrivateDataMode}.
     */
    public static final String PRIVATE_DATA_PROPERTY = "rdmabridge.soft.privateData";

    /** Whether an instance delivers connection-manager private data. */
    public enum PrivateDataMode {
        /** Private data of connect, accept and reject reaches the peer's events, as with rdma_cm. */
        DELIVER,
        /** No private data is ever delivered, as with DiSNI 2.1; {@link #deliversPrivateData()} is false. */
        NONE
    }

    private final PrivateDataMode privateData;
    /** Why the instance cannot be used although the JVM could run it: a bad {@value #PRIVATE_DATA_PROPERTY}. */
    private final RdmaException configurationCause;
    private volatile SoftDevice device;

    /**
     * Creates a handle on the JVM-wide software device, in the private-data mode that the system property
     * {@value #PRIVATE_DATA_PROPERTY} names now; cheap, opens nothing, never throws. An unknown value makes the
     * instance unavailable, with a cause that names the property and its values.
     */
    public SoftProvider() {
        String value = System.getProperty(PRIVATE_DATA_PROPERTY, "deliver").trim();
        PrivateDataMode mode = null;
        for (PrivateDataMode m : PrivateDataMode.values()) {
            if (m.name().equalsIgnoreCase(value)) {
                mode = m;
            }
        }
        privateData = mode == null ? PrivateDataMode.DELIVER : mode;
        configurationCause = mode != null ? null : new RdmaException(PRIVATE_DATA_PROPERTY + "=" + value
                + " (expected: deliver or none): fix the system property, or remove it for the default, deliver");
    }

    /**
     * Creates a handle on the JVM-wide software device in private-data mode {@code privateData}, whatever the system
     * property says; cheap, opens nothing.
     */
    public SoftProvider(PrivateDataMode privateData) {
        if (privateData == null) {
            throw new IllegalArgumentException("privateData: null (expected: DELIVER or NONE)");
        }
        this.privateData = privateData;
        this.configurationCause = null;
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

    /** True in {@link PrivateDataMode#DELIVER}, false in {@link PrivateDataMode#NONE}. */
    @Override
    public boolean deliversPrivateData() {
        return privateData == PrivateDataMode.DELIVER;
    }

    /** The private-data mode fixed when this instance was created. */
    public PrivateDataMode privateDataMode() {
        return privateData;
    }

    @Override
    public boolean isAvailable() {
        return unavailabilityCause() == null;
    }

    @Override
    public Throwable unavailabilityCause() {
        if (configurationCause != null) {
            return configurationCause;
        }
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
        return SoftEngine.get();
    }

    /** This instance's view of {@code soft0}; created on first use. */
    SoftDevice device() throws RdmaException {
        SoftDevice d = device;
        if (d == null) {
            SoftEngine engine = engine();
            synchronized (this) {
                d = device;
                if (d == null) {
                    d = new SoftDevice(this, engine);
                    device = d;
                }
            }
        }
        return d;
    }

    @Override
    public List<RdmaDevice> devices() throws RdmaException {
        return List.of(device());
    }

    @Override
    public RdmaEventChannel createEventChannel(EventNotifier notifier) throws RdmaException {
        return new SoftEventChannel(this, device(), engine(), notifier);
    }

    @Override
    public ResourceUsage resourceUsage() {
        return SoftEngine.get().usage;
    }

    /**
     * RDMA WRITEs and READs this JVM executed one-sided in a same-host peer's shared memory (see
     * {@value SharedMemoryFiles#SAME_HOST_PROPERTY}), for tests and diagnostics.
     */
    public long oneSidedOperations() {
        return SoftEngine.get().sharedMemory.oneSided.get();
    }

    /**
     * RDMA WRITEs and READs of same-host links that went over TCP because the peer's memory could not be reached
     * one-sided (not allocated in shared memory, say), for tests and diagnostics: each cost the peer's engine a copy.
     */
    public long sameHostOperationsOverTcp() {
        return SoftEngine.get().sharedMemory.overTcp.get();
    }

    /**
     * Frames this JVM received through same-host links' shared-memory rings rather than their sockets (see
     * {@code rdmabridge.soft.rings}), for tests and diagnostics.
     */
    public long ringFrames() {
        return SoftEngine.get().sharedMemory.ringFrames.get();
    }

    /**
     * DOORBELL frames this JVM sent on same-host links' sockets: each wakes the peer's engine, which then wakes the
     * event loop the frames are for; for tests and diagnostics.
     */
    public long doorbells() {
        return SoftEngine.get().sharedMemory.doorbells.get();
    }

    /**
     * Datagrams this JVM sent to same-host peers' sleeping event loops, waking them with no engine in between (see
     * {@code rdmabridge.soft.directWake}); for tests and diagnostics.
     */
    public long directWakes() {
        return SoftEngine.get().sharedMemory.directWakes.get();
    }

    /** The fault-injection hooks of the JVM-wide software device, for tests; never {@code null}. */
    public SoftFaults faults() {
        return SoftEngine.get().faults;
    }

    @Override
    public String toString() {
        return "SoftProvider{soft0, privateData=" + privateData.name().toLowerCase(Locale.ROOT) + '}';
    }
}
