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

import java.net.InetSocketAddress;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * What a peer announces in its handshake never sizes this side's memory: a peer that claims 16 MiB receive buffers
 * and then never returns a credit gets frames no larger than this side's own receive buffers, so the staging copies
 * of small heap writes stay small (they took a 16 MiB registration each: 6 messages of 300 bytes pinned 96 MiB).
 */
class RdmaPeerAnnouncementTest extends AbstractSoftChannelTest {

    @Test
    void shouldNotStageMoreThanItsOwnReceiveBufferForAPeerThatAnnouncesHugeOnes() throws Exception {
        try (RawVerbsPeer raw = RawVerbsPeer.listen(provider, new InetSocketAddress("127.0.0.1", 0))) {
            ChannelFuture connecting = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter()).connect(raw.listenAddress());
            channels.add(0, connecting.channel());
            raw.acceptOne();
            // 6 data credits fit the raw peer's 8 posted receives; it never returns one.
            assertEquals(WcStatus.SUCCESS, raw.sendFrame(FrameHeader.HELLO,
                    new Handshake(Handshake.MAX_RECEIVE_BUFFER_SIZE, 6, 2, 1 << 20).encode()));
            Channel ch = connecting.sync().channel();
            assertEquals(FrameHeader.HELLO, raw.receivedFrameType(), "the channel's first frame");
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
}
