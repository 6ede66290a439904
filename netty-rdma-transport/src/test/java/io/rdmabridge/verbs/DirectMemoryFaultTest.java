package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Why the soft provider's same-host path does not copy through a mapping of a peer's file: in JDK 17 a copy into a
 * mapped file that was truncated (SIGBUS) does not fail where it happens. The JVM survives and an
 * {@link InternalError} ("a fault occurred in a recent unsafe memory access operation ...") reaches the same thread,
 * but at a later safepoint poll or VM transition, after the copy returned as if it had worked (seen: at the next
 * {@code Thread.sleep}, at a loop's back edge outside the {@code try} around the copy, at a {@code println}). So
 * a {@code try} around the copy cannot contain it; see {@code SharedPeer}. Also what it uses instead: positional
 * file I/O through a view retargeted at memory known by address.
 */
class DirectMemoryFaultTest {
    private static final int SIZE = 1 << 16;

    @TempDir
    Path dir;

    @Test
    void shouldSurviveACopyIntoATruncatedMappingAndDeliverAnInternalErrorToTheThreadLater() throws Exception {
        ByteBuffer local = ByteBuffer.allocateDirect(SIZE);
        try (FileChannel ch = FileChannel.open(dir.resolve("mapped"), StandardOpenOption.CREATE_NEW,
                StandardOpenOption.READ, StandardOpenOption.WRITE)) {
            MappedByteBuffer map = ch.map(FileChannel.MapMode.READ_WRITE, 0, SIZE);
            long mapped = DirectMemory.address(map);
            DirectMemory.copy(DirectMemory.address(local), mapped, 4096);
            ch.truncate(0);
            InternalError error = null;
            int copiesReturned = 0;
            try {
                for (int k = 0; k < 100; k++) {
                    DirectMemory.copy(DirectMemory.address(local), mapped, 4096);
                    copiesReturned++;
                    Thread.sleep(1); // a VM transition, where the pending error is thrown
                }
            } catch (InternalError e) {
                error = e;
            }
            assertNotNull(error, "no InternalError after " + copiesReturned + " faulting copies");
            assertTrue(error.getMessage().startsWith("a fault occurred in"), error.toString());
            DirectMemory.free(map);
        } finally {
            DirectMemory.free(local);
        }
    }

    @Test
    void shouldReadAndWriteAFileStraightThroughARetargetedView() throws Exception {
        ByteBuffer memory = ByteBuffer.allocateDirect(64);
        for (int i = 0; i < 64; i++) {
            memory.put(i, (byte) i);
        }
        ByteBuffer view = ByteBuffer.allocateDirect(1).duplicate();
        try (FileChannel ch = FileChannel.open(dir.resolve("file"), StandardOpenOption.CREATE_NEW,
                StandardOpenOption.READ, StandardOpenOption.WRITE)) {
            ByteBuffer v = DirectMemory.retarget(view, DirectMemory.address(memory) + 10, 20);
            assertEquals(0, v.position());
            assertEquals(20, v.limit());
            assertEquals(20, v.capacity());
            assertEquals(20, ch.write(v, 100));
            assertEquals(120, ch.size());
            v = DirectMemory.retarget(view, DirectMemory.address(memory) + 40, 20);
            assertEquals(20, ch.read(v, 100));
            for (int i = 0; i < 64; i++) {
                int expected = i >= 40 && i < 60 ? i - 30 : i;
                assertEquals((byte) expected, memory.get(i), "byte " + i);
            }
            // Past the end of the file a read comes back short, with nothing to fault.
            v = DirectMemory.retarget(view, DirectMemory.address(memory), 8);
            assertEquals(-1, ch.read(v, 120));
        } finally {
            DirectMemory.free(memory);
        }
    }
}
