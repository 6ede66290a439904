package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.soft.SoftProvider;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterAll;

/**
 * The conformance suite on the same-host path between two processes that disagree about rings: this JVM runs with
 * {@code rdmabridge.soft.rings=false} (its frames go on the socket), the peer JVM with rings on (its frames go
 * through its ring, which this JVM reads). Each process sets the switch for itself, so a mixed pair is what a user who
 * turns rings off on one side gets. The peer's link keeps the handshake's small socket buffers until this side's
 * frames arrive on the socket and make it grow them; the suite checks every byte either way.
 */
class SoftSameHostMixedRingsConformanceTest extends SoftCrossProcessConformanceTest {
    private static final String SAME_HOST = "rdmabridge.soft.sameHost";
    private static final String RINGS = "rdmabridge.soft.rings";

    static {
        // Surefire gives every test class a JVM of its own (reuseForks=false): these settings end with the class.
        System.setProperty(SAME_HOST, "shm");
        System.setProperty(RINGS, "false");
    }

    @Override
    List<String> peerJvmOptions() {
        List<String> options = new ArrayList<>(super.peerJvmOptions());
        options.add("-D" + SAME_HOST + "=shm");
        options.add("-D" + RINGS + "=true");
        return options;
    }

    @AfterAll
    void bothFramePathsWereTaken() {
        SoftProvider soft = (SoftProvider) provider;
        assertTrue(soft.ringFrames() > 0, "no frame of the peer came through its shared-memory ring");
        assertTrue(soft.oneSidedOperations() > 0, "no RDMA WRITE or READ ran one-sided; over TCP: "
                + soft.sameHostOperationsOverTcp());
    }
}
