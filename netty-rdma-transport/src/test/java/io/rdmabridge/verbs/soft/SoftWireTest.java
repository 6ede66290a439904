package io.rdmabridge.verbs.soft;

import static io.rdmabridge.verbs.soft.SoftPair.awaitEvent;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.CmEvent;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.DirectMemory;
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
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WorkCompletions;
import io.rdmabridge.verbs.WrOpcode;
import java.io.BufferedReader;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junitpioneer.jupiter.SetSystemProperty;

/**
 * A hostile or broken peer speaking raw bytes to a soft listener: the connection is closed (or the request refused
 * with a NAK), the process keeps running, and nothing outside a registered region is ever written.
 */
class SoftWireTest {
    private static final int GUARD = 1024;
    private static final int REGION = 4096;

    private final SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
    private final EventNotifier notifier = new EventNotifier();
    private RdmaEventChannel channel;
    private RdmaCmId listenId;
    private InetSocketAddress bound;
    private RdmaDevice device;
    private ProtectionDomain pd;
    private CompletionQueue cq;
    private ByteBuffer memory;
    private MemoryRegion region;
    private RdmaCmId serverId;
    private QueuePair serverQp;

    @BeforeEach
    void listen() throws Exception {
        device = provider.devices().get(0);
        channel = provider.createEventChannel(notifier);
        listenId = channel.createId();
        bound = listenId.listen(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 4);
        pd = device.allocProtectionDomain();
        cq = device.createCompletionQueue(64, notifier);
        memory = ByteBuffer.allocateDirect(GUARD + REGION + GUARD);
        for (int i = 0; i < memory.capacity(); i++) {
            memory.put(i, (byte) 0xA5);
        }
        region = pd.register(DirectMemory.address(memory) + GUARD, REGION, Access.ALL);
    }

    @AfterEach
    void close() {
        if (serverId != null) {
            serverId.disconnect();
        }
        if (serverQp != null) {
            serverQp.close();
        }
        if (serverId != null) {
            serverId.close();
        }
        region.close();
        cq.close();
        pd.close();
        listenId.close();
        channel.close();
        SoftPair.assertResourcesReleased(provider);
    }

    private void assertGuardsIntact() {
        for (int i = 0; i < GUARD; i++) {
            assertEquals((byte) 0xA5, memory.get(i), "guard byte " + i + " before the region was written");
            assertEquals((byte) 0xA5, memory.get(GUARD + REGION + i), "guard byte " + i
                    + " after the region was written");
        }
    }

    private Socket open() throws IOException {
        Socket s = new Socket(bound.getAddress(), bound.getPort());
        s.setSoTimeout(5000);
        return s;
    }

    private static void assertClosedByPeer(Socket s) throws IOException {
        DataInputStream in = new DataInputStream(s.getInputStream());
        try {
            while (true) {
                if (in.read() < 0) {
                    return;
                }
            }
        } catch (SocketException e) {
            // A reset is a close too.
        }
    }

    /** Completes a real handshake from a raw socket and lets the server accept it. */
    private Socket connected(int rnrRetryCount) throws Exception {
        return connected(rnrRetryCount, new byte[SharedMemoryFiles.TOKEN_LENGTH], 0);
    }

    /** As {@link #connected(int)}, offering {@code hostToken} and {@code pid} (a same-host peer when they match). */
    private Socket connected(int rnrRetryCount, byte[] hostToken, long pid) throws Exception {
        Socket s = open();
        ConnectionParameters params = ConnectionParameters.DEFAULT.withRnrRetryCount(rnrRetryCount);
        s.getOutputStream().write(SoftHandshake.encode(SoftHandshake.CONNECT, 77, params, new byte[] {4, 2}, 0,
                hostToken, pid));
        CmEvent request = awaitEvent(channel, CmEventType.CONNECT_REQUEST);
        assertEquals(2, request.privateData().length);
        serverId = request.id();
        serverQp = serverId.createQueuePair(pd, cq, cq, new QpCapabilities(16, 16, 2, 2, 0));
        serverId.accept(ConnectionParameters.DEFAULT.withPrivateData(new byte[] {7}));
        awaitEvent(channel, CmEventType.ESTABLISHED);
        DataInputStream in = new DataInputStream(s.getInputStream());
        byte[] reply = new byte[SoftHandshake.HEADER_LENGTH + 1];
        in.readFully(reply);
        SoftHandshake h = new SoftHandshake().wrap(ByteBuffer.wrap(reply), 0);
        assertEquals(null, h.validate(1 << SoftHandshake.ACCEPT));
        assertEquals(serverQp.qpNumber(), h.qpNumber());
        return s;
    }

    private static byte[] frame(int op, int flags, int psn, int payload, int length, long address, int rkey,
                                int imm, int bytesFollowing) {
        ByteBuffer b = ByteBuffer.allocate(SoftFrame.HEADER_LENGTH + bytesFollowing);
        new SoftFrame().wrap(b, 0).header(op, flags, psn, payload, length, address, rkey, imm);
        for (int i = SoftFrame.HEADER_LENGTH; i < b.capacity(); i++) {
            b.put(i, (byte) 0x3C);
        }
        return b.array();
    }

    private static ByteBuffer readFrame(Socket s) throws IOException {
        DataInputStream in = new DataInputStream(s.getInputStream());
        byte[] header = new byte[SoftFrame.HEADER_LENGTH];
        in.readFully(header);
        ByteBuffer b = ByteBuffer.wrap(header);
        int payload = b.getInt(SoftFrame.PAYLOAD_LENGTH_OFFSET);
        in.skipNBytes(payload);
        return b;
    }

    private void awaitServerDisconnected() {
        awaitEvent(channel, CmEventType.DISCONNECTED);
        assertEquals(QpState.ERROR, serverQp.state());
    }

    @Test
    void shouldCloseOnBadMagicWithoutConnectRequest() throws Exception {
        try (Socket s = open()) {
            byte[] junk = new byte[64];
            java.util.Arrays.fill(junk, (byte) 'G');
            s.getOutputStream().write(junk);
            assertClosedByPeer(s);
        }
        assertFalse(channel.poll(new CmEvent()), "no CONNECT_REQUEST for garbage");
    }

    @Test
    void shouldLogPeersThatSendGarbageAtAFewLinesNotOneLinePerConnection() throws Exception {
        long before = TcpLink.VIOLATIONS.emitted();
        long suppressedBefore = TcpLink.VIOLATIONS.suppressed();
        long start = System.nanoTime();
        byte[] junk = "GET / HTTP/1.1\r\n\r\n".repeat(4).getBytes(StandardCharsets.US_ASCII);
        for (int i = 0; i < 50; i++) {
            try (Socket s = open()) {
                s.getOutputStream().write(junk);
                assertClosedByPeer(s);
            }
        }
        long lines = TcpLink.VIOLATIONS.emitted() - before;
        long allowed = 1 + (System.nanoTime() - start) / 10_000_000_000L;
        assertTrue(lines <= allowed, "protocol-violation WARN lines for 50 connections: " + lines + " (expected: <= "
                + allowed + ", one per 10 s)");
        assertTrue(TcpLink.VIOLATIONS.suppressed() > suppressedBefore, "the violations were not counted");
    }

    @Test
    void shouldStopAcceptingForAWhileInsteadOfSpinningWhenAcceptFails() throws Exception {
        // accept() failing (out of descriptors) leaves the connection in the backlog, and the selector reports it
        // again at once: the engine thread spun on it, logging a line per attempt (235,000 lines in 2 s).
        provider.faults().failAccepts(100_000);
        try (Socket s = open()) {
            Thread.sleep(500);
            int attempts = 100_000 - provider.faults().acceptFailuresLeft();
            assertTrue(attempts >= 1 && attempts <= 2, "accept attempts in 500 ms: " + attempts
                    + " (expected: one, then a pause of " + SoftCmId.ACCEPT_BACKOFF_MILLIS + " ms)");
            provider.faults().failAccepts(0);
            // Accepted after the pause: garbage then closes it, as on any accepted connection.
            s.setSoTimeout(10_000);
            s.getOutputStream().write(new byte[64]);
            assertClosedByPeer(s);
        } finally {
            provider.faults().reset();
        }
    }

    @Test
    void shouldCloseTheSocketOfAConnectionWhoseQueuePairWasDestroyedRightAfterTheAccept() throws Exception {
        try (Socket s = open()) {
            s.getOutputStream().write(SoftHandshake.encode(SoftHandshake.CONNECT, 77, ConnectionParameters.DEFAULT,
                    new byte[0], 0, new byte[SharedMemoryFiles.TOKEN_LENGTH], 0));
            CmEvent request = awaitEvent(channel, CmEventType.CONNECT_REQUEST);
            RdmaCmId id = request.id();
            QueuePair qp = id.createQueuePair(pd, cq, cq, new QpCapabilities(16, 16, 2, 2, 0));
            // The engine thread sends the accept later: the queue pair is gone by then, and its close found no link
            // to disconnect. The link went on, connected, for as long as the peer kept its socket open.
            id.accept(ConnectionParameters.DEFAULT);
            qp.close();
            id.close();
            assertClosedByPeer(s);
        }
    }

    @Test
    void shouldCloseOnWrongVersionAndOversizedPrivateData() throws Exception {
        byte[] hs = SoftHandshake.encode(SoftHandshake.CONNECT, 1, ConnectionParameters.DEFAULT, new byte[0], 0);
        hs[SoftHandshake.VERSION_OFFSET + 1] = 9;
        try (Socket s = open()) {
            s.getOutputStream().write(hs);
            assertClosedByPeer(s);
        }
        hs = SoftHandshake.encode(SoftHandshake.CONNECT, 1, ConnectionParameters.DEFAULT, new byte[0], 0);
        ByteBuffer.wrap(hs).putShort(SoftHandshake.PRIVATE_DATA_LENGTH_OFFSET, (short) 60000);
        try (Socket s = open()) {
            s.getOutputStream().write(hs);
            assertClosedByPeer(s);
        }
        assertFalse(channel.poll(new CmEvent()));
    }

    @Test
    @SetSystemProperty(key = "rdmabridge.soft.handshakeTimeoutMillis", value = "300")
    void shouldDropHalfOpenHandshakeAfterTimeout() throws Exception {
        try (Socket s = open()) {
            long start = System.nanoTime();
            s.getOutputStream().write(new byte[] {0x52, 0x42, 0x53});
            assertClosedByPeer(s);
            long millis = (System.nanoTime() - start) / 1_000_000;
            assertTrue(millis >= 250 && millis < 4000, "half-open handshake dropped after " + millis + " ms");
        }
    }

    @Test
    void shouldCloseOnHugePayloadLength() throws Exception {
        try (Socket s = connected(6)) {
            s.getOutputStream().write(frame(SoftFrame.SEND, 3, 0, Integer.MAX_VALUE, Integer.MAX_VALUE, 0, 0, 0, 0));
            assertClosedByPeer(s);
        }
        awaitServerDisconnected();
    }

    @Test
    void shouldCloseOnUnknownOpcodeAndReservedBits() throws Exception {
        try (Socket s = connected(6)) {
            s.getOutputStream().write(frame(99, 3, 0, 0, 0, 0, 0, 0, 0));
            assertClosedByPeer(s);
        }
        awaitServerDisconnected();
    }

    @Test
    void shouldCloseOnRingAndDoorbellFramesFromAPeerNotOnThisHost() throws Exception {
        for (int op : new int[] {SoftFrame.RING, SoftFrame.DOORBELL}) {
            try (Socket s = connected(6)) {
                // A RING frame would name a file to map: only a same-host peer may send one, and a DOORBELL too.
                s.getOutputStream().write(frame(op, 0, 0, 0, ShmRing.MIN_CAPACITY, 1, 0, 0, 0));
                assertClosedByPeer(s);
            }
            awaitServerDisconnected();
            serverQp.close();
            serverId.close();
            serverId = null;
            serverQp = null;
        }
    }

    @Test
    void shouldCloseOnPsnOutOfSequence() throws Exception {
        try (Socket s = connected(6)) {
            s.getOutputStream().write(frame(SoftFrame.WRITE, 3, 5, 8, 8, region.address(), region.rkey(), 0, 8));
            assertClosedByPeer(s);
        }
        awaitServerDisconnected();
        assertEquals((byte) 0xA5, memory.get(GUARD), "a refused frame wrote nothing");
    }

    @Test
    void shouldExecuteValidWriteAndAcknowledgeIt() throws Exception {
        try (Socket s = connected(6)) {
            s.getOutputStream().write(frame(SoftFrame.WRITE, 3, 0, 16, 16, region.address() + 100, region.rkey(), 0,
                    16));
            ByteBuffer ack = readFrame(s);
            assertEquals(SoftFrame.ACK, ack.get(SoftFrame.OPCODE_OFFSET));
            assertEquals(0, ack.getInt(SoftFrame.PSN_OFFSET));
            for (int i = 0; i < 16; i++) {
                assertEquals((byte) 0x3C, memory.get(GUARD + 100 + i));
            }
        }
        awaitServerDisconnected();
        assertGuardsIntact();
    }

    @Test
    void shouldNakBadRkeyAndOutOfBoundsWrites() throws Exception {
        long[][] cases = {
            {region.address(), region.rkey() ^ 1, 64},        // bad rkey
            {region.address() + REGION - 32, region.rkey(), 64}, // runs past the end
            {region.address() - 8, region.rkey(), 64},         // starts before the region
            {region.address() + 64, region.rkey(), -1},        // length field negative
        };
        for (long[] c : cases) {
            try (Socket s = connected(6)) {
                int length = (int) c[2];
                int payload = Math.max(length, 0);
                s.getOutputStream().write(frame(SoftFrame.WRITE, 3, 0, payload, length, c[0], (int) c[1], 0,
                        payload));
                if (length >= 0) {
                    ByteBuffer nak = readFrame(s);
                    assertEquals(SoftFrame.NAK, nak.get(SoftFrame.OPCODE_OFFSET));
                    assertEquals(WcStatus.REM_ACCESS_ERR, nak.getInt(SoftFrame.IMM_OFFSET));
                }
                assertClosedByPeer(s);
            }
            awaitServerDisconnected();
            assertGuardsIntact();
            serverQp.close();
            serverQp = null;
            serverId.close();
            serverId = null;
        }
        for (int i = 0; i < REGION; i++) {
            assertEquals((byte) 0xA5, memory.get(GUARD + i), "refused writes wrote nothing");
        }
    }

    @Test
    void shouldCloseWhenAContinuationFrameJumpsOutOfTheRegion() throws Exception {
        try (Socket s = connected(6)) {
            OutputStream out = s.getOutputStream();
            // A 128-byte write, in bounds as announced; its second frame then names an address past the region.
            out.write(frame(SoftFrame.WRITE, SoftFrame.FIRST, 0, 64, 128, region.address() + REGION - 128,
                    region.rkey(), 0, 64));
            out.write(frame(SoftFrame.WRITE, SoftFrame.LAST, 0, 64, 128, region.address() + REGION, region.rkey(), 0,
                    64));
            assertClosedByPeer(s);
        }
        awaitServerDisconnected();
        assertGuardsIntact();
    }

    @Test
    void shouldCloseOnUnsolicitedResponsesAndTruncatedFrames() throws Exception {
        try (Socket s = connected(6)) {
            s.getOutputStream().write(frame(SoftFrame.READ_RESPONSE, 3, 0, 8, 8, 0, 0, 0, 8));
            assertClosedByPeer(s);
        }
        awaitServerDisconnected();
        serverQp.close();
        serverQp = null;
        serverId.close();
        serverId = null;
        try (Socket s = connected(6)) {
            byte[] f = frame(SoftFrame.WRITE, 3, 0, 1000, 1000, region.address(), region.rkey(), 0, 1000);
            s.getOutputStream().write(f, 0, 500);
        }
        awaitServerDisconnected();
        assertGuardsIntact();
    }

    @Test
    void shouldSendReceiverNotReadyThenNakWhenNoReceiveIsPosted() throws Exception {
        try (Socket s = connected(6)) {
            s.getOutputStream().write(frame(SoftFrame.SEND, 3, 0, 8, 8, 0, 0, 0, 8));
            ByteBuffer rnr = readFrame(s);
            assertEquals(SoftFrame.RNR_NAK, rnr.get(SoftFrame.OPCODE_OFFSET));
            assertEquals(0, rnr.getInt(SoftFrame.PSN_OFFSET));
            // Frames that follow the refused one are dropped until it is sent again; now a receive exists.
            s.getOutputStream().write(frame(SoftFrame.WRITE, 3, 1, 8, 8, region.address(), region.rkey(), 0, 8));
            RecvWorkRequest rwr = new RecvWorkRequest(1).addSge(region.address() + 512, 8, region.lkey()).wrId(5);
            serverQp.postRecv(rwr);
            s.getOutputStream().write(frame(SoftFrame.SEND, 3, 0, 8, 8, 0, 0, 0, 8));
            ByteBuffer ack = readFrame(s);
            assertEquals(SoftFrame.ACK, ack.get(SoftFrame.OPCODE_OFFSET));
            assertEquals(0, ack.getInt(SoftFrame.PSN_OFFSET));
            WorkCompletions wc = SoftPair.pollOne(cq, null);
            assertEquals(WcStatus.SUCCESS, wc.status(0), wc.toString(0));
            assertEquals(5, wc.wrId(0));
            assertEquals((byte) 0xA5, memory.get(GUARD), "the dropped WRITE was not executed");
            assertEquals((byte) 0x3C, memory.get(GUARD + 512));
        }
        awaitServerDisconnected();
    }

    /**
     * An ACK for a SEND the peer has just refused with RNR_NAK is a lie, and it used to be taken: the SEND completed,
     * its memory went back to the application, and the RNR timer then sent that memory again, with whatever had been
     * written there since (in the channel's pooled memory, another connection's bytes).
     */
    @Test
    void shouldCloseOnAnAckForASendItRefusedWithReceiverNotReady() throws Exception {
        try (Socket s = connected(6)) {
            for (int i = 0; i < 64; i++) {
                memory.put(GUARD + i, (byte) 0x11);
            }
            serverQp.postSend(new SendWorkRequest(1).reset().opcode(WrOpcode.SEND).flags(SendWorkRequest.SIGNALED)
                    .wrId(9).addSge(region.address(), 64, region.lkey()));
            assertEquals(SoftFrame.SEND, readFrame(s).get(SoftFrame.OPCODE_OFFSET));
            ByteBuffer both = ByteBuffer.allocate(2 * SoftFrame.HEADER_LENGTH)
                    .put(frame(SoftFrame.RNR_NAK, 0, 0, 0, 0, 0, 0, 0, 0))
                    .put(frame(SoftFrame.ACK, 0, 0, 0, 0, 0, 0, 0, 0));
            s.getOutputStream().write(both.array());
            WorkCompletions wc = SoftPair.pollOne(cq, null);
            int status = wc.status(0);
            assertNotSentAgainUntilClosed(s, "SEND completed with " + WcStatus.name(status));
            assertTrue(status != WcStatus.SUCCESS, "the refused SEND completed as delivered");
        }
        awaitServerDisconnected();
    }

    /**
     * An RNR_NAK for a SEND the peer has acknowledged already is a lie too. It used to rewind the send queue to that
     * SEND, which completed anyway once the RDMA READ before it (still unanswered when the ACK came) was answered, and
     * the RNR timer then sent its memory again, with whatever had been written there since.
     */
    @Test
    void shouldCloseOnAReceiverNotReadyForASendItAcknowledgedAlready() throws Exception {
        try (Socket s = connected(6)) {
            for (int i = 0; i < 64; i++) {
                memory.put(GUARD + i, (byte) 0x11);
            }
            serverQp.postSend(new SendWorkRequest(1).reset().opcode(WrOpcode.RDMA_READ).flags(SendWorkRequest.SIGNALED)
                    .wrId(8).addSge(region.address() + 512, 64, region.lkey()).remote(0x10000, 7));
            serverQp.postSend(new SendWorkRequest(1).reset().opcode(WrOpcode.SEND).flags(SendWorkRequest.SIGNALED)
                    .wrId(9).addSge(region.address(), 64, region.lkey()));
            assertEquals(SoftFrame.READ_REQUEST, readFrame(s).get(SoftFrame.OPCODE_OFFSET));
            assertEquals(SoftFrame.SEND, readFrame(s).get(SoftFrame.OPCODE_OFFSET));
            byte[] ack = frame(SoftFrame.ACK, 0, 1, 0, 0, 0, 0, 0, 0);
            byte[] refused = frame(SoftFrame.RNR_NAK, 0, 1, 0, 0, 0, 0, 0, 0);
            byte[] answer = frame(SoftFrame.READ_RESPONSE, SoftFrame.FIRST | SoftFrame.LAST, 0, 64, 64, 0, 0, 0, 64);
            s.getOutputStream().write(ByteBuffer.allocate(ack.length + refused.length).put(ack).put(refused).array());
            // Apart, after the engine has handled the refusal (and rewound the send queue to the SEND).
            Thread.sleep(100);
            s.getOutputStream().write(answer);
            WorkCompletions first = SoftPair.pollOne(cq, null);
            WorkCompletions second = SoftPair.pollOne(cq, null);
            int sendStatus = second.wrId(0) == 9 ? second.status(0) : first.status(0);
            assertNotSentAgainUntilClosed(s, "SEND completed with " + WcStatus.name(sendStatus));
        }
        awaitServerDisconnected();
    }

    /**
     * Does what an application does once a SEND from the first 64 bytes of the region completes (it writes something
     * else there), then reads the frames the server sends until it closes the connection: none may carry those bytes.
     */
    private void assertNotSentAgainUntilClosed(Socket s, String completion) throws IOException {
        for (int i = 0; i < 64; i++) {
            memory.put(GUARD + i, (byte) 0x99);
        }
        s.setSoTimeout(5_000);
        DataInputStream in = new DataInputStream(s.getInputStream());
        try {
            while (true) {
                byte[] header = new byte[SoftFrame.HEADER_LENGTH];
                in.readFully(header);
                ByteBuffer h = ByteBuffer.wrap(header);
                byte[] payload = new byte[h.getInt(SoftFrame.PAYLOAD_LENGTH_OFFSET)];
                in.readFully(payload);
                for (byte b : payload) {
                    assertTrue(b != (byte) 0x99, "sent again, after its completion (" + completion + "): "
                            + SoftFrame.name(h.get(SoftFrame.OPCODE_OFFSET)));
                }
            }
        } catch (EOFException | SocketException closed) {
            // The server closed the connection.
        }
    }

    /**
     * From a copy hook: closes the region on another thread, which then runs {@code afterClose}, and sets
     * {@code closedDuringCopy} when that close returns while this copy is still under way (within 200 ms of the key's
     * withdrawal, from which a close that does not wait for the copy completes at once).
     */
    private void closeDuringCopy(Runnable afterClose, CompletableFuture<Void> closed, AtomicBoolean closedDuringCopy) {
        Thread closer = new Thread(() -> {
            region.close();
            afterClose.run();
            closed.complete(null);
        }, "closer");
        closer.start();
        try {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (!((SoftMemoryRegion) region).isClosed() && System.nanoTime() < deadline) {
                Thread.onSpinWait();
            }
            closed.get(200, TimeUnit.MILLISECONDS);
            closedDuringCopy.set(true);
        } catch (TimeoutException expected) {
            // Still waiting for this copy: right.
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    /**
     * A deregistration waits for a peer's RDMA WRITE frame that passed its key check and is being copied, as a device
     * quiesces its DMA before {@code ibv_dereg_mr} returns: once {@code close()} returns, no byte of the peer's lands
     * in the memory, which the application may reuse at once. It used to return at once, and the copy went on.
     */
    @Test
    void shouldReturnFromADeregistrationOnlyOnceAWriteBeingCopiedIntoTheRegionIsDone() throws Exception {
        CompletableFuture<Void> closed = new CompletableFuture<>();
        AtomicBoolean closedDuringCopy = new AtomicBoolean();
        try (Socket s = connected(6)) {
            provider.faults().beforeRemoteWriteCopy(() -> {
                provider.faults().beforeRemoteWriteCopy(null);
                closeDuringCopy(() -> { }, closed, closedDuringCopy);
            });
            s.getOutputStream().write(frame(SoftFrame.WRITE, SoftFrame.FIRST | SoftFrame.LAST, 0, 64, 64,
                    region.address(), region.rkey(), 0, 64));
            closed.get(10, TimeUnit.SECONDS);
            assertFalse(closedDuringCopy.get(), "close() returned while a WRITE was being copied into the region");
            assertEquals(0x3C, memory.get(GUARD) & 0xFF, "the WRITE that passed its check before the close");
        } finally {
            provider.faults().reset();
        }
    }

    /**
     * A deregistration waits for a chunk of a READ's response that passed its key check and is being copied out of
     * the region, as a device quiesces its DMA: once {@code close()} returns, the application may reuse the memory, or
     * unmap it, and the copy neither reads what it holds next nor faults the process. It used to return at once: the
     * copy was checked again afterwards and dropped, but an unmapped region faulted the engine's copy first.
     */
    @Test
    void shouldReturnFromADeregistrationOnlyOnceAReadResponseBeingCopiedOutOfTheRegionIsDone() throws Exception {
        CompletableFuture<Void> closed = new CompletableFuture<>();
        AtomicBoolean closedDuringCopy = new AtomicBoolean();
        try (Socket s = connected(6)) {
            provider.faults().beforeReadResponseCopy(() -> {
                provider.faults().beforeReadResponseCopy(null);
                // The owner reuses the memory at once, as a pool does.
                closeDuringCopy(() -> {
                    for (int i = 0; i < 64; i++) {
                        memory.put(GUARD + i, (byte) 0x99);
                    }
                }, closed, closedDuringCopy);
            });
            s.getOutputStream().write(frame(SoftFrame.READ_REQUEST, 3, 0, 0, 64, region.address(), region.rkey(), 0,
                    0));
            DataInputStream in = new DataInputStream(s.getInputStream());
            byte[] header = new byte[SoftFrame.HEADER_LENGTH];
            in.readFully(header);
            ByteBuffer h = ByteBuffer.wrap(header);
            assertEquals(SoftFrame.name(SoftFrame.READ_RESPONSE), SoftFrame.name(h.get(SoftFrame.OPCODE_OFFSET)),
                    "the answer to a READ that passed its check before the close");
            byte[] payload = new byte[h.getInt(SoftFrame.PAYLOAD_LENGTH_OFFSET)];
            assertEquals(64, payload.length);
            in.readFully(payload);
            closed.get(10, TimeUnit.SECONDS);
            assertFalse(closedDuringCopy.get(), "close() returned while a READ response was being copied");
            for (int i = 0; i < payload.length; i++) {
                assertEquals((byte) 0xA5, payload[i], "byte " + i + " of the response: what the region held");
            }
        } finally {
            provider.faults().reset();
        }
    }

    @Test
    void shouldAnswerNoMoreReadsOnceTheQueuePairIsDestroyed() throws Exception {
        // The peer asks for 16 READs of 16 MiB and does not read its socket; the application then destroys the queue
        // pair and may reuse the memory. The responses went on being copied out of it: 252 MiB reached the peer.
        int size = 16 << 20;
        ByteBuffer big = ByteBuffer.allocateDirect(size);
        MemoryRegion source = pd.register(big, Access.REMOTE_READ);
        long received = 0;
        try (Socket s = connected(6)) {
            for (int psn = 0; psn < 16; psn++) {
                s.getOutputStream().write(frame(SoftFrame.READ_REQUEST, 3, psn, 0, size, source.address(),
                        source.rkey(), 0, 0));
            }
            Thread.sleep(300); // the responses fill the socket's buffers, and wait
            serverQp.close();
            serverQp = null;
            DataInputStream in = new DataInputStream(s.getInputStream());
            byte[] header = new byte[SoftFrame.HEADER_LENGTH];
            s.setSoTimeout(10_000);
            try {
                while (true) {
                    in.readFully(header);
                    ByteBuffer h = ByteBuffer.wrap(header);
                    int payload = h.getInt(SoftFrame.PAYLOAD_LENGTH_OFFSET);
                    in.skipNBytes(payload);
                    if (h.get(SoftFrame.OPCODE_OFFSET) == SoftFrame.READ_RESPONSE) {
                        received += payload;
                    }
                }
            } catch (java.io.EOFException | SocketException e) {
                // The link closed.
            }
        } finally {
            source.close();
        }
        // What the socket's buffers held when the queue pair went, never the whole 256 MiB.
        assertTrue(received < 64L << 20, "READ response bytes the peer received: " + received);
        awaitEvent(channel, CmEventType.DISCONNECTED);
    }

    @Test
    void shouldSurviveAPeerThatVanishesMidHandshake() throws Exception {
        Socket s = open();
        s.getOutputStream().write(SoftHandshake.encode(SoftHandshake.CONNECT, 1, ConnectionParameters.DEFAULT,
                new byte[0], 0), 0, 10);
        s.close();
        try (Socket t = connected(6)) {
            assertTrue(t.isConnected());
        }
        awaitServerDisconnected();
    }

    /**
     * A local process of another user repeats our token (any peer that has seen one of our handshakes can, and one
     * on this host can compute it) and names our pid: its socket is not our user's, so the link stays on the TCP
     * path, and the ACCEPT tells it neither our token nor our pid. (Before, the server mapped the files of the
     * process the peer named, and answered with its token.)
     */
    @Test
    @SetSystemProperty(key = SharedMemoryFiles.SAME_HOST_PROPERTY, value = "shm") // also in the TCP-path run
    void shouldKeepAPeerOfAnotherUserThatRepeatsOurTokenOnTheTcpPath() throws Exception {
        assumeTrue(Integer.valueOf(0).equals(Files.getAttribute(Path.of("/proc/self"), "unix:uid"))
                && Files.isExecutable(Path.of("/usr/bin/setpriv")) && Files.isExecutable(Path.of("/bin/bash")),
                "needs root, setpriv (util-linux) and bash to connect as another user; CI runs as root");
        byte[] connect = SoftHandshake.encode(SoftHandshake.CONNECT, 77, ConnectionParameters.DEFAULT, new byte[0], 0,
                SoftEngine.get().sharedMemory.hostToken(), ProcessHandle.current().pid());
        StringBuilder escaped = new StringBuilder();
        for (byte b : connect) {
            escaped.append(String.format("\\x%02x", b & 0xff));
        }
        // User nobody sends the handshake through bash's /dev/tcp, prints the ACCEPT in hex and holds the socket.
        Process peer = new ProcessBuilder("/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                "/bin/bash", "-c", "exec 3<>/dev/tcp/" + bound.getAddress().getHostAddress() + "/" + bound.getPort()
                + "; printf '%b' \"" + escaped + "\" >&3; head -c " + (SoftHandshake.HEADER_LENGTH + 1)
                + " <&3 | od -An -v -tx1; sleep 5").redirectErrorStream(true).start();
        try {
            CmEvent request = awaitEvent(channel, CmEventType.CONNECT_REQUEST);
            serverId = request.id();
            serverQp = serverId.createQueuePair(pd, cq, cq, new QpCapabilities(16, 16, 2, 2, 0));
            serverId.accept(ConnectionParameters.DEFAULT.withPrivateData(new byte[] {7}));
            awaitEvent(channel, CmEventType.ESTABLISHED);
            assertFalse(((TcpLink) ((SoftQueuePair) serverQp).link).sameHost(), "same-host with a peer of another "
                    + "user that repeated our token");
            ByteBuffer reply = ByteBuffer.allocate(SoftHandshake.HEADER_LENGTH + 1);
            BufferedReader out = new BufferedReader(new InputStreamReader(peer.getInputStream(),
                    StandardCharsets.US_ASCII));
            for (String line; reply.hasRemaining() && (line = out.readLine()) != null; ) {
                for (String hex : line.trim().split("\\s+")) {
                    reply.put((byte) Integer.parseInt(hex, 16));
                }
            }
            SoftHandshake accept = new SoftHandshake().wrap(reply, 0);
            assertEquals(null, accept.validate(1 << SoftHandshake.ACCEPT));
            assertArrayEquals(new byte[SharedMemoryFiles.TOKEN_LENGTH], accept.hostToken(), "token in the ACCEPT");
            assertEquals(0, accept.pid(), "pid in the ACCEPT");
        } finally {
            peer.destroyForcibly();
            peer.waitFor();
        }
    }

    /** A raw peer that claims to share this host (our own token and pid), on a server with the path on. */
    private Socket connectedSameHost() throws Exception {
        Socket s = connected(6, SoftEngine.get().sharedMemory.hostToken(), ProcessHandle.current().pid());
        assertTrue(((TcpLink) ((SoftQueuePair) serverQp).link).sameHost());
        return s;
    }

    @Test
    @SetSystemProperty(key = SharedMemoryFiles.SAME_HOST_PROPERTY, value = "shm")
    void shouldGrowARingLinksReadBufferForFramesThePeerKeepsOnTheSocket() throws Exception {
        // The server's side of a same-host link has a ring, so its socket keeps the handshake's small buffers; a peer
        // that stays on the socket (rings off, or this raw one) sends frames larger than that, which must still land.
        TcpLink link;
        try (Socket s = connectedSameHost()) {
            link = (TcpLink) ((SoftQueuePair) serverQp).link;
            assertArrayEquals(new int[] {TcpLink.HANDSHAKE_BUFFER_SIZE, TcpLink.HANDSHAKE_BUFFER_SIZE},
                    link.socketBufferCapacities(), "socket buffers of the server's ring link");
            s.getOutputStream().write(frame(SoftFrame.WRITE, 3, 0, REGION, REGION, region.address(),
                    region.rkey(), 0, REGION));
            // The acknowledgement goes into the server's ring, which a raw peer does not read: wait for the bytes.
            long deadline = System.nanoTime() + 10_000_000_000L;
            while (memory.get(GUARD + REGION - 1) != (byte) 0x3C) {
                assertTrue(System.nanoTime() < deadline, "the WRITE on the socket never landed");
                Thread.sleep(1);
            }
            for (int i = 0; i < REGION; i++) {
                assertEquals((byte) 0x3C, memory.get(GUARD + i), "byte " + i + " of the WRITE");
            }
        }
        awaitServerDisconnected();
        assertArrayEquals(new int[] {TcpLink.READ_BUFFER_SIZE, TcpLink.HANDSHAKE_BUFFER_SIZE},
                link.socketBufferCapacities(), "socket buffers after the peer's frame on the socket");
        assertGuardsIntact();
    }

    /** Closes the server's end of the last connection, so that the next {@link #connected} can make another. */
    private void closeServerSide() {
        serverQp.close();
        serverId.close();
        serverQp = null;
        serverId = null;
    }

    /** A same-host connection still executes a valid WRITE after the hostile ones (the engine carries on). */
    private void assertAnotherLinkWorks() throws Exception {
        closeServerSide();
        try (Socket s = connectedSameHost()) {
            s.getOutputStream().write(frame(SoftFrame.DIRECT, 3, 0, 0, 1, 0, 0, 0, 0));
            s.getOutputStream().write(frame(SoftFrame.WRITE, 3, 1, 16, 16, region.address(), region.rkey(), 0, 16));
            ByteBuffer ack = readFrame(s);
            assertEquals(SoftFrame.ACK, ack.get(SoftFrame.OPCODE_OFFSET));
            assertEquals(1, ack.getInt(SoftFrame.PSN_OFFSET), "the DIRECT frame accounted for psn 0");
            assertEquals((byte) 0x3C, memory.get(GUARD));
        }
        awaitServerDisconnected();
        assertGuardsIntact();
    }

    @Test
    @SetSystemProperty(key = SharedMemoryFiles.SAME_HOST_PROPERTY, value = "shm")
    // The raw peer speaks frames over the socket only: no rings, so that the server's ACK comes back on it.
    @SetSystemProperty(key = ShmRing.PROPERTY, value = "false")
    void shouldCloseOnHostileDirectFramesAndKeepServingOtherLinks() throws Exception {
        try (LogCapture log = new LogCapture()) {
            // On a link that is not same-host (the peer offered no token).
            try (Socket s = connected(6)) {
                s.getOutputStream().write(frame(SoftFrame.DIRECT, 3, 0, 0, 1, 0, 0, 0, 0));
                assertClosedByPeer(s);
            }
            awaitServerDisconnected();
            log.assertWarned("protocol violation", "DIRECT", "on a link that is not same-host");

            closeServerSide();
            try (Socket s = connectedSameHost()) {
                s.getOutputStream().write(frame(SoftFrame.DIRECT, 3, 5, 0, 1, 0, 0, 0, 0));
                assertClosedByPeer(s);
            }
            awaitServerDisconnected();
            log.assertWarned("protocol violation", "DIRECT", "psn 5 (expected: 0)");

            // In the middle of a message: the first of two WRITE frames, then DIRECT.
            closeServerSide();
            try (Socket s = connectedSameHost()) {
                s.getOutputStream().write(frame(SoftFrame.WRITE, SoftFrame.FIRST, 0, 8, 16, region.address(),
                        region.rkey(), 0, 8));
                s.getOutputStream().write(frame(SoftFrame.DIRECT, 3, 1, 0, 1, 0, 0, 0, 0));
                assertClosedByPeer(s);
            }
            awaitServerDisconnected();
            log.assertWarned("protocol violation", "DIRECT", "inside message psn 0");

            for (int count : new int[] {0, TcpLink.MAX_DIRECT + 1, -1}) {
                closeServerSide();
                try (Socket s = connectedSameHost()) {
                    s.getOutputStream().write(frame(SoftFrame.DIRECT, 3, 0, 0, count, 0, 0, 0, 0));
                    assertClosedByPeer(s);
                }
                awaitServerDisconnected();
                if (count >= 0) {
                    log.assertWarned("protocol violation", "DIRECT", "count " + count + " (expected: 1.."
                            + TcpLink.MAX_DIRECT + ")");
                }
            }
            for (int i = GUARD; i < GUARD + 16; i++) {
                memory.put(i, (byte) 0xA5); // the partial WRITE above may have landed; the check below needs 0xA5
            }
            assertGuardsIntact();
            assertAnotherLinkWorks();
        }
    }

    /** Reads until EOF, ignoring what arrives. */
    static void drain(Socket s) throws IOException {
        try {
            new DataInputStream(s.getInputStream()).readFully(new byte[1 << 20]);
        } catch (EOFException expected) {
            // Closed.
        }
    }
}
