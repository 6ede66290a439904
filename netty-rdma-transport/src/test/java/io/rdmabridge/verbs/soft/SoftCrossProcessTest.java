package io.rdmabridge.verbs.soft;

import static io.rdmabridge.verbs.soft.SoftPair.assertCompletion;
import static io.rdmabridge.verbs.soft.SoftPair.awaitEvent;
import static io.rdmabridge.verbs.soft.SoftPair.pollOne;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.CmEvent;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.QpCapabilities;
import io.rdmabridge.verbs.QpState;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RecvWorkRequest;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WcOpcode;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WrOpcode;
import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junitpioneer.jupiter.RestoreSystemProperties;
import org.junitpioneer.jupiter.SetSystemProperty;

/**
 * Queue pairs in two processes: one-sided WRITE/READ into the other JVM's memory, then that JVM is killed; also with
 * the other JVM as another user and in another pid namespace, where the link must stay on the TCP path.
 */
@RestoreSystemProperties
class SoftCrossProcessTest {
    /** Both processes' shared-memory directory, so that what a killed peer leaves goes with it. */
    @TempDir
    static Path shm;
    private final SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);

    private static final String JAVA = System.getProperty("java.home") + File.separator + "bin" + File.separator
            + "java";

    @BeforeAll
    static void shareMemoryInATemporaryDirectory() throws IOException {
        // Writable by all, as /dev/shm is, for the peer of another user.
        Files.setPosixFilePermissions(shm, PosixFilePermissions.fromString("rwxrwxrwx"));
        System.setProperty(SharedMemoryFiles.DIRECTORY_PROPERTY, shm.toString());
        assertEquals(shm, SoftEngine.get().sharedMemory.directory);
    }

    /** The peer process's command: {@code launcher}, then Java running {@link SoftPeerMain} with {@code args}. */
    private static List<String> peer(List<String> launcher, String classPath, String... args) {
        List<String> command = new ArrayList<>(launcher);
        command.addAll(List.of(JAVA, "-Xmx64m", "-XX:-UsePerfData", "-D" + SharedMemoryFiles.DIRECTORY_PROPERTY + "="
                + shm, "-cp", classPath, SoftPeerMain.class.getName()));
        command.addAll(List.of(args));
        return command;
    }

    @Test
    void shouldMoveBytesAcrossProcessesAndFlushWhenThePeerDies() throws Exception {
        Process child = new ProcessBuilder(peer(List.of(), System.getProperty("java.class.path")))
                .redirectErrorStream(true).start();
        connectWriteReadAndKill(child);
        SoftPair.assertResourcesReleased(provider);
    }

    /**
     * A peer of another user on this host cannot open our owner-only files, nor we its: the handshake's token tells
     * the two apart, so the link stays on the TCP path and works. (Equal tokens used to make it same-host, and the
     * side that could not map the other's ring closed the connection right after it was established.)
     */
    @Test
    @SetSystemProperty(key = SharedMemoryFiles.SAME_HOST_PROPERTY, value = "shm") // also in the TCP-path run
    void shouldConnectOverTcpToAPeerOfAnotherUser(@TempDir Path copy) throws Exception {
        assumeTrue(isRoot() && Files.isExecutable(Path.of("/usr/bin/setpriv")),
                "needs root and setpriv (util-linux) to start the peer as another user; CI runs as root");
        // The peer, user nobody, reads the class path from a copy: the original may lie under root's home.
        Process child = new ProcessBuilder(peer(List.of("/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                "--clear-groups"), worldReadableCopyOfClassPath(copy), "shared")).redirectErrorStream(true).start();
        long oneSided = provider.oneSidedOperations();
        connectWriteReadAndKill(child);
        assertEquals(oneSided, provider.oneSidedOperations(), "one-sided operations with a peer of another user");
        SoftPair.assertResourcesReleased(provider);
    }

    /**
     * A peer in another pid namespace sharing our shared-memory directory (containers of one pod share /dev/shm)
     * sees our pid as dead and may have our pid itself: its files are named in its namespace, so its start-up sweep
     * leaves ours alone, and the link stays on the TCP path. (Its sweep used to delete our live files, key table
     * included.)
     */
    @Test
    @SetSystemProperty(key = SharedMemoryFiles.SAME_HOST_PROPERTY, value = "shm") // also in the TCP-path run
    void shouldKeepOurFilesAndConnectOverTcpToAPeerInAnotherPidNamespace() throws Exception {
        assumeTrue(isRoot() && Files.isExecutable(Path.of("/usr/bin/unshare")),
                "needs root and unshare (util-linux) to start the peer in a pid namespace of its own; CI runs as root");
        ProtectionDomain pd = provider.devices().get(0).allocProtectionDomain();
        ByteBuffer ours = pd.allocateMemory(4096);
        String prefix = SharedMemoryFiles.filePrefix(ProcessHandle.current().pid());
        List<Path> before = filesStartingWith(shm, prefix);
        assertFalse(before.isEmpty(), "no shared file of ours in " + shm + " to watch");
        Process child = new ProcessBuilder(peer(List.of("/usr/bin/unshare", "--pid", "--fork", "--mount-proc",
                "--kill-child"), System.getProperty("java.class.path"), "shared")).redirectErrorStream(true).start();
        long oneSided = provider.oneSidedOperations();
        // The peer allocates its shared memory, and sweeps, before it accepts.
        connectWriteReadAndKill(child);
        for (Path file : before) {
            assertTrue(Files.exists(file), file + " deleted by the peer in another pid namespace");
        }
        assertEquals(oneSided, provider.oneSidedOperations(), "one-sided operations with a peer in another pid "
                + "namespace");
        pd.freeMemory(ours);
        pd.close();
        SoftPair.assertResourcesReleased(provider);
    }

    /** {@link #connectWriteReadAndKill(SoftProvider, int, Process)} with {@code child}, killed and reaped after. */
    private void connectWriteReadAndKill(Process child) throws Exception {
        try {
            connectWriteReadAndKill(provider, portOf(child), child);
        } finally {
            child.destroyForcibly();
            child.waitFor();
        }
    }

    private static boolean isRoot() throws IOException {
        return Integer.valueOf(0).equals(Files.getAttribute(Path.of("/proc/self"), "unix:uid"));
    }

    private static List<Path> filesStartingWith(Path dir, String prefix) throws IOException {
        try (Stream<Path> files = Files.list(dir)) {
            return files.filter(f -> f.getFileName().toString().startsWith(prefix)).collect(Collectors.toList());
        }
    }

    /** Copies every entry of this JVM's class path under {@code dir}, readable by all; the copy's class path. */
    private static String worldReadableCopyOfClassPath(Path dir) throws IOException {
        Set<PosixFilePermission> readable = PosixFilePermissions.fromString("rwxr-xr-x");
        Files.setPosixFilePermissions(dir, readable);
        List<String> copies = new ArrayList<>();
        String[] entries = System.getProperty("java.class.path").split(File.pathSeparator);
        for (int i = 0; i < entries.length; i++) {
            Path from = Path.of(entries[i]);
            if (!Files.exists(from)) {
                continue;
            }
            Path to = dir.resolve(i + (Files.isDirectory(from) ? "" : ".jar"));
            try (Stream<Path> tree = Files.walk(from)) {
                for (Path p : (Iterable<Path>) tree::iterator) {
                    Path target = to.resolve(from.relativize(p).toString());
                    Files.copy(p, target);
                    Files.setPosixFilePermissions(target, Files.isDirectory(target) ? readable
                            : PosixFilePermissions.fromString("rw-r--r--"));
                }
            }
            copies.add(to.toString());
        }
        return String.join(File.pathSeparator, copies);
    }

    /** The port the peer process prints. */
    private static int portOf(Process child) throws IOException, InterruptedException {
        BufferedReader out = new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8));
        for (String line; (line = out.readLine()) != null; ) {
            if (line.startsWith("PORT ")) {
                return Integer.parseInt(line.substring(5).trim());
            }
        }
        throw new AssertionError("the peer process printed no port (exit status " + child.waitFor() + ")");
    }

    /**
     * Connects to the peer process on {@code port}, WRITEs 1 MiB into its region and READs it back, SENDs, then kills
     * it and checks the flush.
     */
    static void connectWriteReadAndKill(SoftProvider provider, int port, Process child) throws Exception {
        RdmaDevice device = provider.devices().get(0);
        EventNotifier notifier = new EventNotifier();
        try (RdmaEventChannel channel = provider.createEventChannel(notifier)) {
            RdmaCmId id = channel.createId();
            id.resolve(new InetSocketAddress(InetAddress.getLoopbackAddress(), port), 5000);
            awaitEvent(channel, CmEventType.ADDR_RESOLVED);
            ProtectionDomain pd = device.allocProtectionDomain();
            CompletionQueue cq = device.createCompletionQueue(64, notifier);
            QueuePair qp = id.createQueuePair(pd, cq, cq, new QpCapabilities(16, 16, 1, 1, 0));
            ByteBuffer local = ByteBuffer.allocateDirect(1 << 20);
            MemoryRegion mr = pd.register(local, Access.ALL);
            RecvWorkRequest rwr = new RecvWorkRequest(1);
            for (int i = 0; i < 3; i++) {
                qp.postRecv(rwr.reset().wrId(100 + i).addSge(mr.address(), 1024, mr.lkey()));
            }
            id.connect(ConnectionParameters.DEFAULT);
            CmEvent established = awaitEvent(channel, CmEventType.ESTABLISHED);
            ByteBuffer advert = ByteBuffer.wrap(established.privateData());
            long remoteAddress = advert.getLong();
            int rkey = advert.getInt();
            for (int i = 0; i < local.capacity(); i++) {
                local.put(i, (byte) (i * 7 + 1));
            }
            SendWorkRequest swr = new SendWorkRequest(1);
            qp.postSend(swr.reset().wrId(1).opcode(WrOpcode.RDMA_WRITE).flags(SendWorkRequest.SIGNALED)
                    .remote(remoteAddress, rkey).addSge(mr.address(), 1 << 20, mr.lkey()));
            assertCompletion(pollOne(cq, null), 1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE);
            for (int i = 0; i < local.capacity(); i++) {
                local.put(i, (byte) 0);
            }
            qp.postSend(swr.reset().wrId(2).opcode(WrOpcode.RDMA_READ).flags(SendWorkRequest.SIGNALED)
                    .remote(remoteAddress, rkey).addSge(mr.address(), 1 << 20, mr.lkey()));
            assertCompletion(pollOne(cq, null), 2, WcStatus.SUCCESS, WcOpcode.RDMA_READ);
            for (int i = 0; i < local.capacity(); i++) {
                assertEquals((byte) (i * 7 + 1), local.get(i), "byte " + i + " read back from the other process");
            }
            qp.postSend(swr.reset().wrId(3).flags(SendWorkRequest.SIGNALED).addSge(mr.address(), 100, mr.lkey()));
            assertCompletion(pollOne(cq, null), 3, WcStatus.SUCCESS, WcOpcode.SEND);

            long start = System.nanoTime();
            child.destroyForcibly();
            awaitEvent(channel, CmEventType.DISCONNECTED);
            for (int i = 0; i < 3; i++) {
                assertCompletion(pollOne(cq, null), 100 + i, WcStatus.WR_FLUSH_ERR, 0);
            }
            long millis = (System.nanoTime() - start) / 1_000_000;
            assertTrue(millis < 1000, "peer death noticed and flushed after " + millis + " ms");
            assertEquals(QpState.ERROR, qp.state());
            qp.close();
            mr.close();
            id.close();
            cq.close();
            pd.close();
        }
    }
}
