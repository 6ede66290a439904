package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.util.ReferenceCountUtil;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.net.InetSocketAddress;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * By default a write the channel copied into registered memory completes once the copy is posted, one sent by
 * reference still once the peer has it; while connection-manager events wait unread on the loop (on a device, a peer's
 * reset shows only there) a copied write waits for delivery too. {@link RdmaCopiedWritesOnDeliveryTest} has the
 * switch off.
 */
class RdmaCopiedWriteCompletionTest extends AbstractSoftChannelTest {

    @AfterEach
    void resetFaults() {
        provider.faults().reset();
    }

    @Test
    @Timeout(60)
    void shouldCompleteACopiedWriteWhenPostedAndOneSentByReferenceWhenDelivered() throws Exception {
        // No send completion while the test runs: only the peer's frames count writes delivered.
        provider.faults().delaySendCompletions(TimeUnit.MINUTES.toNanos(10));
        Channel server = listen(new ServerBootstrap().childHandler(new Echo()));
        AtomicInteger echoedBytes = new AtomicInteger();
        CompletableFuture<Void> allEchoed = new CompletableFuture<>();
        Channel ch = connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter() {
            @Override
            public void channelRead(ChannelHandlerContext ctx, Object msg) {
                if (echoedBytes.addAndGet(((ByteBuf) msg).readableBytes()) == 200) {
                    allEchoed.complete(null);
                }
                ((ByteBuf) msg).release();
            }
        }), server);
        ByteBuf heap = Unpooled.wrappedBuffer(new byte[100]);
        ByteBuf registered = ch.alloc().directBuffer(100).writeZero(100);
        registered.retain();
        ChannelFuture[] writes = ch.eventLoop().submit(() -> {
            ChannelFuture copied = ch.write(heap);
            ChannelFuture byReference = ch.writeAndFlush(registered);
            // Still inside the flush's event-loop task: no completion or peer frame has been polled yet.
            assertTrue(copied.isSuccess(), "the copied write's promise completed when it was posted: " + copied);
            assertEquals(0, heap.refCnt(), "the channel released the copied buffer once posted");
            assertFalse(byReference.isDone(), "a write sent by reference completes only once the peer has it");
            return new ChannelFuture[] {copied, byReference};
        }).get(30, TimeUnit.SECONDS);
        allEchoed.get(30, TimeUnit.SECONDS);
        assertTrue(writes[1].await(30, TimeUnit.SECONDS) && writes[1].isSuccess(),
                "the write sent by reference completed on delivery: " + writes[1].cause());
        assertEquals(2, registered.refCnt(), "the channel still holds the buffer it sent by reference: no completion");
        ch.close().sync();
        assertEquals(1, registered.refCnt(), "the channel let the buffer go once its queue pair was destroyed");
        registered.release();
    }

    @Test
    @Timeout(60)
    void shouldCompleteACopiedWriteOnDeliveryWhileConnectionManagerEventsWaitUnread() throws Exception {
        CompletableFuture<Void> echoed = new CompletableFuture<>();
        RdmaSocketChannel ch = connectToEcho(echoed);
        ByteBuf heap = Unpooled.wrappedBuffer(new byte[100]);
        ChannelFuture second = ch.eventLoop().submit(() -> {
            // A second connection on the same loop, started from this task (Bootstrap.connect would start it in a
            // later one): its address resolution queues an event, which the loop cannot poll while this task runs.
            ChannelFuture registered = new Bootstrap().group(ch.eventLoop()).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter()).register();
            assertTrue(registered.isSuccess(), "registered from its own loop at once: " + registered);
            ChannelFuture connecting = registered.channel().connect(ch.remoteAddress());
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
            while (!ch.handler.eventChannel().hasPendingEvents()) {
                assertTrue(System.nanoTime() < deadline, "no connection-manager event was queued for the loop");
                Thread.onSpinWait();
            }
            ChannelFuture copied = ch.writeAndFlush(heap);
            assertFalse(copied.isDone(), "a copied write posted while events wait unread completes on delivery");
            assertEquals(1, heap.refCnt(), "the channel keeps the copied buffer until delivery");
            return connecting;
        }).get(30, TimeUnit.SECONDS);
        echoed.get(30, TimeUnit.SECONDS);
        assertEquals(0, heap.refCnt(), "the copied buffer was released once delivered");
        Channel other = second.sync().channel();
        channels.add(0, other);
        assertTrue(other.isActive(), "the second connection, whose event waited, was established");
    }

    /**
     * An accepted channel's connection-manager events arrive on its listener's event channel, which another loop
     * polls: events waiting unread there, not on the channel's own loop, make its copied writes wait for delivery.
     */
    @Test
    @Timeout(60)
    void shouldCompleteAnAcceptedChannelsCopiedWriteOnDeliveryWhileItsListenersLoopHasEventsUnread() throws Exception {
        EventLoopGroup boss = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
        CountDownLatch unblockBoss = new CountDownLatch(1);
        try {
            CompletableFuture<RdmaSocketChannel> accepted = new CompletableFuture<>();
            CompletableFuture<Void> read = new CompletableFuture<>();
            RdmaServerSocketChannel server = (RdmaServerSocketChannel) new ServerBootstrap().group(boss, group)
                    .channel(RdmaServerSocketChannel.class)
                    .childHandler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public void channelActive(ChannelHandlerContext ctx) {
                            accepted.complete((RdmaSocketChannel) ctx.channel());
                            ctx.fireChannelActive();
                        }

                        @Override
                        public boolean isSharable() {
                            return true;
                        }
                    }).bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();
            channels.add(server);
            connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter() {
                @Override
                public void channelRead(ChannelHandlerContext ctx, Object msg) {
                    ReferenceCountUtil.release(msg);
                    read.complete(null);
                }
            }), server);
            RdmaSocketChannel child = accepted.get(30, TimeUnit.SECONDS);

            // The listener's loop busy: a second client's connect request waits unread on its event channel. The
            // client connects only once the loop runs the blocking task; before, the loop could still poll the
            // request in the wake-up that the task's submission caused, and accept it.
            CountDownLatch bossBlocked = new CountDownLatch(1);
            boss.execute(() -> {
                bossBlocked.countDown();
                try {
                    unblockBoss.await(30, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            });
            assertTrue(bossBlocked.await(30, TimeUnit.SECONDS), "the listener's loop ran the blocking task");
            ChannelFuture second = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter()).connect(server.localAddress());
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
            while (!server.handler.eventChannel().hasPendingEvents()) {
                assertTrue(System.nanoTime() < deadline, "no connection-manager event was queued for the listener");
                Thread.sleep(1);
            }
            assertFalse(child.handler.eventChannel().hasPendingEvents(), "the child's own loop has events unread");
            ByteBuf heap = Unpooled.wrappedBuffer(new byte[100]);
            ChannelFuture copied = child.eventLoop().submit(() -> {
                ChannelFuture write = child.writeAndFlush(heap);
                // Still inside the flush's event-loop task: no completion or peer frame has been polled yet.
                assertFalse(write.isDone(), "a copied write posted while its listener's events wait unread "
                        + "completes on delivery");
                assertEquals(1, heap.refCnt(), "the channel keeps the copied buffer until delivery");
                return write;
            }).get(30, TimeUnit.SECONDS);
            read.get(30, TimeUnit.SECONDS);
            assertTrue(copied.await(30, TimeUnit.SECONDS) && copied.isSuccess(), "delivered: " + copied.cause());
            unblockBoss.countDown();
            channels.add(0, second.sync().channel());
        } finally {
            unblockBoss.countDown();
            for (Channel ch : channels) {
                ch.close().sync();
            }
            channels.clear();
            boss.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        }
    }
}
