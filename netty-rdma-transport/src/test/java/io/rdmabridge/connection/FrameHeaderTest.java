package io.rdmabridge.connection;

import org.junit.jupiter.api.Test;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

class FrameHeaderTest {

    @Test
    void shouldEncodeLittleEndianExactBytes() {
        ByteBuffer buf = ByteBuffer.allocate(FrameHeader.HEADER_LENGTH).order(ByteOrder.LITTLE_ENDIAN);
        new FrameHeader().wrap(buf, 0).set(FrameHeader.DATA, 7, 0x0102, 0x0304, 0x05060708);
        assertArrayEquals(new byte[] {1, 7, 0x02, 0x01, 0x04, 0x03, 0, 0, 0x08, 0x07, 0x06, 0x05}, buf.array());
    }

    @Test
    void shouldCountFramesReceivedModulo65536() {
        ByteBuffer buf = ByteBuffer.allocate(FrameHeader.HEADER_LENGTH).order(ByteOrder.LITTLE_ENDIAN);
        FrameHeader h = new FrameHeader().wrap(buf, 0).set(FrameHeader.CREDIT, 0, 0, 0, 0x10000L + 0x0A0B, 0);
        assertEquals(0x0B, buf.get(6));
        assertEquals(0x0A, buf.get(7));
        assertEquals(0x0A0B, h.framesReceived());
        assertNull(h.validate(FrameHeader.HEADER_LENGTH), "any count is well-formed");
    }

    @Test
    void shouldDecodeWhatAnotherInstanceEncoded() {
        ByteBuffer buf = ByteBuffer.allocate(64).order(ByteOrder.LITTLE_ENDIAN);
        new FrameHeader().wrap(buf, 8).set(FrameHeader.RENDEZVOUS, 255, 65535, 3, FrameHeader.RENDEZVOUS_BODY_LENGTH)
                .rendezvous(0x1122334455667788L, 1 << 20, 0xCAFE);
        FrameHeader read = new FrameHeader().wrap(buf, 8);
        assertNull(read.validate(FrameHeader.HEADER_LENGTH + FrameHeader.RENDEZVOUS_BODY_LENGTH));
        assertEquals(FrameHeader.RENDEZVOUS, read.type());
        assertEquals(255, read.controlCredits());
        assertEquals(65535, read.dataCredits());
        assertEquals(3, read.rendezvousAcks());
        assertEquals(0x1122334455667788L, read.rendezvousAddress());
        assertEquals(1 << 20, read.rendezvousLength());
        assertEquals(0xCAFE, read.rendezvousRkey());
    }

    @Test
    void shouldNameTheCauseOfMalformedFrames() {
        ByteBuffer buf = ByteBuffer.allocate(64).order(ByteOrder.LITTLE_ENDIAN);
        FrameHeader h = new FrameHeader().wrap(buf, 0);
        assertTrue(h.validate(4).startsWith("frame too short: frameLength=4"));
        h.set(FrameHeader.DATA, 0, 0, 0, 100);
        assertTrue(h.validate(20).startsWith("frame length mismatch: bodyLength=100, frameLength=20"));
        h.set(FrameHeader.DATA, 0, 0, 0, 0);
        assertTrue(h.validate(12).startsWith("empty DATA frame"));
        h.set((byte) 9, 0, 0, 0, 0);
        assertTrue(h.validate(12).startsWith("unknown frame type: type=9"));
        h.set(FrameHeader.HELLO, 0, 0, 0, 4);
        assertTrue(h.validate(16).startsWith("HELLO frame: bodyLength=4 (expected: 20)"));
        h.set(FrameHeader.HELLO, 0, 0, 0, Handshake.LENGTH);
        assertNull(h.validate(FrameHeader.HEADER_LENGTH + Handshake.LENGTH));
        h.set(FrameHeader.CREDIT, 0, 0, 0, 4);
        assertTrue(h.validate(16).startsWith("CREDIT frame: bodyLength=4 (expected: 0)"));
        h.set(FrameHeader.RENDEZVOUS, 0, 0, 0, FrameHeader.RENDEZVOUS_BODY_LENGTH).rendezvous(1, 0, 1);
        assertTrue(h.validate(28).startsWith("RENDEZVOUS frame: length=0"));
        h.set(FrameHeader.DATA, 0, 0, 0, -1);
        assertTrue(h.validate(12).contains("bodyLength=4294967295"));
    }
}
