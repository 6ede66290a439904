package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.DirectMemory;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * {@link CopyHelper}, the second thread of large one-sided copies: every byte lands where a single-threaded copy puts
 * it, whatever the scatter list's entries and however the chunks fall across them; a file that ends early, and a
 * channel closed under the copy, come back to the caller as the drainer's own copy reports them, and leave the helper
 * free for the next copy.
 */
@Timeout(60)
class CopyHelperTest {
    private static final int FILE_BYTES = 4 << 20;

    @TempDir
    Path dir;

    private FileChannel file;
    private ByteBuffer memory;
    private final ByteBuffer view = ByteBuffer.allocateDirect(1).duplicate();
    private final CopyHelper helper = new CopyHelper();
    private final ScatterGatherLists sges = new ScatterGatherLists(2, 4);

    @BeforeEach
    void setUp() throws Exception {
        file = FileChannel.open(dir.resolve("peer-memory"), StandardOpenOption.CREATE_NEW, StandardOpenOption.READ,
                StandardOpenOption.WRITE);
        memory = ByteBuffer.allocateDirect(FILE_BYTES);
    }

    @AfterEach
    void tearDown() throws Exception {
        file.close();
        DirectMemory.free(memory);
    }

    @Test
    void shouldReadAndWriteEveryByteAcrossRandomScatterListsWithTheHelperTakingChunks() throws Exception {
        Random random = new Random(42);
        byte[] pattern = new byte[FILE_BYTES];
        random.nextBytes(pattern);
        file.write(ByteBuffer.wrap(pattern), 0);
        long base = DirectMemory.address(memory);
        for (int round = 0; round < 200; round++) {
            int length = CopyHelper.SPLIT_BYTES + random.nextInt((3 << 20) - CopyHelper.SPLIT_BYTES + 1);
            long at = random.nextInt(FILE_BYTES - length + 1);
            int entries = 1 + random.nextInt(4);
            int slot = round & 1;
            // Entries of random lengths (empty ones too) at random places of our memory, in reverse order so that
            // the list's bytes are not contiguous in memory.
            int[] cut = new int[entries + 1];
            cut[entries] = length;
            for (int j = 1; j < entries; j++) {
                cut[j] = random.nextInt(length + 1);
            }
            Arrays.sort(cut, 1, entries);
            int memoryAt = FILE_BYTES;
            for (int j = 0; j < entries; j++) {
                int l = cut[j + 1] - cut[j];
                memoryAt -= l;
                sges.set(slot, j, base + memoryAt, l, 0);
            }
            sges.setNumSge(slot, entries);
            boolean read = random.nextBoolean();
            if (read) {
                assertEquals(CopyHelper.COPIED, helper.tryCopy(file, view, sges, slot, length, at, true),
                        "round " + round);
            } else {
                byte[] fresh = new byte[length];
                random.nextBytes(fresh);
                for (int j = 0; j < entries; j++) {
                    memory.put((int) (sges.address(slot, j) - base), fresh, cut[j], sges.length(slot, j));
                }
                assertEquals(CopyHelper.COPIED, helper.tryCopy(file, view, sges, slot, length, at, false),
                        "round " + round);
                System.arraycopy(fresh, 0, pattern, (int) at, length);
                byte[] written = new byte[length];
                ByteBuffer w = ByteBuffer.wrap(written);
                while (w.hasRemaining()) {
                    file.read(w, at + w.position());
                }
                assertTrue(Arrays.equals(written, 0, length, pattern, (int) at, (int) at + length),
                        "round " + round + ": the file's bytes after a WRITE of " + length + " at " + at);
            }
            for (int j = 0; j < entries; j++) {
                int l = sges.length(slot, j);
                byte[] got = new byte[l];
                memory.get((int) (sges.address(slot, j) - base), got);
                assertTrue(Arrays.equals(got, 0, l, pattern, (int) at + cut[j], (int) at + cut[j] + l),
                        "round " + round + ": entry " + j + " of " + entries + " (" + l + " bytes) after a "
                                + (read ? "READ" : "WRITE") + " of " + length + " at " + at);
            }
        }
        assertTrue(helper.shared.get() > 0, "the helper took no chunk in 200 copies of 256 KiB to 3 MiB");
    }

    @Test
    void shouldLeaveSmallCopiesToTheCaller() throws Exception {
        sges.set(0, 0, DirectMemory.address(memory), CopyHelper.SPLIT_BYTES - 1, 0);
        sges.setNumSge(0, 1);
        assertEquals(-1, helper.tryCopy(file, view, sges, 0, CopyHelper.SPLIT_BYTES - 1, 0, false));
        assertEquals(0, file.size(), "a copy left to the caller wrote nothing");
    }

    @Test
    void shouldReportAFileThatEndsBeforeTheReadAndStayUsable() throws Exception {
        int length = 1 << 20;
        file.write(ByteBuffer.allocate(length / 2 + 10), 0);
        sges.set(0, 0, DirectMemory.address(memory), length, 0);
        sges.setNumSge(0, 1);
        assertEquals(CopyHelper.SHORT, helper.tryCopy(file, view, sges, 0, length, 0, true),
                "a READ past the end of a truncated file");
        file.write(ByteBuffer.allocate(length), 0);
        assertEquals(CopyHelper.COPIED, helper.tryCopy(file, view, sges, 0, length, 0, true),
                "the helper is free again after a short copy");
    }

    @Test
    void shouldThrowWhenTheChannelIsClosedUnderTheCopyAndStayUsable() throws Exception {
        int length = 1 << 20;
        sges.set(0, 0, DirectMemory.address(memory), length, 0);
        sges.setNumSge(0, 1);
        FileChannel closed = FileChannel.open(dir.resolve("closed"), StandardOpenOption.CREATE_NEW,
                StandardOpenOption.READ, StandardOpenOption.WRITE);
        closed.close();
        assertThrows(ClosedChannelException.class, () -> helper.tryCopy(closed, view, sges, 0, length, 0, true));
        file.write(ByteBuffer.allocate(length), 0);
        assertEquals(CopyHelper.COPIED, helper.tryCopy(file, view, sges, 0, length, 0, true),
                "the helper is free again after a failed copy");
    }
}
