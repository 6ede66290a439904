package io.rdmabridge.verbs.soft;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The same-host groundwork of the soft provider: registered memory in shared files that another process can map,
 * their cleanup, and the handshake's same-host test.
 */
class SoftSameHostTest {
    @TempDir
    Path dir;
    private String oldMode;
    private String oldDirectory;

    @BeforeEach
    void shareMemoryInTheTemporaryDirectory() {
        oldMode = System.getProperty(SharedMemoryFiles.SAME_HOST_PROPERTY);
        oldDirectory = System.getProperty(SharedMemoryFiles.DIRECTORY_PROPERTY);
        System.setProperty(SharedMemoryFiles.SAME_HOST_PROPERTY, "shm");
        System.setProperty(SharedMemoryFiles.DIRECTORY_PROPERTY, dir.toString());
    }

    @AfterEach
    void restoreProperties() {
        restore(SharedMemoryFiles.SAME_HOST_PROPERTY, oldMode);
        restore(SharedMemoryFiles.DIRECTORY_PROPERTY, oldDirectory);
    }

    private static void restore(String key, String value) {
        if (value == null) {
            System.clearProperty(key);
        } else {
            System.setProperty(key, value);
        }
    }

    private List<Path> files() throws IOException {
        try (Stream<Path> s = Files.list(dir)) {
            return s.toList();
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
        assertTrue(file.getFileName().toString().startsWith(SharedMemoryFiles.PREFIX + ProcessHandle.current().pid()
                + '-'), file.toString());
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
        Path dead = Files.createFile(dir.resolve(SharedMemoryFiles.PREFIX + finished.pid() + "-1"));
        long parent = ProcessHandle.current().parent().orElseThrow().pid();
        Path live = Files.createFile(dir.resolve(SharedMemoryFiles.PREFIX + parent + "-1"));
        Path foreign = Files.createFile(dir.resolve("other-file"));

        SharedMemoryFiles shm = new SharedMemoryFiles();
        ByteBuffer memory = shm.allocate(4096);
        assertFalse(Files.exists(dead), "file of the dead process " + finished.pid() + " still there");
        assertTrue(Files.exists(live));
        assertTrue(Files.exists(foreign));
        shm.free(memory);
        assertEquals(2, files().size());
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
            assertEquals(1, files().size());
            pd.register(memory, io.rdmabridge.verbs.Access.ALL).close();
            pd.freeMemory(memory);
            assertEquals(List.of(), files());
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
}
