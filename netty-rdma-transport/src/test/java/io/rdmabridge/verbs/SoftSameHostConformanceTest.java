package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.soft.SoftProvider;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterAll;

/**
 * The conformance suite on the soft provider's same-host path: as {@link SoftCrossProcessConformanceTest}, with both
 * JVMs on {@code rdmabridge.soft.sameHost=shm}, so registered memory lives in shared files and RDMA WRITE and READ
 * run one-sided in the peer's memory wherever it is shared, and every other frame crosses a shared-memory ring; the
 * sockets carry the handshakes, doorbells, final frames and peer death. Checks at the end that both paths were taken.
 */
class SoftSameHostConformanceTest extends SoftCrossProcessConformanceTest {
    private static final String SAME_HOST = "rdmabridge.soft.sameHost";

    static {
        // Surefire gives every test class a JVM of its own (reuseForks=false): this setting ends with the class.
        System.setProperty(SAME_HOST, "shm");
    }

    @Override
    List<String> peerJvmOptions() {
        List<String> options = new ArrayList<>(super.peerJvmOptions());
        options.add("-D" + SAME_HOST + "=shm");
        return options;
    }

    @AfterAll
    void oneSidedPathWasTaken() {
        SoftProvider soft = (SoftProvider) provider;
        assertTrue(soft.oneSidedOperations() > 0, "no RDMA WRITE or READ ran one-sided (the suite ran over TCP alone);"
                + " over TCP: " + soft.sameHostOperationsOverTcp());
        assertTrue(soft.ringFrames() > 0, "no frame came through a shared-memory ring (the suite's frames crossed the"
                + " sockets)");
    }
}
