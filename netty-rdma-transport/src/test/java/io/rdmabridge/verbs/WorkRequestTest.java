package io.rdmabridge.verbs;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

/** The scatter/gather lists of send and receive work requests: filling, limits, reuse. */
class WorkRequestTest {

    @Test
    void shouldKeepEntriesInOrderAndSumTheirLengths() {
        RecvWorkRequest recv = new RecvWorkRequest(2);
        assertSame(recv, recv.wrId(7).addSge(0x1000, 100, 11).addSge(0x2000, Integer.MAX_VALUE, 12));
        assertEquals(7, recv.wrId());
        assertEquals(2, recv.maxSge());
        assertEquals(2, recv.numSge());
        assertEquals(0x2000, recv.sgeAddress(1));
        assertEquals(100, recv.sgeLength(0));
        assertEquals(12, recv.sgeLkey(1));
        assertEquals(100L + Integer.MAX_VALUE, recv.totalLength());

        SendWorkRequest send = new SendWorkRequest(3);
        send.wrId(9).opcode(WrOpcode.RDMA_WRITE).remote(0xabc, 0x55).addSge(0x3000, 40, 21).addSge(0x4000, 2, 22);
        assertEquals(2, send.numSge());
        assertEquals(3, send.maxSge());
        assertEquals(0x4000, send.sgeAddress(1));
        assertEquals(21, send.sgeLkey(0));
        assertEquals(42, send.totalLength());
        assertEquals("SendWorkRequest{wrId=9, opcode=RDMA_WRITE, flags=0, numSge=2, length=42, remote=0xabc,"
                + " rkey=0x55}", send.toString());
    }

    @Test
    void shouldClearEverythingOnReset() {
        RecvWorkRequest recv = new RecvWorkRequest(1).wrId(3).addSge(1, 2, 3).reset();
        assertEquals(0, recv.wrId());
        assertEquals(0, recv.numSge());
        assertEquals(0, recv.totalLength());
        recv.addSge(4, 5, 6);
        assertEquals(4, recv.sgeAddress(0));

        SendWorkRequest send = new SendWorkRequest(1).wrId(3).opcode(WrOpcode.RDMA_READ).addSge(1, 2, 3).reset();
        assertEquals(0, send.wrId());
        assertEquals(0, send.numSge());
        assertEquals(WrOpcode.SEND, send.opcode());
    }

    @Test
    void shouldRefuseBadSizesWithTheCauseAndTheFix() {
        assertEquals("maxSge: 0 (expected: > 0)",
                assertThrows(IllegalArgumentException.class, () -> new RecvWorkRequest(0)).getMessage());
        assertEquals("maxSge: -1 (expected: > 0)",
                assertThrows(IllegalArgumentException.class, () -> new SendWorkRequest(-1)).getMessage());

        RecvWorkRequest recv = new RecvWorkRequest(1).addSge(1, 1, 1);
        assertEquals("scatter list full: 1 entries (expected: at most 1; create the request with a larger maxSge)",
                assertThrows(IllegalStateException.class, () -> recv.addSge(2, 2, 2)).getMessage());
        SendWorkRequest send = new SendWorkRequest(1).addSge(1, 1, 1);
        assertEquals("scatter/gather list full: 1 entries (expected: at most 1; create the request with a larger"
                + " maxSge)", assertThrows(IllegalStateException.class, () -> send.addSge(2, 2, 2)).getMessage());

        assertEquals("length: -1 (expected: >= 0)", assertThrows(IllegalArgumentException.class,
                () -> new RecvWorkRequest(1).addSge(1, -1, 1)).getMessage());
        assertEquals("length: -5 (expected: >= 0)", assertThrows(IllegalArgumentException.class,
                () -> new SendWorkRequest(1).addSge(1, -5, 1)).getMessage());
    }
}
