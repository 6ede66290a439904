package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.EventLoop;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * An event loop that shuts down closes its channels, even when Netty skips {@link RdmaIoHandler#prepareToDestroy()}:
 * it does when the loop is shut down without a quiet period while it runs its tasks (a task shutting its own loop
 * down, or {@code shutdownGracefully(0, ...)} called from another thread at that moment). Nothing a channel holds may
 * outlive the loop: not its queue pair, not the buffers of a close that waited for posted work, not what was written
 * and not yet flushed. On the soft provider, and in the rxe stage on DiSNI over Soft-RoCE ({@link DeviceUnderTest}).
 */
@Tag("device")
class RdmaEventLoopShutdownTest extends AbstractChannelTest {
    RdmaEventLoopShutdownTest() {
        super(DeviceUnderTest.provider());
    }

    @Test
    @Timeout(120)
    void shouldCloseChannelsOfALoopThatATaskOfItsOwnShutsDown() throws Exception {
        Channel server = listen(new ServerBootstrap().childHandler(new ChannelInboundHandlerAdapter()));
        EventLoopGroup clientLoop = new MultiThreadIoEventLoopGroup(1,
                RdmaIoHandler.newFactory(DeviceUnderTest.provider()));
        CountDownLatch inactive = new CountDownLatch(1);
        CountDownLatch unregistered = new CountDownLatch(1);
        ByteBuf posted = null;
        ByteBuf unflushed = null;
        try {
            Channel client = new Bootstrap().group(clientLoop).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public void channelInactive(ChannelHandlerContext ctx) {
                            inactive.countDown();
                        }

                        @Override
                        public void channelUnregistered(ChannelHandlerContext ctx) {
                            unregistered.countDown();
                        }
                    }).connect(server.localAddress()).sync().channel();
            posted = client.alloc().directBuffer(100).writeZero(100);
            unflushed = client.alloc().directBuffer(100).writeZero(100);
            ByteBuf p = posted;
            ByteBuf u = unflushed;
            EventLoop loop = client.eventLoop();
            AtomicReference<ChannelFuture> close = new AtomicReference<>();
            AtomicReference<Throwable> failure = new AtomicReference<>();
            loop.execute(() -> {
                try {
                    client.writeAndFlush(p);
                    client.write(u);
                    // The SEND is posted and not yet complete: a graceful close waits for it.
                    close.set(client.close());
                    if (close.get().isDone()) {
                        throw new AssertionError("the close did not wait for the posted SEND");
                    }
                    // No quiet period, from a task: the loop ends without another round.
                    loop.shutdownGracefully(0, 5, TimeUnit.SECONDS);
                } catch (Throwable t) {
                    failure.set(t);
                }
            });
            assertTrue(loop.terminationFuture().await(DeviceUnderTest.scaled(Duration.ofSeconds(10)).toMillis()),
                    "the client's loop did not terminate");
            assertNull(failure.get());
            assertTrue(close.get().isSuccess(), "the delayed close did not complete: " + close.get());
            assertTrue(client.closeFuture().isDone(), "the close future did not complete");
            assertEquals(0, p.refCnt(), "the posted buffer outlived the loop");
            assertEquals(0, u.refCnt(), "the unflushed buffer outlived the loop");
            assertEquals(0, inactive.getCount(), "channelInactive was not fired");
            assertEquals(0, unregistered.getCount(), "channelUnregistered was not fired");
        } finally {
            clientLoop.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
            for (ByteBuf b : new ByteBuf[] {posted, unflushed}) {
                if (b != null && b.refCnt() > 0) {
                    b.release(b.refCnt());
                }
            }
        }
    }
}
