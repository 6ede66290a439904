package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.UnpooledByteBufAllocator;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandler;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * {@link RdmaChannelOption#REGISTERED_ALLOCATOR}: a channel given another allocator (as gRPC gives every channel its
 * own) still allocates registered memory, whichever option was set first, so its writes go out without a copy;
 * without the option the given allocator is used and its buffers are copied once.
 */
class RdmaRegisteredAllocatorTest extends AbstractSoftChannelTest {
    private static final int SIZE = 100_000;

    @Test
    @Timeout(30)
    void shouldAllocateRegisteredMemoryWhateverAllocatorIsSet() throws Exception {
        Channel server = listen(new ServerBootstrap().childHandler(new Sink()));
        UnpooledByteBufAllocator other = new UnpooledByteBufAllocator(true);

        RdmaSocketChannel plain = connect(new Bootstrap().handler(new Sink())
                .option(ChannelOption.ALLOCATOR, other), server);
        assertSame(other, plain.alloc());
        assertEquals(SIZE, writeOne(plain), "bytes copied from the other allocator's buffer");

        // The framework's ALLOCATOR after ours, as gRPC's bootstrap options come before the user's: order is free.
        RdmaSocketChannel registered = connect(new Bootstrap().handler(new Sink())
                .option(RdmaChannelOption.REGISTERED_ALLOCATOR, true).option(ChannelOption.ALLOCATOR, other), server);
        assertInstanceOf(RdmaByteBufAllocator.class, registered.alloc());
        assertTrue(registered.config().getOption(RdmaChannelOption.REGISTERED_ALLOCATOR));
        assertEquals(0, writeOne(registered), "bytes copied from a registered buffer");
    }

    /** Writes one buffer of {@link #SIZE} bytes from the channel's allocator; returns the bytes the write copied. */
    private static long writeOne(RdmaSocketChannel ch) throws Exception {
        long before = ch.metrics().copiedBytes();
        ByteBuf buf = ch.alloc().directBuffer(SIZE).writeZero(SIZE);
        ch.writeAndFlush(buf).sync();
        return ch.metrics().copiedBytes() - before;
    }

    /** Drops what it reads. */
    @ChannelHandler.Sharable
    private static final class Sink extends ChannelInboundHandlerAdapter {
        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ((ByteBuf) msg).release();
        }
    }
}
