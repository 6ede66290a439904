package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.buffer.CompositeByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.SimpleChannelInboundHandler;
import io.rdmabridge.verbs.RdmaProviders;
import io.rdmabridge.verbs.soft.SoftProvider;
import org.junit.jupiter.api.Test;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * An {@link Error} thrown while one channel is polled (here: direct memory exhausted while copying a received message,
 * what a peer that makes the receiver allocate provokes) fails that channel only, abortively; the event loop, the
 * listener registered on it and every other channel keep working. One loop serves everything, so a dead loop shows.
 */
class RdmaEventLoopSurvivalTest {
    private final SoftProvider provider = (SoftProvider) RdmaProviders.byName("soft");

    /** Hands out heap buffers until told to fail, then throws what the JDK throws when direct memory runs out. */
    private static final class ExhaustibleAllocator extends io.netty.buffer.AbstractByteBufAllocator {
        volatile boolean exhausted;

        @Override
        protected ByteBuf newHeapBuffer(int initialCapacity, int maxCapacity) {
            return allocate(initialCapacity, maxCapacity);
        }

        @Override
        protected ByteBuf newDirectBuffer(int initialCapacity, int maxCapacity) {
            return allocate(initialCapacity, maxCapacity);
        }

        private ByteBuf allocate(int initialCapacity, int maxCapacity) {
            if (exhausted) {
                throw new OutOfMemoryError("Cannot reserve " + initialCapacity + " bytes of direct buffer memory"
                        + " (simulated by the test)");
            }
            return Unpooled.buffer(initialCapacity, maxCapacity);
        }

        @Override
        public boolean isDirectBufferPooled() {
            return false;
        }

        @Override
        public CompositeByteBuf compositeBuffer(int maxNumComponents) {
            return Unpooled.compositeBuffer(maxNumComponents);
        }
    }

    @Test
    void shouldFailOnlyTheChannelWhoseLoopWorkThrewAnError() throws Exception {
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
        ExhaustibleAllocator exhaustible = new ExhaustibleAllocator();
        List<ByteBuf> held = new CopyOnWriteArrayList<>();
        LinkedBlockingQueue<Throwable> failures = new LinkedBlockingQueue<>();
        try {
            // The victim's children hold every message (as an application that aggregates would), so the channel
            // copies further messages out of its receive buffers through the exhausted allocator.
            Channel victimServer = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                    .childOption(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, 4)
                    .childOption(ChannelOption.ALLOCATOR, exhaustible)
                    .childHandler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public void channelRead(ChannelHandlerContext ctx, Object msg) {
                            held.add((ByteBuf) msg);
                        }

                        @Override
                        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
                            failures.add(cause);
                        }

                        @Override
                        public boolean isSharable() {
                            return true;
                        }
                    })
                    .bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();
            Channel echoServer = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                    .childHandler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public void channelRead(ChannelHandlerContext ctx, Object msg) {
                            ctx.writeAndFlush(msg);
                        }

                        @Override
                        public boolean isSharable() {
                            return true;
                        }
                    })
                    .bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();

            LinkedBlockingQueue<Throwable> clientFailures = new LinkedBlockingQueue<>();
            Channel attacker = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
                            clientFailures.add(cause);
                        }
                    })
                    .connect(victimServer.localAddress()).sync().channel();
            exhaustible.exhausted = true;
            for (int i = 0; i < 8; i++) {
                attacker.writeAndFlush(Unpooled.copiedBuffer("message " + i, StandardCharsets.UTF_8));
            }

            Throwable cause = failures.poll(10, TimeUnit.SECONDS);
            assertNotNull(cause, "the victim channel reported no failure");
            assertInstanceOf(OutOfMemoryError.class, cause);
            // Abortive: the peer sees a reset, not a clean end of stream.
            assertTrue(attacker.closeFuture().await(10, TimeUnit.SECONDS), "the attacker was not disconnected");
            Throwable reset = clientFailures.poll(10, TimeUnit.SECONDS);
            assertNotNull(reset, "the attacker saw a clean close instead of a reset");
            assertTrue(reset.getMessage().startsWith("connection reset by peer"), reset.getMessage());

            // The one loop still serves the other listener.
            CompletableFuture<String> echo = new CompletableFuture<>();
            Channel good = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new SimpleChannelInboundHandler<ByteBuf>() {
                        @Override
                        protected void channelRead0(ChannelHandlerContext ctx, ByteBuf msg) {
                            echo.complete(msg.toString(StandardCharsets.UTF_8));
                        }
                    })
                    .connect(echoServer.localAddress()).sync().channel();
            good.writeAndFlush(Unpooled.copiedBuffer("loop alive", StandardCharsets.UTF_8));
            assertEquals("loop alive", echo.get(10, TimeUnit.SECONDS));
            good.close().sync();
            // And the victim's own listener accepts again.
            Channel again = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter()).connect(victimServer.localAddress()).sync().channel();
            again.close().sync();
            victimServer.close().sync();
            echoServer.close().sync();
        } finally {
            held.forEach(ByteBuf::release);
            group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        }
        assertTrue(provider.resourceUsage().isZero(), "leaked: " + provider.resourceUsage());
    }
}
