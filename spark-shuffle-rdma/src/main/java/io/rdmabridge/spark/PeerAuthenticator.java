package io.rdmabridge.spark;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * HMAC-SHA256 challenge-response over the application's shared secret ({@code spark.authenticate}): the block server
 * sends a fresh random nonce on every connection and serves nothing until the peer answers with
 * HMAC(secret, domain || nonce). The secret itself never crosses the wire; a recorded answer is useless for another
 * connection. Thread-safe.
 */
final class PeerAuthenticator {
    /** Binds answers to this protocol, so an HMAC made for something else over the same secret never verifies. */
    private static final byte[] DOMAIN = "rdma-bridge spark shuffle block server v1".getBytes(StandardCharsets.UTF_8);
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

    /** The answer to {@code nonce}; all zeros when this side holds no secret. */
    byte[] answer(byte[] nonce) {
        if (key == null) {
            return new byte[BlockFrame.MAC_LENGTH];
        }
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(key);
            mac.update(DOMAIN);
            return mac.doFinal(nonce);
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HmacSHA256 is not available in this JVM", e);
        }
    }

    /** Whether {@code answer} proves knowledge of the secret for {@code nonce}; compared in constant time. */
    boolean verify(byte[] nonce, byte[] answer) {
        return key != null && MessageDigest.isEqual(answer(nonce), answer);
    }
}
