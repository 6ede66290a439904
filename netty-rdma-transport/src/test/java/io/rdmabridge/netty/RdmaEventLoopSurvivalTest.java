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
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

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
        final AtomicInteger refused = new AtomicInteger();

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
                refused.incrementAndGet();
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

    /**
     * With {@code autoRead} off the victim reads one message per {@code read()}, each from a task the channel queues
     * on its loop, not from the loop's poll: that task failed the same way, but Netty only logged its exception, so
     * the channel went on without the lost message and nobody heard of it.
     */
    @ParameterizedTest(name = "autoRead={0}")
    @ValueSource(booleans = {true, false})
    void shouldFailOnlyTheChannelWhoseLoopWorkThrewAnError(boolean autoRead) throws Exception {
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
        CompletableFuture<Channel> victim = new CompletableFuture<>();
        ExhaustibleAllocator exhaustible = new ExhaustibleAllocator();
        List<ByteBuf> held = new CopyOnWriteArrayList<>();
        LinkedBlockingQueue<Throwable> failures = new LinkedBlockingQueue<>();
        try {
            // The victim's children hold every message (as an application that aggregates would), so the channel
            // copies further messages out of its receive buffers through the exhausted allocator.
            Channel victimServer = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                    .childOption(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, 4)
                    .childOption(ChannelOption.ALLOCATOR, exhaustible)
                    .childOption(ChannelOption.AUTO_READ, autoRead)
                    .childHandler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public void channelActive(ChannelHandlerContext ctx) {
                            victim.complete(ctx.channel());
                        }

                        @Override
                        public void channelRead(ChannelHandlerContext ctx, Object msg) {
                            held.add((ByteBuf) msg);
                            if (!autoRead) {
                                ctx.read();
                            }
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
            Channel echoServer = echoServer(group);

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
            if (!autoRead) {
                // Once the first messages wait in the receive buffers, each read is a task of its own.
                Thread.sleep(200);
                victim.get(10, TimeUnit.SECONDS).read();
            }

            Throwable cause = failures.poll(10, TimeUnit.SECONDS);
            assertNotNull(cause, "the victim channel reported no failure");
            assertInstanceOf(OutOfMemoryError.class, cause);
            // Abortive: the peer sees a reset, not a clean end of stream.
            assertTrue(attacker.closeFuture().await(10, TimeUnit.SECONDS), "the attacker was not disconnected");
            Throwable reset = clientFailures.poll(10, TimeUnit.SECONDS);
            assertNotNull(reset, "the attacker saw a clean close instead of a reset");
            assertTrue(reset.getMessage().startsWith("connection reset by peer"), reset.getMessage());
            // The first failed copy failed the channel: it did not read on past a message it had lost.
            assertEquals(1, exhaustible.refused.get(), "allocations refused before the channel failed");

            // The one loop still serves the other listener.
            assertEchoes(group, echoServer);
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

    /**
     * Arming a completion queue fails (on a device: {@code ibv_req_notify_cq} once the device is gone). The loop arms
     * every channel before it sleeps, outside any one channel's poll: the exception ended the loop's thread, and with
     * it every channel and listener registered there.
     */
    @Test
    void shouldFailOnlyTheChannelWhoseQueueCannotBeArmed() throws Exception {
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
        try {
            Channel echoServer = echoServer(group);
            LinkedBlockingQueue<Throwable> failures = new LinkedBlockingQueue<>();
            Channel idle = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
                            failures.add(cause);
                        }
                    })
                    .connect(echoServer.localAddress()).sync().channel();
            try {
                // The loop arms its channels whenever it is about to sleep: it does so at once, all of them idle.
                provider.faults().failNotifyRequests(1);
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
                while (provider.faults().notifyRequestFailuresLeft() > 0 && System.nanoTime() < deadline) {
                    Thread.sleep(5);
                    group.next().execute(() -> { });
                }
            } finally {
                provider.faults().reset();
            }
            // One of the loop's channels (the client, or the server's child of it) failed and closed.
            assertTrue(idle.closeFuture().await(10, TimeUnit.SECONDS), "the client was not closed");
            // The one loop still serves the listener and new channels.
            assertEchoes(group, echoServer);
            echoServer.close().sync();
        } finally {
            group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        }
        assertTrue(provider.resourceUsage().isZero(), "leaked: " + provider.resourceUsage());
    }

    /** A listener on {@code group} whose children echo what they read. */
    private static Channel echoServer(EventLoopGroup group) throws InterruptedException {
        return new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
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
    }

    /** A new channel on {@code group} gets its bytes echoed by {@code echoServer}: the loop still serves. */
    private static void assertEchoes(EventLoopGroup group, Channel echoServer) throws Exception {
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
    }
}
