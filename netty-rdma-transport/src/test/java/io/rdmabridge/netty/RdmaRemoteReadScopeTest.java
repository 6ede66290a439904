package io.rdmabridge.netty;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.DefaultFileRegion;
import io.rdmabridge.connection.FrameHeader;
import io.rdmabridge.connection.Handshake;
import io.rdmabridge.connection.RegisteredMemory;
import io.rdmabridge.verbs.WcStatus;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.File;
import java.net.InetSocketAddress;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * No connection can read memory that is not being sent to it (issue 11, item 3). Every connection of a server shares
 * one protection domain, and an rkey is valid for every queue pair of its domain, so the server's queue pair for a
 * second client B answers READs naming an rkey the server advertised to client A. These tests play A and B with raw
 * verbs ({@link RawVerbsPeer}): A takes a rendezvous of secret bytes and passes its address and rkey to B, as a
 * colluding or eavesdropping peer would. B's READs must fail with a remote access error and land no byte: once A
 * has acknowledged the transfer, once A's connection is gone, and at any time outside the advertised bytes (the rest
 * of the pooled slab, or of the mapped file chunk). Before the fix slabs and file chunks were registered for remote
 * read for as long as they lived, and every such READ returned the secret. What B can still do is READ the
 * advertised bytes while A's transfer is in flight (docs/security.md).
 *
 * <p>Afterwards every exposed region is withdrawn and the soft provider's resources are back to zero (the base
 * class checks that after the group has shut down).
 */
class RdmaRemoteReadScopeTest extends AbstractSoftChannelTest {
    private static final int SECRET = 64 * 1024;
    private static final int PROBE = 4096;

    private final LinkedBlockingQueue<Channel> children = new LinkedBlockingQueue<>();
    // The server's channel to A, the only child that becomes active (B never sends a HELLO).
    private Channel childA;
    private final LinkedBlockingQueue<ChannelFuture> writes = new LinkedBlockingQueue<>();

    @Test
    void aFreshConnectionCannotReadAnAcknowledgedRendezvous() throws Exception {
        byte[] secret = randomBytes(SECRET, 11);
        InetSocketAddress server = serverWriting(ch -> ch.alloc().directBuffer(SECRET).writeBytes(secret));
        try (RawVerbsPeer a = helloFrom(server)) {
            Advert advert = awaitRendezvous(a);
            assertEquals(SECRET, advert.length);
            assertEquals(WcStatus.SUCCESS, a.read(advert.address, PROBE, advert.rkey), "A reads its own rendezvous");
            assertArrayEquals(Arrays.copyOf(secret, PROBE), a.readBytes(PROBE));
            Channel child = awaitChild();
            assertEquals(1, memoryOf(child).exposedRegions(), "the rendezvous in flight");

            assertEquals(WcStatus.SUCCESS, a.sendCredits(1, 1, 1), "A acknowledges the rendezvous");
            ChannelFuture write = awaitWrite();
            assertTrue(write.isSuccess(), () -> "the server's write failed: " + write.cause());
            assertEquals(0, memoryOf(child).exposedRegions(), "exposed after the acknowledgement");

            assertUnreadable(server, advert.address, PROBE, advert.rkey, "A's acknowledged rendezvous, from B");
            assertEquals(WcStatus.REM_ACCESS_ERR, a.read(advert.address, PROBE, advert.rkey),
                    "A itself after its acknowledgement");
            assertArrayEquals(new byte[PROBE], a.readBytes(PROBE), "bytes A read after its acknowledgement");
        }
    }

    @Test
    void noReadOutsideTheAdvertisedBytesSucceedsDuringTheTransfer() throws Exception {
        byte[] secret = randomBytes(SECRET, 12);
        InetSocketAddress server = serverWriting(ch -> ch.alloc().directBuffer(SECRET).writeBytes(secret));
        try (RawVerbsPeer a = helloFrom(server)) {
            Advert advert = awaitRendezvous(a);
            // The blocks beside the advertised one, in the same 1 MiB slab.
            assertUnreadable(server, advert.address + SECRET, PROBE, advert.rkey, "the block after the advertised one");
            assertUnreadable(server, advert.address - PROBE, PROBE, advert.rkey, "the bytes before the advertised ones");
            assertUnreadable(server, advert.address + SECRET - 16, 32, advert.rkey, "a READ past the advertised end");
            assertEquals(WcStatus.SUCCESS, a.read(advert.address + SECRET - PROBE, PROBE, advert.rkey),
                    "A reads the end of its rendezvous");
            assertArrayEquals(Arrays.copyOfRange(secret, SECRET - PROBE, SECRET), a.readBytes(PROBE));
            assertEquals(WcStatus.SUCCESS, a.sendCredits(1, 1, 1));
            assertTrue(awaitWrite().isSuccess());
        }
    }

    /** The Spark block server's path: a file region goes by rendezvous from a registered, mapped 4 MiB chunk. */
    @Test
    void aFileRegionExposesOnlyTheBytesItSendsAndOnlyUntilAcknowledged(@TempDir Path dir) throws Exception {
        byte[] file = randomBytes(2 * 1024 * 1024, 13);
        Path path = dir.resolve("shuffle.data");
        Files.write(path, file);
        int offset = 1024 * 1024;
        File f = path.toFile();
        InetSocketAddress server = serverWriting(ch -> new DefaultFileRegion(f, offset, SECRET));
        try (RawVerbsPeer a = helloFrom(server)) {
            Advert advert = awaitRendezvous(a);
            assertEquals(SECRET, advert.length);
            assertEquals(WcStatus.SUCCESS, a.read(advert.address, PROBE, advert.rkey));
            assertArrayEquals(Arrays.copyOfRange(file, offset, offset + PROBE), a.readBytes(PROBE));
            // The same mapped chunk holds the blocks before and after: other reducers' shuffle data.
            assertUnreadable(server, advert.address - PROBE, PROBE, advert.rkey, "the file's bytes before the region");
            assertUnreadable(server, advert.address + SECRET, PROBE, advert.rkey, "the file's bytes after the region");

            assertEquals(WcStatus.SUCCESS, a.sendCredits(1, 1, 1));
            ChannelFuture write = awaitWrite();
            assertTrue(write.isSuccess(), () -> "the server's write failed: " + write.cause());
            assertEquals(0, memoryOf(awaitChild()).exposedRegions());
            assertUnreadable(server, advert.address, PROBE, advert.rkey, "the acknowledged file region, from B");
        }
    }

    @Test
    void aConnectionThatDiesMidTransferLeavesNothingExposed() throws Exception {
        byte[] secret = randomBytes(SECRET, 14);
        InetSocketAddress server = serverWriting(ch -> ch.alloc().directBuffer(SECRET).writeBytes(secret));
        Advert advert;
        Channel child;
        try (RawVerbsPeer a = helloFrom(server)) {
            advert = awaitRendezvous(a);
            child = awaitChild();
            assertEquals(1, memoryOf(child).exposedRegions());
            // A disconnects without reading or acknowledging.
        }
        assertTrue(child.closeFuture().await(10, TimeUnit.SECONDS), "the server's channel to A did not close");
        ChannelFuture write = awaitWrite();
        assertTrue(write.isDone() && !write.isSuccess(), "the write to a peer that disconnected succeeded");
        assertEquals(0, memoryOf(child).exposedRegions(), "exposed after the connection died");
        assertUnreadable(server, advert.address, PROBE, advert.rkey, "the rendezvous of a dead connection, from B");
    }

    /**
     * The device refuses the per-transfer registration (memlock exhausted, on a NIC): the write fails naming the
     * refusal, nothing is advertised or exposed, and the buffer and staging memory go back (the base class and the
     * leak detector check).
     */
    @Test
    void aRefusedRegistrationFailsTheWriteAndExposesNothing() throws Exception {
        byte[] secret = randomBytes(SECRET, 15);
        InetSocketAddress server = serverWriting(ch -> {
            ByteBuf buf = ch.alloc().directBuffer(SECRET).writeBytes(secret);
            // The buffer's slab is registered by now: the next registration is the rendezvous's.
            provider.faults().failRegistrations(1);
            return buf;
        });
        try (RawVerbsPeer a = helloFrom(server)) {
            ChannelFuture write = awaitWrite();
            assertNotNull(write.cause(), "the write succeeded without its registration");
            assertTrue(write.cause().getMessage().contains("registration of " + SECRET + " bytes refused"),
                    write.cause().getMessage());
            assertEquals(0, memoryOf(awaitChild()).exposedRegions());
        }
    }

    /**
     * A write the channel copied goes by rendezvous from a staging block that stays pinned until the peer has READ it
     * and says so: it completes only then, and meanwhile counts against writability, so a peer that never answers
     * cannot have a writer that heeds writability pin a block per write. (Before, it completed once posted, the
     * channel stayed writable, and each further write pinned another block.)
     */
    @Test
    void aCopiedRendezvousCompletesOnlyOnceThePeerHasReadIt() throws Exception {
        byte[] secret = randomBytes(2 * SECRET, 18);
        InetSocketAddress server = serverWriting(ch -> Unpooled.wrappedBuffer(secret));
        try (RawVerbsPeer a = helloFrom(server)) {
            Advert advert = awaitRendezvous(a);
            assertEquals(2 * SECRET, advert.length);
            ChannelFuture write = writes.poll(10, TimeUnit.SECONDS);
            assertNotNull(write, "the server wrote nothing within 10 s");
            Channel child = awaitChild();
            assertFalse(write.await(300, TimeUnit.MILLISECONDS), "the copied write completed before the peer read it");
            assertFalse(child.isWritable(), "writable with a copy the peer has not read");
            assertEquals(WcStatus.SUCCESS, a.read(advert.address, PROBE, advert.rkey));
            assertArrayEquals(Arrays.copyOf(secret, PROBE), a.readBytes(PROBE));
            assertEquals(WcStatus.SUCCESS, a.sendCredits(1, 1, 1), "A acknowledges the rendezvous");
            assertTrue(write.await(10, TimeUnit.SECONDS) && write.isSuccess(), () -> "the write did not complete "
                    + "after the acknowledgement: " + write.cause());
            // Netty completes the promise before it lowers the pending bytes: writability follows on the loop.
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (!child.isWritable() && System.nanoTime() < deadline) {
                Thread.sleep(1);
            }
            assertTrue(child.isWritable(), "not writable after the acknowledgement");
        }
    }

    /**
     * A later write fails (here: the application wrote a buffer it had already released) while the rendezvous of an
     * earlier one is still advertised. Netty frees every flushed buffer on a write error; the earlier buffer must not
     * go back to the pool while the peer can still READ it, or the peer reads whatever the pool hands out next.
     */
    @Test
    void aFailedWriteFreesNoBufferThePeerCanStillRead() throws Exception {
        byte[] secret = randomBytes(SECRET, 16);
        byte[] reused = randomBytes(SECRET, 17);
        LinkedBlockingQueue<ByteBuf> allocatedAfter = new LinkedBlockingQueue<>();
        InetSocketAddress server = serverWriting(ch -> {
            ByteBuf released = ch.alloc().heapBuffer(16).writeZero(16);
            released.release();
            ch.eventLoop().execute(() -> {
                ChannelFuture failed = ch.writeAndFlush(released);
                failed.addListener(f -> {
                    // What the pool hands out next: another connection's data, say.
                    allocatedAfter.add(ch.alloc().directBuffer(SECRET).writeBytes(reused));
                });
            });
            return ch.alloc().directBuffer(SECRET).writeBytes(secret);
        });
        try (RawVerbsPeer a = helloFrom(server)) {
            Advert advert = awaitRendezvous(a);
            ByteBuf next = allocatedAfter.poll(10, TimeUnit.SECONDS);
            assertNotNull(next, "the failing write did not complete within 10 s");
            try {
                int status = a.read(advert.address, PROBE, advert.rkey);
                assertTrue(status != WcStatus.SUCCESS, () -> "A read the advertised rendezvous after its buffer was "
                        + "freed; it got " + (Arrays.equals(a.readBytes(PROBE), Arrays.copyOf(reused, PROBE))
                        ? "the bytes allocated after it" : "other bytes"));
                assertArrayEquals(new byte[PROBE], a.readBytes(PROBE), "bytes that landed");
                assertTrue(awaitChild().closeFuture().await(10, TimeUnit.SECONDS), "the failed channel closed");
                assertTrue(awaitWrite().cause() != null, "the rendezvous write failed with its channel");
            } finally {
                next.release();
            }
        }
    }

    @AfterEach
    void resetFaults() {
        provider.faults().reset();
    }

    /** B: a fresh connection to the server READs and must get a remote access error and no byte. */
    private void assertUnreadable(InetSocketAddress server, long address, int length, int rkey, String what)
            throws Exception {
        try (RawVerbsPeer b = RawVerbsPeer.connect(provider, server)) {
            int status = b.read(address, length, rkey);
            assertEquals(WcStatus.name(WcStatus.REM_ACCESS_ERR), WcStatus.name(status), what);
            assertArrayEquals(new byte[length], b.readBytes(length), "bytes that landed reading " + what);
        }
    }

    /** A server whose children write {@code message} (built for each) as soon as they are active. */
    private InetSocketAddress serverWriting(Function<Channel, Object> message) throws InterruptedException {
        // The secret goes by rendezvous: the threshold below its size.
        Channel server = listen(new ServerBootstrap().childOption(RdmaChannelOption.RENDEZVOUS_THRESHOLD, PROBE)
                .childHandler(new ChannelInitializer<Channel>() {
                    @Override
                    protected void initChannel(Channel ch) {
                        ch.pipeline().addLast(new ChannelInboundHandlerAdapter() {
                            @Override
                            public void channelActive(ChannelHandlerContext ctx) {
                                children.add(ctx.channel());
                                writes.add(ctx.writeAndFlush(message.apply(ctx.channel())));
                            }

                            @Override
                            public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
                                // B's failed READs fail B's connection: expected here, and it closes.
                                ctx.close();
                            }
                        });
                    }
                }));
        return (InetSocketAddress) server.localAddress();
    }

    private RawVerbsPeer helloFrom(InetSocketAddress server) throws Exception {
        RawVerbsPeer a = RawVerbsPeer.connect(provider, server);
        assertEquals(WcStatus.SUCCESS, a.sendFrame(FrameHeader.HELLO, new Handshake(4096, 4, 4, 1 << 20).encode()));
        assertEquals(FrameHeader.HELLO, a.receivedFrameType(), "the server's first frame");
        return a;
    }

    private static Advert awaitRendezvous(RawVerbsPeer a) {
        for (;;) {
            FrameHeader h = a.receivedFrame();
            if (h.type() == FrameHeader.RENDEZVOUS) {
                return new Advert(h.rendezvousAddress(), (int) h.rendezvousLength(), h.rendezvousRkey());
            }
            assertEquals(FrameHeader.typeName(FrameHeader.CREDIT), FrameHeader.typeName(h.type()),
                    "a frame before the rendezvous");
        }
    }

    private Channel awaitChild() throws InterruptedException {
        if (childA == null) {
            childA = children.poll(10, TimeUnit.SECONDS);
            assertNotNull(childA, "no server child became active within 10 s");
        }
        return childA;
    }

    private ChannelFuture awaitWrite() throws InterruptedException {
        ChannelFuture write = writes.poll(10, TimeUnit.SECONDS);
        assertNotNull(write, "the server wrote nothing within 10 s");
        assertTrue(write.await(10, TimeUnit.SECONDS), "the server's write did not complete within 10 s");
        return write;
    }

    private static RegisteredMemory memoryOf(Channel child) {
        return ((RdmaSocketChannel) child).domain.memory;
    }

    private record Advert(long address, int length, int rkey) {
    }
}
