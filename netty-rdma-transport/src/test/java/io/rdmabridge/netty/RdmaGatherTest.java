package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.rdmabridge.connection.RdmaConnection;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.io.ByteArrayOutputStream;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * How one flush of many small buffers becomes eager frames: every byte arrives in order whatever mix of registered
 * and heap buffers the flush holds, however many more buffers than a work request has segments, and registered
 * buffers go by reference, {@link RdmaConnection#MAX_SGE} less one per frame.
 */
class RdmaGatherTest extends AbstractSoftChannelTest {
    /** Keeps what arrives, in order. */
    private static final class Collect extends ChannelInboundHandlerAdapter {
        final ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        /** One per frame: the channel delivers each eager frame's payload as one buffer. */
        int reads;

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ByteBuf buf = (ByteBuf) msg;
            synchronized (bytes) {
                reads++;
                byte[] b = new byte[buf.readableBytes()];
                buf.readBytes(b);
                bytes.writeBytes(b);
            }
            buf.release();
        }

        byte[] await(int length) throws InterruptedException {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
            while (System.nanoTime() < deadline) {
                synchronized (bytes) {
                    if (bytes.size() >= length) {
                        return bytes.toByteArray();
                    }
                }
                Thread.sleep(5);
            }
            synchronized (bytes) {
                return bytes.toByteArray();
            }
        }
    }

    private RdmaSocketChannel connectTo(Collect collect) throws InterruptedException {
        Channel server = listen(new ServerBootstrap().childHandler(collect));
        return connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter()), server);
    }

    /** 10 heap bytes go to the frame's scratch area, 1000 to a staging block. */
    @ParameterizedTest
    @ValueSource(ints = {10, 1000})
    @Timeout(60)
    void shouldKeepOrderWhenCopiedBytesFollowMoreRegisteredBuffersThanAFrameHasSegments(int heapLength)
            throws Exception {
        Collect collect = new Collect();
        RdmaSocketChannel client = connectTo(collect);
        ByteArrayOutputStream expected = new ByteArrayOutputStream();
        byte[] heap = randomBytes(heapLength, 1);
        byte[] small = randomBytes(100, 2);
        ByteBuf registered = client.alloc().directBuffer(small.length).writeBytes(small);
        // Each flush: heap bytes (copied into the frame), then registered buffers at one address (never contiguous,
        // a segment each) until the frame has no segment left, then heap bytes again; for every count around that.
        int copied = 0;
        for (int buffers = RdmaConnection.MAX_SGE - 4; buffers <= RdmaConnection.MAX_SGE + 1; buffers++) {
            client.write(Unpooled.wrappedBuffer(heap));
            expected.writeBytes(heap);
            for (int i = 0; i < buffers; i++) {
                client.write(registered.retainedDuplicate());
                expected.writeBytes(small);
            }
            client.writeAndFlush(Unpooled.wrappedBuffer(heap)).sync();
            expected.writeBytes(heap);
            copied += 2 * heap.length;
        }
        registered.release();
        byte[] want = expected.toByteArray();
        assertTrue(client.isActive(), "the channel is still open after the flush");
        assertArrayEquals(want, collect.await(want.length));
        assertEquals(copied, client.metrics().copiedBytes(), client.metrics().toString());
    }

    @Test
    @Timeout(60)
    void shouldSendAFrameForEveryMaxSgeLessOneSmallRegisteredBuffersWithoutCopying() throws Exception {
        Collect collect = new Collect();
        RdmaSocketChannel client = connectTo(collect);
        byte[] message = randomBytes(1024, 3);
        ByteBuf registered = client.alloc().directBuffer(message.length).writeBytes(message);
        ByteArrayOutputStream expected = new ByteArrayOutputStream();
        int perFrame = RdmaConnection.MAX_SGE - 1;
        for (int i = 0; i < 2 * perFrame; i++) {
            client.write(registered.retainedDuplicate());
            expected.writeBytes(message);
        }
        registered.release();
        client.flush();
        byte[] want = expected.toByteArray();
        assertArrayEquals(want, collect.await(want.length));
        synchronized (collect.bytes) {
            assertEquals(2, collect.reads, "frames received for " + 2 * perFrame + " buffers of 1 KiB");
        }
        assertEquals(0, client.metrics().copiedBytes(), client.metrics().toString());
    }
}
