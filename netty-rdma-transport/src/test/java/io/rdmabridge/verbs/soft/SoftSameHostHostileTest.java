package io.rdmabridge.verbs.soft;

import static io.rdmabridge.verbs.soft.SoftPair.assertCompletion;
import static io.rdmabridge.verbs.soft.SoftPair.pollOne;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.QpState;
import io.rdmabridge.verbs.ResourceUsage;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WcOpcode;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WrOpcode;
import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Stream;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junitpioneer.jupiter.RestoreSystemProperties;

/**
 * The same-host path against a hostile or broken peer: a memory file truncated under a registered region, a key
 * table full of garbage or targeted lies, and a killed peer process whose files must go. In one JVM the "peer" of a
 * {@link SoftPair#tcp()} client is its server, whose files and table the test corrupts as another process could.
 */
@RestoreSystemProperties
class SoftSameHostHostileTest {
    private static final int GUARD = 16 * 1024;
    /** Large enough that whole-region copies are split with the copy helper ({@link CopyHelper#SPLIT_BYTES}). */
    private static final int REGION = 512 * 1024;

    @TempDir
    static Path deviceDir;

    private final ResourceUsage usage = SoftEngine.get().usage;

    @BeforeAll
    static void shareTheDevicesMemoryInATemporaryDirectory() {
        System.setProperty(SharedMemoryFiles.DIRECTORY_PROPERTY, deviceDir.toString());
        assertEquals(deviceDir, SoftEngine.get().sharedMemory.directory);
    }

    @BeforeEach
    void shareMemory() {
        System.setProperty(SharedMemoryFiles.SAME_HOST_PROPERTY, "shm");
    }

    /** Server memory: one shared file of guard, region, guard; only the middle is registered. */
    private static final class Target implements AutoCloseable {
        final SoftPair.Side side;
        final ByteBuffer memory;
        final MemoryRegion mr;
        final Path file;

        Target(SoftPair.Side side) throws IOException {
            this.side = side;
            List<Path> before = files(deviceDir);
            memory = side.pd.allocateMemory(GUARD + REGION + GUARD);
            List<Path> after = files(deviceDir);
            after.removeAll(before);
            assertEquals(1, after.size(), after.toString());
            file = after.get(0);
            for (int i = 0; i < memory.capacity(); i++) {
                memory.put(i, (byte) 0xA5);
            }
            mr = side.pd.register(DirectMemory.address(memory) + GUARD, REGION, Access.LOCAL_WRITE
                    | Access.REMOTE_WRITE | Access.REMOTE_READ);
        }

        long address() {
            return mr.address();
        }

        void assertGuardsIntact() {
            for (int i = 0; i < GUARD; i++) {
                assertEquals((byte) 0xA5, memory.get(i), "guard byte " + i + " before the region");
                assertEquals((byte) 0xA5, memory.get(GUARD + REGION + i), "guard byte " + i + " after the region");
            }
        }

        @Override
        public void close() {
            mr.close();
            side.pd.freeMemory(memory);
        }
    }

    /** This process's own key table, mapped writable as a hostile peer would map it, to tell lies in. */
    private final class OwnKeyTable implements AutoCloseable {
        private final FileChannel channel;
        final MappedByteBuffer table;

        OwnKeyTable() throws IOException {
            channel = FileChannel.open(deviceDir.resolve(SharedMemoryFiles.filePrefix(ProcessHandle.current().pid())
                    + "keys"), StandardOpenOption.READ, StandardOpenOption.WRITE);
            table = channel.map(FileChannel.MapMode.READ_WRITE, 0, SharedKeyTable.SIZE);
            table.order(ByteOrder.nativeOrder());
        }

        /** Where the entry of the region with this rkey starts. */
        int region(int rkey) {
            return SharedKeyTable.HEADER + (rkey & (SharedKeyTable.REGION_SLOTS - 1)) * SharedKeyTable.REGION_ENTRY;
        }

        /** Where the entry of the queue pair with this number starts, after the region entries. */
        int queuePair(int qpn) {
            return SharedKeyTable.HEADER + SharedKeyTable.REGION_SLOTS * SharedKeyTable.REGION_ENTRY
                    + (qpn & (SharedKeyTable.QP_SLOTS - 1)) * SharedKeyTable.QP_ENTRY;
        }

        @Override
        public void close() throws IOException {
            DirectMemory.free(table);
            channel.close();
        }
    }

    private static List<Path> files(Path d) throws IOException {
        try (Stream<Path> s = Files.list(d)) {
            return new ArrayList<>(s.filter(f -> !f.getFileName().toString().endsWith("-keys")).toList());
        }
    }

    private static void fill(ByteBuffer b, int seed) {
        for (int i = 0; i < b.capacity(); i++) {
            b.put(i, (byte) (seed + i * 31));
        }
    }

    private static void write(SoftPair p, ByteBuffer local, MemoryRegion lmr, Target t, int offset, int len,
                              long wrId, int status) throws Exception {
        p.client.qp.postSend(new SendWorkRequest(1).wrId(wrId).opcode(WrOpcode.RDMA_WRITE)
                .flags(SendWorkRequest.SIGNALED).remote(t.address() + offset, t.mr.rkey())
                .addSge(lmr.address(), len, lmr.lkey()));
        assertCompletion(pollOne(p.client.sendCq, null), wrId, status, status == WcStatus.SUCCESS
                ? WcOpcode.RDMA_WRITE : -1);
    }

    private static void read(SoftPair p, MemoryRegion lmr, Target t, int offset, int len, long wrId, int status)
            throws Exception {
        p.client.qp.postSend(new SendWorkRequest(1).wrId(wrId).opcode(WrOpcode.RDMA_READ)
                .flags(SendWorkRequest.SIGNALED).remote(t.address() + offset, t.mr.rkey())
                .addSge(lmr.address(), len, lmr.lkey()));
        assertCompletion(pollOne(p.client.sendCq, null), wrId, status, status == WcStatus.SUCCESS
                ? WcOpcode.RDMA_READ : -1);
    }

    private void awaitPeerMappingsReleased() {
        long deadline = System.nanoTime() + SoftPair.TIMEOUT_NANOS;
        while (!usage.peerMappingsReleased() && System.nanoTime() < deadline) {
            SoftPair.sleepMicros(1000);
        }
        assertTrue(usage.peerMappingsReleased(), usage.toString());
    }

    /**
     * The key table is ours, but every same-host peer maps it writable. A peer that clears a key while another peer
     * copies under it must not make the deregistration return before that copy ends (the memory would go back to the
     * allocator under the copy); one that drives a key's in-use count below zero spoils the slot, which is retired
     * with a WARN naming the key. Before, a cleared key skipped the wait, and a negative count was taken for none.
     */
    @Test
    void shouldWaitOutACopyWhoseKeyAPeerClearedAndRetireASlotAPeerDroveBelowZero() throws Exception {
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        try (SoftPair p = SoftPair.tcp(); OwnKeyTable own = new OwnKeyTable()) {
            Target held = new Target(p.server);
            int e = own.region(held.mr.rkey());
            own.table.putInt(e + SharedKeyTable.IN_USE, 1); // a peer's copy under way
            own.table.putInt(e + SharedKeyTable.KEY, 0); // and another peer clears the key
            CompletableFuture<Void> deregistered = CompletableFuture.runAsync(held::close);
            Thread.sleep(300);
            assertFalse(deregistered.isDone(), "the deregistration returned while a copy held the key");
            own.table.putInt(e + SharedKeyTable.IN_USE, 0);
            deregistered.get(10, TimeUnit.SECONDS);

            Target spoiled = new Target(p.server);
            int rkey = spoiled.mr.rkey();
            own.table.putInt(own.region(rkey) + SharedKeyTable.IN_USE, -1);
            try (LogCapture log = new LogCapture()) {
                spoiled.close();
                log.assertWarned("0x" + Integer.toHexString(rkey), "below zero (-1)", "retiring its key slot");
            }
        }
        SoftPair.assertResourcesReleased(provider);
    }

    @Test
    void shouldFailTheRequestAndCloseOnlyThatLinkWhenThePeerTruncatesARegisteredFile() throws Exception {
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        for (boolean isRead : new boolean[] {false, true}) {
            try (LogCapture log = new LogCapture(); SoftPair p = SoftPair.tcp(); SoftPair healthy = SoftPair.tcp()) {
                SoftPair.Buffer local = p.buffer(p.client, REGION);
                SoftPair.Buffer healthyLocal = healthy.buffer(healthy.client, REGION);
                try (Target t = new Target(p.server); Target h = new Target(healthy.server)) {
                    long oneSided = provider.oneSidedOperations();
                    local.fill(3);
                    write(p, local.buf(), local.mr(), t, 0, 4096, 1, WcStatus.SUCCESS); // opens the peer's file
                    write(healthy, healthyLocal.buf(), healthyLocal.mr(), h, 0, 4096, 1, WcStatus.SUCCESS);
                    assertEquals(oneSided + 2, provider.oneSidedOperations(), "both ran one-sided");
                    assertEquals(2, usage.peerFiles(), usage.toString());
                    assertTrue(usage.peerKeyTables() >= 1, usage.toString());

                    try (FileChannel ch = FileChannel.open(t.file, StandardOpenOption.WRITE)) {
                        ch.truncate(GUARD); // the registered region is past the end now
                    }
                    local.fill(9);
                    if (isRead) {
                        read(p, local.mr(), t, 0, REGION, 2, WcStatus.REM_ACCESS_ERR);
                        local.assertFilled(0, REGION, 9, 0); // our memory: not written at all
                    } else {
                        write(p, local.buf(), local.mr(), t, 0, REGION, 2, WcStatus.REM_ACCESS_ERR);
                    }
                    log.assertWarned("truncated its memory file " + t.file, "closing the connection");
                    SoftPair.awaitEvent(p.client.channel, io.rdmabridge.verbs.CmEventType.DISCONNECTED);
                    assertEquals(QpState.ERROR, p.client.qp.state());

                    // The engine and the other link carry on, one-sided.
                    healthyLocal.fill(5);
                    write(healthy, healthyLocal.buf(), healthyLocal.mr(), h, 100, REGION - 100, 3, WcStatus.SUCCESS);
                    healthyLocal.fill(0);
                    read(healthy, healthyLocal.mr(), h, 100, REGION - 100, 4, WcStatus.SUCCESS);
                    healthyLocal.assertFilled(0, REGION - 100, 5, 0);
                    h.assertGuardsIntact();
                    assertEquals(oneSided + 4, provider.oneSidedOperations(), "the healthy link stayed one-sided");
                    // A new link to the same (broken) peer still connects and works over the wire or one-sided.
                    try (SoftPair again = SoftPair.tcp()) {
                        assertTrue(((TcpLink) ((SoftQueuePair) again.client.qp).link).sameHost());
                    }
                }
            }
            SoftPair.assertResourcesReleased(provider);
            awaitPeerMappingsReleased();
        }
    }

    @Test
    void shouldDeclineOrFailCleanlyOnAGarbageKeyTableAndKeepTheDataCorrect() throws Exception {
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        try (SoftPair p = SoftPair.tcp()) {
            SoftPair.Buffer local = p.buffer(p.client, REGION);
            SoftPair.Buffer back = p.buffer(p.client, REGION);
            try (Target t = new Target(p.server); Target other = new Target(p.server)) {
                local.fill(1);
                write(p, local.buf(), local.mr(), t, 0, REGION, 1, WcStatus.SUCCESS);
                long oneSided = provider.oneSidedOperations();
                try (OwnKeyTable own = new OwnKeyTable()) {
                    MappedByteBuffer table = own.table;
                    int e = own.region(t.mr.rkey());
                    int qe = own.queuePair(p.server.qp.qpNumber());
                    byte[] saved = new byte[SharedKeyTable.REGION_ENTRY];
                    table.get(e, saved);
                    long otherNumber = table.getLong(own.region(other.mr.rkey()) + SharedKeyTable.FILE_NUMBER);
                    // Lies that do not add up: each is declined, and the owner's engine executes the WRITE.
                    Runnable[] lies = {
                        () -> table.putLong(e + SharedKeyTable.LENGTH, -1),
                        () -> table.putLong(e + SharedKeyTable.LENGTH, Long.MIN_VALUE),
                        () -> table.putLong(e + SharedKeyTable.FILE_OFFSET, -GUARD),
                        () -> table.putLong(e + SharedKeyTable.FILE_OFFSET, Long.MAX_VALUE - 10),
                        () -> table.putLong(e + SharedKeyTable.ADDRESS, Long.MAX_VALUE - 100),
                        () -> table.putLong(e + SharedKeyTable.ADDRESS, Long.MIN_VALUE),
                        () -> { // remote - address overflows to MIN + 1; the offset brings it back to 0: the guard
                            table.putLong(e + SharedKeyTable.ADDRESS, t.address() + Long.MIN_VALUE - 1);
                            table.putLong(e + SharedKeyTable.FILE_OFFSET, Long.MAX_VALUE);
                        },
                        () -> table.putLong(e + SharedKeyTable.FILE_NUMBER, 1L << 40), // no such file
                        () -> table.putLong(e + SharedKeyTable.FILE_NUMBER, -otherNumber),
                        () -> table.putInt(e + SharedKeyTable.DOMAIN, table.getInt(e + SharedKeyTable.DOMAIN) + 1),
                        () -> table.putInt(e + SharedKeyTable.ACCESS, Access.REMOTE_READ), // a WRITE needs more
                        () -> table.putInt(qe + 4, table.getInt(qe + 4) + 1), // the queue pair's domain
                        () -> table.putInt(qe, 0), // the queue pair withdrawn
                    };
                    for (int k = 0; k < lies.length; k++) {
                        lies[k].run();
                        local.fill(10 + k);
                        write(p, local.buf(), local.mr(), t, 0, REGION, 10 + k, WcStatus.SUCCESS);
                        table.put(e, saved);
                        table.putInt(qe, p.server.qp.qpNumber());
                        table.putInt(qe + 4, ((SoftQueuePair) p.server.qp).pd.id);
                        read(p, back.mr(), t, 0, REGION, 100 + k, WcStatus.SUCCESS);
                        back.assertFilled(0, REGION, 10 + k, 0);
                        t.assertGuardsIntact();
                        other.assertGuardsIntact();
                    }
                    assertEquals(oneSided + lies.length, provider.oneSidedOperations(),
                            "each lie was declined (its WRITE went over the wire), each READ ran one-sided");

                    // A huge length adds up for a request inside the real region: one-sided, and still only the
                    // file's bytes can be reached (the table is the owner's word about its own memory; see
                    // SharedPeer), here exactly the requested ones.
                    table.putLong(e + SharedKeyTable.LENGTH, Long.MAX_VALUE);
                    local.fill(40);
                    write(p, local.buf(), local.mr(), t, 0, REGION, 40, WcStatus.SUCCESS);
                    table.put(e, saved);
                    read(p, back.mr(), t, 0, REGION, 41, WcStatus.SUCCESS);
                    back.assertFilled(0, REGION, 40, 0);
                    t.assertGuardsIntact();

                    // An in-use count driven negative: copies still run and the count goes back.
                    table.putInt(e + SharedKeyTable.IN_USE, -5);
                    local.fill(50);
                    write(p, local.buf(), local.mr(), t, 0, REGION, 50, WcStatus.SUCCESS);
                    assertEquals(-5, table.getInt(e + SharedKeyTable.IN_USE));
                    table.putInt(e + SharedKeyTable.IN_USE, 0);

                    // Random bytes in the region's entry and the queue pair's, while requests run.
                    AtomicBoolean stop = new AtomicBoolean();
                    Thread vandal = new Thread(() -> {
                        Random random = new Random(42);
                        byte[] junk = new byte[SharedKeyTable.REGION_ENTRY];
                        while (!stop.get()) {
                            random.nextBytes(junk);
                            table.put(e, junk);
                            table.putLong(qe, random.nextLong());
                        }
                    }, "vandal");
                    vandal.start();
                    try {
                        for (int k = 0; k < 200; k++) {
                            local.fill(k);
                            write(p, local.buf(), local.mr(), t, 0, REGION, 1000 + k, WcStatus.SUCCESS);
                            read(p, back.mr(), t, 0, REGION, 2000 + k, WcStatus.SUCCESS);
                            back.assertFilled(0, REGION, k, 0);
                        }
                    } finally {
                        stop.set(true);
                        vandal.join();
                    }
                    table.put(e, saved);
                    table.putInt(qe, p.server.qp.qpNumber());
                    table.putInt(qe + 4, ((SoftQueuePair) p.server.qp).pd.id);
                    t.assertGuardsIntact();
                    other.assertGuardsIntact();
                }
            }
        }
        SoftPair.assertResourcesReleased(provider);
        awaitPeerMappingsReleased();
    }

    @Test
    void shouldKeepABoundedNumberOfFilesOpenForAPeerThatKeepsNamingNewOnes() throws Exception {
        // The peer's table names the file behind each key; one that names a new file for every request made us open
        // and keep one more descriptor each time, until the process ran out of them.
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        List<Path> decoys = new ArrayList<>();
        try (SoftPair p = SoftPair.tcp()) {
            SoftPair.Buffer local = p.buffer(p.client, 4096);
            try (Target t = new Target(p.server)) {
                local.fill(1);
                write(p, local.buf(), local.mr(), t, 0, 4096, 1, WcStatus.SUCCESS);
                long oneSided = provider.oneSidedOperations();
                String prefix = SharedMemoryFiles.filePrefix(ProcessHandle.current().pid());
                try (OwnKeyTable own = new OwnKeyTable()) {
                    MappedByteBuffer table = own.table;
                    int e = own.region(t.mr.rkey());
                    long real = table.getLong(e + SharedKeyTable.FILE_NUMBER);
                    int files = SharedPeer.MAX_OPEN_FILES + 64;
                    for (int k = 0; k < files; k++) {
                        Path decoy = deviceDir.resolve(prefix + (1_000_000 + k));
                        decoys.add(decoy);
                        try (FileChannel d = FileChannel.open(decoy, StandardOpenOption.CREATE_NEW,
                                StandardOpenOption.WRITE)) {
                            d.write(ByteBuffer.allocate(1), GUARD + REGION + GUARD - 1);
                        }
                        table.putLong(e + SharedKeyTable.FILE_NUMBER, 1_000_000 + k);
                        write(p, local.buf(), local.mr(), t, 0, 4096, 10 + k, WcStatus.SUCCESS);
                        assertTrue(usage.peerFiles() <= SharedPeer.MAX_OPEN_FILES, "peer files open after " + (k + 1)
                                + " new ones: " + usage.peerFiles());
                    }
                    assertEquals(oneSided + files, provider.oneSidedOperations(),
                            "each WRITE ran one-sided, into the file the table named");
                    // A file that cannot be opened, named at the bound: no open file makes room for it.
                    long open = usage.peerFiles();
                    table.putLong(e + SharedKeyTable.FILE_NUMBER, 5_000_000);
                    write(p, local.buf(), local.mr(), t, 0, 4096, 5, WcStatus.SUCCESS);
                    assertEquals(open, usage.peerFiles(), "peer files open after a failed open at the bound");
                    table.putLong(e + SharedKeyTable.FILE_NUMBER, real);
                }
                t.assertGuardsIntact();
            }
        } finally {
            for (Path decoy : decoys) {
                Files.deleteIfExists(decoy);
            }
        }
        SoftPair.assertResourcesReleased(provider);
        awaitPeerMappingsReleased();
    }

    @Test
    void shouldTryAPeerFileThatCannotBeOpenedOnlyOnceInAWhile() throws Exception {
        // The peer's table names the file behind each key. One that names a file we cannot open (none there, a link
        // we refuse) cost every request on that key an open, a look at each peer file open already and, for a link,
        // its checks, on the requesting thread; the peer only has to keep using the key.
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        AtomicLong refusedFiles = SoftEngine.get().sharedMemory.refusedPeerFiles;
        try (SoftPair p = SoftPair.tcp()) {
            SoftPair.Buffer local = p.buffer(p.client, 4096);
            try (Target t = new Target(p.server)) {
                for (int i = 0; i < REGION; i++) {
                    t.memory.put(GUARD + i, (byte) (5 + i * 31)); // as SoftPair.Buffer#fill(5)
                }
                read(p, local.mr(), t, 0, 4096, 1, WcStatus.SUCCESS); // opens the peer's table and file
                long oneSided = provider.oneSidedOperations();
                try (OwnKeyTable own = new OwnKeyTable()) {
                    int e = own.region(t.mr.rkey());
                    long real = own.table.getLong(e + SharedKeyTable.FILE_NUMBER);
                    own.table.putLong(e + SharedKeyTable.FILE_NUMBER, 3_000_000); // no such file
                    long refused = refusedFiles.get();
                    long start = System.nanoTime();
                    for (int k = 0; k < 20; k++) {
                        local.fill(0);
                        read(p, local.mr(), t, 4096, 4096, 10 + k, WcStatus.SUCCESS);
                        local.assertFilled(0, 4096, 5, 4096);
                    }
                    // One try per delay that began since the first (on a slow host the READs may outlast one).
                    long delays = 1 + (System.nanoTime() - start) / SharedPeer.REOPEN_DELAY_NANOS;
                    long tried = refusedFiles.get() - refused;
                    assertTrue(tried >= 1 && tried <= delays, "opens tried for 20 READs of a key naming a file "
                            + "that is not there: " + tried + " in " + delays + " delays");
                    assertEquals(oneSided, provider.oneSidedOperations(), "the READs went over the wire");

                    long deadline = System.nanoTime() + SharedPeer.REOPEN_DELAY_NANOS + 50_000_000L;
                    while (System.nanoTime() < deadline) {
                        SoftPair.sleepMicros(50_000);
                    }
                    refused = refusedFiles.get();
                    read(p, local.mr(), t, 0, 4096, 40, WcStatus.SUCCESS);
                    assertEquals(refused + 1, refusedFiles.get(), "opens tried after the delay");

                    // A new number before each request: at most MAX_FAILED_OPENS failed opens per delay.
                    refused = refusedFiles.get();
                    start = System.nanoTime();
                    for (int k = 0; k < 40; k++) {
                        own.table.putLong(e + SharedKeyTable.FILE_NUMBER, 3_000_100 + k);
                        read(p, local.mr(), t, 4096, 4096, 50 + k, WcStatus.SUCCESS);
                        local.assertFilled(0, 4096, 5, 4096);
                    }
                    delays = 1 + (System.nanoTime() - start) / SharedPeer.REOPEN_DELAY_NANOS;
                    tried = refusedFiles.get() - refused;
                    assertTrue(tried <= delays * SharedPeer.MAX_FAILED_OPENS, "opens tried for 40 READs, each naming "
                            + "another file that is not there: " + tried + " in " + delays + " delays");

                    own.table.putLong(e + SharedKeyTable.FILE_NUMBER, real);
                    read(p, local.mr(), t, 0, 4096, 41, WcStatus.SUCCESS);
                    assertEquals(oneSided + 1, provider.oneSidedOperations(), "the READ of the real file again");
                }
                t.assertGuardsIntact();
            }
        }
        SoftPair.assertResourcesReleased(provider);
        awaitPeerMappingsReleased();
    }

    @Test
    void shouldReadNoFileThroughAPeersLinkThatLeadsElsewhereThanItPublished(@TempDir Path elsewhere) throws Exception {
        // A peer's table may name a link to a mapped file it offers (MappedFileLinks). One that leads to a FIFO (its
        // open could block the reading thread) or into the shared-memory directory (our own memory, or another
        // peer's, taken for this peer's), even with that file's device and inode published, or to another file than
        // the device and inode published, is declined: the READ takes the TCP path, where the peer's engine serves it
        // from its registered memory.
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        Path fifo = elsewhere.resolve("fifo");
        assertEquals(0, new ProcessBuilder("mkfifo", fifo.toString()).inheritIO().start().waitFor(), "mkfifo");
        Path other = elsewhere.resolve("other");
        Files.write(other, new byte[REGION]);
        String prefix = SharedMemoryFiles.filePrefix(ProcessHandle.current().pid());
        List<Path> links = new ArrayList<>();
        try (SoftPair p = SoftPair.tcp()) {
            SoftPair.Buffer local = p.buffer(p.client, 4096);
            try (Target t = new Target(p.server); Target ours = new Target(p.client)) {
                byte[] expected = new byte[4096];
                for (int i = 0; i < 4096; i++) {
                    expected[i] = (byte) (i * 7 + 1);
                    t.memory.put(GUARD + i, expected[i]);
                }
                read(p, local.mr(), t, 0, 4096, 1, WcStatus.SUCCESS);
                long oneSided = provider.oneSidedOperations();
                assertTrue(oneSided > 0, "the first READ ran one-sided: the peer's table is in use");
                try (OwnKeyTable own = new OwnKeyTable()) {
                    MappedByteBuffer table = own.table;
                    int e = own.region(t.mr.rkey());
                    long real = table.getLong(e + SharedKeyTable.FILE_NUMBER);
                    long realOffset = table.getLong(e + SharedKeyTable.FILE_OFFSET);
                    List<Path> targets = List.of(fifo, ours.file, other);
                    for (int k = 0; k < targets.size(); k++) {
                        Path link = deviceDir.resolve(prefix + (2_000_000 + k));
                        links.add(Files.createSymbolicLink(link, targets.get(k)));
                        table.putLong(e + SharedKeyTable.FILE_NUMBER, 2_000_000 + k);
                        table.putLong(e + SharedKeyTable.FILE_OFFSET, 0);
                        boolean published = targets.get(k) != other;
                        table.putLong(e + SharedKeyTable.FILE_DEVICE, published ? ((Number) Files.getAttribute(
                                targets.get(k), "unix:dev")).longValue() : 0);
                        table.putLong(e + SharedKeyTable.FILE_INODE, published ? ((Number) Files.getAttribute(
                                targets.get(k), "unix:ino")).longValue() : 0);
                        local.buf().clear().put(new byte[4096]);
                        read(p, local.mr(), t, 0, 4096, 10 + k, WcStatus.SUCCESS);
                        byte[] got = new byte[4096];
                        local.buf().clear().get(got);
                        assertEquals(java.util.Arrays.toString(expected), java.util.Arrays.toString(got),
                                "bytes read through a link to " + targets.get(k));
                        assertEquals(oneSided, provider.oneSidedOperations(), "a READ through a link to "
                                + targets.get(k) + " ran one-sided");
                    }
                    // The same link to a file outside, now with its device and inode published: read from it, as
                    // the peer offered (its own choice of bytes), so the refusals above were the checks'.
                    table.putLong(e + SharedKeyTable.FILE_DEVICE, ((Number) Files.getAttribute(other, "unix:dev"))
                            .longValue());
                    table.putLong(e + SharedKeyTable.FILE_INODE, ((Number) Files.getAttribute(other, "unix:ino"))
                            .longValue());
                    read(p, local.mr(), t, 0, 4096, 20, WcStatus.SUCCESS);
                    byte[] got = new byte[4096];
                    local.buf().clear().get(got);
                    assertEquals(java.util.Arrays.toString(new byte[4096]), java.util.Arrays.toString(got),
                            "bytes read through the link with its file's device and inode published");
                    assertEquals(oneSided + 1, provider.oneSidedOperations(), "the READ of the published file");
                    table.putLong(e + SharedKeyTable.FILE_NUMBER, real);
                    table.putLong(e + SharedKeyTable.FILE_OFFSET, realOffset);
                    table.putLong(e + SharedKeyTable.FILE_DEVICE, 0);
                    table.putLong(e + SharedKeyTable.FILE_INODE, 0);
                }
                t.assertGuardsIntact();
            }
        } finally {
            for (Path link : links) {
                Files.deleteIfExists(link);
            }
        }
        SoftPair.assertResourcesReleased(provider);
        awaitPeerMappingsReleased();
    }

    @Test
    void shouldDeleteTheFilesOfAKilledPeerProcessWithinBoundedTime() throws Exception {
        String java = System.getProperty("java.home") + File.separator + "bin" + File.separator + "java";
        Process child = new ProcessBuilder(java, "-Xmx64m", "-D" + SharedMemoryFiles.SAME_HOST_PROPERTY + "=shm",
                "-D" + SharedMemoryFiles.DIRECTORY_PROPERTY + "=" + deviceDir, "-cp",
                System.getProperty("java.class.path"), SoftPeerMain.class.getName(), "shared")
                .redirectErrorStream(true).start();
        String prefix = SharedMemoryFiles.filePrefix(child.pid());
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        try {
            BufferedReader out = new BufferedReader(new InputStreamReader(child.getInputStream(),
                    StandardCharsets.UTF_8));
            int port = -1;
            for (String line; (line = out.readLine()) != null; ) {
                if (line.startsWith("PORT ")) {
                    port = Integer.parseInt(line.substring(5).trim());
                    break;
                }
            }
            assertTrue(port > 0, "the peer process printed no port");
            SoftCrossProcessTest.connectWriteReadAndKill(provider, port, child);
            // No waitFor: the killed child may still be a zombie, which must not keep its files.
            long deadline = System.nanoTime() + 5_000_000_000L;
            List<String> left;
            do {
                SoftPair.sleepMicros(20_000);
                try (Stream<Path> s = Files.list(deviceDir)) {
                    left = s.map(f -> f.getFileName().toString()).filter(n -> n.startsWith(prefix)).toList();
                }
            } while (!left.isEmpty() && System.nanoTime() < deadline);
            if (!left.isEmpty()) {
                fail("files of the killed peer " + child.pid() + " left after 5 s: " + left);
            }
        } finally {
            child.destroyForcibly();
            child.waitFor();
        }
        SoftPair.assertResourcesReleased(provider);
        awaitPeerMappingsReleased();
    }
}
