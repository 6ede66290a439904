package io.rdmabridge.verbs.soft;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.rdmabridge.verbs.DirectMemory;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The same-host path in a shared-memory directory too small for what is asked (a container's 64 MiB {@code /dev/shm}
 * is the common case): every page is committed when a file is made, so a full directory falls back to private memory
 * with a WARN instead of faulting (SIGBUS) on first touch. Needs a tmpfs of its own: the test mounts a 2 MiB one (the
 * key table commits 768 KiB of it), which takes root (CI and the development machines run as root; elsewhere it is
 * skipped, saying so).
 */
class SoftSameHostFullDirectoryTest {
    private Path mount;
    private boolean mounted;

    @BeforeEach
    void mountSmallTmpfs() throws Exception {
        mount = Files.createTempDirectory("rdmabridge-small-shm");
        Process p = new ProcessBuilder("mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", mount.toString())
                .redirectErrorStream(true).start();
        mounted = p.waitFor(20, TimeUnit.SECONDS) && p.exitValue() == 0;
        assumeTrue(mounted, "mounting a 2 MiB tmpfs needs root and mount(8): "
                + new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).trim());
    }

    @AfterEach
    void unmount() throws Exception {
        if (mounted) {
            new ProcessBuilder("umount", mount.toString()).start().waitFor(20, TimeUnit.SECONDS);
        }
        Files.deleteIfExists(mount);
    }

    @Test
    void shouldFallBackToPrivateMemoryInsteadOfFaultingWhenTheDirectoryIsFull() throws Exception {
        Process child = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-cp", System.getProperty("java.class.path"), "-Drdmabridge.soft.sameHost=shm",
                "-Drdmabridge.soft.shmDirectory=" + mount, FullDirectoryMain.class.getName())
                .redirectErrorStream(true).start();
        String output = new String(child.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertTrue(child.waitFor(60, TimeUnit.SECONDS), output);
        assertEquals(0, child.exitValue(), output);
        List<String> lines = output.lines().filter(l -> l.startsWith("RESULT ")).toList();
        assertEquals(List.of("RESULT touched=4456448 fallbacks=1"), lines, output);
        assertTrue(output.contains("cannot allocate registered memory in " + mount), output);
        assertTrue(!output.contains("InternalError"), output);
    }

    /** The child: a key table, a file that fits, one that does not; every byte of both written and read back. */
    static final class FullDirectoryMain {
        public static void main(String[] args) {
            SharedMemoryFiles files = SoftEngine.get().sharedMemory;
            files.keyTable();
            ByteBuffer fits = files.allocate(256 * 1024);
            ByteBuffer tooBig = files.allocate(4 * 1024 * 1024);
            long touched = touch(fits) + touch(tooBig);
            System.out.println("RESULT touched=" + touched + " fallbacks=" + files.fallbacks());
            files.free(fits);
            files.free(tooBig);
            System.out.flush();
        }

        private static long touch(ByteBuffer b) {
            long address = DirectMemory.address(b);
            for (int i = 0; i < b.capacity(); i += 512) {
                b.put(i, (byte) 7);
            }
            for (int i = 0; i < b.capacity(); i += 512) {
                if (b.get(i) != 7) {
                    throw new AssertionError("lost a write at " + i + " of " + address);
                }
            }
            return b.capacity();
        }
    }
}
