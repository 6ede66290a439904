package io.rdmabridge.verbs;

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
 * a {@code try} around the copy cannot contain it; see {@code SharedPeer}.
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
}
