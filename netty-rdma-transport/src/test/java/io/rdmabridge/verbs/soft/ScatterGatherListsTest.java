package io.rdmabridge.verbs.soft;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.DirectMemory;
import java.nio.ByteBuffer;
import org.junit.jupiter.api.Test;

class ScatterGatherListsTest {

    @Test
    void shouldScatterAcrossTheEntriesOfItsOwnSlotOnly() {
        ByteBuffer memory = ByteBuffer.allocateDirect(64);
        long base = DirectMemory.address(memory);
        ScatterGatherLists lists = new ScatterGatherLists(2, 2);
        lists.set(0, 0, base + 8, 4, 1);
        lists.set(0, 1, base, 4, 1);
        lists.setNumSge(0, 2);
        // The next slot's entry lies right behind slot 0's in the arrays: a walk past slot 0's end would use it.
        lists.set(1, 0, base + 32, 16, 1);
        lists.setNumSge(1, 1);
        ByteBuffer source = ByteBuffer.allocateDirect(16);
        for (int k = 0; k < 16; k++) {
            source.put(k, (byte) (k + 1));
        }
        long src = DirectMemory.address(source);

        lists.scatter(0, 0, src, 8);
        byte[] got = new byte[12];
        memory.get(0, got);
        assertArrayEquals(new byte[] {5, 6, 7, 8, 0, 0, 0, 0, 1, 2, 3, 4}, got, "entries in list order");

        IllegalStateException e = assertThrows(IllegalStateException.class, () -> lists.scatter(0, 4, src, 8));
        assertTrue(e.getMessage().contains("4 bytes short"), e::getMessage);
        for (int k = 32; k < 48; k++) {
            assertEquals(0, memory.get(k), "byte " + k + " of the next slot's entry");
        }
    }
}
