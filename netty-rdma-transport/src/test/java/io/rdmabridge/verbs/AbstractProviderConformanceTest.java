package io.rdmabridge.verbs;

import static io.rdmabridge.verbs.LocalEnd.assertStatus;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.rdmabridge.verbs.ConformancePeer.Completion;
import io.rdmabridge.verbs.ConformancePeer.Config;
import io.rdmabridge.verbs.ConformancePeer.Region;
import io.rdmabridge.verbs.LocalEnd.Buffer;
import io.rdmabridge.verbs.LocalEnd.Cm;
import io.rdmabridge.verbs.LocalEnd.Connection;
import io.rdmabridge.verbs.LocalEnd.Wc;
import java.lang.ref.Reference;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import java.util.zip.CRC32;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * The provider conformance suite: what every {@link RdmaProvider} must do, written against the verbs SPI alone.
 * Every provider runs it through a few-line subclass that names the provider and the kind of peer (in this JVM, in a
 * child JVM). Each test drives a local end on the test thread against a {@link ConformancePeer} and asserts exact
 * outcomes: bytes, completion statuses and opcodes, queue-pair states, CM events; after every test the local end and
 * the peer destroy what they made and the provider's {@link ResourceUsage} must be zero.
 *
 * <p>Every wait has a deadline; "promptly" means within {@value #PROMPT_MS} ms.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@Timeout(value = 120, unit = TimeUnit.SECONDS)
public abstract class AbstractProviderConformanceTest {
    /** How long an operation that should complete at once may take on a loaded 2-core CI machine. */
    protected static final long WAIT_MS = 10_000;
    /** The receiver-not-ready timer of a queue pair connected through rdma_cm (minimum RNR timer 0: 655.36 ms). */
    private static final long RNR_TIMER_MS = 655;
    /** Bound on disconnect, flush and peer-death reporting. */
    protected static final long PROMPT_MS = 5_000;
    protected static final int MIB = 1 << 20;
    protected static final long BIG_TRANSFER = 64L * MIB;

    private static final int REMOTE_RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ;

    protected RdmaProvider provider;
    protected ConformancePeer peer;
    protected LocalEnd local;
    private int nextPeerConn;
    private final SendWorkRequest swr = new SendWorkRequest(4);
    private final RecvWorkRequest rwr = new RecvWorkRequest(4);

    /** The provider under test; called once, before any test. */
    protected abstract RdmaProvider newProvider() throws Exception;

    /** A fresh peer for {@link #provider}; called before the first test and again after a peer was killed. */
    protected abstract ConformancePeer newPeer() throws Exception;

    /** The IP address both ends use: {@code rdmabridge.test.address}, by default {@code 127.0.0.1}. */
    protected String address() {
        return System.getProperty("rdmabridge.test.address", "127.0.0.1");
    }

    /**
     * Makes the peer of {@code c} vanish without a disconnect. By default SIGKILLs a peer that lives in a process of
     * its own; modes whose peer shares this JVM override it with their provider's fault hooks, or the test is
     * aborted with the reason.
     */
    protected void killPeerAbruptly(Connection c) throws Exception {
        assumeTrue(peer.canDie(), "this mode's peer shares the JVM and the provider offers no fault hook to cut the"
                + " connection; the cross-process mode covers peer death");
        peer.kill();
    }

    @BeforeAll
    void startPeer() throws Exception {
        provider = newProvider();
        peer = newPeer();
    }

    @AfterAll
    void stopPeer() {
        if (peer != null) {
            peer.close();
        }
    }

    @BeforeEach
    void setUp(TestInfo test) throws Exception {
        // Names the case before it runs: when a native fault kills the JVM, surefire keeps no report, only this.
        System.err.println("conformance case: " + test.getDisplayName() + " (" + provider.name() + ")");
        if (!peer.isAlive()) {
            peer.close();
            peer = newPeer();
        }
        nextPeerConn = 0;
        local = new LocalEnd(provider);
    }

    @AfterEach
    void resourcesReturnToZero() throws Exception {
        Throwable localFailure = null;
        try {
            local.close();
        } catch (Throwable t) {
            localFailure = t;
        }
        ConformancePeer.Usage peerUsage = null;
        if (peer.isAlive()) {
            peerUsage = peer.reset();
        } else {
            // A killed peer freed everything with its process; the next test starts a new one.
            peer.close();
            peer = newPeer();
        }
        ResourceUsage usage = provider.resourceUsage();
        if (localFailure != null) {
            throw new AssertionError("destroying the local end failed; usage: " + usage, localFailure);
        }
        // DiSNI's completion queues are destroyed by their event threads shortly after close() returned.
        assertTrue(usage.awaitZero(Duration.ofSeconds(5)), () -> "resources leaked (local provider): " + usage);
        if (peerUsage != null) {
            ConformancePeer.Usage u = peerUsage;
            assertTrue(u.zero(), () -> "resources leaked (peer's provider): " + u.usage());
        }
    }

    // ------------------------------------------------------------------------------------------------------------
    // helpers

    private InetSocketAddress listen(Config config) throws Exception {
        return new InetSocketAddress(address(), peer.listen(address(), config));
    }

    private Connection connect(InetSocketAddress peerAddress, ConnectionParameters params, int sendWr, int recvWr)
            throws Exception {
        Connection c = local.connect(peerAddress, params, sendWr, recvWr);
        c.peerIndex = nextPeerConn++;
        assertEquals(QpState.RTS, c.qp.state(), "queue pair state after ESTABLISHED");
        return c;
    }

    private Connection connect(InetSocketAddress peerAddress) throws Exception {
        return connect(peerAddress, ConnectionParameters.DEFAULT, 64, 64);
    }

    private Buffer patterned(Connection c, int size, int access, long seed) throws RdmaException {
        Buffer b = local.register(c, size, access);
        TestPattern.fill(b.buf(), seed, 0);
        return b;
    }

    private void postSend(Connection c, long wrId, int opcode, Buffer b, int index, int length) throws RdmaException {
        c.qp.postSend(swr.reset().wrId(wrId).opcode(opcode).flags(SendWorkRequest.SIGNALED)
                .addSge(b.address() + index, length, b.lkey()));
    }

    private void postRdma(Connection c, long wrId, int opcode, Buffer b, int index, int length, long remoteAddress,
                          int rkey) throws RdmaException {
        c.qp.postSend(swr.reset().wrId(wrId).opcode(opcode).flags(SendWorkRequest.SIGNALED)
                .addSge(b.address() + index, length, b.lkey()).remote(remoteAddress, rkey));
    }

    private void postRecv(Connection c, long wrId, Buffer b, int index, int length) throws RdmaException {
        c.qp.postRecv(rwr.reset().wrId(wrId).addSge(b.address() + index, length, b.lkey()));
    }

    /** Exactly {@code n} completions of the peer's connection {@code conn}. */
    private List<Completion> peerCompletions(int conn, int n, long timeoutMillis) throws Exception {
        List<Completion> list = peer.takeCompletions(conn, n, timeoutMillis);
        assertEquals(n, list.size(), () -> "peer completions on connection " + conn + " within " + timeoutMillis
                + " ms: " + list);
        return list;
    }

    private static void assertPeerStatus(int expected, Completion c) {
        assertEquals(WcStatus.name(expected), WcStatus.name(c.status()), () -> "peer completion " + c);
    }

    private static long crc(byte[] b) {
        CRC32 crc = new CRC32();
        crc.update(b);
        return crc.getValue();
    }

    /**
     * After an RDMA access violation: the initiator's single work request completed with REM_ACCESS_ERR, its queue
     * pair is in ERROR, and so is the responder's, which shows as its posted receives flushing.
     */
    private void assertRemoteAccessError(Connection c, long wrId, int peerPosted) throws Exception {
        Wc wc = local.poll(c.sendCq, 1, WAIT_MS).get(0);
        assertStatus(WcStatus.REM_ACCESS_ERR, wc);
        assertEquals(wrId, wc.wrId());
        assertEquals(QpState.ERROR, c.qp.state(), "initiator queue pair after REM_ACCESS_ERR");
        List<Completion> flushed = peerCompletions(c.peerIndex, peerPosted, PROMPT_MS);
        for (Completion f : flushed) {
            assertTrue(f.recv(), () -> "peer completion " + f);
            assertPeerStatus(WcStatus.WR_FLUSH_ERR, f);
        }
        assertEquals(QpState.ERROR, peer.qpState(c.peerIndex), "responder queue pair after the access violation");
    }

    // ------------------------------------------------------------------------------------------------------------
    // device and registration

    @Test
    public void shouldDescribeDevicesAndLimits() throws Exception {
        List<RdmaDevice> devices = provider.devices();
        assertFalse(devices.isEmpty(), "devices()");
        for (RdmaDevice d : devices) {
            DeviceAttributes a = d.attributes();
            assertFalse(d.name().isEmpty(), "device name");
            assertTrue(d.provider() == provider, "device's provider");
            assertTrue(a.maxQp() >= 64 && a.maxQpWr() >= 64 && a.maxSge() >= 1 && a.maxCqe() >= 64
                    && a.maxMrSize() >= MIB && a.maxMr() >= 16, () -> "device limits too small for any use: " + a);
            assertFalse(d.ports().isEmpty(), "ports of " + d.name());
        }
        assertTrue(provider.isAvailable());
        assertEquals(null, provider.unavailabilityCause());
    }

    /**
     * Closing completion queues that signal a notifier returns at once, also where the provider waits for their
     * events on threads of its own (DiSNI: {@code ibv_get_cq_event} with a 100 ms timeout). The caller is a channel's
     * event loop, which must not wait out such a timeout for every channel it closes. The queues stay counted until
     * they are destroyed, and are soon after.
     */
    @Test
    public void shouldCloseCompletionQueuesWithoutWaitingForTheirEventThreads() throws Exception {
        RdmaDevice device = local.defaultDevice();
        long before = provider.resourceUsage().completionQueues();
        List<CompletionQueue> queues = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
            queues.add(local.newCq(device, 16));
        }
        assertEquals(before + queues.size(), provider.resourceUsage().completionQueues());
        long start = System.nanoTime();
        for (CompletionQueue cq : queues) {
            cq.close();
        }
        long elapsedMillis = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
        // A close that waited for its event thread's wait to time out would cost 50 ms on average: eight, 400 ms.
        assertTrue(elapsedMillis < 100, () -> "closing 8 completion queues took " + elapsedMillis
                + " ms: a close waits for the provider's event thread");
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        while (provider.resourceUsage().completionQueues() != before && System.nanoTime() - deadline < 0) {
            Thread.sleep(5);
        }
        assertEquals(before, provider.resourceUsage().completionQueues(),
                () -> "closed completion queues still counted: " + provider.resourceUsage());
    }

    /**
     * A queue pair is never created on a closed completion queue or protection domain, whose native objects are
     * freed (on DiSNI a completion queue's by its event thread, shortly after the close): the call is refused and
     * creates nothing.
     */
    @Test
    public void shouldRefuseAQueuePairOnAClosedCompletionQueueOrProtectionDomain() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 0, 64));
        RdmaCmId id = local.resolve(addr);
        RdmaDevice device = id.device();
        QpCapabilities caps = LocalEnd.caps(device, 4, 4);
        CompletionQueue open = local.newCq(device, 16);
        CompletionQueue closed = local.newCq(device, 16);
        closed.close();
        ProtectionDomain closedPd = device.allocProtectionDomain();
        closedPd.close();
        long queuePairs = provider.resourceUsage().queuePairs();
        RdmaException onClosedCq = assertThrows(RdmaException.class,
                () -> id.createQueuePair(local.pd(device), open, closed, caps));
        assertMessageContains("closed", onClosedCq);
        RdmaException onClosedPd = assertThrows(RdmaException.class,
                () -> id.createQueuePair(closedPd, open, open, caps));
        assertMessageContains("closed", onClosedPd);
        assertEquals(queuePairs, provider.resourceUsage().queuePairs(), "queue pairs created by refused calls");
        assertEquals(null, id.queuePair(), "the id's queue pair after refused calls");
    }

    @Test
    public void shouldRegisterWithDistinctNonZeroKeysAndCountUsage() throws Exception {
        RdmaDevice device = local.defaultDevice();
        ResourceUsage usage = provider.resourceUsage();
        long bytesBefore = usage.registeredBytes();
        long regionsBefore = usage.memoryRegions();
        int[] accesses = {0, Access.LOCAL_WRITE, Access.LOCAL_WRITE | Access.REMOTE_WRITE, Access.REMOTE_READ,
            Access.ALL};
        Set<Integer> lkeys = new HashSet<>();
        Set<Integer> rkeys = new HashSet<>();
        List<Buffer> buffers = new ArrayList<>();
        long total = 0;
        for (int i = 0; i < 32; i++) {
            int size = 4096 + i * 64;
            int access = accesses[i % accesses.length];
            Buffer b = local.register(device, size, access);
            buffers.add(b);
            total += size;
            MemoryRegion mr = b.mr();
            assertNotEquals(0, mr.lkey(), "lkey");
            assertTrue(lkeys.add(mr.lkey()), () -> "lkey 0x" + Integer.toHexString(mr.lkey()) + " repeated");
            // The specification returns an R_Key only for a region with remote access (ibv_reg_mr(3) leaves it
            // unspecified otherwise): rxe answers 0 there, mlx5 the lkey's value. Only remote-access keys must be
            // distinct and non-zero, since only they name a region to a peer.
            if ((access & (Access.REMOTE_READ | Access.REMOTE_WRITE)) != 0) {
                assertNotEquals(0, mr.rkey(), "rkey of a region with remote access");
                assertTrue(rkeys.add(mr.rkey()), () -> "rkey 0x" + Integer.toHexString(mr.rkey()) + " repeated");
            }
            assertEquals(DirectMemory.address(b.buf()), mr.address(), "address");
            assertEquals(size, mr.length(), "length");
            assertEquals(access, mr.access(), "access");
        }
        assertEquals(bytesBefore + total, usage.registeredBytes(), "registeredBytes after 32 registrations");
        assertEquals(regionsBefore + 32, usage.memoryRegions(), "memoryRegions after 32 registrations");

        MemoryRegion first = buffers.get(0).mr();
        first.close();
        assertEquals(bytesBefore + total - first.length(), usage.registeredBytes(), "registeredBytes after close");
        assertEquals(regionsBefore + 31, usage.memoryRegions(), "memoryRegions after close");
        first.close(); // idempotent: counted once
        assertEquals(bytesBefore + total - first.length(), usage.registeredBytes(), "registeredBytes after 2nd close");
        assertEquals(regionsBefore + 31, usage.memoryRegions(), "memoryRegions after 2nd close");
    }

    @Test
    public void shouldRejectInvalidRegistrations() throws Exception {
        RdmaDevice device = local.defaultDevice();
        ProtectionDomain pd = local.pd(device);
        ByteBuffer buf = ByteBuffer.allocateDirect(4096);
        long address = DirectMemory.address(buf);
        ResourceUsage usage = provider.resourceUsage();
        long bytesBefore = usage.registeredBytes();
        long regionsBefore = usage.memoryRegions();

        assertMessageContains("length", assertThrows(IllegalArgumentException.class,
                () -> pd.register(address, 0, Access.LOCAL_WRITE)));
        assertMessageContains("length", assertThrows(IllegalArgumentException.class,
                () -> pd.register(address, -1, Access.LOCAL_WRITE)));
        long maxMrSize = device.attributes().maxMrSize();
        if (maxMrSize < Long.MAX_VALUE) {
            assertMessageContains("length", assertThrows(IllegalArgumentException.class,
                    () -> pd.register(address, maxMrSize + 1, Access.LOCAL_WRITE)));
        }
        assertMessageContains("access", assertThrows(IllegalArgumentException.class,
                () -> pd.register(address, 4096, Access.REMOTE_WRITE)));
        assertMessageContains("access", assertThrows(IllegalArgumentException.class,
                () -> pd.register(address, 4096, Access.REMOTE_WRITE | Access.REMOTE_READ)));
        assertMessageContains("access", assertThrows(IllegalArgumentException.class,
                () -> pd.register(address, 4096, 1 << 5)));
        assertMessageContains("direct", assertThrows(IllegalArgumentException.class,
                () -> pd.register(ByteBuffer.allocate(64), Access.LOCAL_WRITE)));
        // ibv_reg_mr refuses write access to read-only memory; a software provider would fault on the write.
        ByteBuffer readOnly = buf.asReadOnlyBuffer();
        assertMessageContains("read-only", assertThrows(IllegalArgumentException.class,
                () -> pd.register(readOnly, Access.LOCAL_WRITE)));
        assertMessageContains("read-only", assertThrows(IllegalArgumentException.class,
                () -> pd.register(readOnly, Access.LOCAL_WRITE | Access.REMOTE_WRITE)));

        assertEquals(bytesBefore, usage.registeredBytes(), "registeredBytes after refused registrations");
        assertEquals(regionsBefore, usage.memoryRegions(), "memoryRegions after refused registrations");
        MemoryRegion readable = pd.register(readOnly, Access.REMOTE_READ);
        assertEquals(4096, readable.length(), "a read-only buffer registers for reading");
        readable.close();
        assertEquals(bytesBefore, usage.registeredBytes(), "registeredBytes after closing the read-only region");
    }

    private static void assertMessageContains(String word, Throwable t) {
        String message = String.valueOf(t.getMessage()).toLowerCase(Locale.ROOT);
        assertTrue(message.contains(word), () -> "message of " + t + " should name '" + word + "'");
    }

    @Test
    public void shouldFailWriteAndReadThroughDeregisteredRkey() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 2, 64));
        Region r = peer.register(4096, REMOTE_RW, 64);
        peer.fill(r.id(), 11);
        peer.deregister(r.id());

        Connection c = connect(addr);
        Buffer src = patterned(c, 4096, Access.LOCAL_WRITE, 12);
        postRdma(c, 1, WrOpcode.RDMA_WRITE, src, 0, 16, r.address(), r.rkey());
        assertRemoteAccessError(c, 1, 2);
        assertEquals(TestPattern.crc(11, 0, 4096 + 128), peer.checksum(r.id(), -64, 4096 + 128),
                "peer buffer after a WRITE through a dead rkey");

        Connection c2 = connect(addr);
        Buffer dst = local.register(c2, 4096, Access.LOCAL_WRITE);
        postRdma(c2, 2, WrOpcode.RDMA_READ, dst, 0, 16, r.address(), r.rkey());
        assertRemoteAccessError(c2, 2, 2);
        assertArrayEquals(new byte[16], LocalEnd.bytes(dst.buf(), 0, 16), "READ target after a dead rkey");
    }

    // ------------------------------------------------------------------------------------------------------------
    // send / receive

    @Test
    public void shouldDeliverSendToPeer() throws Exception {
        InetSocketAddress addr = listen(Config.accept(8, 4, 256));
        Connection c = connect(addr);
        Buffer b = patterned(c, 256, 0, 21);
        postSend(c, 7, WrOpcode.SEND, b, 0, 200);

        Wc wc = local.poll(c.sendCq, 1, WAIT_MS).get(0);
        assertStatus(WcStatus.SUCCESS, wc);
        assertEquals(7, wc.wrId());
        assertEquals(WcOpcode.SEND, wc.opcode());
        assertEquals(c.qp.qpNumber(), wc.qpNumber());

        Completion p = peerCompletions(c.peerIndex, 1, WAIT_MS).get(0);
        assertPeerStatus(WcStatus.SUCCESS, p);
        assertTrue(p.recv());
        assertEquals(0, p.wrId(), "first posted receive slot");
        assertEquals(WcOpcode.RECV, p.opcode());
        assertEquals(200, p.byteLength());
        assertFalse(p.hasImm());
        assertEquals(TestPattern.crc(21, 0, 200), p.crc(), "received bytes");
    }

    /**
     * File-backed memory: a private mapping of a file, registered without local write access (with remote read and
     * without), is a source that sends gather from. (A read-only shared mapping, which is what the channel's file
     * regions try first, is registered by Linux 6.2 and later, and refused with EFAULT before that, where every
     * registration pins its pages for writing; rxe on Linux 6.1 refuses it. {@code FileChunkCache} then reads the
     * file into registered memory instead; {@code FileChunkCacheTest} covers both.)
     */
    @Test
    public void shouldSendFromPrivateFileMapping(@TempDir Path dir) throws Exception {
        int size = 3 * 4096 + 100;
        Path file = dir.resolve("chunk");
        Files.write(file, TestPattern.bytes(23, 0, size));
        InetSocketAddress addr = listen(Config.accept(4, 4, 8192));
        Connection c = connect(addr);
        ProtectionDomain pd = local.pd(c.id.device());
        try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE)) {
            MappedByteBuffer map = channel.map(FileChannel.MapMode.PRIVATE, 0, size);
            long address = DirectMemory.address(map);
            int[] accesses = {0, Access.REMOTE_READ};
            for (int i = 0; i < accesses.length; i++) {
                MemoryRegion mr = pd.register(address, size, accesses[i]);
                try {
                    c.qp.postSend(swr.reset().wrId(i).opcode(WrOpcode.SEND).flags(SendWorkRequest.SIGNALED)
                            .addSge(address + 100 + i, 5000, mr.lkey()));
                    assertStatus(WcStatus.SUCCESS, local.poll(c.sendCq, 1, WAIT_MS).get(0));
                    Completion p = peerCompletions(c.peerIndex, 1, WAIT_MS).get(0);
                    assertPeerStatus(WcStatus.SUCCESS, p);
                    assertEquals(TestPattern.crc(23, 100 + i, 5000), p.crc(), "bytes sent from the mapped file, access "
                            + Access.toString(accesses[i]));
                } finally {
                    mr.close();
                }
            }
            // The mapping must outlive its registrations.
            Reference.reachabilityFence(map);
        }
    }

    @Test
    public void shouldReceiveSendsFromPeerInOrder() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 4, 64));
        Connection c = connect(addr);
        Buffer b = local.register(c, 3 * 128, Access.LOCAL_WRITE);
        for (int i = 0; i < 3; i++) {
            postRecv(c, 100 + i, b, i * 128, 128);
        }
        peer.send(c.peerIndex, 3, 100, 31, WrOpcode.SEND, 0);

        List<Wc> wcs = local.poll(c.recvCq, 3, WAIT_MS);
        for (int i = 0; i < 3; i++) {
            Wc wc = wcs.get(i);
            assertStatus(WcStatus.SUCCESS, wc);
            assertEquals(100 + i, wc.wrId(), "receives complete in posting order");
            assertEquals(WcOpcode.RECV, wc.opcode());
            assertEquals(100, wc.byteLength());
            assertFalse(wc.hasImm());
            assertArrayEquals(TestPattern.bytes(TestPattern.messageSeed(31, i), 0, 100),
                    LocalEnd.bytes(b.buf(), i * 128, 100), "message " + i);
        }
        for (Completion p : peerCompletions(c.peerIndex, 3, WAIT_MS)) {
            assertPeerStatus(WcStatus.SUCCESS, p);
            assertFalse(p.recv());
            assertEquals(WcOpcode.SEND, p.opcode());
        }
    }

    @Test
    public void shouldGatherAndScatterAcrossEntries() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 2, 256).withRecvSges(4));
        Connection c = connect(addr);
        assumeTrue(c.qp.capabilities().maxSendSge() >= 3 && c.qp.capabilities().maxRecvSge() >= 3,
                "device offers fewer than 3 scatter/gather entries: " + c.qp.capabilities());

        // Gather: three entries from two regions, out of address order.
        Buffer a = patterned(c, 1024, 0, 41);
        Buffer bb = patterned(c, 512, 0, 42);
        c.qp.postSend(swr.reset().wrId(1).opcode(WrOpcode.SEND).flags(SendWorkRequest.SIGNALED)
                .addSge(bb.address() + 100, 50, bb.lkey())
                .addSge(a.address(), 70, a.lkey())
                .addSge(a.address() + 500, 80, a.lkey()));
        byte[] expected = new byte[200];
        System.arraycopy(LocalEnd.bytes(bb.buf(), 100, 50), 0, expected, 0, 50);
        System.arraycopy(LocalEnd.bytes(a.buf(), 0, 70), 0, expected, 50, 70);
        System.arraycopy(LocalEnd.bytes(a.buf(), 500, 80), 0, expected, 120, 80);
        assertStatus(WcStatus.SUCCESS, local.poll(c.sendCq, 1, WAIT_MS).get(0));
        Completion p = peerCompletions(c.peerIndex, 1, WAIT_MS).get(0);
        assertPeerStatus(WcStatus.SUCCESS, p);
        assertEquals(200, p.byteLength());
        assertEquals(crc(expected), p.crc(), "gathered bytes, scattered over the peer's 4 reversed entries");

        // Scatter: the peer's 180 bytes land across three local entries in order; the rest stays untouched.
        Buffer s1 = local.register(c, 512, Access.LOCAL_WRITE);
        Buffer s2 = local.register(c, 64, Access.LOCAL_WRITE);
        c.qp.postRecv(rwr.reset().wrId(9)
                .addSge(s1.address() + 300, 40, s1.lkey())
                .addSge(s1.address(), 100, s1.lkey())
                .addSge(s2.address(), 60, s2.lkey()));
        peer.send(c.peerIndex, 1, 180, 43, WrOpcode.SEND, 0);
        Wc wc = local.poll(c.recvCq, 1, WAIT_MS).get(0);
        assertStatus(WcStatus.SUCCESS, wc);
        assertEquals(180, wc.byteLength());
        byte[] sent = TestPattern.bytes(TestPattern.messageSeed(43, 0), 0, 180);
        assertArrayEquals(Arrays.copyOfRange(sent, 0, 40), LocalEnd.bytes(s1.buf(), 300, 40), "entry 0");
        assertArrayEquals(Arrays.copyOfRange(sent, 40, 140), LocalEnd.bytes(s1.buf(), 0, 100), "entry 1");
        assertArrayEquals(Arrays.copyOfRange(sent, 140, 180), LocalEnd.bytes(s2.buf(), 0, 40), "entry 2");
        assertArrayEquals(new byte[20], LocalEnd.bytes(s2.buf(), 40, 20), "entry 2 beyond the message");
        assertArrayEquals(new byte[200], LocalEnd.bytes(s1.buf(), 100, 200), "bytes between entries 1 and 0");
    }

    @Test
    public void shouldDeliverImmediates() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 4, 128));
        Region r = peer.register(4096, REMOTE_RW, 64);
        Connection c = connect(addr);
        Buffer b = patterned(c, 4096, 0, 51);

        c.qp.postSend(swr.reset().wrId(1).opcode(WrOpcode.SEND_WITH_IMM).flags(SendWorkRequest.SIGNALED)
                .immData(0xCAFEBABE).addSge(b.address(), 64, b.lkey()));
        Wc sendWc = local.poll(c.sendCq, 1, WAIT_MS).get(0);
        assertStatus(WcStatus.SUCCESS, sendWc);
        assertEquals(WcOpcode.SEND, sendWc.opcode(), "initiator opcode of SEND_WITH_IMM");
        Completion p = peerCompletions(c.peerIndex, 1, WAIT_MS).get(0);
        assertPeerStatus(WcStatus.SUCCESS, p);
        assertEquals(WcOpcode.RECV, p.opcode());
        assertTrue(p.hasImm(), "SEND_WITH_IMM delivers an immediate");
        assertEquals(0xCAFEBABE, p.imm());
        assertEquals(64, p.byteLength());
        assertEquals(TestPattern.crc(51, 0, 64), p.crc());

        c.qp.postSend(swr.reset().wrId(2).opcode(WrOpcode.RDMA_WRITE_WITH_IMM).flags(SendWorkRequest.SIGNALED)
                .immData(0x12345678).addSge(b.address() + 1000, 1000, b.lkey()).remote(r.address() + 512, r.rkey()));
        Wc writeWc = local.poll(c.sendCq, 1, WAIT_MS).get(0);
        assertStatus(WcStatus.SUCCESS, writeWc);
        assertEquals(WcOpcode.RDMA_WRITE, writeWc.opcode(), "initiator opcode of RDMA_WRITE_WITH_IMM");
        Completion w = peerCompletions(c.peerIndex, 1, WAIT_MS).get(0);
        assertPeerStatus(WcStatus.SUCCESS, w);
        assertEquals(WcOpcode.RECV_RDMA_WITH_IMM, w.opcode());
        assertTrue(w.hasImm());
        assertEquals(0x12345678, w.imm());
        assertEquals(1000, w.byteLength(), "byteLength of RECV_RDMA_WITH_IMM is the written length");
        assertEquals(TestPattern.crc(51, 1000, 1000), peer.checksum(r.id(), 512, 1000), "written bytes");
        byte[] zeros = new byte[512];
        assertEquals(crc(zeros), peer.checksum(r.id(), 0, 512), "bytes before the write");

        Buffer in = local.register(c, 2 * 64, Access.LOCAL_WRITE);
        postRecv(c, 20, in, 0, 64);
        postRecv(c, 21, in, 64, 64);
        peer.send(c.peerIndex, 2, 32, 52, WrOpcode.SEND_WITH_IMM, 0x1000);
        List<Wc> recvs = local.poll(c.recvCq, 2, WAIT_MS);
        for (int i = 0; i < 2; i++) {
            Wc wc = recvs.get(i);
            assertStatus(WcStatus.SUCCESS, wc);
            assertEquals(WcOpcode.RECV, wc.opcode());
            assertTrue(wc.hasImm());
            assertEquals(0x1000 + i, wc.imm());
            assertEquals(32, wc.byteLength());
            assertArrayEquals(TestPattern.bytes(TestPattern.messageSeed(52, i), 0, 32),
                    LocalEnd.bytes(in.buf(), i * 64, 32));
        }
        peerCompletions(c.peerIndex, 2, WAIT_MS);
    }

    @Test
    public void shouldCopyInlinePayloadAtPostTime() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 4, 128));
        Connection c = connect(addr);
        assumeTrue(c.qp.capabilities().maxInlineData() >= 32, "device grants no inline data: "
                + c.qp.capabilities());
        // Unregistered memory, lkey 0: INLINE ignores keys and copies during postSend.
        ByteBuffer payload = ByteBuffer.allocateDirect(32);
        TestPattern.fill(payload, 61, 0);
        c.qp.postSend(swr.reset().wrId(3).opcode(WrOpcode.SEND)
                .flags(SendWorkRequest.SIGNALED | SendWorkRequest.INLINE)
                .addSge(DirectMemory.address(payload), 32, 0));
        payload.duplicate().put(new byte[32]);

        assertStatus(WcStatus.SUCCESS, local.poll(c.sendCq, 1, WAIT_MS).get(0));
        Completion p = peerCompletions(c.peerIndex, 1, WAIT_MS).get(0);
        assertPeerStatus(WcStatus.SUCCESS, p);
        assertEquals(32, p.byteLength());
        assertEquals(TestPattern.crc(61, 0, 32), p.crc(), "bytes as they were at post time");
    }

    // ------------------------------------------------------------------------------------------------------------
    // RDMA WRITE / READ

    @Test
    public void shouldWriteIntoPeerRegion() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 2, 64));
        int len = 65536;
        Region r = peer.register(len, REMOTE_RW, 64);
        peer.fill(r.id(), 71);
        Connection c = connect(addr);
        Buffer src = patterned(c, len, 0, 72);

        // Two unsignaled writes and a signaled one: its completion covers all three.
        c.qp.postSend(swr.reset().wrId(1).opcode(WrOpcode.RDMA_WRITE).addSge(src.address(), 1000, src.lkey())
                .remote(r.address(), r.rkey()));
        c.qp.postSend(swr.reset().wrId(2).opcode(WrOpcode.RDMA_WRITE)
                .addSge(src.address() + 1000, 39000, src.lkey()).remote(r.address() + 1000, r.rkey()));
        postRdma(c, 3, WrOpcode.RDMA_WRITE, src, 40000, len - 40000, r.address() + 40000, r.rkey());
        List<Wc> wcs = local.poll(c.sendCq, 1, WAIT_MS);
        assertStatus(WcStatus.SUCCESS, wcs.get(0));
        assertEquals(3, wcs.get(0).wrId());
        assertEquals(WcOpcode.RDMA_WRITE, wcs.get(0).opcode());

        assertEquals(TestPattern.crc(src.buf()), peer.checksum(r.id(), 0, len), "written region");
        assertEquals(TestPattern.crc(71, 0, 64), peer.checksum(r.id(), -64, 64), "guard before the region");
        assertEquals(TestPattern.crc(71, 64 + len, 64), peer.checksum(r.id(), len, 64), "guard after the region");
        assertEquals(List.of(), peer.takeCompletions(c.peerIndex, 0, 0), "a plain WRITE consumes no receive");
        assertEquals(List.of(), local.pollFor(c.sendCq, 50), "unsignaled writes complete silently");
    }

    @Test
    public void shouldReadPeerPattern() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 2, 64));
        int len = 65536;
        Region r = peer.register(len, Access.REMOTE_READ, 64);
        peer.fill(r.id(), 81);
        Connection c = connect(addr);
        Buffer dst = local.register(c, len, Access.LOCAL_WRITE);
        Buffer dst2 = local.register(c, 4096, Access.LOCAL_WRITE);

        postRdma(c, 1, WrOpcode.RDMA_READ, dst, 0, 30000, r.address(), r.rkey());
        // A READ that scatters into two local entries.
        c.qp.postSend(swr.reset().wrId(2).opcode(WrOpcode.RDMA_READ).flags(SendWorkRequest.SIGNALED)
                .addSge(dst.address() + 30000, len - 30000 - 1000, dst.lkey())
                .addSge(dst2.address() + 96, 1000, dst2.lkey())
                .remote(r.address() + 30000, r.rkey()));
        List<Wc> wcs = local.poll(c.sendCq, 2, WAIT_MS);
        for (int i = 0; i < 2; i++) {
            assertStatus(WcStatus.SUCCESS, wcs.get(i));
            assertEquals(i + 1, wcs.get(i).wrId());
            assertEquals(WcOpcode.RDMA_READ, wcs.get(i).opcode());
        }
        assertEquals(30000, wcs.get(0).byteLength(), "byteLength of an RDMA READ");
        assertEquals(len - 30000, wcs.get(1).byteLength(), "byteLength of a scattering RDMA READ");
        assertArrayEquals(TestPattern.bytes(81, 64, len - 1000), LocalEnd.bytes(dst.buf(), 0, len - 1000));
        assertArrayEquals(TestPattern.bytes(81, 64 + len - 1000, 1000), LocalEnd.bytes(dst2.buf(), 96, 1000));
        assertArrayEquals(new byte[96], LocalEnd.bytes(dst2.buf(), 0, 96), "before the second entry");
        assertArrayEquals(new byte[1000], LocalEnd.bytes(dst.buf(), len - 1000, 1000), "past the first entry");
    }

    @Test
    public void shouldFailWriteOutsideRegion() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 2, 64));
        int len = 4096;
        Region r = peer.register(len, REMOTE_RW, 64);
        peer.fill(r.id(), 91);
        long untouched = TestPattern.crc(91, 0, len + 128);
        // One byte past the end; a write straddling the end; one byte before the start.
        long[][] cases = {{r.address() + len, 1}, {r.address() + len - 8, 16}, {r.address() - 1, 1}};
        for (int i = 0; i < cases.length; i++) {
            Connection c = connect(addr);
            Buffer src = patterned(c, 64, 0, 92);
            postRdma(c, 10 + i, WrOpcode.RDMA_WRITE, src, 0, (int) cases[i][1], cases[i][0], r.rkey());
            assertRemoteAccessError(c, 10 + i, 2);
            assertEquals(untouched, peer.checksum(r.id(), -64, len + 128),
                    "peer buffer (region and guards) after out-of-bounds write case " + i);
        }
    }

    @Test
    public void shouldFailReadOutsideRegion() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 2, 64));
        int len = 4096;
        Region r = peer.register(len, REMOTE_RW, 64);
        peer.fill(r.id(), 101);
        long[][] cases = {{r.address() + len, 1}, {r.address() + len - 8, 16}, {r.address() - 1, 1}};
        for (int i = 0; i < cases.length; i++) {
            Connection c = connect(addr);
            Buffer dst = local.register(c, 64, Access.LOCAL_WRITE);
            postRdma(c, 20 + i, WrOpcode.RDMA_READ, dst, 0, (int) cases[i][1], cases[i][0], r.rkey());
            assertRemoteAccessError(c, 20 + i, 2);
            assertArrayEquals(new byte[64], LocalEnd.bytes(dst.buf(), 0, 64), "READ target after case " + i);
        }
        assertEquals(TestPattern.crc(101, 0, len + 128), peer.checksum(r.id(), -64, len + 128));
    }

    @Test
    public void shouldFailWriteWithoutRemoteWriteAccess() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 2, 64));
        Region r = peer.register(4096, Access.LOCAL_WRITE | Access.REMOTE_READ, 64);
        peer.fill(r.id(), 111);
        Connection c = connect(addr);
        Buffer src = patterned(c, 64, 0, 112);
        postRdma(c, 1, WrOpcode.RDMA_WRITE, src, 0, 64, r.address(), r.rkey());
        assertRemoteAccessError(c, 1, 2);
        assertEquals(TestPattern.crc(111, 0, 4096 + 128), peer.checksum(r.id(), -64, 4096 + 128));
    }

    @Test
    public void shouldFailReadWithoutRemoteReadAccess() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 2, 64));
        Region r = peer.register(4096, Access.LOCAL_WRITE | Access.REMOTE_WRITE, 64);
        peer.fill(r.id(), 121);
        Connection c = connect(addr);
        Buffer dst = local.register(c, 64, Access.LOCAL_WRITE);
        postRdma(c, 1, WrOpcode.RDMA_READ, dst, 0, 64, r.address(), r.rkey());
        assertRemoteAccessError(c, 1, 2);
        assertArrayEquals(new byte[64], LocalEnd.bytes(dst.buf(), 0, 64));
    }

    @Test
    public void shouldFailBadLocalKeyOrRange() throws Exception {
        InetSocketAddress addr = listen(Config.accept(8, 8, 256));
        Region r = peer.register(4096, REMOTE_RW, 0);

        // A SEND naming a wrong lkey. ibv_poll_cq(3) names LOC_PROT_ERR for "buffers that do not reference a valid
        // memory region", and mlx5 reports it; rxe (Linux 6.1) fails the key lookup while building the packet and
        // reports LOC_QP_OP_ERR. Both are local errors that move the queue pair to ERROR. (A range past the region
        // and a READ into a region without LOCAL_WRITE are LOC_PROT_ERR on both.)
        Connection c = connect(addr);
        Buffer b = patterned(c, 4096, 0, 131);
        c.qp.postSend(swr.reset().wrId(1).opcode(WrOpcode.SEND).flags(SendWorkRequest.SIGNALED)
                .addSge(b.address(), 64, b.lkey() ^ 0x5A5A5A5A));
        assertLocalError(c, 1, WcStatus.LOC_PROT_ERR, WcStatus.LOC_QP_OP_ERR);

        // A SEND with the right lkey but bytes past the region's end.
        Connection c2 = connect(addr);
        Buffer b2 = patterned(c2, 4096, 0, 132);
        postSend(c2, 2, WrOpcode.SEND, b2, 4096 - 8, 16);
        assertLocalError(c2, 2, WcStatus.LOC_PROT_ERR);

        // An RDMA READ into a region registered without LOCAL_WRITE.
        Connection c3 = connect(addr);
        Buffer readOnly = local.register(c3, 4096, 0);
        postRdma(c3, 3, WrOpcode.RDMA_READ, readOnly, 0, 64, r.address(), r.rkey());
        assertLocalError(c3, 3, WcStatus.LOC_PROT_ERR);
        assertArrayEquals(new byte[64], LocalEnd.bytes(readOnly.buf(), 0, 64), "read-only region untouched");

        for (int i = 0; i < 2; i++) {
            for (Completion p : peer.takeCompletions(i, 0, 0)) {
                assertNotEquals(WcStatus.SUCCESS, p.status(), () -> "peer received a message after a local"
                        + " protection error: " + p);
            }
        }
    }

    /** The single work request {@code wrId} failed locally with one of {@code allowed}; its queue pair is in ERROR. */
    private void assertLocalError(Connection c, long wrId, int... allowed) {
        Wc wc = local.poll(c.sendCq, 1, WAIT_MS).get(0);
        assertStatusIn(wc.status(), () -> wc.toString(), allowed);
        assertEquals(wrId, wc.wrId());
        assertEquals(QpState.ERROR, c.qp.state(), "queue pair after " + WcStatus.name(wc.status()));
    }

    private static void assertStatusIn(int status, Supplier<String> what, int... allowed) {
        List<String> names = new ArrayList<>();
        for (int a : allowed) {
            if (a == status) {
                return;
            }
            names.add(WcStatus.name(a));
        }
        fail("status " + WcStatus.name(status) + " of " + what.get() + " (expected: one of " + names + ")");
    }

    @Test
    public void shouldFailSendLargerThanReceive() throws Exception {
        InetSocketAddress addr = listen(Config.accept(2, 1, 64));
        Connection c = connect(addr);
        Buffer b = patterned(c, 128, 0, 141);
        postSend(c, 1, WrOpcode.SEND, b, 0, 128);
        Wc wc = local.poll(c.sendCq, 1, WAIT_MS).get(0);
        // ibv_poll_cq(3): LOC_LEN_ERR at the receiver, whose receive "isn't big enough for holding the incoming
        // message", and the NAK invalid request, REM_INV_REQ_ERR, at the sender, as mlx5 reports. rxe (Linux 6.1)
        // finds the overflow while copying into the receive and treats it as a malformed receive work request:
        // LOC_QP_OP_ERR at the receiver and the NAK remote operational error, REM_OP_ERR, at the sender. Either pair
        // leaves both queue pairs in ERROR; a mix of the two would be a provider bug.
        assertStatusIn(wc.status(), wc::toString, WcStatus.REM_INV_REQ_ERR, WcStatus.REM_OP_ERR);
        assertEquals(QpState.ERROR, c.qp.state(), "sender queue pair after " + WcStatus.name(wc.status()));
        Completion p = peerCompletions(c.peerIndex, 1, WAIT_MS).get(0);
        assertTrue(p.recv());
        assertPeerStatus(wc.status() == WcStatus.REM_INV_REQ_ERR ? WcStatus.LOC_LEN_ERR : WcStatus.LOC_QP_OP_ERR, p);
    }

    // ------------------------------------------------------------------------------------------------------------
    // receiver not ready

    @Test
    public void shouldExhaustReceiverNotReadyRetries() throws Exception {
        // The responder's count bounds the retries (rdma_accept(3)); the connect's is the same, so either would do.
        InetSocketAddress addr = listen(Config.accept(4, 0, 64).withRnrRetryCount(1));
        Connection c = connect(addr, ConnectionParameters.DEFAULT.withRnrRetryCount(1), 16, 16);
        Buffer b = patterned(c, 128, 0, 151);
        long start = System.nanoTime();
        postSend(c, 1, WrOpcode.SEND, b, 0, 64);
        postSend(c, 2, WrOpcode.SEND, b, 64, 64);
        List<Wc> wcs = local.poll(c.sendCq, 2, WAIT_MS);
        long millis = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
        assertStatus(WcStatus.RNR_RETRY_EXC_ERR, wcs.get(0));
        assertEquals(1, wcs.get(0).wrId());
        assertStatus(WcStatus.WR_FLUSH_ERR, wcs.get(1));
        assertEquals(2, wcs.get(1).wrId(), "the SEND behind the stalled one is flushed");
        assertEquals(QpState.ERROR, c.qp.state());
        assertTrue(millis < WAIT_MS, "RNR retries exhausted after " + millis + " ms");
        assertEquals(List.of(), peer.takeCompletions(c.peerIndex, 0, 0), "nothing was received");
    }

    /**
     * rdma_connect(3) and rdma_accept(3): a side's rnr_retry_count is how often its peer's sends are retried, and the
     * CM's REQ and REP carry it to the other side's queue pair. So a responder that accepted with none fails the
     * connecting side's SEND on the first receiver-not-ready NAK, however many retries the connect asked for.
     */
    @Test
    public void shouldFailASendAtOnceWhenTheResponderAcceptedNoReceiverNotReadyRetry() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 0, 64).withRnrRetryCount(0));
        Connection c = connect(addr, ConnectionParameters.DEFAULT.withRnrRetryCount(6), 16, 16);
        Buffer b = patterned(c, 64, 0, 152);
        long start = System.nanoTime();
        postSend(c, 1, WrOpcode.SEND, b, 0, 64);
        Wc wc = local.poll(c.sendCq, 1, WAIT_MS).get(0);
        long millis = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
        assertStatus(WcStatus.RNR_RETRY_EXC_ERR, wc);
        // One retry would have waited out the RNR timer of a queue pair connected through rdma_cm (655.36 ms).
        assertTrue(millis < RNR_TIMER_MS, "the SEND failed after " + millis + " ms, as if it had been retried"
                + " (expected: at once, on the first receiver-not-ready NAK)");
    }

    /** The other side of the same rule: a connect that asked for no retries still has its SENDs retried. */
    @Test
    public void shouldRetryASendAsOftenAsTheResponderAcceptedWhenTheConnectAskedForNone() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 0, 64).withRnrRetryCount(6));
        Connection c = connect(addr, ConnectionParameters.DEFAULT.withRnrRetryCount(0), 16, 16);
        Buffer b = patterned(c, 64, 0, 153);
        postSend(c, 1, WrOpcode.SEND, b, 0, 64);
        Thread.sleep(RNR_TIMER_MS / 4);
        assertEquals(List.of(), local.pollFor(c.sendCq, 0), "the SEND waits for a receive, retried as the responder"
                + " accepted");
        peer.postRecvs(c.peerIndex, 1);
        Wc wc = local.poll(c.sendCq, 1, WAIT_MS).get(0);
        assertStatus(WcStatus.SUCCESS, wc);
        Completion p = peerCompletions(c.peerIndex, 1, WAIT_MS).get(0);
        assertPeerStatus(WcStatus.SUCCESS, p);
        assertEquals(TestPattern.crc(153, 0, 64), p.crc());
    }

    @Test
    public void shouldDeliverSendPostedBeforeItsReceive() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 0, 64));
        // Measure this device's whole RNR budget (6 retries) on a first connection.
        Connection probe = connect(addr, ConnectionParameters.DEFAULT.withRnrRetryCount(6), 16, 16);
        Buffer pb = patterned(probe, 64, 0, 161);
        long start = System.nanoTime();
        postSend(probe, 1, WrOpcode.SEND, pb, 0, 64);
        Wc probeWc = local.poll(probe.sendCq, 1, 30_000).get(0);
        long budgetMillis = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
        assertStatus(WcStatus.RNR_RETRY_EXC_ERR, probeWc);
        assumeTrue(budgetMillis >= 40, "this device gives up receiver-not-ready retries after " + budgetMillis
                + " ms, too soon for a test thread to post the receive in between");

        Connection c = connect(addr, ConnectionParameters.DEFAULT.withRnrRetryCount(6), 16, 16);
        Buffer b = patterned(c, 64, 0, 162);
        postSend(c, 2, WrOpcode.SEND, b, 0, 64);
        Thread.sleep(budgetMillis / 4);
        assertEquals(List.of(), local.pollFor(c.sendCq, 0), "the SEND waits for a receive");
        peer.postRecvs(c.peerIndex, 1);
        Wc wc = local.poll(c.sendCq, 1, WAIT_MS).get(0);
        assertStatus(WcStatus.SUCCESS, wc);
        Completion p = peerCompletions(c.peerIndex, 1, WAIT_MS).get(0);
        assertPeerStatus(WcStatus.SUCCESS, p);
        assertEquals(TestPattern.crc(162, 0, 64), p.crc());
    }

    // ------------------------------------------------------------------------------------------------------------
    // ordering

    @Test
    public void shouldDeliverTenThousandSendsInOrder() throws Exception {
        streamSends(10_000, 1, 128);
    }

    @Test
    public void shouldCompleteUnsignaledSendsThroughPeriodicSignaledOne() throws Exception {
        streamSends(10_000, 64, 128);
    }

    /**
     * Sends {@code count} 64-byte messages carrying their sequence number, signaling every {@code signalEvery}-th and
     * the last, with at most {@code window} outstanding; asserts exactly the signaled completions in order and every
     * message received in order with its bytes.
     */
    private void streamSends(int count, int signalEvery, int window) throws Exception {
        int size = 64;
        int slots = 256;
        InetSocketAddress addr = listen(Config.accept(512, 512, size).autoReposting());
        Connection c = connect(addr, ConnectionParameters.DEFAULT, slots, 16);
        Buffer b = local.register(c, slots * size, 0);
        long[] expectedCrc = new long[count];
        List<Wc> completions = new ArrayList<>();
        long completedThrough = -1; // a signaled completion covers every earlier send
        for (int i = 0; i < count; i++) {
            while (i - completedThrough - 1 >= window) {
                List<Wc> got = local.pollFor(c.sendCq, 0);
                if (got.isEmpty()) {
                    got = local.poll(c.sendCq, 1, WAIT_MS);
                }
                for (Wc wc : got) {
                    assertStatus(WcStatus.SUCCESS, wc);
                    completedThrough = wc.wrId();
                }
                completions.addAll(got);
            }
            int slot = i % slots;
            ByteBuffer m = b.buf().duplicate().order(ByteOrder.LITTLE_ENDIAN);
            m.putLong(slot * size, i);
            TestPattern.fill(m.position(slot * size + 8).limit((slot + 1) * size), TestPattern.messageSeed(7, i), 0);
            expectedCrc[i] = TestPattern.crc(b.buf(), slot * size, size);
            boolean signaled = (i + 1) % signalEvery == 0 || i == count - 1;
            c.qp.postSend(swr.reset().wrId(i).opcode(WrOpcode.SEND).flags(signaled ? SendWorkRequest.SIGNALED : 0)
                    .addSge(b.address() + (long) slot * size, size, b.lkey()));
        }
        while (completedThrough < count - 1) {
            Wc wc = local.poll(c.sendCq, 1, WAIT_MS).get(0);
            assertStatus(WcStatus.SUCCESS, wc);
            completedThrough = wc.wrId();
            completions.add(wc);
        }
        completions.addAll(local.pollFor(c.sendCq, 50));
        List<Long> expectedIds = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            if ((i + 1) % signalEvery == 0 || i == count - 1) {
                expectedIds.add((long) i);
            }
        }
        List<Long> ids = new ArrayList<>();
        for (Wc wc : completions) {
            ids.add(wc.wrId());
        }
        assertEquals(expectedIds, ids, "send completions: exactly the signaled ones, in posting order");

        List<Completion> received = peerCompletions(c.peerIndex, count, 30_000);
        for (int i = 0; i < count; i++) {
            Completion p = received.get(i);
            assertPeerStatus(WcStatus.SUCCESS, p);
            assertEquals(i, p.head(), "sequence number of receive " + i);
            assertEquals(size, p.byteLength());
            assertEquals(expectedCrc[i], p.crc(), "bytes of message " + i);
        }
    }

    // ------------------------------------------------------------------------------------------------------------
    // queue-pair state and posting rules

    @Test
    public void shouldRefuseSendBeforeConnected() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 4, 64));
        Connection c = local.createQueuePair(local.resolve(addr), 16, 16, null, null);
        assertEquals(QpState.INIT, c.qp.state());
        Buffer b = local.register(c, 128, Access.LOCAL_WRITE);
        postRecv(c, 1, b, 0, 64); // allowed from INIT on
        assertThrows(RdmaException.class, () -> postSend(c, 2, WrOpcode.SEND, b, 64, 64), "SEND in INIT");
        assertEquals(List.of(), local.pollFor(c.sendCq, 20), "a refused post completes nothing");
    }

    @Test
    public void shouldRefusePostingBeyondQueueDepth() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 4, 64));
        Connection c = local.createQueuePair(local.resolve(addr), 16, 16, null, null);
        int depth = c.qp.capabilities().maxRecvWr();
        assertTrue(depth >= 16, () -> "granted " + c.qp.capabilities() + " (expected: at least the 16 requested)");
        Buffer b = local.register(c, (depth + 1) * 16, Access.LOCAL_WRITE);
        for (int i = 0; i < depth; i++) {
            postRecv(c, i, b, i * 16, 16);
        }
        assertThrows(RdmaException.class, () -> postRecv(c, depth, b, depth * 16, 16), "receive beyond depth");
    }

    @Test
    public void shouldFlushWorkPostedInErrorState() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 4, 64));
        Connection c = connect(addr);
        c.id.disconnect();
        local.awaitCm(c.id, CmEventType.DISCONNECTED, PROMPT_MS);
        assertEquals(QpState.ERROR, c.qp.state(), "queue pair after DISCONNECTED");
        Buffer b = local.register(c, 128, Access.LOCAL_WRITE);
        postRecv(c, 5, b, 0, 64);
        postSend(c, 6, WrOpcode.SEND, b, 64, 64);
        Wc r = local.poll(c.recvCq, 1, PROMPT_MS).get(0);
        assertStatus(WcStatus.WR_FLUSH_ERR, r);
        assertEquals(5, r.wrId());
        Wc s = local.poll(c.sendCq, 1, PROMPT_MS).get(0);
        assertStatus(WcStatus.WR_FLUSH_ERR, s);
        assertEquals(6, s.wrId());
    }

    // ------------------------------------------------------------------------------------------------------------
    // disconnect and peer death

    @Test
    public void shouldFlushReceivesOnBothSidesOnDisconnect() throws Exception {
        InetSocketAddress addr = listen(Config.accept(8, 8, 64));
        Connection c = connect(addr);
        Buffer b = local.register(c, 8 * 64, Access.LOCAL_WRITE);
        for (int i = 0; i < 8; i++) {
            postRecv(c, i, b, i * 64, 64);
        }
        long start = System.nanoTime();
        c.id.disconnect();
        local.awaitCm(c.id, CmEventType.DISCONNECTED, PROMPT_MS);
        List<Wc> flushed = local.poll(c.recvCq, 8, PROMPT_MS);
        for (int i = 0; i < 8; i++) {
            assertStatus(WcStatus.WR_FLUSH_ERR, flushed.get(i));
            assertEquals(i, flushed.get(i).wrId(), "flush order");
        }
        assertTrue(peer.awaitDisconnected(c.peerIndex, PROMPT_MS), "peer saw DISCONNECTED");
        List<Completion> peerFlushed = peerCompletions(c.peerIndex, 8, PROMPT_MS);
        for (Completion p : peerFlushed) {
            assertTrue(p.recv());
            assertPeerStatus(WcStatus.WR_FLUSH_ERR, p);
        }
        long millis = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
        assertTrue(millis < PROMPT_MS, "disconnect and flush took " + millis + " ms");
        c.id.disconnect(); // idempotent
        assertEquals(List.of(), local.pollFor(c.recvCq, 20), "nothing more after the flush");
    }

    @Test
    public void shouldFlushSendsInFlightOnDisconnect() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 0, 64));
        Connection c = connect(addr, ConnectionParameters.DEFAULT.withRnrRetryCount(6), 16, 16);
        Buffer b = patterned(c, 4 * 64, 0, 171);
        for (int i = 0; i < 4; i++) {
            postSend(c, i, WrOpcode.SEND, b, i * 64, 64);
        }
        c.id.disconnect();
        local.awaitCm(c.id, CmEventType.DISCONNECTED, PROMPT_MS);
        List<Wc> wcs = local.poll(c.sendCq, 4, PROMPT_MS);
        for (int i = 0; i < 4; i++) {
            Wc wc = wcs.get(i);
            assertEquals(i, wc.wrId(), "completion order");
            if (i == 0 && wc.status() == WcStatus.RNR_RETRY_EXC_ERR) {
                continue; // its RNR budget may run out before the disconnect lands; both outcomes are correct
            }
            assertStatus(WcStatus.WR_FLUSH_ERR, wc);
        }
        assertTrue(peer.awaitDisconnected(c.peerIndex, PROMPT_MS), "peer saw DISCONNECTED");
    }

    @Test
    public void shouldFlushWhenPeerDisconnects() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 4, 64));
        Connection c = connect(addr);
        Buffer b = local.register(c, 4 * 64, Access.LOCAL_WRITE);
        for (int i = 0; i < 4; i++) {
            postRecv(c, i, b, i * 64, 64);
        }
        peer.disconnect(c.peerIndex);
        local.awaitCm(c.id, CmEventType.DISCONNECTED, PROMPT_MS);
        assertEquals(QpState.ERROR, c.qp.state());
        for (Wc wc : local.poll(c.recvCq, 4, PROMPT_MS)) {
            assertStatus(WcStatus.WR_FLUSH_ERR, wc);
        }
        assertTrue(peer.awaitDisconnected(c.peerIndex, PROMPT_MS), "the disconnecting side sees DISCONNECTED too");
    }

    @Test
    public void shouldShowAPeersDisconnectAsAPendingEventBeforeItIsPolled() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 4, 64));
        Connection c = connect(addr);
        assertFalse(local.channel.hasPendingEvents(), "an established connection's events were all polled");
        peer.disconnect(c.peerIndex);
        // The owner learns of the reset here first: on a device the queue pair still says RTS until it polls.
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(PROMPT_MS);
        while (!local.channel.hasPendingEvents()) {
            assertTrue(System.nanoTime() < deadline, "the peer's disconnect never showed as a pending event");
            Thread.sleep(1);
        }
        local.awaitCm(c.id, CmEventType.DISCONNECTED, PROMPT_MS);
        assertEquals(QpState.ERROR, c.qp.state(), "queue pair once DISCONNECTED was polled");
    }

    @Test
    public void shouldReportPeerDeathPromptly() throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 4, 64));
        Connection c = connect(addr);
        Buffer b = patterned(c, 8 * 64, Access.LOCAL_WRITE, 181);
        postSend(c, 100, WrOpcode.SEND, b, 0, 64);
        assertStatus(WcStatus.SUCCESS, local.poll(c.sendCq, 1, WAIT_MS).get(0));
        for (int i = 0; i < 4; i++) {
            postRecv(c, i, b, (4 + i) * 64, 64);
        }

        long start = System.nanoTime();
        killPeerAbruptly(c);
        local.awaitCm(c.id, CmEventType.DISCONNECTED, PROMPT_MS);
        List<Wc> flushed = local.poll(c.recvCq, 4, PROMPT_MS);
        long millis = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
        for (Wc wc : flushed) {
            assertStatus(WcStatus.WR_FLUSH_ERR, wc);
        }
        assertEquals(QpState.ERROR, c.qp.state());
        assertTrue(millis < PROMPT_MS, "peer death reported after " + millis + " ms");
        postSend(c, 101, WrOpcode.SEND, b, 0, 64);
        assertStatus(WcStatus.WR_FLUSH_ERR, local.poll(c.sendCq, 1, PROMPT_MS).get(0));
    }

    // ------------------------------------------------------------------------------------------------------------
    // scale

    @Test
    public void shouldCarryTrafficOnManyQueuePairs() throws Exception {
        int qps = 64;
        int perQp = 8;
        int size = 256;
        InetSocketAddress addr = listen(Config.accept(16, 16, size).echoing());
        // Resolve all, then connect each as it resolves, then wait: the handshakes overlap.
        List<RdmaCmId> ids = new ArrayList<>();
        for (int q = 0; q < qps; q++) {
            RdmaCmId id = local.newId();
            id.resolve(addr, 5_000);
            ids.add(id);
        }
        CompletionQueue sendCq = null;
        CompletionQueue recvCq = null;
        List<Connection> conns = new ArrayList<>();
        Map<Integer, Integer> qpIndex = new HashMap<>();
        List<Buffer> inBufs = new ArrayList<>();
        for (int q = 0; q < qps; q++) {
            local.awaitCm(ids.get(q), CmEventType.ADDR_RESOLVED, WAIT_MS);
            if (sendCq == null) {
                // One pair of completion queues shared by every queue pair.
                sendCq = local.newCq(ids.get(q).device(), qps * perQp * 2);
                recvCq = local.newCq(ids.get(q).device(), qps * perQp * 2);
            }
            Connection c = local.createQueuePair(ids.get(q), perQp * 2, perQp * 2, sendCq, recvCq);
            Buffer in = local.register(c, perQp * size, Access.LOCAL_WRITE);
            for (int i = 0; i < perQp; i++) {
                postRecv(c, i, in, i * size, size);
            }
            ids.get(q).connect(ConnectionParameters.DEFAULT);
            conns.add(c);
            inBufs.add(in);
            assertEquals(null, qpIndex.put(c.qp.qpNumber(), q), "queue pair numbers are unique");
        }
        for (Connection c : conns) {
            local.awaitCm(c.id, CmEventType.ESTABLISHED, WAIT_MS);
        }
        List<Buffer> outBufs = new ArrayList<>();
        for (int q = 0; q < qps; q++) {
            Connection c = conns.get(q);
            Buffer out = patterned(c, perQp * size, 0, 1000 + q);
            outBufs.add(out);
            for (int i = 0; i < perQp; i++) {
                out.buf().duplicate().order(ByteOrder.LITTLE_ENDIAN).putLong(i * size, ((long) q << 32) | i);
                postSend(c, i, WrOpcode.SEND, out, i * size, size);
            }
        }
        List<Wc> sends = local.poll(sendCq, qps * perQp, 30_000);
        List<Wc> recvs = local.poll(recvCq, qps * perQp, 30_000);
        int[] nextSend = new int[qps];
        int[] nextRecv = new int[qps];
        for (Wc wc : sends) {
            assertStatus(WcStatus.SUCCESS, wc);
            int q = qpIndex.get(wc.qpNumber());
            assertEquals(nextSend[q]++, wc.wrId(), "send order on queue pair " + q);
        }
        for (Wc wc : recvs) {
            assertStatus(WcStatus.SUCCESS, wc);
            int q = qpIndex.get(wc.qpNumber());
            int i = nextRecv[q]++;
            assertEquals(i, wc.wrId(), "receive order on queue pair " + q);
            assertEquals(size, wc.byteLength());
            assertArrayEquals(LocalEnd.bytes(outBufs.get(q).buf(), i * size, size),
                    LocalEnd.bytes(inBufs.get(q).buf(), i * size, size), "echo " + i + " on queue pair " + q);
        }
    }

    @Test
    public void shouldWriteSixtyFourMebibytes() throws Exception {
        bigTransfer(WrOpcode.RDMA_WRITE);
    }

    @Test
    public void shouldReadSixtyFourMebibytes() throws Exception {
        bigTransfer(WrOpcode.RDMA_READ);
    }

    /** Moves {@link #BIG_TRANSFER} bytes by WRITE or READ in 1 MiB work requests over regions of at most maxMrSize. */
    private void bigTransfer(int opcode) throws Exception {
        InetSocketAddress addr = listen(Config.accept(4, 2, 64));
        Connection c = connect(addr, ConnectionParameters.DEFAULT, 64, 16);
        long maxMr = c.id.device().attributes().maxMrSize();
        int segment = (int) Math.min(BIG_TRANSFER, Math.max(MIB, maxMr / MIB * MIB));
        int segments = (int) (BIG_TRANSFER / segment);
        int wrSize = MIB;
        int window = 16;
        List<Buffer> localSegs = new ArrayList<>();
        List<Region> peerSegs = new ArrayList<>();
        for (int s = 0; s < segments; s++) {
            boolean write = opcode == WrOpcode.RDMA_WRITE;
            localSegs.add(write ? patterned(c, segment, 0, 200 + s) : local.register(c, segment, Access.LOCAL_WRITE));
            Region r = peer.register(segment, REMOTE_RW, 0);
            if (!write) {
                peer.fill(r.id(), 300 + s);
            }
            peerSegs.add(r);
        }
        int perSegment = segment / wrSize;
        int total = segments * perSegment;
        int completed = 0;
        for (int n = 0; n < total; n++) {
            if (n - completed >= window) {
                completed += checkSuccess(local.poll(c.sendCq, 1, WAIT_MS), completed);
            }
            int s = n / perSegment;
            int off = (n % perSegment) * wrSize;
            Region r = peerSegs.get(s);
            postRdma(c, n, opcode, localSegs.get(s), off, wrSize, r.address() + off, r.rkey());
        }
        while (completed < total) {
            completed += checkSuccess(local.poll(c.sendCq, 1, WAIT_MS), completed);
        }
        for (int s = 0; s < segments; s++) {
            assertEquals(TestPattern.crc(localSegs.get(s).buf()), peer.checksum(peerSegs.get(s).id(), 0, segment),
                    "segment " + s + " of " + segments + " (" + segment + " bytes each)");
        }
    }

    private static int checkSuccess(List<Wc> wcs, int expectedFirstId) {
        for (int i = 0; i < wcs.size(); i++) {
            assertStatus(WcStatus.SUCCESS, wcs.get(i));
            assertEquals(expectedFirstId + i, wcs.get(i).wrId(), "completion order");
        }
        return wcs.size();
    }

    @Test
    public void shouldStreamSixtyFourMebibytesOfSends() throws Exception {
        int size = 256 * 1024;
        int count = (int) (BIG_TRANSFER / size);
        int slots = 16;
        int window = 8;
        InetSocketAddress addr = listen(Config.accept(32, 32, size).autoReposting());
        Connection c = connect(addr, ConnectionParameters.DEFAULT, 64, 16);
        Buffer b = local.register(c, slots * size, 0);
        long[] expectedCrc = new long[count];
        int completed = 0;
        for (int i = 0; i < count; i++) {
            if (i - completed >= window) {
                completed += checkSuccess(local.poll(c.sendCq, 1, WAIT_MS), completed);
            }
            int slot = i % slots;
            TestPattern.fill(b.buf().duplicate().position(slot * size).limit((slot + 1) * size),
                    TestPattern.messageSeed(8, i), 0);
            expectedCrc[i] = TestPattern.crc(b.buf(), (long) slot * size, size);
            postSend(c, i, WrOpcode.SEND, b, slot * size, size);
        }
        while (completed < count) {
            completed += checkSuccess(local.poll(c.sendCq, 1, WAIT_MS), completed);
        }
        List<Completion> received = peerCompletions(c.peerIndex, count, 30_000);
        for (int i = 0; i < count; i++) {
            assertPeerStatus(WcStatus.SUCCESS, received.get(i));
            assertEquals(size, received.get(i).byteLength());
            assertEquals(expectedCrc[i], received.get(i).crc(), "bytes of message " + i);
        }
    }

    /**
     * 20,000 echoed round trips with posting and completion handling interleaved. A lost completion or wake-up shows
     * as a stall: the test fails when nothing arrives for {@value #WAIT_MS} ms, naming the counts. The whole run
     * may take as long as the device needs (52 s on rxe in an emulated guest on a loaded host, where a 60 s total
     * once ran out at 19,647 echoes); the test's own timeout bounds it.
     */
    @Test
    @Timeout(value = 600, unit = TimeUnit.SECONDS)
    public void shouldKeepPostingWhileCompletionsArrive() throws Exception {
        int count = 20_000;
        int size = 512;
        int slots = 128;
        int window = 64;
        InetSocketAddress addr = listen(Config.accept(slots, slots, size).echoing());
        Connection c = connect(addr, ConnectionParameters.DEFAULT, slots, slots);
        Buffer out = local.register(c, slots * size, 0);
        Buffer in = local.register(c, slots * size, Access.LOCAL_WRITE);
        for (int i = 0; i < slots; i++) {
            postRecv(c, i, in, i * size, size);
        }
        long[] expectedCrc = new long[count];
        EchoCheck check = new EchoCheck(c, in, size, slots, expectedCrc);
        int sent = 0;
        long stallDeadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(WAIT_MS);
        while (check.echoed < count || check.sendsDone < count) {
            // Post while the provider's threads deliver completions into both queues. Also bounded by the send
            // completions polled: a send's slot is free once its completion is published (as on rxe), so the
            // completion queue (slots entries) must hold every send posted and not yet polled, or it overruns and the
            // queue pair goes to ERROR (a window counted against echoes alone once let them exceed it, in CI).
            while (sent < count && sent - check.echoed < window && sent - check.sendsDone < slots) {
                int slot = sent % slots;
                ByteBuffer m = out.buf().duplicate().order(ByteOrder.LITTLE_ENDIAN);
                m.putLong(slot * size, sent);
                TestPattern.fill(m.position(slot * size + 8).limit((slot + 1) * size),
                        TestPattern.messageSeed(9, sent), 0);
                expectedCrc[sent] = TestPattern.crc(out.buf(), (long) slot * size, size);
                postSend(c, sent, WrOpcode.SEND, out, slot * size, size);
                sent++;
            }
            if (check.drain()) {
                stallDeadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(WAIT_MS);
                continue;
            }
            c.sendCq.requestNotify();
            c.recvCq.requestNotify();
            if (check.drain()) {
                stallDeadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(WAIT_MS);
                continue;
            }
            long left = stallDeadline - System.nanoTime();
            if (left <= 0) {
                fail("no completion for " + WAIT_MS + " ms: sent " + sent + ", send completions " + check.sendsDone
                        + ", echoed " + check.echoed + " of " + count);
            }
            local.notifier.await(left);
        }
        assertEquals(count, check.echoed);
        assertEquals(count, check.sendsDone);
    }

    /** Checks send completions and echoed messages of {@link #shouldKeepPostingWhileCompletionsArrive}. */
    private final class EchoCheck {
        final Connection c;
        final Buffer in;
        final ByteBuffer inView;
        final int size;
        final int slots;
        final long[] expectedCrc;
        final WorkCompletions wc = new WorkCompletions(64);
        int sendsDone;
        int echoed;

        EchoCheck(Connection c, Buffer in, int size, int slots, long[] expectedCrc) {
            this.c = c;
            this.in = in;
            this.inView = in.buf().duplicate().order(ByteOrder.LITTLE_ENDIAN);
            this.size = size;
            this.slots = slots;
            this.expectedCrc = expectedCrc;
        }

        /** Handles every completion available now, reposting each consumed receive at once. */
        boolean drain() throws RdmaException {
            boolean progress = false;
            int n;
            while ((n = c.sendCq.poll(wc)) > 0) {
                progress = true;
                for (int i = 0; i < n; i++) {
                    assertEquals(WcStatus.name(WcStatus.SUCCESS), WcStatus.name(wc.status(i)), wc.toString(i));
                    assertEquals(sendsDone++, wc.wrId(i), "send completion order");
                }
            }
            while ((n = c.recvCq.poll(wc)) > 0) {
                progress = true;
                for (int i = 0; i < n; i++) {
                    assertEquals(WcStatus.name(WcStatus.SUCCESS), WcStatus.name(wc.status(i)), wc.toString(i));
                    int slot = (int) wc.wrId(i);
                    assertEquals(echoed % slots, slot, "receive completion order");
                    assertEquals(size, wc.byteLength(i));
                    assertEquals(echoed, inView.getLong(slot * size), "sequence number of echo " + echoed);
                    assertEquals(expectedCrc[echoed], TestPattern.crc(in.buf(), (long) slot * size, size),
                            "bytes of echo " + echoed);
                    echoed++;
                    postRecv(c, slot, in, slot * size, size);
                }
            }
            return progress;
        }
    }

    // ------------------------------------------------------------------------------------------------------------
    // connection management

    @Test
    public void shouldSurviveQueuePairsClosedWhileTheirConnectIsAnswered() throws Exception {
        // A connecting queue pair closed (then its id) at varying points while the answer comes in: the process and
        // the provider carry on, and a later connection works. On DiSNI, librdmacm modifies the queue pair inside
        // rdma_get_cm_event on the event thread (RTR and RTS on the connect response); destroying it in between
        // crashed the JVM (SIGSEGV in libibverbs, seen on rxe).
        InetSocketAddress addr = listen(Config.accept(4, 0, 64));
        for (int i = 0; i < 20; i++) {
            Connection c = local.startConnect(addr, ConnectionParameters.DEFAULT, 4, 4);
            if (i % 4 != 0) {
                Thread.sleep(i % 4);
            }
            c.qp.close();
            c.id.close();
        }
        Connection c = connect(addr);
        assertEquals(QpState.RTS, c.qp.state(), "a connection after the closed ones");
    }

    @Test
    public void shouldSurviveAcceptedQueuePairsClosedWhileTheirConnectorGivesUp() throws Exception {
        // The passive side of the case above: a connector that goes away before or just after the accept makes its
        // connection manager reject the reply, and on DiSNI librdmacm moves the accepted queue pair to ERROR inside
        // rdma_get_cm_event on the event thread when that REJ arrives, while this thread closes the queue pair at
        // varying points. The process and the provider carry on, and the listener then accepts a working connection.
        RdmaCmId listener = local.newId();
        InetSocketAddress bound = listener.listen(new InetSocketAddress(address(), 0), 32);
        InetSocketAddress addr = new InetSocketAddress(address(), bound.getPort());
        for (int i = 0; i < 20; i++) {
            Connection c = local.startConnect(addr, ConnectionParameters.DEFAULT, 4, 4);
            RdmaCmId passive = local.track(local.awaitCm(listener, CmEventType.CONNECT_REQUEST, WAIT_MS).id());
            Connection accepted = local.createQueuePair(passive, 4, 4, null, null);
            boolean leavesFirst = i % 2 == 0;
            if (leavesFirst) {
                c.qp.close();
                c.id.close();
            }
            try {
                passive.accept(ConnectionParameters.DEFAULT);
            } catch (RdmaException gone) {
                // The connector's reject came first: nothing left to accept.
            }
            if (!leavesFirst) {
                c.qp.close();
                c.id.close();
            }
            if (i % 4 > 1) {
                Thread.sleep(i % 4 - 1);
            }
            accepted.qp.close();
            passive.close();
        }
        Connection c = local.startConnect(addr, ConnectionParameters.DEFAULT, 4, 4);
        RdmaCmId passive = local.track(local.awaitCm(listener, CmEventType.CONNECT_REQUEST, WAIT_MS).id());
        Connection accepted = local.createQueuePair(passive, 4, 4, null, null);
        passive.accept(ConnectionParameters.DEFAULT);
        local.awaitCm(c.id, CmEventType.ESTABLISHED, WAIT_MS);
        assertEquals(QpState.RTS, c.qp.state(), "the connector's queue pair after the closed ones");
        assertEquals(QpState.RTS, accepted.qp.state(), "the accepted queue pair after the closed ones");
    }

    @Test
    public void shouldRejectConnectWithoutListener() throws Exception {
        int port;
        try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getByName(address()))) {
            port = s.getLocalPort();
        }
        Connection c = local.createQueuePair(local.resolve(new InetSocketAddress(address(), port)), 4, 4, null,
                null);
        c.id.connect(ConnectionParameters.DEFAULT);
        Cm cm = local.nextCm(c.id, WAIT_MS);
        assertEquals(CmEventType.REJECTED, cm.type(), () -> "connect to port " + port + " with no listener: " + cm);
        assertFalse(c.qp.state() == QpState.RTS, "queue pair after REJECTED");
    }

    /** Skips a case about delivered private data, with the reason, on a provider that declares it delivers none. */
    private void assumeDeliversPrivateData() {
        assumeTrue(provider.deliversPrivateData(), () -> provider.name() + " declares deliversPrivateData() false"
                + " (" + provider + "): what it does instead is shouldDeliverNoPrivateDataWhereNoneIsDeclared");
    }

    @Test
    public void shouldDeliverRejectPrivateData() throws Exception {
        assumeDeliversPrivateData();
        byte[] request = TestPattern.bytes(191, 0, ConnectionParameters.MAX_CONNECT_PRIVATE_DATA);
        byte[] reason = TestPattern.bytes(192, 0, ConnectionParameters.MAX_REJECT_PRIVATE_DATA);
        InetSocketAddress addr = listen(Config.accept(1, 0, 64).rejecting(reason));
        Connection c = local.startConnect(addr, ConnectionParameters.DEFAULT.withPrivateData(request), 4, 4);
        Cm cm = local.awaitCm(c.id, CmEventType.REJECTED, WAIT_MS);
        assertArrayEquals(reason, cm.privateData(), "reject private data");
        List<byte[]> seen = peer.connectRequests();
        assertEquals(1, seen.size(), "requests the peer saw");
        assertArrayEquals(request, seen.get(0), "connect private data");
    }

    @Test
    public void shouldExchangePrivateDataOnConnectAndAccept() throws Exception {
        assumeDeliversPrivateData();
        byte[] request = TestPattern.bytes(201, 0, ConnectionParameters.MAX_CONNECT_PRIVATE_DATA);
        byte[] reply = TestPattern.bytes(202, 0, ConnectionParameters.MAX_ACCEPT_PRIVATE_DATA);
        InetSocketAddress addr = listen(Config.accept(1, 0, 64).withReply(reply));
        Connection c = connect(addr, ConnectionParameters.DEFAULT.withPrivateData(request), 4, 4);
        assertArrayEquals(reply, c.established.privateData(), "accept private data in ESTABLISHED");
        assertNotNull(c.id.peerParameters(), "peerParameters after ESTABLISHED");
        assertArrayEquals(reply, c.id.peerParameters().privateData(), "peerParameters().privateData()");
        assertArrayEquals(request, peer.connectRequests().get(0), "connect private data at the peer");
        assertEquals(addr.getPort(), c.id.remoteAddress().getPort(), "remoteAddress port");
        assertNotNull(c.id.localAddress(), "localAddress");
    }

    @Test
    public void shouldRejectLocallyWithPrivateData() throws Exception {
        assumeDeliversPrivateData();
        RdmaCmId listener = local.newId();
        InetSocketAddress bound = listener.listen(new InetSocketAddress(address(), 0), 8);
        assertNotEquals(0, bound.getPort(), "bound port");
        byte[] request = TestPattern.bytes(211, 0, ConnectionParameters.MAX_CONNECT_PRIVATE_DATA);
        byte[] reason = TestPattern.bytes(212, 0, ConnectionParameters.MAX_REJECT_PRIVATE_DATA);
        Connection c = local.startConnect(new InetSocketAddress(address(), bound.getPort()),
                ConnectionParameters.DEFAULT.withPrivateData(request), 4, 4);
        Cm req = local.awaitCm(listener, CmEventType.CONNECT_REQUEST, WAIT_MS);
        assertTrue(req.listenId() == listener, "CONNECT_REQUEST names its listener");
        assertArrayEquals(request, req.privateData(), "connect private data");
        local.track(req.id());
        assertOversizedPrivateDataRefused(() -> req.id().reject(
                new byte[ConnectionParameters.MAX_REJECT_PRIVATE_DATA + 1]));
        req.id().reject(reason);
        Cm rejected = local.awaitCm(c.id, CmEventType.REJECTED, WAIT_MS);
        assertArrayEquals(reason, rejected.privateData(), "reject private data");
    }

    /**
     * What {@link RdmaProvider#deliversPrivateData()} false promises: connect still works with private data, which
     * no event and no {@code peerParameters()} carries; accept with private data is refused before anything is
     * sent; a reject reaches the connector as REJECTED, without data.
     */
    @Test
    public void shouldDeliverNoPrivateDataWhereNoneIsDeclared() throws Exception {
        assumeTrue(!provider.deliversPrivateData(), () -> provider.name() + " delivers private data (" + provider
                + "): the private data cases cover it");
        byte[] request = TestPattern.bytes(221, 0, ConnectionParameters.MAX_CONNECT_PRIVATE_DATA);
        InetSocketAddress addr = listen(Config.accept(4, 4, 64));
        Connection c = connect(addr, ConnectionParameters.DEFAULT.withPrivateData(request), 4, 4);
        assertArrayEquals(new byte[0], c.established.privateData(), "private data in ESTABLISHED");
        assertEquals(null, c.id.peerParameters(), "peerParameters() without private data");
        assertArrayEquals(new byte[0], peer.connectRequests().get(0), "connect private data at the peer");
        // The connection works without it.
        Buffer b = patterned(c, 64, 0, 222);
        postSend(c, 1, WrOpcode.SEND, b, 0, 64);
        assertStatus(WcStatus.SUCCESS, local.poll(c.sendCq, 1, WAIT_MS).get(0));
        assertEquals(TestPattern.crc(222, 0, 64), peerCompletions(c.peerIndex, 1, WAIT_MS).get(0).crc());

        RdmaCmId listener = local.newId();
        InetSocketAddress bound = listener.listen(new InetSocketAddress(address(), 0), 8);
        Connection rejected = local.startConnect(new InetSocketAddress(address(), bound.getPort()),
                ConnectionParameters.DEFAULT.withPrivateData(request), 4, 4);
        Cm req = local.awaitCm(listener, CmEventType.CONNECT_REQUEST, WAIT_MS);
        assertArrayEquals(new byte[0], req.privateData(), "private data in CONNECT_REQUEST");
        local.track(req.id());
        local.createQueuePair(req.id(), 4, 4, null, null);
        RdmaException refused = assertThrows(RdmaException.class, () -> req.id().accept(
                ConnectionParameters.DEFAULT.withPrivateData(new byte[] {1, 2, 3})));
        assertMessageContains("private", refused);
        req.id().reject(TestPattern.bytes(223, 0, ConnectionParameters.MAX_REJECT_PRIVATE_DATA));
        Cm cm = local.awaitCm(rejected.id, CmEventType.REJECTED, WAIT_MS);
        assertArrayEquals(new byte[0], cm.privateData(), "private data in REJECTED");
    }

    @Test
    public void shouldRefuseOversizedConnectPrivateData() throws Exception {
        InetSocketAddress addr = listen(Config.accept(1, 0, 64));
        Connection c = local.createQueuePair(local.resolve(addr), 4, 4, null, null);
        assertOversizedPrivateDataRefused(() -> c.id.connect(ConnectionParameters.DEFAULT
                .withPrivateData(new byte[ConnectionParameters.MAX_CONNECT_PRIVATE_DATA + 1])));
        assertEquals(List.of(), peer.connectRequests(), "nothing reached the peer");
    }

    private static void assertOversizedPrivateDataRefused(org.junit.jupiter.api.function.Executable call) {
        Throwable e = assertThrows(Throwable.class, call);
        assertTrue(e instanceof IllegalArgumentException || e instanceof RdmaException, () -> "thrown: " + e
                + " (expected: IllegalArgumentException or RdmaException)");
        assertMessageContains("private", e);
    }

    @Test
    public void shouldConnectFromABoundAddress() throws Exception {
        InetSocketAddress addr = listen(Config.accept(8, 4, 256));
        RdmaCmId id = local.newId();
        InetSocketAddress bound = id.bind(new InetSocketAddress(address(), 0));
        assertEquals(InetAddress.getByName(address()), bound.getAddress(), "bound address");
        assertNotEquals(0, bound.getPort(), "port 0 picks a port");
        assertEquals(bound, id.localAddress(), "localAddress before resolve");
        id.resolve(addr, 5_000);
        local.awaitCm(id, CmEventType.ADDR_RESOLVED, WAIT_MS);
        Connection c = local.startConnect(id, ConnectionParameters.DEFAULT, 64, 64, null, null);
        c.established = local.awaitCm(id, CmEventType.ESTABLISHED, WAIT_MS);
        c.peerIndex = nextPeerConn++;
        assertEquals(bound, c.id.localAddress(), "local address of the connection");
        assertEquals(bound, peer.remoteAddress(c.peerIndex), "the peer's remote address of the connection");

        // The connection carries traffic like any other.
        Buffer b = patterned(c, 256, 0, 31);
        postSend(c, 9, WrOpcode.SEND, b, 0, 100);
        assertStatus(WcStatus.SUCCESS, local.poll(c.sendCq, 1, WAIT_MS).get(0));
        Completion p = peerCompletions(c.peerIndex, 1, WAIT_MS).get(0);
        assertPeerStatus(WcStatus.SUCCESS, p);
        assertEquals(TestPattern.crc(31, 0, 100), p.crc(), "received bytes");
    }

    @Test
    public void shouldRefuseBindingAnAddressAlreadyBound() throws Exception {
        RdmaCmId first = local.newId();
        InetSocketAddress bound = first.bind(new InetSocketAddress(address(), 0));
        RdmaCmId second = local.newId();
        RdmaException e = assertThrows(RdmaException.class, () -> second.bind(bound));
        assertMessageContains(bound.getAddress().getHostAddress() + ":" + bound.getPort(), e);
        // The reservation ends with the id that holds it; the refused id is still fresh.
        first.close();
        assertEquals(bound, second.bind(bound), "binding the address once its first id is closed");
    }

    @Test
    public void shouldRefuseBindingAnAddressOfAnotherHost() throws Exception {
        // TEST-NET-1 (RFC 5737): documentation only. Binding sends no packet, and nothing here dials it.
        InetAddress foreign = InetAddress.getByName("192.0.2.1");
        assumeTrue(java.net.NetworkInterface.getByInetAddress(foreign) == null,
                "192.0.2.1 is assigned to this host, so it cannot play an address of another host");
        RdmaCmId id = local.newId();
        RdmaException e = assertThrows(RdmaException.class, () -> id.bind(new InetSocketAddress(foreign, 0)));
        assertMessageContains("192.0.2.1", e);
        assertMessageContains("an address of this host", e);
    }

    @Test
    public void shouldRefuseBindOnAnIdThatIsNotFresh() throws Exception {
        InetSocketAddress addr = listen(Config.accept(1, 0, 64));
        RdmaCmId resolved = local.resolve(addr);
        RdmaException afterResolve = assertThrows(RdmaException.class,
                () -> resolved.bind(new InetSocketAddress(address(), 0)));
        assertMessageContains("expected: a fresh id", afterResolve);

        RdmaCmId bound = local.newId();
        bound.bind(new InetSocketAddress(address(), 0));
        RdmaException twice = assertThrows(RdmaException.class,
                () -> bound.bind(new InetSocketAddress(address(), 0)));
        assertMessageContains("expected: a fresh id", twice);

        RdmaCmId listener = local.newId();
        listener.listen(new InetSocketAddress(address(), 0), 8);
        RdmaException onListener = assertThrows(RdmaException.class,
                () -> listener.bind(new InetSocketAddress(address(), 0)));
        assertMessageContains("expected: a fresh id", onListener);
    }

    @Test
    public void shouldReportUnreachablePeer() throws Exception {
        // A loopback listener that accepts and never answers plays the peer that does not respond: the handshake
        // must fail in bounded time with a cause. (Tests only ever talk to loopback addresses.)
        try (ServerSocket silent = new ServerSocket(0, 8, InetAddress.getLoopbackAddress())) {
            RdmaCmId id = local.newId();
            long start = System.nanoTime();
            id.resolve(new InetSocketAddress(silent.getInetAddress(), silent.getLocalPort()), 2_000);
            Cm cm = local.nextCm(id, 30_000);
            if (cm.type() == CmEventType.ADDR_RESOLVED) {
                Connection c = local.createQueuePair(id, 4, 4, null, null);
                c.id.connect(ConnectionParameters.DEFAULT);
                cm = local.nextCm(id, 30_000);
            }
            Cm outcome = cm;
            long millis = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
            assertTrue(outcome.type() == CmEventType.ADDR_ERROR || outcome.type() == CmEventType.UNREACHABLE
                    || outcome.type() == CmEventType.CONNECT_ERROR, () -> "silent peer reported as " + outcome);
            assertNotNull(outcome.detail(), () -> "failure event without a cause: " + outcome);
            assertTrue(millis < 30_000, "took " + millis + " ms");
        }
    }
}
