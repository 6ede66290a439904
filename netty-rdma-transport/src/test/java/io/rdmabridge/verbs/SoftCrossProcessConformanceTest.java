package io.rdmabridge.verbs;

/**
 * The conformance suite on the soft provider with the peer in a second JVM ({@link ConformancePeerMain}): every byte
 * crosses the soft device's TCP wire path, and peer death is a real SIGKILL.
 */
class SoftCrossProcessConformanceTest extends AbstractProviderConformanceTest {

    @Override
    protected RdmaProvider newProvider() throws RdmaException {
        return RdmaProviders.select("soft").orElseThrow();
    }

    @Override
    protected ConformancePeer newPeer() throws Exception {
        return new ProcessConformancePeer(provider.name());
    }
}
