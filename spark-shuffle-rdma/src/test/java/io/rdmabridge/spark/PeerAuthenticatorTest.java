package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** The mutual challenge-response: each side's MAC verifies only in its own role, for its own nonces and secret. */
class PeerAuthenticatorTest {
    private final PeerAuthenticator right = new PeerAuthenticator("right");
    private final byte[] serverNonce = PeerAuthenticator.newNonce();
    private final byte[] clientNonce = PeerAuthenticator.newNonce();

    @Test
    void shouldVerifyEachRoleWithTheSameSecret() {
        PeerAuthenticator other = new PeerAuthenticator("right");
        assertTrue(right.verifyClient(serverNonce, clientNonce, other.clientAnswer(serverNonce, clientNonce)));
        assertTrue(right.verifyServer(serverNonce, clientNonce, other.serverProof(serverNonce, clientNonce)));
    }

    @Test
    void shouldNotTakeOneRolesMacForTheOther() {
        // A server that reflects the client's own answer back as its proof has proven nothing.
        byte[] answer = right.clientAnswer(serverNonce, clientNonce);
        assertFalse(right.verifyServer(serverNonce, clientNonce, answer));
        assertFalse(right.verifyClient(serverNonce, clientNonce, right.serverProof(serverNonce, clientNonce)));
    }

    @Test
    void shouldNotVerifyAnotherSecretOrOtherNonces() {
        PeerAuthenticator wrong = new PeerAuthenticator("wrong");
        assertFalse(right.verifyServer(serverNonce, clientNonce, wrong.serverProof(serverNonce, clientNonce)));
        assertFalse(right.verifyServer(serverNonce, PeerAuthenticator.newNonce(),
                right.serverProof(serverNonce, clientNonce)));
        assertFalse(right.verifyClient(clientNonce, serverNonce, right.clientAnswer(serverNonce, clientNonce)));
    }

    @Test
    void shouldVerifyNothingWithoutASecret() {
        PeerAuthenticator none = new PeerAuthenticator(null);
        assertArrayEquals(new byte[BlockFrame.MAC_LENGTH], none.serverProof(serverNonce, clientNonce));
        assertFalse(none.verifyServer(serverNonce, clientNonce, new byte[BlockFrame.MAC_LENGTH]));
    }
}
