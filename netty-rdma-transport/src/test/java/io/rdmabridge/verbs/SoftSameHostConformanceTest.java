package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.soft.SoftProvider;
import io.rdmabridge.verbs.soft.SoftProvider.PrivateDataMode;
import java.util.List;
import org.junit.jupiter.api.AfterAll;

/**
 * The conformance suite on the soft provider's same-host path: the peer in a second JVM, both ends with
 * {@code rdmabridge.soft.sameHost=shm}, so registered memory lives in shared files and RDMA WRITE and READ run
 * one-sided in the peer's memory wherever it is shared; everything else (and the control and peer-death signals)
 * crosses the TCP link as in {@link SoftCrossProcessConformanceTest}.
 */
class SoftSameHostConformanceTest extends AbstractProviderConformanceTest {
    private static final String SAME_HOST = "-Drdmabridge.soft.sameHost=shm";

    static {
        // Surefire gives every test class a JVM of its own (reuseForks=false): this setting ends with the class.
        System.setProperty("rdmabridge.soft.sameHost", "shm");
    }

    @Override
    protected RdmaProvider newProvider() {
        return new SoftProvider(PrivateDataMode.DELIVER);
    }

    @Override
    protected ConformancePeer newPeer() throws Exception {
        return new ProcessConformancePeer(provider.name(), List.of("-D" + SoftProvider.PRIVATE_DATA_PROPERTY
                + "=deliver", SAME_HOST));
    }

    @AfterAll
    void oneSidedPathWasTaken() {
        long oneSided = ((SoftProvider) provider).oneSidedOperations();
        assertTrue(oneSided > 0, "no RDMA WRITE or READ ran one-sided (the suite ran over TCP alone); over TCP: "
                + ((SoftProvider) provider).sameHostOperationsOverTcp());
    }
}
