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
 */
final class RdmaDomain {
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
                    + " (ibv_devices) or set rdmabridge.provider=soft");
        }
        RdmaDevice device = devices.get(0);
        return new RdmaDomain(provider, device, device.allocProtectionDomain());
    }

    void close() {
        memory.close();
        memory.whenReleased(pd::close);
    }
}
