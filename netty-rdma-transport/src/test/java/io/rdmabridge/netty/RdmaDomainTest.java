package io.rdmabridge.netty;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.DeviceAttributes;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.PortAttributes;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RdmaProviders;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junitpioneer.jupiter.SetSystemProperty;

/** Which device the channels use, and the error of a connection another device serves. */
class RdmaDomainTest {
    private final RdmaProvider soft = RdmaProviders.byName("soft");

    @Test
    @SetSystemProperty(key = RdmaDomain.DEVICE_PROPERTY, value = "mlx5_1")
    void shouldRefuseADeviceTheProviderDoesNotHaveNamingThoseItHas() {
        RdmaException e = assertThrows(RdmaException.class, () -> RdmaDomain.open(soft));
        assertEquals("rdmabridge.device=mlx5_1: no such device of RDMA provider soft (expected: one of [soft0])",
                e.getMessage());
    }

    /**
     * A host with two devices (two NIC ports) where a channel's address is served by the one the group does not use:
     * its queue pair could use neither the group's protection domain nor its memory, so it fails naming the fix.
     */
    @Test
    @SetSystemProperty(key = RdmaDomain.DEVICE_PROPERTY, value = "soft0")
    void shouldRefuseAConnectionThroughAnotherDeviceNamingTheFix() throws Exception {
        RdmaDomain domain = RdmaDomain.open(soft);
        try {
            assertEquals("soft0", domain.device.name());
            domain.checkServes(domain.device, "10.0.0.2:4791");
            RdmaException e = assertThrows(RdmaException.class, () -> domain.checkServes(new Named("mlx5_1"),
                    "10.0.0.2:4791"));
            assertEquals("the connection with 10.0.0.2:4791 goes through RDMA device mlx5_1, but the channels of "
                    + "this event loop group use device soft0: bind and connect on addresses soft0 serves, or start "
                    + "the JVM with -Drdmabridge.device=mlx5_1", e.getMessage());
        } finally {
            domain.close();
        }
    }

    /** A second device, known by name only. */
    private record Named(String name) implements RdmaDevice {
        @Override
        public RdmaProvider provider() {
            throw new UnsupportedOperationException();
        }

        @Override
        public DeviceAttributes attributes() {
            throw new UnsupportedOperationException();
        }

        @Override
        public List<PortAttributes> ports() {
            throw new UnsupportedOperationException();
        }

        @Override
        public ProtectionDomain allocProtectionDomain() {
            throw new UnsupportedOperationException();
        }

        @Override
        public CompletionQueue createCompletionQueue(int entries, EventNotifier notifier) {
            throw new UnsupportedOperationException();
        }
    }
}
