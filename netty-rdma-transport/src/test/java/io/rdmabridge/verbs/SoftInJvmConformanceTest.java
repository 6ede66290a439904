package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.soft.SoftProvider;
import io.rdmabridge.verbs.soft.SoftProvider.PrivateDataMode;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The conformance suite on the soft provider with the peer on a thread of this JVM: both ends meet on the soft
 * device's direct in-memory path. Peer death is simulated by cutting the link with {@link SoftProvider#faults()}.
 * The provider delivers private data, as rdma_cm does; {@link SoftInJvmNoPrivateDataConformanceTest} runs the same
 * suite in the mode that delivers none.
 */
class SoftInJvmConformanceTest extends AbstractProviderConformanceTest {

    /** Made explicitly in its mode, whatever {@value SoftProvider#PRIVATE_DATA_PROPERTY} the JVM was given. */
    @Override
    protected RdmaProvider newProvider() {
        return new SoftProvider(PrivateDataMode.DELIVER);
    }

    @Override
    protected ConformancePeer newPeer() {
        return new InJvmConformancePeer(provider);
    }

    @Override
    protected void killPeerAbruptly(LocalEnd.Connection c) {
        ((SoftProvider) provider).faults().dropConnection(c.qp);
    }

    @AfterEach
    void resetFaults() {
        ((SoftProvider) provider).faults().reset();
    }

    @Test
    public void shouldReportInjectedRegistrationFailure() throws Exception {
        RdmaDevice device = local.defaultDevice();
        ProtectionDomain pd = local.pd(device);
        long before = provider.resourceUsage().memoryRegions();
        ((SoftProvider) provider).faults().failRegistrations(1);
        RdmaException e = assertThrows(RdmaException.class, () -> local.register(device, 4096, Access.LOCAL_WRITE));
        assertTrue(String.valueOf(e.getMessage()).contains("injected"), () -> "message: " + e.getMessage());
        assertEquals(before, provider.resourceUsage().memoryRegions(), "a refused registration is not counted");
        // Only one failure was injected: the next registration succeeds.
        assertEquals(4096, local.register(device, 4096, Access.LOCAL_WRITE).mr().length());
        assertEquals(device, pd.device());
    }
}
