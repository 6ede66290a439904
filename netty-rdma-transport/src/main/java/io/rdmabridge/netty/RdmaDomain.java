package io.rdmabridge.netty;

import io.rdmabridge.connection.RegisteredMemory;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;

import java.util.List;

/**
 * What the event loops of one {@link RdmaIoHandler#newFactory() factory} share: the device, one protection domain
 * (so any registered buffer can go out on any loop's queue pairs) and its registered memory with the allocator over
 * it. Opened with the first handler, closed with the last; the protection domain is deallocated once the last
 * region is gone. Thread-safe.
 *
 * <p>One device serves every channel: the provider's first, or the one {@value #DEVICE_PROPERTY} names. A channel
 * whose address another device serves fails, naming both devices and that property.
 */
final class RdmaDomain {
    /** System property naming the RDMA device the channels use (as {@code ibv_devices} lists it); default the first. */
    static final String DEVICE_PROPERTY = "rdmabridge.device";

    final RdmaProvider provider;
    final RdmaDevice device;
    final ProtectionDomain pd;
    final RegisteredMemory memory;
    final RdmaByteBufAllocator allocator;

    private RdmaDomain(RdmaProvider provider, RdmaDevice device, ProtectionDomain pd) {
        this.provider = provider;
        this.device = device;
        this.pd = pd;
        memory = new RegisteredMemory(pd);
        allocator = new RdmaByteBufAllocator(memory);
    }

    static RdmaDomain open(RdmaProvider provider) throws RdmaException {
        List<RdmaDevice> devices = provider.devices();
        if (devices.isEmpty()) {
            throw new RdmaException("RDMA provider " + provider.name() + " has no device: check that a device is up"
                    + " (ibv_devices) or use the software provider (soft)");
        }
        String wanted = System.getProperty(DEVICE_PROPERTY, "").trim();
        RdmaDevice device = wanted.isEmpty() ? devices.get(0) : null;
        for (RdmaDevice d : devices) {
            if (device == null && d.name().equals(wanted)) {
                device = d;
            }
        }
        if (device == null) {
            throw new RdmaException(DEVICE_PROPERTY + "=" + wanted + ": no such device of RDMA provider "
                    + provider.name() + " (expected: one of " + devices.stream().map(RdmaDevice::name).toList()
                    + ")");
        }
        return new RdmaDomain(provider, device, device.allocProtectionDomain());
    }

    /**
     * Refuses a connection whose address {@code via} serves, when that is not this domain's device: its queue pair
     * could use neither this protection domain nor its memory.
     */
    void checkServes(RdmaDevice via, Object address) throws RdmaException {
        if (via != null && !via.name().equals(device.name())) {
            throw new RdmaException("the connection with " + address + " goes through RDMA device " + via.name()
                    + ", but the channels of this event loop group use device " + device.name() + ": bind and "
                    + "connect on addresses " + device.name() + " serves, or start the JVM with -D" + DEVICE_PROPERTY
                    + "=" + via.name());
        }
    }

    void close() {
        memory.close();
        memory.whenReleased(pd::close);
    }
}
