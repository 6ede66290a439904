package io.rdmabridge.netty;

import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.soft.SoftProvider;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.condition.EnabledIf;

/**
 * {@link RdmaCrossProcessEchoTest} on the soft provider's same-host path: both JVMs with
 * {@code rdmabridge.soft.sameHost=shm}, so the echoed messages at or above the rendezvous threshold are READ one-sided
 * from the other process's shared memory, while SENDs, acknowledgements and the peer's death still cross the TCP link.
 * Checks at the end that the one-sided path was taken. Soft provider only.
 */
@EnabledIf("onTheSoftProvider")
class RdmaSameHostEchoTest extends RdmaCrossProcessEchoTest {
    private static final String SAME_HOST = "rdmabridge.soft.sameHost";

    static {
        // Before the inherited @BeforeAll starts the peer: JUnit evaluates onTheSoftProvider() first, which
        // initialises this class. Surefire gives every test class a JVM of its own, so the settings end with it.
        System.setProperty(SAME_HOST, "shm");
        System.setProperty("rdmabridge.test.childJvmOptions",
                (System.getProperty("rdmabridge.test.childJvmOptions", "") + " -D" + SAME_HOST + "=shm").trim());
    }

    static boolean onTheSoftProvider() {
        return SoftProvider.NAME.equals(DeviceUnderTest.providerName());
    }

    @AfterAll
    static void oneSidedPathWasTaken() {
        SoftProvider soft = new SoftProvider();
        assertTrue(soft.oneSidedOperations() > 0, "no RDMA READ ran one-sided (the echo ran over TCP alone); over TCP: "
                + soft.sameHostOperationsOverTcp());
        assertTrue(soft.ringFrames() > 0, "no frame came through a shared-memory ring (the echo's frames crossed the"
                + " sockets)");
        // The peer's event loop sleeps between the echo's messages: our frames woke it with a datagram of ours.
        assertTrue(soft.directWakes() > 0, "no sleeping event loop of the peer was woken directly; DOORBELLs: "
                + soft.doorbells());
    }
}
