package io.rdmabridge.verbs;

import io.rdmabridge.verbs.soft.SoftProvider;
import io.rdmabridge.verbs.soft.SoftProvider.PrivateDataMode;
import java.util.List;

/**
 * The conformance suite on the soft provider with the peer in a second JVM ({@link ConformancePeerMain}): every byte
 * crosses the soft device's TCP wire path, and peer death is a real SIGKILL. Both ends deliver private data, each
 * told so explicitly rather than by whatever {@value SoftProvider#PRIVATE_DATA_PROPERTY} the test JVM was given.
 */
class SoftCrossProcessConformanceTest extends AbstractProviderConformanceTest {

    @Override
    protected RdmaProvider newProvider() {
        return new SoftProvider(PrivateDataMode.DELIVER);
    }

    @Override
    protected ConformancePeer newPeer() throws Exception {
        return new ProcessConformancePeer(provider.name(), peerJvmOptions());
    }

    /** The peer JVM's options: the provider's modes. */
    List<String> peerJvmOptions() {
        return List.of("-D" + SoftProvider.PRIVATE_DATA_PROPERTY + "=deliver");
    }
}
