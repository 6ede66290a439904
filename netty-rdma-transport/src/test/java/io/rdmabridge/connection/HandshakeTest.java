package io.rdmabridge.connection;

import org.junit.jupiter.api.Test;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

class HandshakeTest {

    @Test
    void shouldRoundTrip() throws Exception {
        Handshake h = new Handshake(16384, 32, 8, 1 << 30);
        byte[] wire = h.encode();
        assertEquals(Handshake.LENGTH, wire.length);
        assertEquals(h, Handshake.decode(wire));
    }

    @Test
    void shouldRejectForeignOrBadHandshakes() {
        assertTrue(assertThrows(Handshake.HandshakeException.class, () -> Handshake.decode(new byte[3]))
                .getMessage().startsWith("handshake too short: 3 bytes"));
        assertTrue(assertThrows(Handshake.HandshakeException.class, () -> Handshake.decode(new byte[20]))
                .getMessage().startsWith("handshake magic: 0x0"));
        byte[] wire = new Handshake(16384, 32, 8, 1 << 20).encode();
        wire[4] = 1;
        assertTrue(assertThrows(Handshake.HandshakeException.class, () -> Handshake.decode(wire))
                .getMessage().startsWith("protocol version: 1 (expected: 3"));
        byte[] small = new Handshake(16384, 32, 8, 1 << 20).encode();
        small[8] = (byte) 0xFF; // 1023: one byte below the smallest receive buffer a peer may announce
        small[9] = 3;
        assertTrue(assertThrows(Handshake.HandshakeException.class, () -> Handshake.decode(small))
                .getMessage().contains("receiveBufferSize: 1023 (expected: 1024..16777216)"));
        byte[] control = new Handshake(16384, 32, 8, 1 << 20).encode();
        control[14] = 1;
        assertTrue(assertThrows(Handshake.HandshakeException.class, () -> Handshake.decode(control))
                .getMessage().contains("controlCredits: 1 (expected: 2..255)"));
        byte[] deep = new Handshake(16384, 32, 8, 1 << 20).encode();
        deep[12] = (byte) 0xFF;
        deep[13] = (byte) 0xFF;
        assertTrue(assertThrows(Handshake.HandshakeException.class, () -> Handshake.decode(deep)).getMessage()
                .contains("dataCredits + controlCredits: 65543 (expected: <= 65535"));
        byte[] tiny = new Handshake(16384, 32, 8, 1 << 20).encode();
        ByteBuffer.wrap(tiny).order(ByteOrder.LITTLE_ENDIAN).putInt(16, 4095);
        assertTrue(assertThrows(Handshake.HandshakeException.class, () -> Handshake.decode(tiny)).getMessage()
                .contains("maxMessageSize: 4095 (expected: >= 4096)"));
    }
}
