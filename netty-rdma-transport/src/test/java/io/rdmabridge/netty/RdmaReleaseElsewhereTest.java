package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.IoHandle;
import io.netty.channel.IoHandler;
import io.netty.channel.IoHandlerContext;
import io.netty.channel.IoHandlerFactory;
import io.netty.channel.IoRegistration;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.util.concurrent.SingleThreadEventExecutor;
import io.rdmabridge.verbs.EventNotifier;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Received buffers released on a thread other than the channel's loop: their reposts wait for the loop's next
 * wake-up instead of waking it, up to a quarter of the receive queue. {@code RdmaEchoTest} checks that such releases
 * still return every credit under load and pressure.
 */
class RdmaReleaseElsewhereTest extends AbstractSoftChannelTest {

    /**
     * A buffer released on another thread does not wake the channel's sleeping loop: its repost waits for the loop's
     * next wake-up, until a quarter of the receive queue waits, which wakes the loop at once.
     */
    @Test
    @Timeout(60)
    void shouldDeferRepostsFromAnotherThreadUntilAQuarterOfTheQueueWaits() throws Exception {
        int depth = 16;
        int quarter = depth / 4;
        EventLoopGroup serverLoop = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
        SingleThreadEventExecutor loop = (SingleThreadEventExecutor) serverLoop.next();
        BlockingQueue<ByteBuf> received = new LinkedBlockingQueue<>();
        AtomicReference<RdmaSocketChannel> child = new AtomicReference<>();
        List<ByteBuf> held = new ArrayList<>();
        try {
            Channel server = listenWithReceiveDepth(serverLoop, depth, (ch, msg) -> {
                child.set(ch);
                received.add((ByteBuf) msg);
            });
            Channel client = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter())
                    .connect(server.localAddress()).sync().channel();
            for (int i = 0; i < quarter; i++) {
                client.writeAndFlush(client.alloc().directBuffer(100).writeZero(100)).sync();
            }
            for (int i = 0; i < quarter; i++) {
                ByteBuf buf = received.poll(10, TimeUnit.SECONDS);
                assertTrue(buf != null, "message " + i + " of " + quarter + " did not arrive");
                held.add(buf);
            }
            assertEquals(quarter, serverLoop.submit(() -> child.get().heldReceiveBuffers()).get());
            // Nothing else happens on the connection: the loop goes to sleep on its notifier.
            EventNotifier notifier = child.get().handler.notifier();
            for (int i = 0; i < 500 && !(notifier.isWaiting() && loop.pendingTasks() == 0); i++) {
                Thread.sleep(10);
            }
            assertTrue(notifier.isWaiting() && loop.pendingTasks() == 0, "the server's loop did not go to sleep");

            for (int i = 0; i < quarter - 1; i++) {
                held.get(i).release();
            }
            // A wake-up would show at once: signalling the notifier ends its wait in this thread's call.
            assertEquals(1, loop.pendingTasks(), "the reposts were not queued as one task");
            assertTrue(notifier.isWaiting(), (quarter - 1) + " releases on another thread woke the loop");

            held.get(quarter - 1).release();
            for (int i = 0; i < 500 && loop.pendingTasks() != 0; i++) {
                Thread.sleep(10);
            }
            assertEquals(0, loop.pendingTasks(), "the release that made a quarter of the queue wait did not wake the "
                    + "loop");
            assertEquals(0, serverLoop.submit(() -> child.get().heldReceiveBuffers()).get(),
                    "released receive buffers were not reposted");
            client.close().sync();
            server.close().sync();
        } finally {
            // A failed assertion must not leave receive buffers held: the slab would outlive the test.
            for (ByteBuf buf : held) {
                if (buf.refCnt() > 0) {
                    buf.release();
                }
            }
            serverLoop.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        }
    }

    /**
     * A buffer released while its loop shuts down goes back only once the loop has terminated. Netty stops taking
     * tasks before the loop's final cleanup, which destroys the connection; the release used to run at once on the
     * releasing thread, beside that cleanup, on the receive buffers' unsynchronized state (a slab freed twice, or
     * never). The test holds the loop at the start of its cleanup while the buffer is released.
     */
    @Test
    @Timeout(60)
    void shouldGiveABufferBackOnlyOnceItsLoopHasTerminatedWhenTheLoopTakesNoMoreTasks() throws Exception {
        CountDownLatch destroying = new CountDownLatch(1);
        CountDownLatch proceed = new CountDownLatch(1);
        IoHandlerFactory rdma = RdmaIoHandler.newFactory(provider);
        IoHandlerFactory heldAtDestroy = executor -> {
            IoHandler handler = rdma.newHandler(executor);
            return new IoHandler() {
                @Override
                public void initialize() {
                    handler.initialize();
                }

                @Override
                public int run(IoHandlerContext context) {
                    return handler.run(context);
                }

                @Override
                public void prepareToDestroy() {
                    handler.prepareToDestroy();
                }

                @Override
                public void destroy() {
                    destroying.countDown();
                    try {
                        proceed.await(30, TimeUnit.SECONDS);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                    handler.destroy();
                }

                @Override
                public IoRegistration register(IoHandle handle) throws Exception {
                    return handler.register(handle);
                }

                @Override
                public void wakeup() {
                    handler.wakeup();
                }

                @Override
                public boolean isCompatible(Class<? extends IoHandle> handleType) {
                    return handler.isCompatible(handleType);
                }
            };
        };
        EventLoopGroup serverLoop = new MultiThreadIoEventLoopGroup(1, heldAtDestroy);
        BlockingQueue<ByteBuf> received = new LinkedBlockingQueue<>();
        AtomicReference<RdmaSocketChannel> child = new AtomicReference<>();
        ByteBuf held = null;
        try {
            Channel server = listenWithReceiveDepth(serverLoop, 16, (ch, msg) -> {
                child.set(ch);
                received.add((ByteBuf) msg);
            });
            Channel client = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter())
                    .connect(server.localAddress()).sync().channel();
            channels.add(client);
            client.writeAndFlush(client.alloc().directBuffer(100).writeZero(100)).sync();
            held = received.poll(10, TimeUnit.SECONDS);
            assertNotNull(held, "the message did not arrive");
            serverLoop.shutdownGracefully(0, 0, TimeUnit.SECONDS);
            assertTrue(destroying.await(10, TimeUnit.SECONDS), "the loop did not reach its cleanup");
            assertTrue(serverLoop.next().isShutdown(), "the loop still takes tasks");
            held.release();
            held = null;
            // The loop waits at the start of its cleanup (the latch orders this read after its last write).
            assertEquals(1, child.get().heldReceiveBuffers(), "the buffer went back beside the loop's cleanup");
        } finally {
            proceed.countDown();
            if (held != null) {
                held.release();
            }
            assertTrue(serverLoop.terminationFuture().await(10, TimeUnit.SECONDS), "the loop did not terminate");
        }
        // The tear-down finds every registration gone: the buffer went back once the loop had terminated.
    }
}
