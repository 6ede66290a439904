package io.rdmabridge.it.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

/** The main job ({@code bin/rdma-bridge-demo}) at a tiny size, and the TeraSort validation it relies on. */
class ShuffleDemoTest {

    @Test
    void shouldRunTheDemoWithIdenticalOutputsAndEveryRemoteByteOverRdma() {
        ShuffleDemo.Outcome outcome = ShuffleDemo.run(new ShuffleDemo.Options(20, false, null, false));
        ShuffleDemo.Run rdma = outcome.rdma();
        ShuffleDemo.Run sort = outcome.sort();
        String table = ShuffleDemo.table(outcome);
        System.out.println(table);
        assertEquals(List.of(), outcome.problems(), table);
        assertEquals(sort.digest(), rdma.digest());
        assertTrue(rdma.remoteBytes() > 5_000_000, "remote shuffle bytes: " + rdma.remoteBytes());
        assertEquals(rdma.remoteBytes(), rdma.rdmaBytes());
        assertTrue(rdma.rdmaBlocks() > 0, "blocks fetched over RDMA: " + rdma.rdmaBlocks());
        assertEquals(0, rdma.fallbackBlocks());
        // Blocks leave shuffle files as mapped, registered chunks and land in registered receive memory.
        assertEquals(0, rdma.copiedBytes(), "CPU-copied bytes");
        assertEquals(1.0, rdma.zeroCopyShare());
        assertTrue(table.contains("identical"), table);
        // Both executors on one host: the soft provider's same-host path (its default), and the demo says so.
        assertTrue(rdma.sameHostConnections() > 0, table);
        assertTrue(table.contains("path: same-host shared memory ("), table);
    }

    @Test
    void shouldDigestTheSortedSequenceWhateverThePartitionBoundaries() {
        // The same four records in order, split 2+2 and 1+3: one digest. Out of order: another.
        List<TeraSort.Summary> split22 = List.of(partition(0, 11, 22), partition(1, 33, 44));
        List<TeraSort.Summary> split13 = List.of(partition(0, 11), partition(1, 22, 33, 44));
        List<TeraSort.Summary> swapped = List.of(partition(0, 22, 11), partition(1, 33, 44));
        assertEquals(TeraSort.outputDigest(split22), TeraSort.outputDigest(split13));
        assertNotEquals(TeraSort.outputDigest(split22), TeraSort.outputDigest(swapped));
    }

    @Test
    void shouldRejectUnsortedOverlappingOrIncompleteOutput() {
        TeraSort.Summary input = new TeraSort.Summary(-1, 4, 110, 0, true, null, null);
        TeraSort.Summary a = new TeraSort.Summary(0, 2, 30, 0, true, "aa", "bb");
        TeraSort.Summary b = new TeraSort.Summary(1, 2, 80, 0, true, "cc", "dd");
        assertNull(TeraSort.validate(input, List.of(a, b)));
        assertEquals("partition 0 starts before partition 1 ends", TeraSort.validate(input, List.of(b, a)));
        assertEquals("partition 1 is not sorted", TeraSort.validate(input,
                List.of(a, new TeraSort.Summary(1, 2, 80, 0, false, "cc", "dd"))));
        assertEquals("output: 2 records, checksum 1e (expected: 4 records, checksum 6e)",
                TeraSort.validate(input, List.of(a)));
    }

    /** A partition whose records have the given CRCs, hashed as TeraSort does. */
    private static TeraSort.Summary partition(int index, long... crcs) {
        long hash = 0;
        for (long c : crcs) {
            hash = hash * TeraSort.SEQUENCE_BASE + c;
        }
        return new TeraSort.Summary(index, crcs.length, 0, hash, true, "k", "k");
    }
}
