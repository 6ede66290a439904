package io.rdmabridge.verbs;

import org.junit.jupiter.api.Tag;

import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * The conformance suite on the DiSNI provider, with the peer on a thread of this JVM. It runs wherever a real RDMA
 * device and libdisni are usable and is skipped elsewhere, with the provider's reason. On a machine with a device:
 * <pre>
 * mvn -o -Pdisni -pl netty-rdma-transport test -Dtest=DisniConformanceTest \
 *     -Drdmabridge.test.address=&lt;IP of an RDMA interface, e.g. 192.168.1.10&gt; \
 *     -Ddisni.library.path=&lt;directory of libdisni.so, default /usr/local/lib&gt;
 * </pre>
 * (The {@code disni} profile's argLine exports {@code sun.nio.ch} to DiSNI and points {@code java.library.path} at
 * libdisni.) On Soft-RoCE the address is that of the rxe device's interface. The private-data cases are skipped,
 * with the reason, because DiSNI 2.1 delivers none; {@code shouldDeliverNoPrivateDataWhereNoneIsDeclared} runs
 * instead.
 */
// The rxe stage selects the device tag (rxe/steps).
@Tag("device")
class DisniConformanceTest extends AbstractProviderConformanceTest {

    @Override
    protected RdmaProvider newProvider() {
        RdmaProvider provider = RdmaProviders.byName("disni");
        // Skipped, not failed, where there is no DiSNI provider, device or libdisni: the reason is printed.
        assumeTrue(provider != null, "DiSNI unavailable: no provider named 'disni' on the class path");
        assumeTrue(provider.isAvailable(), () -> "DiSNI unavailable: " + provider.unavailabilityCause());
        return provider;
    }

    @Override
    protected ConformancePeer newPeer() {
        return new InJvmConformancePeer(provider);
    }

    /**
     * The peer shares this JVM, so it dies the way the kernel buries a dead process's connection: its queue pair and
     * id are destroyed without a disconnect (the release of the uverbs and rdma_cm files does exactly that), and
     * rdma_cm tells this end with a DREQ.
     */
    @Override
    protected void killPeerAbruptly(LocalEnd.Connection c) throws Exception {
        peer.destroy(c.peerIndex);
    }
}
