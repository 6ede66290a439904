package io.rdmabridge.verbs.soft;

import static io.rdmabridge.verbs.soft.SoftPair.assertCompletion;
import static io.rdmabridge.verbs.soft.SoftPair.awaitEvent;
import static io.rdmabridge.verbs.soft.SoftPair.pollOne;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

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
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RecvWorkRequest;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WcOpcode;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WorkCompletions;
import io.rdmabridge.verbs.WrOpcode;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.ByteBuffer;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.junitpioneer.jupiter.RestoreSystemProperties;
import org.junitpioneer.jupiter.SetSystemProperty;

/** The soft provider's verbs semantics on both paths: in-JVM direct ({@code false}) and TCP ({@code true}). */
class SoftVerbsTest {
    private final SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
    private final SendWorkRequest swr = new SendWorkRequest(4);
    private final RecvWorkRequest rwr = new RecvWorkRequest(4);

    @AfterEach
    void resourcesReturnToZero() {
        provider.faults().reset();
        SoftPair.assertResourcesReleased(provider);
    }

    /** A client id resolved to {@code target}, with a queue pair (4 sends, 4 receives) ready to connect. */
    private record Resolved(RdmaCmId id, ProtectionDomain pd, CompletionQueue cq, QueuePair qp)
            implements AutoCloseable {
        static Resolved to(RdmaEventChannel client, EventNotifier n, InetSocketAddress target, int timeoutMillis)
                throws Exception {
            RdmaCmId id = client.createId();
            id.resolve(target, timeoutMillis);
            awaitEvent(client, CmEventType.ADDR_RESOLVED);
            ProtectionDomain pd = id.device().allocProtectionDomain();
            CompletionQueue cq = id.device().createCompletionQueue(16, n);
            return new Resolved(id, pd, cq, id.createQueuePair(pd, cq, cq, new QpCapabilities(4, 4, 1, 1, 0)));
        }

        @Override
        public void close() {
            qp.close();
            id.close();
            cq.close();
            pd.close();
        }
    }

    private void postRecv(SoftPair.Side side, long wrId, SoftPair.Buffer b, int offset, int length)
            throws RdmaException {
        side.qp.postRecv(rwr.reset().wrId(wrId).addSge(b.address() + offset, length, b.mr().lkey()));
    }

    @Test
    void shouldDescribeDeviceSoft0() throws Exception {
        var attrs = provider.devices().get(0).attributes();
        assertEquals("soft0", attrs.name());
        assertEquals("software (TCP / in-JVM)", attrs.transport());
        assertEquals(256, attrs.maxInlineData());
        assertEquals(32, attrs.maxSge());
        assertEquals(16384, attrs.maxQpWr());
        assertEquals(65536, attrs.maxCqe());
        assertTrue(attrs.maxMrSize() >= Integer.MAX_VALUE);
        assertEquals("127.0.0.1", provider.devices().get(0).ports().get(0).address());
        assertFalse(provider.isHardware());
        assertTrue(provider.isAvailable());
        assertEquals("soft", provider.name());
        // One device per JVM, seen by each instance through a device object of its own.
        SoftProvider other = new SoftProvider(SoftProvider.PrivateDataMode.NONE);
        RdmaDevice otherDevice = other.devices().get(0);
        assertTrue(otherDevice.provider() == other, "device of another instance names that instance");
        assertEquals(provider.devices().get(0).name(), otherDevice.name());
        assertTrue(other.resourceUsage() == provider.resourceUsage(), "one resource count per JVM");
    }

    @Test
    void shouldNameTheMakerOfALiveIdInTheResourceReport() throws Exception {
        // A leak report names who made what is left, so that a test's leftover can be traced to its maker.
        RdmaEventChannel channel = provider.createEventChannel(null);
        try (RdmaCmId id = channel.createId()) {
            String report = provider.resourceUsage().toString();
            assertTrue(report.contains("live: [SoftEventChannel{made on " + Thread.currentThread().getName()
                    + ", ids=[SoftCmId{IDLE"), report);
        } finally {
            channel.close();
        }
        assertFalse(provider.resourceUsage().toString().contains("live:"), provider.resourceUsage()::toString);
    }

    @Test
    @RestoreSystemProperties
    void shouldReadThePrivateDataModeWhenCreated() {
        System.setProperty(SoftProvider.PRIVATE_DATA_PROPERTY, "none");
        SoftProvider none = new SoftProvider();
        System.setProperty(SoftProvider.PRIVATE_DATA_PROPERTY, "DELIVER");
        SoftProvider deliver = new SoftProvider();
        System.setProperty(SoftProvider.PRIVATE_DATA_PROPERTY, "sometimes");
        SoftProvider wrong = new SoftProvider();
        System.clearProperty(SoftProvider.PRIVATE_DATA_PROPERTY);
        SoftProvider unset = new SoftProvider();

        assertFalse(none.deliversPrivateData(), "created with none");
        assertEquals(SoftProvider.PrivateDataMode.NONE, none.privateDataMode(), "fixed at creation");
        assertTrue(deliver.deliversPrivateData(), "created with DELIVER (any case)");
        assertTrue(unset.deliversPrivateData(), "the default");
        assertFalse(wrong.isAvailable(), "an unknown mode makes the instance unusable");
        String cause = String.valueOf(wrong.unavailabilityCause().getMessage());
        assertTrue(cause.contains("rdmabridge.soft.privateData=sometimes (expected: deliver or none)"), cause);
        RdmaException e = assertThrows(RdmaException.class, () -> wrong.createEventChannel(null));
        assertEquals(cause, e.getMessage());
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldGiveBothEndsTheirAddressesWithRealPorts(boolean tcp) throws Exception {
        try (SoftPair p = SoftPair.of(tcp)) {
            InetSocketAddress clientLocal = p.client.id.localAddress();
            assertTrue(clientLocal.getPort() > 0, "client local address " + clientLocal);
            assertFalse(clientLocal.getAddress().isAnyLocalAddress(), "client local address " + clientLocal);
            assertEquals(clientLocal, p.server.id.remoteAddress());
            assertEquals(p.listenId.localAddress(), p.server.id.localAddress());
            assertEquals(p.server.id.localAddress().getPort(), p.client.id.remoteAddress().getPort());
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldSendAndReceiveWithImmediateAndScatterGather(boolean tcp) throws Exception {
        try (SoftPair p = SoftPair.of(tcp)) {
            SoftPair.Buffer src = p.buffer(p.client, 4096);
            SoftPair.Buffer dst = p.buffer(p.server, 4096);
            src.fill(7);
            // Receive scattered over two entries: 100 bytes at offset 0 and the rest at offset 1000.
            p.server.qp.postRecv(rwr.reset().wrId(11).addSge(dst.address(), 100, dst.mr().lkey())
                    .addSge(dst.address() + 1000, 2000, dst.mr().lkey()));
            // Send gathered from two entries: 60 bytes at 0 and 90 bytes at 500.
            p.client.qp.postSend(swr.reset().wrId(21).opcode(WrOpcode.SEND_WITH_IMM).immData(0xCAFE)
                    .flags(SendWorkRequest.SIGNALED).addSge(src.address(), 60, src.mr().lkey())
                    .addSge(src.address() + 500, 90, src.mr().lkey()));
            WorkCompletions rc = pollOne(p.server.recvCq, null);
            assertCompletion(rc, 11, WcStatus.SUCCESS, WcOpcode.RECV);
            assertEquals(150, rc.byteLength(0));
            assertTrue(rc.hasImmediate(0));
            assertEquals(0xCAFE, rc.immData(0));
            assertEquals(p.server.qp.qpNumber(), rc.qpNumber(0));
            assertCompletion(pollOne(p.client.sendCq, null), 21, WcStatus.SUCCESS, WcOpcode.SEND);
            dst.assertFilled(0, 60, 7, 0);
            dst.assertFilled(60, 40, 7, 500);
            dst.assertFilled(1000, 50, 7, 540);
            assertEquals(0, dst.get(1050), "nothing beyond the message");
        }
    }

    /**
     * ibv_destroy_qp(3): once it returns, the device touches none of the queue pair's buffers, and their owner frees
     * them. A SEND that was landing in a receive buffer (copied by the peer's posting thread in-JVM, by the engine
     * over TCP) went on landing after close() had returned.
     */
    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldLandNothingInAReceiveBufferOnceItsQueuePairIsClosed(boolean tcp) throws Exception {
        int size = 128 << 20;
        try (SoftPair p = SoftPair.of(tcp)) {
            SoftPair.Buffer src = p.buffer(p.client, size);
            SoftPair.Buffer dst = p.buffer(p.server, size);
            for (int i = 0; i < size; i += Long.BYTES) {
                src.buf().putLong(i, i + 1L);
            }
            p.server.qp.postRecv(rwr.reset().wrId(1).addSge(dst.address(), size, dst.mr().lkey()));
            // In-JVM the posting thread copies the SEND into the receive: post on a thread of its own.
            CompletableFuture<Void> posted = CompletableFuture.runAsync(() -> {
                try {
                    p.client.qp.postSend(new SendWorkRequest(1).wrId(2).opcode(WrOpcode.SEND)
                            .flags(SendWorkRequest.SIGNALED).addSge(src.address(), size, src.mr().lkey()));
                } catch (RdmaException e) {
                    throw new CompletionException(e);
                }
            });
            long deadline = System.nanoTime() + SoftPair.TIMEOUT_NANOS;
            while (dst.buf().getLong(0) == 0 && System.nanoTime() < deadline) {
                Thread.onSpinWait();
            }
            assertEquals(1L, dst.buf().getLong(0), "the SEND started landing");
            p.server.qp.close();
            long atClose = checksum(dst.buf());
            Thread.sleep(300);
            assertEquals(atClose, checksum(dst.buf()), "bytes landed after the queue pair was closed");
            posted.get(10, TimeUnit.SECONDS);
        }
    }

    private static long checksum(ByteBuffer b) {
        long h = 0;
        for (int i = 0; i < b.capacity(); i += Long.BYTES) {
            h = 31 * h + b.getLong(i);
        }
        return h;
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldCopyInlinePayloadAtPostTime(boolean tcp) throws Exception {
        try (SoftPair p = SoftPair.of(tcp)) {
            ByteBuffer unregistered = ByteBuffer.allocateDirect(64);
            long address = DirectMemory.address(unregistered);
            for (int i = 0; i < 64; i++) {
                unregistered.put(i, (byte) i);
            }
            SoftPair.Buffer dst = p.buffer(p.server, 64);
            postRecv(p.server, 1, dst, 0, 64);
            p.client.qp.postSend(swr.reset().wrId(2).flags(SendWorkRequest.INLINE | SendWorkRequest.SIGNALED)
                    .addSge(address, 64, 0));
            for (int i = 0; i < 64; i++) {
                unregistered.put(i, (byte) 0x55);
            }
            assertCompletion(pollOne(p.server.recvCq, null), 1, WcStatus.SUCCESS, WcOpcode.RECV);
            for (int i = 0; i < 64; i++) {
                assertEquals((byte) i, dst.get(i));
            }
            assertThrows(RdmaException.class, () -> p.client.qp.postSend(swr.reset().flags(SendWorkRequest.INLINE)
                    .addSge(address, 64, 0).addSge(address, 64, 0).addSge(address, 64, 0).addSge(address, 65, 0)));
            ByteBuffer keep = unregistered;
            assertEquals(64, keep.capacity());
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldWriteAndReadRemoteMemoryWithoutTheTarget(boolean tcp) throws Exception {
        try (SoftPair p = SoftPair.of(tcp)) {
            SoftPair.Buffer local = p.buffer(p.client, 8192);
            SoftPair.Buffer remote = p.buffer(p.server, 8192, Access.LOCAL_WRITE | Access.REMOTE_WRITE
                    | Access.REMOTE_READ);
            local.fill(3);
            p.client.qp.postSend(swr.reset().wrId(1).opcode(WrOpcode.RDMA_WRITE).flags(SendWorkRequest.SIGNALED)
                    .remote(remote.address() + 100, remote.mr().rkey()).addSge(local.address(), 5000,
                            local.mr().lkey()));
            assertCompletion(pollOne(p.client.sendCq, null), 1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE);
            remote.assertFilled(100, 5000, 3, 0);
            assertEquals(0, remote.get(99));
            assertEquals(0, remote.get(5100));

            SoftPair.Buffer back = p.buffer(p.client, 8192);
            // Read scattered into two entries.
            p.client.qp.postSend(swr.reset().wrId(2).opcode(WrOpcode.RDMA_READ).flags(SendWorkRequest.SIGNALED)
                    .remote(remote.address() + 100, remote.mr().rkey())
                    .addSge(back.address(), 1000, back.mr().lkey())
                    .addSge(back.address() + 2000, 4000, back.mr().lkey()));
            WorkCompletions wc = pollOne(p.client.sendCq, null);
            assertCompletion(wc, 2, WcStatus.SUCCESS, WcOpcode.RDMA_READ);
            assertEquals(5000, wc.byteLength(0));
            back.assertFilled(0, 1000, 3, 0);
            back.assertFilled(2000, 4000, 3, 1000);
            SoftPair.assertQuiet(p.server.recvCq, 20);
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldDeliverWriteWithImmediateIntoAReceive(boolean tcp) throws Exception {
        try (SoftPair p = SoftPair.of(tcp)) {
            SoftPair.Buffer local = p.buffer(p.client, 1024);
            SoftPair.Buffer remote = p.buffer(p.server, 1024);
            local.fill(9);
            postRecv(p.server, 77, remote, 0, 0);
            p.client.qp.postSend(swr.reset().wrId(5).opcode(WrOpcode.RDMA_WRITE_WITH_IMM).immData(42)
                    .flags(SendWorkRequest.SIGNALED).remote(remote.address() + 8, remote.mr().rkey())
                    .addSge(local.address(), 512, local.mr().lkey()));
            WorkCompletions rc = pollOne(p.server.recvCq, null);
            assertCompletion(rc, 77, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM);
            assertEquals(512, rc.byteLength(0));
            assertEquals(42, rc.immData(0));
            assertCompletion(pollOne(p.client.sendCq, null), 5, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE);
            remote.assertFilled(8, 512, 9, 0);
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldCompleteInOrderAndOnlySignaledOnes(boolean tcp) throws Exception {
        try (SoftPair p = SoftPair.of(tcp)) {
            SoftPair.Buffer src = p.buffer(p.client, 64 * 100);
            SoftPair.Buffer dst = p.buffer(p.server, 64 * 100);
            for (int i = 0; i < 50; i++) {
                postRecv(p.server, 1000 + i, dst, i * 64, 64);
            }
            for (int i = 0; i < 50; i++) {
                p.client.qp.postSend(swr.reset().wrId(i).flags(i % 10 == 9 ? SendWorkRequest.SIGNALED : 0)
                        .addSge(src.address() + i * 64, 64, src.mr().lkey()));
            }
            for (int i = 0; i < 50; i++) {
                assertCompletion(pollOne(p.server.recvCq, null), 1000 + i, WcStatus.SUCCESS, WcOpcode.RECV);
            }
            for (int i = 9; i < 50; i += 10) {
                assertCompletion(pollOne(p.client.sendCq, null), i, WcStatus.SUCCESS, WcOpcode.SEND);
            }
            SoftPair.assertQuiet(p.client.sendCq, 20);
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldRefuseBadRkeyAndOutOfBoundsWriteWithoutTouchingNeighbours(boolean tcp) throws Exception {
        for (int variant = 0; variant < 4; variant++) {
            try (SoftPair p = SoftPair.of(tcp)) {
                SoftPair.Buffer local = p.buffer(p.client, 4096);
                local.fill(1);
                // The region is the middle 1 KiB of a 3 KiB buffer whose outer parts are guard bytes.
                ByteBuffer whole = ByteBuffer.allocateDirect(3072);
                for (int i = 0; i < 3072; i++) {
                    whole.put(i, (byte) 0x5A);
                }
                long base = DirectMemory.address(whole);
                int access = variant == 3 ? Access.LOCAL_WRITE | Access.REMOTE_READ : Access.ALL;
                MemoryRegion region = p.server.pd.register(base + 1024, 1024, access);
                long remoteAddress = base + 1024;
                int rkey = region.rkey();
                int length = 512;
                switch (variant) {
                    case 0: // unknown rkey
                        rkey = region.rkey() ^ 0x1234567;
                        break;
                    case 1: // runs past the end
                        remoteAddress = base + 1024 + 768;
                        break;
                    case 2: // starts before the region
                        remoteAddress = base + 1024 - 16;
                        break;
                    default: // region without REMOTE_WRITE
                        break;
                }
                p.client.qp.postSend(swr.reset().wrId(9).opcode(WrOpcode.RDMA_WRITE).remote(remoteAddress, rkey)
                        .addSge(local.address(), length, local.mr().lkey()));
                p.client.qp.postSend(swr.reset().wrId(10).opcode(WrOpcode.SEND).flags(SendWorkRequest.SIGNALED)
                        .addSge(local.address(), 8, local.mr().lkey()));
                assertCompletion(pollOne(p.client.sendCq, null), 9, WcStatus.REM_ACCESS_ERR, 0);
                assertEquals(QpState.ERROR, p.client.qp.state(), "ERROR before the error completion is visible");
                assertEquals(QpState.ERROR, p.server.qp.state(), "the target moved to ERROR before the NAK");
                assertCompletion(pollOne(p.client.sendCq, null), 10, WcStatus.WR_FLUSH_ERR, 0);
                awaitEvent(p.client.channel, CmEventType.DISCONNECTED);
                awaitEvent(p.server.channel, CmEventType.DISCONNECTED);
                assertEquals(QpState.ERROR, p.client.qp.state());
                assertEquals(QpState.ERROR, p.server.qp.state());
                for (int i = 0; i < 3072; i++) {
                    assertEquals((byte) 0x5A, whole.get(i), "variant " + variant + ": byte " + i + " was written");
                }
                region.close();
            }
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldRefuseReadWithoutRemoteReadAndDeadRkeys(boolean tcp) throws Exception {
        for (int variant = 0; variant < 2; variant++) {
            try (SoftPair p = SoftPair.of(tcp)) {
                SoftPair.Buffer local = p.buffer(p.client, 4096);
                SoftPair.Buffer remote = p.buffer(p.server, 4096, variant == 0
                        ? Access.LOCAL_WRITE | Access.REMOTE_WRITE : Access.ALL);
                int rkey = remote.mr().rkey();
                if (variant == 1) {
                    p.deregister(remote.mr());
                }
                p.client.qp.postSend(swr.reset().wrId(3).opcode(WrOpcode.RDMA_READ).remote(remote.address(), rkey)
                        .addSge(local.address(), 100, local.mr().lkey()));
                assertCompletion(pollOne(p.client.sendCq, null), 3, WcStatus.REM_ACCESS_ERR, 0);
                awaitEvent(p.server.channel, CmEventType.DISCONNECTED);
            }
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldFailBadLocalKeyWithLocalProtectionError(boolean tcp) throws Exception {
        try (SoftPair p = SoftPair.of(tcp)) {
            SoftPair.Buffer local = p.buffer(p.client, 4096);
            p.client.qp.postSend(swr.reset().wrId(4).addSge(local.address(), 100, local.mr().lkey() + 1));
            assertCompletion(pollOne(p.client.sendCq, null), 4, WcStatus.LOC_PROT_ERR, 0);
            p.client.qp.postSend(swr.reset().wrId(5).addSge(local.address() + 4000, 100, local.mr().lkey()));
            assertCompletion(pollOne(p.client.sendCq, null), 5, WcStatus.WR_FLUSH_ERR, 0);
            awaitEvent(p.server.channel, CmEventType.DISCONNECTED);
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldFailSendLargerThanReceive(boolean tcp) throws Exception {
        try (SoftPair p = SoftPair.of(tcp)) {
            SoftPair.Buffer src = p.buffer(p.client, 4096);
            SoftPair.Buffer dst = p.buffer(p.server, 4096);
            for (int i = 0; i < 4096; i++) {
                dst.buf().put(i, (byte) 0x11);
            }
            postRecv(p.server, 1, dst, 0, 100);
            postRecv(p.server, 2, dst, 100, 100);
            p.client.qp.postSend(swr.reset().wrId(7).addSge(src.address(), 101, src.mr().lkey()));
            assertCompletion(pollOne(p.server.recvCq, null), 1, WcStatus.LOC_LEN_ERR, 0);
            assertCompletion(pollOne(p.server.recvCq, null), 2, WcStatus.WR_FLUSH_ERR, 0);
            assertCompletion(pollOne(p.client.sendCq, null), 7, WcStatus.REM_INV_REQ_ERR, 0);
            for (int i = 0; i < 4096; i++) {
                assertEquals((byte) 0x11, dst.buf().get(i));
            }
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldBoundReceiverNotReadyRetries(boolean tcp) throws Exception {
        // The responder's accept bounds the retries of the sends it receives (rdma_accept(3)).
        try (SoftPair p = new SoftPair(tcp, ConnectionParameters.DEFAULT,
                ConnectionParameters.DEFAULT.withRnrRetryCount(2))) {
            SoftPair.Buffer src = p.buffer(p.client, 4096);
            long start = System.nanoTime();
            p.client.qp.postSend(swr.reset().wrId(8).flags(SendWorkRequest.SIGNALED)
                    .addSge(src.address(), 10, src.mr().lkey()));
            p.client.qp.postSend(swr.reset().wrId(9).flags(SendWorkRequest.SIGNALED)
                    .addSge(src.address(), 10, src.mr().lkey()));
            assertCompletion(pollOne(p.client.sendCq, null), 8, WcStatus.RNR_RETRY_EXC_ERR, 0);
            long millis = (System.nanoTime() - start) / 1_000_000;
            assertTrue(millis >= 4 && millis < 2000, "RNR budget of 2 retries (2 + 4 ms) took " + millis + " ms");
            assertCompletion(pollOne(p.client.sendCq, null), 9, WcStatus.WR_FLUSH_ERR, 0);
            awaitEvent(p.server.channel, CmEventType.DISCONNECTED);
        }
        try (SoftPair p = SoftPair.of(tcp)) {
            SoftPair.Buffer src = p.buffer(p.client, 4096);
            SoftPair.Buffer dst = p.buffer(p.server, 4096);
            src.fill(5);
            p.client.qp.postSend(swr.reset().wrId(1).flags(SendWorkRequest.SIGNALED)
                    .addSge(src.address(), 10, src.mr().lkey()));
            Thread.sleep(5);
            postRecv(p.server, 2, dst, 0, 100);
            assertCompletion(pollOne(p.server.recvCq, null), 2, WcStatus.SUCCESS, WcOpcode.RECV);
            assertCompletion(pollOne(p.client.sendCq, null), 1, WcStatus.SUCCESS, WcOpcode.SEND);
            dst.assertFilled(0, 10, 5, 0);
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldFlushEverythingPromptlyOnDisconnect(boolean tcp) throws Exception {
        try (SoftPair p = SoftPair.of(tcp)) {
            SoftPair.Buffer src = p.buffer(p.client, 4096);
            for (int i = 0; i < 5; i++) {
                postRecv(p.client, 100 + i, src, i * 10, 10);
            }
            // The server has no receive posted, so these sends wait on receiver-not-ready retries.
            for (int i = 0; i < 3; i++) {
                p.client.qp.postSend(swr.reset().wrId(200 + i).addSge(src.address(), 10, src.mr().lkey()));
            }
            long start = System.nanoTime();
            p.server.id.disconnect();
            for (int i = 0; i < 3; i++) {
                assertCompletion(pollOne(p.client.sendCq, null), 200 + i, WcStatus.WR_FLUSH_ERR, 0);
            }
            for (int i = 0; i < 5; i++) {
                assertCompletion(pollOne(p.client.recvCq, null), 100 + i, WcStatus.WR_FLUSH_ERR, 0);
            }
            awaitEvent(p.client.channel, CmEventType.DISCONNECTED);
            awaitEvent(p.server.channel, CmEventType.DISCONNECTED);
            long millis = (System.nanoTime() - start) / 1_000_000;
            assertTrue(millis < 500, "flush took " + millis + " ms");
            postRecv(p.client, 300, src, 0, 10);
            assertCompletion(pollOne(p.client.recvCq, null), 300, WcStatus.WR_FLUSH_ERR, 0);
            p.client.qp.postSend(swr.reset().wrId(301).addSge(src.address(), 10, src.mr().lkey()));
            assertCompletion(pollOne(p.client.sendCq, null), 301, WcStatus.WR_FLUSH_ERR, 0);
            assertEquals(QpState.ERROR, p.client.qp.state());
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldDropConnectionAndDelaySendsOnRequest(boolean tcp) throws Exception {
        try (SoftPair p = SoftPair.of(tcp)) {
            SoftPair.Buffer src = p.buffer(p.client, 4096);
            SoftPair.Buffer dst = p.buffer(p.server, 4096);
            provider.faults().delaySends(30_000_000L);
            postRecv(p.server, 1, dst, 0, 100);
            long start = System.nanoTime();
            p.client.qp.postSend(swr.reset().wrId(1).flags(SendWorkRequest.SIGNALED)
                    .addSge(src.address(), 10, src.mr().lkey()));
            assertCompletion(pollOne(p.server.recvCq, null), 1, WcStatus.SUCCESS, WcOpcode.RECV);
            long millis = (System.nanoTime() - start) / 1_000_000;
            assertTrue(millis >= 29, "delayed send arrived after " + millis + " ms");
            assertCompletion(pollOne(p.client.sendCq, null), 1, WcStatus.SUCCESS, WcOpcode.SEND);
            provider.faults().reset();

            postRecv(p.server, 2, dst, 0, 100);
            provider.faults().dropConnection(p.client.qp);
            assertCompletion(pollOne(p.server.recvCq, null), 2, WcStatus.WR_FLUSH_ERR, 0);
            awaitEvent(p.client.channel, CmEventType.DISCONNECTED);
            awaitEvent(p.server.channel, CmEventType.DISCONNECTED);
        }
    }

    /**
     * A peer host that vanishes without a reset (power lost, cable cut): a NIC fails the oldest waiting request with
     * RETRY_EXC_ERR once its transport retries run out, and flushes the rest. Over TCP such requests used to wait for
     * TCP's own retransmission timeout, about 15 minutes. A peer that is only quiet, with nothing waiting for it, is no
     * such case: the link stays up past the timeout.
     */
    @Test
    @SetSystemProperty(key = TcpLink.TRANSPORT_TIMEOUT_PROPERTY, value = "1000")
    // As between hosts: a same-host peer cannot vanish without its kernel resetting the socket.
    @SetSystemProperty(key = SharedMemoryFiles.SAME_HOST_PROPERTY, value = "tcp")
    void shouldFailWaitingRequestsWithRetryExceededWhenThePeerHostVanishes() throws Exception {
        try (SoftPair p = SoftPair.tcp()) {
            SoftPair.Buffer src = p.buffer(p.client, 4096);
            SoftPair.Buffer dst = p.buffer(p.server, 4096);
            Thread.sleep(2500);
            postRecv(p.server, 1, dst, 0, 100);
            p.client.qp.postSend(swr.reset().wrId(1).flags(SendWorkRequest.SIGNALED)
                    .addSge(src.address(), 10, src.mr().lkey()));
            assertCompletion(pollOne(p.client.sendCq, null), 1, WcStatus.SUCCESS, WcOpcode.SEND);
            assertCompletion(pollOne(p.server.recvCq, null), 1, WcStatus.SUCCESS, WcOpcode.RECV);

            // Acknowledged, with its completion held back: it still completes successfully, ahead of the failure.
            provider.faults().delaySendCompletions(TimeUnit.SECONDS.toNanos(60));
            postRecv(p.server, 2, dst, 0, 100);
            p.client.qp.postSend(swr.reset().wrId(2).flags(SendWorkRequest.SIGNALED)
                    .addSge(src.address(), 10, src.mr().lkey()));
            assertCompletion(pollOne(p.server.recvCq, null), 2, WcStatus.SUCCESS, WcOpcode.RECV);

            postRecv(p.server, 3, dst, 0, 100);
            provider.faults().silence(p.server.qp);
            long start = System.nanoTime();
            for (long wrId = 3; wrId <= 4; wrId++) {
                p.client.qp.postSend(swr.reset().wrId(wrId).flags(SendWorkRequest.SIGNALED)
                        .addSge(src.address(), 10, src.mr().lkey()));
            }
            assertCompletion(pollOne(p.client.sendCq, null), 2, WcStatus.SUCCESS, WcOpcode.SEND);
            assertCompletion(pollOne(p.client.sendCq, null), 3, WcStatus.RETRY_EXC_ERR, 0);
            long millis = (System.nanoTime() - start) / 1_000_000;
            assertTrue(millis >= 900 && millis < 5000, "timed out after " + millis + " ms (expected: 1000 to 1250)");
            assertCompletion(pollOne(p.client.sendCq, null), 4, WcStatus.WR_FLUSH_ERR, 0);
            assertEquals(QpState.ERROR, p.client.qp.state());
            awaitEvent(p.client.channel, CmEventType.DISCONNECTED);
        }
    }

    @Test
    void shouldFailInjectedRegistrations() throws Exception {
        ProtectionDomain pd = provider.devices().get(0).allocProtectionDomain();
        ByteBuffer b = ByteBuffer.allocateDirect(128);
        provider.faults().failRegistrations(2);
        RdmaException e = assertThrows(RdmaException.class, () -> pd.register(b, Access.LOCAL_WRITE));
        assertTrue(e.getMessage().startsWith("injected fault: "), e.getMessage());
        assertThrows(RdmaException.class, () -> pd.register(b, Access.LOCAL_WRITE));
        MemoryRegion mr = pd.register(b, Access.LOCAL_WRITE);
        assertEquals(128, provider.resourceUsage().registeredBytes());
        assertThrows(IllegalStateException.class, pd::close);
        mr.close();
        pd.close();
    }

    @Test
    void shouldHandOutUniqueNonZeroKeysThatDieAtDeregistration() throws Exception {
        ProtectionDomain pd = provider.devices().get(0).allocProtectionDomain();
        ByteBuffer b = ByteBuffer.allocateDirect(4096);
        MemoryRegion[] mrs = new MemoryRegion[200];
        java.util.Set<Integer> keys = new java.util.HashSet<>();
        for (int i = 0; i < mrs.length; i++) {
            mrs[i] = pd.register(DirectMemory.address(b) + i, 16, Access.ALL);
            assertNotEquals(0, mrs[i].rkey());
            assertNotEquals(0, mrs[i].lkey());
            assertTrue(keys.add(mrs[i].rkey()), "rkey reused among live regions");
        }
        SoftEngine engine = SoftEngine.get();
        SoftProtectionDomain softPd = (SoftProtectionDomain) pd;
        int rkey = mrs[0].rkey();
        long address = mrs[0].address();
        assertTrue(engine.keys.permits(rkey, softPd, address, 16, Access.REMOTE_READ));
        for (MemoryRegion mr : mrs) {
            mr.close();
        }
        assertFalse(engine.keys.permits(rkey, softPd, address, 16, Access.REMOTE_READ));
        pd.close();
    }

    /**
     * A registration per transfer: re-registering a closed region reuses its object, gives it a new key, and leaves
     * the old key dead; over 10,000 re-registrations no key comes back (a peer that kept one cannot wait for it).
     */
    @Test
    void shouldReuseAClosedRegionUnderAFreshKeyThatDoesNotComeBackSoon() throws Exception {
        SoftProtectionDomain pd = (SoftProtectionDomain) provider.devices().get(0).allocProtectionDomain();
        ByteBuffer b = ByteBuffer.allocateDirect(4096);
        long base = DirectMemory.address(b);
        long regionsBefore = provider.resourceUsage().memoryRegions();
        MemoryRegion mr = pd.register(base, 64, Access.REMOTE_READ);
        MemoryRegion open = pd.register(base, 64, Access.REMOTE_READ);
        assertThrows(IllegalArgumentException.class, () -> pd.registerReusing(open, base, 64, Access.REMOTE_READ),
                "reusing a region that is still registered");
        java.util.Set<Integer> seen = new java.util.HashSet<>();
        SoftEngine engine = SoftEngine.get();
        long at = base;
        for (int i = 0; i < 10_000; i++) {
            int old = mr.rkey();
            long oldAt = at;
            assertTrue(seen.add(old), "rkey 0x" + Integer.toHexString(old) + " came back after " + i);
            mr.close();
            assertFalse(engine.keys.permits(old, pd, oldAt, 64, Access.REMOTE_READ), "closed key still valid");
            at = oldAt == base ? base + 64 : base;
            MemoryRegion again = pd.registerReusing(mr, at, 64, Access.REMOTE_READ);
            assertSame(mr, again, "the closed region's object is reused");
            assertFalse(engine.keys.permits(old, pd, at, 64, Access.REMOTE_READ), "old key names the new range");
            assertTrue(engine.keys.permits(mr.rkey(), pd, at, 64, Access.REMOTE_READ));
            assertFalse(engine.keys.permits(mr.rkey(), pd, oldAt, 64, Access.REMOTE_READ),
                    "new key reaches the old range");
        }
        assertEquals(regionsBefore + 2, provider.resourceUsage().memoryRegions());
        mr.close();
        open.close();
        pd.close();
    }

    @Test
    @RestoreSystemProperties
    void shouldRejectWithPrivateDataAndReportNobodyListening() throws Exception {
        EventNotifier n = new EventNotifier();
        try (RdmaEventChannel server = provider.createEventChannel(n);
             RdmaEventChannel client = provider.createEventChannel(n)) {
            RdmaCmId listen = server.createId();
            InetSocketAddress bound = listen.listen(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 4);
            for (boolean tcp : new boolean[] {false, true}) {
                System.setProperty("rdmabridge.soft.loopback", tcp ? "tcp" : "direct");
                try (Resolved r = Resolved.to(client, n, bound, 2000)) {
                    r.id().connect(ConnectionParameters.DEFAULT.withPrivateData(new byte[] {1, 2, 3}));
                    CmEvent req = awaitEvent(server, CmEventType.CONNECT_REQUEST);
                    assertArrayEquals(new byte[] {1, 2, 3}, req.privateData());
                    assertEquals(listen, req.listenId());
                    assertEquals(6, req.id().peerParameters().rnrRetryCount());
                    req.id().reject(new byte[] {9, 8});
                    CmEvent rej = awaitEvent(client, CmEventType.REJECTED);
                    assertArrayEquals(new byte[] {9, 8}, rej.privateData());
                    req.id().close();
                }
            }
            System.clearProperty("rdmabridge.soft.loopback"); // the default, direct, from here on
            listen.close();
            int freePort;
            try (ServerSocket s = new ServerSocket(0)) {
                freePort = s.getLocalPort();
            }
            try (Resolved r = Resolved.to(client, n, new InetSocketAddress(InetAddress.getLoopbackAddress(), freePort),
                    2000)) {
                r.id().connect(ConnectionParameters.DEFAULT);
                CmEvent rej = awaitEvent(client, CmEventType.REJECTED);
                assertTrue(rej.detail().contains(String.valueOf(freePort)), rej.detail());
            }
        }
    }

    @Test
    void shouldStreamLargeTransfersOverTcpInBoundedFrames() throws Exception {
        try (SoftPair p = SoftPair.tcp()) {
            int size = 64 << 20;
            SoftPair.Buffer local = p.buffer(p.client, size);
            SoftPair.Buffer remote = p.buffer(p.server, size);
            for (int i = 0; i < size; i += 4096) {
                local.buf().put(i, (byte) (i >>> 12));
            }
            local.buf().put(size - 1, (byte) 0x77);
            p.client.qp.postSend(swr.reset().wrId(1).opcode(WrOpcode.RDMA_WRITE).flags(SendWorkRequest.SIGNALED)
                    .remote(remote.address(), remote.mr().rkey()).addSge(local.address(), size, local.mr().lkey()));
            assertCompletion(pollOne(p.client.sendCq, null), 1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE);
            for (int i = 0; i < size; i += 4096) {
                assertEquals((byte) (i >>> 12), remote.buf().get(i));
            }
            assertEquals((byte) 0x77, remote.buf().get(size - 1));
            local.buf().put(size - 1, (byte) 0);
            p.client.qp.postSend(swr.reset().wrId(2).opcode(WrOpcode.RDMA_READ).flags(SendWorkRequest.SIGNALED)
                    .remote(remote.address(), remote.mr().rkey()).addSge(local.address(), size, local.mr().lkey()));
            WorkCompletions wc = pollOne(p.client.sendCq, null);
            assertCompletion(wc, 2, WcStatus.SUCCESS, WcOpcode.RDMA_READ);
            assertEquals(size, wc.byteLength(0));
            assertEquals((byte) 0x77, local.buf().get(size - 1));
        }
    }

    @Test
    void shouldReportUnreachableWhenNobodyAnswersInTime() throws Exception {
        EventNotifier n = new EventNotifier();
        try (RdmaEventChannel server = provider.createEventChannel(n);
             RdmaEventChannel client = provider.createEventChannel(n);
             ServerSocket silent = new ServerSocket(0, 4, InetAddress.getLoopbackAddress())) {
            RdmaCmId listen = server.createId();
            InetSocketAddress bound = listen.listen(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 4);
            // In-JVM listener that never accepts, and a plain TCP socket that never answers the handshake.
            InetSocketAddress[] targets = {bound, (InetSocketAddress) silent.getLocalSocketAddress()};
            for (InetSocketAddress target : targets) {
                try (Resolved r = Resolved.to(client, n, target, 300)) {
                    long start = System.nanoTime();
                    r.id().connect(ConnectionParameters.DEFAULT);
                    CmEvent e = awaitEvent(client, CmEventType.UNREACHABLE);
                    long millis = (System.nanoTime() - start) / 1_000_000;
                    assertTrue(millis >= 250 && millis < 5000, "UNREACHABLE after " + millis + " ms");
                    assertTrue(e.detail().contains(String.valueOf(target.getPort())), e.detail());
                    assertThrows(IllegalStateException.class, r.cq()::close, "a completion queue in use cannot close");
                    assertThrows(IllegalStateException.class, r.id()::close,
                            "an id with an open queue pair cannot close");
                }
            }
            CmEvent stale = awaitEvent(server, CmEventType.CONNECT_REQUEST);
            ProtectionDomain pd = stale.id().device().allocProtectionDomain();
            var cq = pd.device().createCompletionQueue(16, n);
            var qp = stale.id().createQueuePair(pd, cq, cq, new QpCapabilities(4, 4, 1, 1, 0));
            RdmaException gaveUp = assertThrows(RdmaException.class,
                    () -> stale.id().accept(ConnectionParameters.DEFAULT));
            assertTrue(gaveUp.getMessage().contains("gave up"), gaveUp.getMessage());
            qp.close();
            stale.id().close();
            cq.close();
            pd.close();
            listen.close();
        }
    }

    @ParameterizedTest(name = "tcp={0}")
    @ValueSource(booleans = {false, true})
    void shouldFreeQueueSlotsBeforeTheirCompletionsAreVisible(boolean tcp) throws Exception {
        try (SoftPair p = SoftPair.of(tcp)) {
            SoftPair.Buffer src = p.buffer(p.client, 64);
            SoftPair.Buffer dst = p.buffer(p.server, 64 * 64);
            for (int i = 0; i < 64; i++) {
                postRecv(p.server, i, dst, i * 64, 64); // a full receive queue (maxRecvWr 64)
            }
            WorkCompletions sendWc = new WorkCompletions(64);
            WorkCompletions rc = new WorkCompletions(1);
            int sent = 0;
            int sendsDone = 0;
            int received = 0;
            long deadline = System.nanoTime() + SoftPair.TIMEOUT_NANOS;
            while (received < 2000) {
                while (sent - sendsDone < 64 && sent < 2000) {
                    p.client.qp.postSend(swr.reset().wrId(sent++).flags(SendWorkRequest.SIGNALED)
                            .addSge(src.address(), 64, src.mr().lkey()));
                }
                sendsDone += p.client.sendCq.poll(sendWc);
                if (p.server.recvCq.poll(rc) == 1) {
                    assertEquals(WcStatus.SUCCESS, rc.status(0), rc.toString(0));
                    int slot = (int) rc.wrId(0);
                    postRecv(p.server, slot, dst, slot * 64, 64); // reposted the moment its completion is polled
                    received++;
                    // A stall detector, not a rate: on a loaded host 2,000 round trips of receiver-not-ready
                    // retries may take longer than one timeout, but no receive may take that long.
                    deadline = System.nanoTime() + SoftPair.TIMEOUT_NANOS;
                }
                assertTrue(System.nanoTime() < deadline, "stalled after " + received + " receives");
            }
        }
    }
}
