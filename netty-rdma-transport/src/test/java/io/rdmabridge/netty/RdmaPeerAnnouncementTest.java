package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.rdmabridge.connection.FrameHeader;
import io.rdmabridge.connection.Handshake;
import io.rdmabridge.verbs.WcStatus;
import org.junit.jupiter.api.Test;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * What a peer announces in its handshake never sizes this side's memory: a peer that claims 16 MiB receive buffers
 * and then never returns a credit gets frames no larger than this side's own receive buffers, so the staging copies
 * of small heap writes stay small (they took a 16 MiB registration each: 6 messages of 300 bytes pinned 96 MiB). Nor
 * does it multiply this side's work: a peer's largest message must hold a rendezvous part of a useful size. Nor does
 * a huge largest message size this side's staging: a copied rendezvous part is at most 16 MiB.
 */
class RdmaPeerAnnouncementTest extends AbstractSoftChannelTest {

    /**
     * Connects a channel to the raw listener {@code raw}, which accepts it and sends a HELLO announcing
     * {@code announced}; returns the channel once connected, its own HELLO read by {@code raw} as its first frame.
     */
    private Channel connectAnnouncing(RawVerbsPeer raw, Handshake announced) throws Exception {
        ChannelFuture connecting = connectToRaw(new Bootstrap().handler(new ChannelInboundHandlerAdapter()), raw);
        assertEquals(WcStatus.SUCCESS, raw.sendFrame(FrameHeader.HELLO, announced.encode()));
        Channel ch = connecting.sync().channel();
        assertEquals(FrameHeader.HELLO, raw.receivedFrameType(), "the channel's first frame");
        return ch;
    }

    @Test
    void shouldNotStageMoreThanItsOwnReceiveBufferForAPeerThatAnnouncesHugeOnes() throws Exception {
        try (RawVerbsPeer raw = listenRaw()) {
            // 6 data credits fit the raw peer's 8 posted receives; it never returns one.
            Channel ch = connectAnnouncing(raw, new Handshake(Handshake.MAX_RECEIVE_BUFFER_SIZE, 6, 2, 1 << 20));
            long before = provider.resourceUsage().registeredBytes();
            for (int i = 0; i < 6; i++) {
                ch.writeAndFlush(Unpooled.wrappedBuffer(new byte[300]));
            }
            for (int i = 0; i < 6; i++) {
                assertEquals(FrameHeader.DATA, raw.receivedFrameType(), "frame " + i);
            }
            long staged = provider.resourceUsage().registeredBytes() - before;
            // Six copies of 300 bytes: pooled blocks of this side's 16 KiB frames at most, never 6 x 16 MiB.
            assertTrue(staged <= 2L * 1024 * 1024, "registered for staging: " + staged + " bytes");
            ch.close().await(5, TimeUnit.SECONDS);
        }
    }

    @Test
    void shouldNotStageAHeapWriteInOneBlockForAPeerThatAnnouncesAHugeLargestMessage() throws Exception {
        try (RawVerbsPeer raw = listenRaw()) {
            // A largest message of 2 GiB and one data credit, which it never returns.
            Channel ch = connectAnnouncing(raw, new Handshake(4096, 1, 2, Integer.MAX_VALUE));
            long before = provider.resourceUsage().registeredBytes();
            // A heap write, so the rendezvous is staged in registered memory.
            ch.writeAndFlush(Unpooled.wrappedBuffer(new byte[4 * RdmaWriteProcessor.MAX_STAGED_PART]));
            assertEquals(FrameHeader.RENDEZVOUS, raw.receivedFrameType(), "the write's first frame");
            long staged = provider.resourceUsage().registeredBytes() - before;
            // One staged part, registered twice (the staging block, and its read-only exposure to the peer); never
            // the whole write in one block.
            assertTrue(staged <= 2L * RdmaWriteProcessor.MAX_STAGED_PART + 2L * 1024 * 1024,
                    "registered for staging: " + staged + " bytes");
            ch.close().await(5, TimeUnit.SECONDS);
        }
    }

    /**
     * A peer that announces credits for many rendezvous parts and never acknowledges one must not pin a staging copy
     * per credit: a connection holds at most {@link RdmaWriteProcessor#MAX_STAGED_BYTES} of them, and the rest of the
     * write waits in the outbound buffer until the peer acknowledges. It used to stage a part per credit, up to the
     * send queue: 4 GiB a connection with the default settings.
     */
    @Test
    void shouldStageAtMostTwoPartsForAPeerThatNeverAcknowledgesAndGoOnOnceItDoes() throws Exception {
        try (RawVerbsPeer raw = listenRaw()) {
            // Six data credits (the raw peer posts 8 receives) and a largest message of 2 GiB.
            Channel ch = connectAnnouncing(raw, new Handshake(4096, 6, 2, Integer.MAX_VALUE));
            long before = provider.resourceUsage().registeredBytes();
            // A heap write of four parts, so each is staged in registered memory.
            ChannelFuture written = ch.writeAndFlush(Unpooled.wrappedBuffer(
                    new byte[4 * RdmaWriteProcessor.MAX_STAGED_PART]));
            assertEquals(FrameHeader.RENDEZVOUS, raw.receivedFrameType(), "the write's first part");
            assertEquals(FrameHeader.RENDEZVOUS, raw.receivedFrameType(), "the write's second part");
            Thread.sleep(300); // time to stage more, were it allowed
            long staged = provider.resourceUsage().registeredBytes() - before;
            // Each staged part is registered twice (the staging block, and its read-only exposure to the peer).
            assertTrue(staged <= 2 * RdmaWriteProcessor.MAX_STAGED_BYTES + 2L * 1024 * 1024,
                    "registered for staging while the peer acknowledges nothing: " + staged + " bytes");
            assertFalse(written.isDone(), "the write completed before the peer read it");

            assertEquals(WcStatus.SUCCESS, raw.sendCredits(2, 0, 2), "acknowledging the two parts");
            assertEquals(FrameHeader.RENDEZVOUS, raw.receivedFrameType(), "the write's third part");
            assertEquals(FrameHeader.RENDEZVOUS, raw.receivedFrameType(), "the write's fourth part");
            assertEquals(WcStatus.SUCCESS, raw.sendCredits(2, 0, 2), "acknowledging the last two parts");
            assertTrue(written.await(10, TimeUnit.SECONDS), "the write did not complete once acknowledged");
            assertTrue(written.isSuccess(), () -> String.valueOf(written.cause()));
            ch.close().await(5, TimeUnit.SECONDS);
        }
    }

    @Test
    void shouldRefuseAPeerThatAnnouncesMessagesTooSmallForUsefulRendezvousParts() throws Exception {
        // A largest message of 1 byte: a 16 MiB write would go as 16 million rendezvous parts.
        assertRefusesHelloWith(16, 1, "maxMessageSize: 1 (expected: >= 4096)");
    }

    @Test
    void shouldRefuseAPeerThatAnnouncesReceiveBuffersTooSmallForUsefulFrames() throws Exception {
        // Receive buffers of 32 bytes, which hold a HELLO: every eager write would go as a SEND per 20 bytes.
        assertRefusesHelloWith(8, 32, "receiveBufferSize: 32 (expected: 1024..");
    }

    /** A peer's HELLO with the int at {@code offset} set to {@code value} fails the connect, naming {@code cause}. */
    private void assertRefusesHelloWith(int offset, int value, String cause) throws Exception {
        try (RawVerbsPeer raw = listenRaw()) {
            ChannelFuture connecting = connectToRaw(new Bootstrap().handler(new ChannelInboundHandlerAdapter()), raw);
            byte[] hello = new Handshake(4096, 6, 2, 1 << 20).encode();
            ByteBuffer.wrap(hello).order(ByteOrder.LITTLE_ENDIAN).putInt(offset, value);
            assertEquals(WcStatus.SUCCESS, raw.sendFrame(FrameHeader.HELLO, hello));
            assertTrue(connecting.await(10, TimeUnit.SECONDS), "connect neither failed nor succeeded");
            assertFalse(connecting.isSuccess(), "connected to a peer announcing " + cause);
            assertTrue(connecting.cause().getMessage().contains(cause), connecting.cause()::toString);
        }
    }
}
