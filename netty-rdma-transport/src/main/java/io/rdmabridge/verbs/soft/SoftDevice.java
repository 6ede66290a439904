package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.DeviceAttributes;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.PortAttributes;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import java.net.InetAddress;
import java.util.List;

/**
 * The software device {@code soft0} as one {@link SoftProvider} instance sees it: every instance has its own device
 * object (so {@link #provider()} names it, and the resources made through it answer this device), all of them over
 * the one JVM-wide {@link SoftEngine}. Thread-safe.
 */
final class SoftDevice implements RdmaDevice {
    static final String NAME = "soft0";
    static final int MAX_QP_WR = 16384;
    static final int MAX_SGE = 32;
    static final int MAX_CQE = 65536;
    static final int MAX_INLINE_DATA = 256;
    static final int MAX_RD_ATOM = 16;

    private final SoftProvider provider;
    private final SoftEngine engine;
    static final DeviceAttributes ATTRIBUTES = new DeviceAttributes(NAME, "software (TCP / in-JVM)", 1 << 16,
            MAX_QP_WR, MAX_SGE, MAX_CQE, MAX_INLINE_DATA, 1L << 40, MemoryKeyTable.MAX_REGIONS, MAX_RD_ATOM);
    private final List<PortAttributes> ports = List.of(new PortAttributes(1, "ACTIVE", "software", 4096,
            InetAddress.getLoopbackAddress().getHostAddress()));

    SoftDevice(SoftProvider provider, SoftEngine engine) {
        this.provider = provider;
        this.engine = engine;
    }

    @Override
    public RdmaProvider provider() {
        return provider;
    }

    @Override
    public String name() {
        return NAME;
    }

    @Override
    public DeviceAttributes attributes() {
        return ATTRIBUTES;
    }

    @Override
    public List<PortAttributes> ports() {
        return ports;
    }

    @Override
    public ProtectionDomain allocProtectionDomain() throws RdmaException {
        return new SoftProtectionDomain(this, engine);
    }

    @Override
    public CompletionQueue createCompletionQueue(int entries, EventNotifier notifier) throws RdmaException {
        if (entries < 1 || entries > MAX_CQE) {
            throw new IllegalArgumentException("entries: " + entries + " (expected: 1.." + MAX_CQE + ")");
        }
        return new SoftCompletionQueue(this, engine, entries, notifier);
    }

    @Override
    public String toString() {
        return NAME;
    }
}
