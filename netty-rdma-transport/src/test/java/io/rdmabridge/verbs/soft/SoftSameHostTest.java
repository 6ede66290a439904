package io.rdmabridge.verbs.soft;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.RecvWorkRequest;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WcOpcode;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WorkCompletions;
import io.rdmabridge.verbs.WrOpcode;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junitpioneer.jupiter.RestoreSystemProperties;

/**
 * The soft provider's same-host path: registered memory in shared files that another process can map, their cleanup,
 * the handshake's same-host test, the shared key table's deregistration guard, and one-sided WRITE and READ in order
 * with the TCP link's SENDs.
 */
@RestoreSystemProperties
class SoftSameHostTest {
    /** The JVM-wide device's directory (Surefire runs each test class in a JVM of its own). */
    @TempDir
    static Path deviceDir;
    /** The directory of the files a test's own {@link SharedMemoryFiles} makes. */
    @TempDir
    Path dir;

    @BeforeAll
    static void shareTheDevicesMemoryInATemporaryDirectory() {
        System.setProperty(SharedMemoryFiles.DIRECTORY_PROPERTY, deviceDir.toString());
        assertEquals(deviceDir, SoftEngine.get().sharedMemory.directory);
    }

    @BeforeEach
    void shareMemory() {
        System.setProperty(SharedMemoryFiles.SAME_HOST_PROPERTY, "shm");
        System.setProperty(SharedMemoryFiles.DIRECTORY_PROPERTY, dir.toString());
    }

    private List<Path> files() throws IOException {
        return files(dir);
    }

    /** The data files in {@code d}: the key table, which lives as long as the process, left out. */
    private static List<Path> files(Path d) throws IOException {
        try (Stream<Path> s = Files.list(d)) {
            return s.filter(f -> !f.getFileName().toString().endsWith("-keys")).toList();
        }
    }

    @Test
    void shouldAllocateOwnerOnlySharedFilesThatAnotherMappingSeesAndDeleteThemWhenFreed() throws Exception {
        SharedMemoryFiles shm = new SharedMemoryFiles();
        ByteBuffer memory = shm.allocate(8192);
        assertInstanceOf(MappedByteBuffer.class, memory);
        List<Path> files = files();
        assertEquals(1, files.size(), files.toString());
        Path file = files.get(0);
        String ours = SharedMemoryFiles.filePrefix(ProcessHandle.current().pid());
        assertTrue(file.getFileName().toString().startsWith(ours), file + " (expected: named " + ours + "<n>)");
        assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(file)));
        assertEquals(8192, Files.size(file));
        assertEquals(1, shm.liveFiles());
        assertEquals(8192, shm.liveBytes());

        // A second mapping of the file, as a peer process would make, sees the bytes written through the first.
        memory.put(5000, (byte) 42);
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ)) {
            MappedByteBuffer peer = ch.map(FileChannel.MapMode.READ_ONLY, 0, 8192);
            assertEquals(42, peer.get(5000));
        }

        shm.free(memory);
        assertEquals(List.of(), files());
        assertEquals(0, shm.liveFiles());
        assertEquals(0, shm.liveBytes());
        assertEquals(0, shm.fallbacks());
    }

    @Test
    void shouldRemoveFilesOfDeadProcessesButNotOfLiveOnes() throws Exception {
        Process finished = new ProcessBuilder("true").start();
        finished.waitFor();
        Path dead = Files.createFile(dir.resolve(SharedMemoryFiles.filePrefix(finished.pid()) + "1"));
        long parent = ProcessHandle.current().parent().orElseThrow().pid();
        Path live = Files.createFile(dir.resolve(SharedMemoryFiles.filePrefix(parent) + "1"));
        Path foreign = Files.createFile(dir.resolve("other-file"));
        // The same pid in another pid namespace (a container sharing /dev/shm): its liveness cannot be told from here.
        Path otherNamespace = Files.createFile(dir.resolve(SharedMemoryFiles.PREFIX
                + (SharedMemoryFiles.PID_NAMESPACE + 1) + '-' + finished.pid() + "-1"));

        SharedMemoryFiles shm = new SharedMemoryFiles();
        ByteBuffer memory = shm.allocate(4096);
        assertFalse(Files.exists(dead), "file of the dead process " + finished.pid() + " still there");
        assertTrue(Files.exists(live));
        assertTrue(Files.exists(foreign));
        assertTrue(Files.exists(otherNamespace), "a file of another pid namespace was deleted");
        shm.free(memory);
        assertEquals(3, files().size());
    }

    @Test
    void shouldTreatAZombieAsDeadAndDeleteItsFiles() throws Exception {
        // The child exits after a second, by when its parent has exec'd into sleep, which never reaps it: a zombie
        // until the parent ends. (A child that exited at once could be reaped by the shell before its exec.)
        Process parent = new ProcessBuilder("sh", "-c", "sleep 1 & echo $!; exec sleep 10").start();
        try {
            long zombie = Long.parseLong(new java.io.BufferedReader(new java.io.InputStreamReader(
                    parent.getInputStream(), java.nio.charset.StandardCharsets.UTF_8)).readLine().trim());
            long deadline = System.nanoTime() + SoftPair.TIMEOUT_NANOS;
            while (!Files.readString(Path.of("/proc/" + zombie + "/stat")).contains(") Z ")) {
                assertTrue(System.nanoTime() < deadline, "process " + zombie + " never became a zombie");
                SoftPair.sleepMicros(10_000);
            }
            assertTrue(ProcessHandle.of(zombie).map(ProcessHandle::isAlive).orElse(false),
                    "a zombie's pid still answers: why a liveness check alone left files behind");
            assertTrue(SharedMemoryFiles.isDead(zombie));
            assertFalse(SharedMemoryFiles.isDead(ProcessHandle.current().pid()));
            Path data = Files.createFile(dir.resolve(SharedMemoryFiles.filePrefix(zombie) + "1"));
            Path keys = Files.createFile(dir.resolve(SharedMemoryFiles.filePrefix(zombie) + "keys"));
            SharedMemoryFiles.removeFilesOfDeadProcess(dir, zombie);
            assertFalse(Files.exists(data));
            assertFalse(Files.exists(keys));
        } finally {
            parent.destroyForcibly();
            parent.waitFor();
        }
    }

    @Test
    void shouldFallBackToPrivateMemoryAndCountItWhenTheDirectoryRefuses() {
        System.setProperty(SharedMemoryFiles.DIRECTORY_PROPERTY, dir.resolve("missing").toString());
        SharedMemoryFiles shm = new SharedMemoryFiles();
        ByteBuffer memory = shm.allocate(4096);
        assertTrue(memory.isDirect());
        assertEquals(1, shm.fallbacks());
        assertEquals(0, shm.liveFiles());
        shm.free(memory);
    }

    @Test
    void shouldAllocatePlainDirectMemoryWhenTurnedOff() throws Exception {
        System.setProperty(SharedMemoryFiles.SAME_HOST_PROPERTY, "tcp");
        SharedMemoryFiles shm = new SharedMemoryFiles();
        ByteBuffer memory = shm.allocate(4096);
        assertEquals(List.of(), files());
        assertEquals(0, shm.fallbacks());
        assertArrayEquals(new byte[SharedMemoryFiles.TOKEN_LENGTH], shm.hostToken());
        shm.free(memory);
    }

    @Test
    void shouldAllocateThroughTheProtectionDomainAndRegisterTheSharedMemory() throws Exception {
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        try (var pd = provider.devices().get(0).allocProtectionDomain()) {
            ByteBuffer memory = pd.allocateMemory(65536);
            assertInstanceOf(MappedByteBuffer.class, memory);
            assertEquals(1, files(deviceDir).size());
            pd.register(memory, Access.ALL).close();
            pd.freeMemory(memory);
            assertEquals(List.of(), files(deviceDir));
        }
        SoftPair.assertResourcesReleased(provider);
    }

    @Test
    void shouldRecogniseSameHostPeersOnlyWhenBothOfferSharedMemory() {
        SharedMemoryFiles shm = new SharedMemoryFiles();
        byte[] token = shm.hostToken();
        byte[] none = new byte[SharedMemoryFiles.TOKEN_LENGTH];
        assertFalse(SharedMemoryFiles.sameHost(none, none), "zeros offer nothing");
        assertTrue(SharedMemoryFiles.sameHost(token, token.clone()));
        assertFalse(SharedMemoryFiles.sameHost(token, none));
        assertFalse(SharedMemoryFiles.sameHost(none, token));
        byte[] otherHost = token.clone();
        otherHost[0] ^= 1;
        assertFalse(SharedMemoryFiles.sameHost(token, otherHost));
    }

    @Test
    void shouldTellBothEndsOfATcpConnectionTheyShareTheHost() throws Exception {
        try (SoftPair p = SoftPair.tcp()) {
            assertTrue(tcpLink(p.client).sameHost());
            assertTrue(tcpLink(p.server).sameHost());
        }
        System.setProperty(SharedMemoryFiles.SAME_HOST_PROPERTY, "tcp");
        try (SoftPair p = SoftPair.tcp()) {
            assertFalse(tcpLink(p.client).sameHost());
            assertFalse(tcpLink(p.server).sameHost());
        }
    }

    private static TcpLink tcpLink(SoftPair.Side side) {
        return assertInstanceOf(TcpLink.class, ((SoftQueuePair) side.qp).link);
    }

    /**
     * A region of {@code size} bytes in memory from the side's domain (shared when the mode is shm), registered with
     * the pair; {@code toFree} gets what frees the memory, to run after the pair is closed.
     */
    static SoftPair.Buffer shared(SoftPair p, SoftPair.Side side, int size, int access, List<Runnable> toFree)
            throws Exception {
        ByteBuffer memory = side.pd.allocateMemory(size);
        ProtectionDomain pd = side.pd;
        toFree.add(() -> pd.freeMemory(memory));
        return p.track(new SoftPair.Buffer(memory, side.pd.register(memory, access)));
    }

    @Test
    void shouldWriteAndReadSharedMemoryOneSidedAndStillOrderAgainstSends() throws Exception {
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        List<Runnable> toFree = new ArrayList<>();
        SendWorkRequest swr = new SendWorkRequest(4);
        try (SoftPair p = SoftPair.tcp()) {
            SoftPair.Buffer local = shared(p, p.client, 65536, Access.ALL, toFree);
            SoftPair.Buffer remote = shared(p, p.server, 65536, Access.LOCAL_WRITE | Access.REMOTE_WRITE
                    | Access.REMOTE_READ, toFree);
            SoftPair.Buffer inbox = shared(p, p.server, 64, Access.LOCAL_WRITE, toFree);
            long oneSided = provider.oneSidedOperations();
            local.fill(7);
            p.client.qp.postSend(swr.reset().wrId(1).opcode(WrOpcode.RDMA_WRITE).flags(SendWorkRequest.SIGNALED)
                    .remote(remote.address() + 100, remote.mr().rkey()).addSge(local.address(), 40000,
                            local.mr().lkey()));
            SoftPair.assertCompletion(SoftPair.pollOne(p.client.sendCq, null), 1, WcStatus.SUCCESS,
                    WcOpcode.RDMA_WRITE);
            remote.assertFilled(100, 40000, 7, 0);
            assertEquals(0, remote.get(99));
            assertEquals(0, remote.get(40100));
            assertEquals(oneSided + 1, provider.oneSidedOperations(), "the WRITE ran one-sided");

            // A SEND behind a one-sided WRITE: the WRITE's bytes are in place when the receive completes.
            p.server.qp.postRecv(new RecvWorkRequest(1).wrId(9).addSge(inbox.address(), 64, inbox.mr().lkey()));
            p.client.qp.postSend(swr.reset().wrId(2).opcode(WrOpcode.RDMA_WRITE)
                    .remote(remote.address(), remote.mr().rkey()).addSge(local.address() + 1, 50, local.mr().lkey()));
            p.client.qp.postSend(swr.reset().wrId(3).flags(SendWorkRequest.SIGNALED)
                    .addSge(local.address(), 8, local.mr().lkey()));
            SoftPair.assertCompletion(SoftPair.pollOne(p.server.recvCq, null), 9, WcStatus.SUCCESS, WcOpcode.RECV);
            remote.assertFilled(0, 50, 7, 1);
            SoftPair.assertCompletion(SoftPair.pollOne(p.client.sendCq, null), 3, WcStatus.SUCCESS, WcOpcode.SEND);

            SoftPair.Buffer back = shared(p, p.client, 65536, Access.ALL, toFree);
            p.client.qp.postSend(swr.reset().wrId(4).opcode(WrOpcode.RDMA_READ).flags(SendWorkRequest.SIGNALED)
                    .remote(remote.address() + 100, remote.mr().rkey())
                    .addSge(back.address(), 1000, back.mr().lkey())
                    .addSge(back.address() + 2000, 39000, back.mr().lkey()));
            WorkCompletions wc = SoftPair.pollOne(p.client.sendCq, null);
            SoftPair.assertCompletion(wc, 4, WcStatus.SUCCESS, WcOpcode.RDMA_READ);
            assertEquals(40000, wc.byteLength(0));
            back.assertFilled(0, 1000, 7, 0);
            back.assertFilled(2000, 39000, 7, 1000);
            assertEquals(oneSided + 3, provider.oneSidedOperations(), "both WRITEs and the READ ran one-sided");

            // A large WRITE right behind a SEND waits for the SEND's acknowledgement, then runs one-sided.
            p.server.qp.postRecv(new RecvWorkRequest(1).wrId(10).addSge(inbox.address(), 64, inbox.mr().lkey()));
            p.client.qp.postSend(swr.reset().wrId(5).flags(SendWorkRequest.SIGNALED)
                    .addSge(local.address(), 8, local.mr().lkey()));
            p.client.qp.postSend(swr.reset().wrId(6).opcode(WrOpcode.RDMA_WRITE).flags(SendWorkRequest.SIGNALED)
                    .remote(remote.address(), remote.mr().rkey()).addSge(local.address(), 65536, local.mr().lkey()));
            SoftPair.assertCompletion(SoftPair.pollOne(p.client.sendCq, null), 5, WcStatus.SUCCESS, WcOpcode.SEND);
            SoftPair.assertCompletion(SoftPair.pollOne(p.client.sendCq, null), 6, WcStatus.SUCCESS,
                    WcOpcode.RDMA_WRITE);
            remote.assertFilled(0, 65536, 7, 0);
            assertEquals(oneSided + 4, provider.oneSidedOperations(), "the WRITE behind the SEND ran one-sided");
            SoftPair.assertCompletion(SoftPair.pollOne(p.server.recvCq, null), 10, WcStatus.SUCCESS, WcOpcode.RECV);
            SoftPair.assertQuiet(p.server.recvCq, 20);

            // An inline WRITE runs one-sided too, from the queue pair's copy of its bytes.
            p.client.qp.postSend(swr.reset().wrId(7).opcode(WrOpcode.RDMA_WRITE)
                    .flags(SendWorkRequest.SIGNALED | SendWorkRequest.INLINE)
                    .remote(remote.address() + 1000, remote.mr().rkey()).addSge(local.address() + 5, 200,
                            local.mr().lkey()));
            SoftPair.assertCompletion(SoftPair.pollOne(p.client.sendCq, null), 7, WcStatus.SUCCESS,
                    WcOpcode.RDMA_WRITE);
            remote.assertFilled(1000, 200, 7, 5);
            assertEquals(oneSided + 5, provider.oneSidedOperations(), "the inline WRITE ran one-sided");
        } finally {
            toFree.forEach(Runnable::run);
        }
        SoftPair.assertResourcesReleased(provider);
        awaitNoFiles(deviceDir);
    }

    /** Waits (bounded) for {@code d} to hold no data files: links delete their ring files when they close. */
    static void awaitNoFiles(Path d) throws Exception {
        long deadline = System.nanoTime() + SoftPair.TIMEOUT_NANOS;
        while (!files(d).isEmpty() && System.nanoTime() < deadline) {
            SoftPair.sleepMicros(10_000);
        }
        assertEquals(List.of(), files(d), "shared files left");
    }

    @Test
    void shouldReadARegisteredFileMappingOneSidedFromTheFileUnlessItWasReplacedUnderItsPath() throws Exception {
        // A file region's chunk (a read-only mapping registered as such) exposed for READ: the peer reads the file
        // itself through a link, one copy and no work here, as a NIC reads the pinned pages; never a file renamed
        // over the mapped one since (Spark commits shuffle files by renaming), which holds other bytes.
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        int size = 1 << 20;
        Path file = dir.resolve("shuffle.data");
        Files.write(file, pattern(size, 3));
        List<Runnable> toFree = new ArrayList<>();
        List<MemoryRegion> regions = new ArrayList<>();
        try (SoftPair p = SoftPair.tcp()) {
            try {
                SoftPair.Buffer local = shared(p, p.client, 65536, Access.LOCAL_WRITE, toFree);
                long oneSided = provider.oneSidedOperations();

                // A mapping from an offset into the file, named by its own bounds (/proc/self/map_files).
                MappedByteBuffer first = map(file, 65536, size - 65536, toFree);
                regions.add(p.server.pd.registerFileMapping(DirectMemory.address(first), size - 65536, 65536));
                MemoryRegion exposed = expose(p, DirectMemory.address(first) + 4096, regions);
                assertEquals(List.of(file), links(), "the exposure made one link, to the mapped file");
                read(p, local, exposed, 1);
                assertArrayEquals(Arrays.copyOfRange(pattern(size, 3), 65536 + 4096, 65536 + 4096 + 65536),
                        bytes(local.buf(), 65536));
                assertEquals(oneSided + 1, provider.oneSidedOperations(), "the READ of the mapped file ran one-sided");

                // Another file, renamed over after the exposure and before the peer's first READ of it: served by this
                // process, from the mapping, which still holds the replaced file's bytes.
                Path other = dir.resolve("other.data");
                Files.write(other, pattern(size, 5));
                MappedByteBuffer second = map(other, 0, size, toFree);
                regions.add(p.server.pd.registerFileMapping(DirectMemory.address(second), size, 0));
                exposed = expose(p, DirectMemory.address(second), regions);
                assertEquals(2, links().size(), "one link per file: " + links());
                Path replacement = dir.resolve("other.data.tmp");
                Files.write(replacement, pattern(size, 7));
                Files.move(replacement, other, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
                read(p, local, exposed, 2);
                assertArrayEquals(Arrays.copyOfRange(pattern(size, 5), 0, 65536), bytes(local.buf(), 65536));
                assertEquals(oneSided + 1, provider.oneSidedOperations(), "a READ of a replaced file ran one-sided");

                // The file now at that path, registered from inside its mapping (no map_files entry has those bounds;
                // found in /proc/self/maps): read from the file, one-sided.
                MappedByteBuffer third = map(other, 0, size, toFree);
                regions.add(p.server.pd.registerFileMapping(DirectMemory.address(third) + 8192, size - 8192, 8192));
                exposed = expose(p, DirectMemory.address(third) + size - 65536, regions);
                read(p, local, exposed, 3);
                assertArrayEquals(Arrays.copyOfRange(pattern(size, 7), size - 65536, size), bytes(local.buf(), 65536));
                assertEquals(oneSided + 2, provider.oneSidedOperations(), "the READ of the new file ran one-sided");

                // A second mapping of the first file shares its link, which the peer has open already.
                MappedByteBuffer fourth = map(file, 0, size, toFree);
                regions.add(p.server.pd.registerFileMapping(DirectMemory.address(fourth), size, 0));
                exposed = expose(p, DirectMemory.address(fourth), regions);
                assertEquals(3, links().size(), "links of the first file, the replaced one and the new one: "
                        + links());
                read(p, local, exposed, 4);
                assertArrayEquals(Arrays.copyOfRange(pattern(size, 3), 0, 65536), bytes(local.buf(), 65536));
                assertEquals(oneSided + 3, provider.oneSidedOperations(),
                        "the READ of the first file's second mapping");

                // A file of more than 2 GiB (sparse; Spark's shuffle files can be that large), mapped near its end.
                Path large = dir.resolve("large.data");
                long end = 3L << 30;
                try (FileChannel ch = FileChannel.open(large, StandardOpenOption.CREATE_NEW,
                        StandardOpenOption.WRITE)) {
                    ch.write(ByteBuffer.wrap(pattern(size, 9)), end - size);
                }
                MappedByteBuffer fifth = map(large, end - size, size, toFree);
                regions.add(p.server.pd.registerFileMapping(DirectMemory.address(fifth), size, end - size));
                exposed = expose(p, DirectMemory.address(fifth) + size - 65536, regions);
                read(p, local, exposed, 5);
                assertArrayEquals(Arrays.copyOfRange(pattern(size, 9), size - 65536, size), bytes(local.buf(), 65536));
                assertEquals(oneSided + 4, provider.oneSidedOperations(), "the READ of the file of 3 GiB ran one-sided");
            } finally {
                for (int i = regions.size() - 1; i >= 0; i--) {
                    regions.get(i).close();
                }
            }
            assertEquals(List.of(), links(), "links left after their mappings were deregistered");
        } finally {
            toFree.forEach(Runnable::run);
        }
        SoftPair.assertResourcesReleased(provider);
    }

    @Test
    void shouldReadAMappedFileThatGrewOneSidedAndFailAReadOfOneCutShortNamingTheFile() throws Exception {
        // A log appended to while regions of it are registered (FileChunkCache maps the chunk past the old end
        // again): we opened the file at its old size, and every READ past that size went over the wire.
        // Cut short under a registered region, the READ fails and names the file, not the peer, as the one cut.
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        int size = 1 << 20;
        byte[] bytes = pattern(2 * size, 11);
        Path file = dir.resolve("segment.log");
        Files.write(file, Arrays.copyOf(bytes, size));
        List<Runnable> toFree = new ArrayList<>();
        List<MemoryRegion> regions = new ArrayList<>();
        try (LogCapture log = new LogCapture(); SoftPair p = SoftPair.tcp()) {
            try {
                SoftPair.Buffer local = shared(p, p.client, 65536, Access.LOCAL_WRITE, toFree);
                long oneSided = provider.oneSidedOperations();
                MappedByteBuffer head = map(file, 0, size, toFree);
                regions.add(p.server.pd.registerFileMapping(DirectMemory.address(head), size, 0));
                read(p, local, expose(p, DirectMemory.address(head) + size - 65536, regions), 1);
                assertArrayEquals(Arrays.copyOfRange(bytes, size - 65536, size), bytes(local.buf(), 65536));
                assertEquals(oneSided + 1, provider.oneSidedOperations(), "the READ before the file grew");

                Files.write(file, Arrays.copyOfRange(bytes, size, 2 * size), StandardOpenOption.APPEND);
                MappedByteBuffer tail = map(file, size, size, toFree);
                regions.add(p.server.pd.registerFileMapping(DirectMemory.address(tail), size, size));
                MemoryRegion exposed = expose(p, DirectMemory.address(tail) + size / 2, regions);
                assertEquals(List.of(file), links(), "one link to the file, shared by both mappings");
                read(p, local, exposed, 2);
                assertArrayEquals(Arrays.copyOfRange(bytes, size + size / 2, size + size / 2 + 65536),
                        bytes(local.buf(), 65536));
                assertEquals(oneSided + 2, provider.oneSidedOperations(), "the READ past the size the file had when "
                        + "we opened it ran one-sided");

                try (FileChannel ch = FileChannel.open(file, StandardOpenOption.WRITE)) {
                    ch.truncate(size + size / 4); // the exposed range is past the end now
                }
                p.client.qp.postSend(new SendWorkRequest(1).wrId(3).opcode(WrOpcode.RDMA_READ)
                        .flags(SendWorkRequest.SIGNALED).remote(exposed.address(), exposed.rkey())
                        .addSge(local.address(), 65536, local.mr().lkey()));
                SoftPair.assertCompletion(SoftPair.pollOne(p.client.sendCq, null), 3, WcStatus.REM_ACCESS_ERR, -1);
                log.assertWarned("the file " + file + " that same-host peer", "truncated while registered",
                        "closing the connection");
                assertEquals(oneSided + 2, provider.oneSidedOperations(), "the failed READ");
            } finally {
                for (int i = regions.size() - 1; i >= 0; i--) {
                    regions.get(i).close();
                }
            }
            assertEquals(List.of(), links(), "links left after their mappings were deregistered");
        } finally {
            toFree.forEach(Runnable::run);
        }
        SoftPair.assertResourcesReleased(provider);
    }

    private static MemoryRegion expose(SoftPair p, long address, List<MemoryRegion> regions) throws Exception {
        MemoryRegion mr = p.server.pd.register(address, 65536, Access.REMOTE_READ);
        regions.add(mr);
        return mr;
    }

    private static byte[] pattern(int size, int seed) {
        byte[] b = new byte[size];
        for (int i = 0; i < size; i++) {
            b[i] = (byte) (seed + i * 31 + (i >> 12));
        }
        return b;
    }

    private static MappedByteBuffer map(Path file, long position, int size, List<Runnable> toFree)
            throws IOException {
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ)) {
            MappedByteBuffer map = ch.map(FileChannel.MapMode.READ_ONLY, position, size);
            toFree.add(() -> DirectMemory.free(map));
            return map;
        }
    }

    private static byte[] bytes(ByteBuffer b, int length) {
        byte[] out = new byte[length];
        b.duplicate().clear().get(out);
        return out;
    }

    /** Where the device's links lead: the mapped files offered to same-host peers. */
    private static List<Path> links() throws IOException {
        try (Stream<Path> s = Files.list(deviceDir)) {
            List<Path> out = new ArrayList<>();
            for (Path f : s.filter(Files::isSymbolicLink).toList()) {
                out.add(Files.readSymbolicLink(f));
            }
            return out;
        }
    }

    private static void read(SoftPair p, SoftPair.Buffer into, MemoryRegion remote, long wrId) throws Exception {
        p.client.qp.postSend(new SendWorkRequest(1).wrId(wrId).opcode(WrOpcode.RDMA_READ)
                .flags(SendWorkRequest.SIGNALED).remote(remote.address(), remote.rkey())
                .addSge(into.address(), (int) remote.length(), into.mr().lkey()));
        SoftPair.assertCompletion(SoftPair.pollOne(p.client.sendCq, null), wrId, WcStatus.SUCCESS,
                WcOpcode.RDMA_READ);
    }

    @Test
    void shouldMakeDeregistrationWaitForAPeersCopyAndRefuseTheKeyAfterwards() throws Exception {
        SharedKeyTable owner = SharedKeyTable.create(dir.resolve(SharedMemoryFiles.filePrefix(1) + "keys"));
        FileChannel peerChannel = FileChannel.open(owner.file, StandardOpenOption.READ, StandardOpenOption.WRITE);
        SharedKeyTable peer = SharedKeyTable.open(peerChannel, owner.file);
        try {
            int key = 0x5a000007;
            owner.publish(key, 3, Access.REMOTE_WRITE, 0x10000, 4096, 2, 512, 0, 0);
            assertEquals(-1, peer.acquire(key ^ 0x100000), "a key of another tag");
            int e = peer.acquire(key);
            assertTrue(e >= 0);
            assertEquals(3, peer.domain(e));
            assertEquals(0x10000, peer.address(e));
            assertEquals(4096, peer.length(e));
            assertEquals(2, peer.fileNumber(e));
            assertEquals(512, peer.fileOffset(e));

            Thread deregistration = new Thread(() -> owner.withdraw(key), "withdraw");
            deregistration.start();
            deregistration.join(200);
            assertTrue(deregistration.isAlive(), "deregistration returned while the peer still copies");
            assertEquals(-1, peer.acquire(key), "the key is refused as soon as deregistration starts");
            peer.release(e);
            deregistration.join(10_000);
            assertFalse(deregistration.isAlive(), "deregistration still waits after the peer's copy ended");
            assertEquals(-1, peer.acquire(key));

            owner.publishQueuePair(77, 3);
            assertEquals(3, peer.queuePairDomain(77));
            assertEquals(-1, peer.queuePairDomain(78));
            owner.withdrawQueuePair(77);
            assertEquals(-1, peer.queuePairDomain(77));
        } finally {
            io.rdmabridge.verbs.DirectMemory.free(peer.mapping());
            io.rdmabridge.verbs.DirectMemory.free(owner.mapping());
            peerChannel.close();
        }
    }

    @Test
    void shouldRetireTheKeySlotOfAPeerThatNeverLetGo() throws Exception {
        // A peer killed mid-copy leaves the slot's in-use count raised for good. Given to another registration, the
        // slot made every later deregistration of it wait the full timeout again, under the key lock.
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        ProtectionDomain pd = provider.devices().get(0).allocProtectionDomain();
        ByteBuffer memory = pd.allocateMemory(4096);
        SharedKeyTable owner = SoftEngine.get().sharedMemory.keyTable();
        FileChannel peerChannel = FileChannel.open(owner.file, StandardOpenOption.READ, StandardOpenOption.WRITE);
        SharedKeyTable peer = SharedKeyTable.open(peerChannel, owner.file);
        try {
            MemoryRegion held = pd.register(memory, Access.ALL);
            int slot = held.rkey() & (SharedKeyTable.REGION_SLOTS - 1);
            assertTrue(peer.acquire(held.rkey()) >= 0, "the peer's hold");
            long start = System.nanoTime();
            held.close();
            long millis = (System.nanoTime() - start) / 1_000_000;
            assertTrue(millis >= SharedKeyTable.WITHDRAW_WAIT_NANOS / 1_000_000 - 50, "deregistration returned after "
                    + millis + " ms while the peer held the key");
            // Free slots are handed out oldest first: a freed slot would come back within about 1,024 registrations.
            for (int i = 0; i < 4096; i++) {
                MemoryRegion mr = pd.register(memory, Access.ALL);
                mr.close();
                assertNotEquals(slot, mr.rkey() & (SharedKeyTable.REGION_SLOTS - 1),
                        "registration " + i + " got the slot the dead peer still holds");
            }
        } finally {
            io.rdmabridge.verbs.DirectMemory.free(peer.mapping());
            peerChannel.close();
            pd.freeMemory(memory);
            pd.close();
        }
        SoftPair.assertResourcesReleased(provider);
    }
}
