package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * The conformance suite on the DiSNI provider, with the peer on a thread of this JVM. It runs wherever a real RDMA
 * device and libdisni are usable and is skipped elsewhere, with the provider's reason. On a machine with a device:
 * <pre>
 * mvn -o -pl netty-rdma-transport test -Dtest=DisniConformanceTest \
 *     -Drdmabridge.test.address=&lt;IP of an RDMA interface, e.g. 192.168.1.10&gt; \
 *     -Dtest.argLine="--add-exports java.base/sun.nio.ch=ALL-UNNAMED -Djava.library.path=/usr/local/lib \
 *         -Xmx1g -XX:MaxDirectMemorySize=2g"
 * </pre>
 * ({@code test.argLine} replaces the default one, which selects the soft provider; the library path is where
 * libdisni is installed.) Abrupt peer death needs a second process and is covered by the cross-process soft mode.
 */
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
}
