package io.rdmabridge.spark;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Mutual HMAC-SHA256 challenge-response over the application's shared secret ({@code spark.authenticate}). The block
 * server sends a fresh random nonce on every connection and serves nothing until the client answers with
 * HMAC(secret, domain || "client" || server's executor id || server nonce || client nonce) and its own fresh nonce;
 * the server then proves itself with HMAC(secret, domain || "server" || its executor id || both nonces), and the
 * client accepts no block before that proof. So neither side takes the other's word: a process that took a dead
 * executor's port, or another application's block server, cannot feed this one blocks. The secret never crosses the
 * wire; a recorded answer or proof is useless for another connection, and neither side ever computes the other's
 * role, so one cannot be reflected as the other. The executor id binds an answer to the server the client meant to
 * reach: a process that lures a reducer to itself (on a dead executor's port) and relays that server's challenge
 * to it cannot pass the reducer's answer on to another executor, whose id differs. Thread-safe.
 */
final class PeerAuthenticator {
    /** Binds answers to this protocol, so an HMAC made for something else over the same secret never verifies. */
    private static final byte[] DOMAIN = "rdma-bridge spark shuffle block server v3".getBytes(StandardCharsets.UTF_8);
    private static final byte[] CLIENT = "client".getBytes(StandardCharsets.UTF_8);
    private static final byte[] SERVER = "server".getBytes(StandardCharsets.UTF_8);
    private static final SecureRandom RANDOM = new SecureRandom();

    private final SecretKeySpec key;

    /** @param secret the application secret, or {@code null} when authentication is off */
    PeerAuthenticator(String secret) {
        key = secret == null ? null : new SecretKeySpec(secret.getBytes(StandardCharsets.UTF_8), "HmacSHA256");
    }

    boolean isRequired() {
        return key != null;
    }

    static byte[] newNonce() {
        byte[] nonce = new byte[BlockFrame.NONCE_LENGTH];
        RANDOM.nextBytes(nonce);
        return nonce;
    }

    /** The client's answer to the challenge of executor {@code serverId}'s server; zeros without a secret here. */
    byte[] clientAnswer(String serverId, byte[] serverNonce, byte[] clientNonce) {
        return mac(CLIENT, serverId, serverNonce, clientNonce);
    }

    /** Server {@code serverId}'s proof, once it has accepted the client's answer; zeros without a secret here. */
    byte[] serverProof(String serverId, byte[] serverNonce, byte[] clientNonce) {
        return mac(SERVER, serverId, serverNonce, clientNonce);
    }

    /** Whether {@code answer} proves the client holds the secret and meant to reach {@code serverId}; constant time. */
    boolean verifyClient(String serverId, byte[] serverNonce, byte[] clientNonce, byte[] answer) {
        return key != null && MessageDigest.isEqual(clientAnswer(serverId, serverNonce, clientNonce), answer);
    }

    /** Whether {@code proof} proves the server holds the secret and is executor {@code serverId}'s; constant time. */
    boolean verifyServer(String serverId, byte[] serverNonce, byte[] clientNonce, byte[] proof) {
        return key != null && MessageDigest.isEqual(serverProof(serverId, serverNonce, clientNonce), proof);
    }

    private byte[] mac(byte[] role, String serverId, byte[] serverNonce, byte[] clientNonce) {
        if (key == null) {
            return new byte[BlockFrame.MAC_LENGTH];
        }
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(key);
            mac.update(DOMAIN);
            mac.update(role);
            // Length first: the nonces that follow have fixed lengths, so no two ids give the same input.
            byte[] id = serverId.getBytes(StandardCharsets.UTF_8);
            mac.update(ByteBuffer.allocate(Integer.BYTES).putInt(id.length).array());
            mac.update(id);
            mac.update(serverNonce);
            return mac.doFinal(clientNonce);
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HmacSHA256 is not available in this JVM", e);
        }
    }
}
