package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/**
 * The mutual challenge-response: each side's MAC verifies only in its own role, for its own nonces and secret, and
 * for the executor whose server the client meant to reach.
 */
class PeerAuthenticatorTest {
    private static final String ID = "1";
    private final PeerAuthenticator right = new PeerAuthenticator("right");
    private final byte[] serverNonce = PeerAuthenticator.newNonce();
    private final byte[] clientNonce = PeerAuthenticator.newNonce();

    @Test
    void shouldVerifyEachRoleWithTheSameSecret() {
        PeerAuthenticator other = new PeerAuthenticator("right");
        assertTrue(right.verifyClient(ID, serverNonce, clientNonce, other.clientAnswer(ID, serverNonce, clientNonce)));
        assertTrue(right.verifyServer(ID, serverNonce, clientNonce, other.serverProof(ID, serverNonce, clientNonce)));
    }

    @Test
    void shouldNotTakeOneRolesMacForTheOther() {
        // A server that reflects the client's own answer back as its proof has proven nothing.
        byte[] answer = right.clientAnswer(ID, serverNonce, clientNonce);
        assertFalse(right.verifyServer(ID, serverNonce, clientNonce, answer));
        assertFalse(right.verifyClient(ID, serverNonce, clientNonce, right.serverProof(ID, serverNonce, clientNonce)));
    }

    @Test
    void shouldNotVerifyAnotherSecretOrOtherNonces() {
        PeerAuthenticator wrong = new PeerAuthenticator("wrong");
        assertFalse(right.verifyServer(ID, serverNonce, clientNonce, wrong.serverProof(ID, serverNonce, clientNonce)));
        assertFalse(right.verifyServer(ID, serverNonce, PeerAuthenticator.newNonce(),
                right.serverProof(ID, serverNonce, clientNonce)));
        assertFalse(right.verifyClient(ID, clientNonce, serverNonce, right.clientAnswer(ID, serverNonce, clientNonce)));
    }

    @Test
    void shouldVerifyNothingWithoutASecret() {
        PeerAuthenticator none = new PeerAuthenticator(null);
        assertArrayEquals(new byte[BlockFrame.MAC_LENGTH], none.serverProof(ID, serverNonce, clientNonce));
        assertFalse(none.verifyServer(ID, serverNonce, clientNonce, new byte[BlockFrame.MAC_LENGTH]));
    }

    /**
     * A process that lures a reducer to itself (on a dead executor's port) and relays another executor's challenge to
     * it gets an answer for the executor the reducer meant: the other executor's server does not take it.
     */
    @Test
    void shouldNotVerifyAnAnswerOrProofMadeForAnotherExecutorsServer() {
        byte[] answerForDeadExecutor = right.clientAnswer("7", serverNonce, clientNonce);
        assertFalse(right.verifyClient("2", serverNonce, clientNonce, answerForDeadExecutor));
        assertFalse(right.verifyServer("7", serverNonce, clientNonce,
                right.serverProof("2", serverNonce, clientNonce)));
        // Ids that only concatenate alike are still different ids.
        assertFalse(right.verifyClient("1", serverNonce, clientNonce, right.clientAnswer("12", serverNonce,
                clientNonce)));
    }
}
