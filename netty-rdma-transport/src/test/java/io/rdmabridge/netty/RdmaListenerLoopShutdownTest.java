package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.SimpleChannelInboundHandler;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.ByteArrayOutputStream;
import java.net.ConnectException;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.Random;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * An accepted connection's connection-manager id lives on its listener's loop, while its queue pair is used by the
 * loop the connection is registered with. A listener's loop that shuts down first (a boss group shut down on its own,
 * or simply the first loop of a group to finish) must leave the other loops' connections alone, as Netty's NIO and
 * epoll transports do: they keep moving bytes, learn of their peer's close, and give back every resource when they
 * close. On the soft provider, and in the rxe stage on DiSNI over Soft-RoCE ({@link DeviceUnderTest}).
 */
@Tag("device")
class RdmaListenerLoopShutdownTest extends AbstractChannelTest {
    RdmaListenerLoopShutdownTest() {
        super(DeviceUnderTest.provider());
    }

    @Test
    @Timeout(120)
    void shouldKeepAcceptedConnectionsWorkingAfterTheListenersGroupShutsDown() throws Exception {
        EventLoopGroup boss = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(DeviceUnderTest.provider()));
        CompletableFuture<Channel> accepted = new CompletableFuture<>();
        Channel server;
        try {
            server = new ServerBootstrap().group(boss, group).channel(RdmaServerSocketChannel.class)
                    .childHandler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public void channelActive(ChannelHandlerContext ctx) {
                            accepted.complete(ctx.channel());
                            ctx.fireChannelActive();
                        }

                        @Override
                        public void channelRead(ChannelHandlerContext ctx, Object msg) {
                            ctx.writeAndFlush(msg);
                        }
                    }).bind(new InetSocketAddress(DeviceUnderTest.address(), 0)).sync().channel();
        } catch (Throwable t) {
            boss.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
            throw t;
        }
        BlockingQueue<byte[]> echoed = new LinkedBlockingQueue<>();
        RdmaSocketChannel client = connect(new Bootstrap().handler(new SimpleChannelInboundHandler<ByteBuf>() {
            @Override
            protected void channelRead0(ChannelHandlerContext ctx, ByteBuf msg) {
                byte[] bytes = new byte[msg.readableBytes()];
                msg.readBytes(bytes);
                echoed.add(bytes);
            }
        }), server);
        Channel child = accepted.get(DeviceUnderTest.scaled(Duration.ofSeconds(10)).toMillis(), TimeUnit.MILLISECONDS);
        Random random = new Random(42);
        echo(client, echoed, random, 1000);

        boss.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        assertTrue(!server.isOpen(), "the listener outlived its loop");
        assertTrue(child.isActive(), "the accepted connection closed with its listener's loop");
        // Eager frames and, at 200 KiB, rendezvous READs: the queue pair, not only the id, is still there.
        for (int size : new int[] {1, 4096, 200 * 1024, 100, 64 * 1024}) {
            echo(client, echoed, random, size);
        }

        client.close().sync();
        assertTrue(child.closeFuture().await(DeviceUnderTest.scaled(Duration.ofSeconds(10)).toMillis()),
                "the accepted connection did not see its peer close after its listener's loop was gone");
        // The tear-down shuts the workers down and checks that every resource, the listener's event channel
        // included, is gone.
    }

    /**
     * A connection Netty accepted but never registered (here its child handler, not sharable, cannot be added twice,
     * so Netty's acceptor gives up on the second connection) holds nothing beyond its listener's loop: it goes with
     * that loop's event channel, and its peer's connect times out.
     */
    @Test
    @Timeout(120)
    void shouldCloseAnAcceptedConnectionNeverRegisteredWithItsListenersEventChannel() throws Exception {
        Channel server = listen(new ServerBootstrap().childHandler(new ChannelInboundHandlerAdapter()));
        connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter()), server);
        int timeoutMillis = (int) DeviceUnderTest.scaled(Duration.ofSeconds(1)).toMillis();
        ChannelFuture abandoned = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                .option(ChannelOption.CONNECT_TIMEOUT_MILLIS, timeoutMillis)
                .handler(new ChannelInboundHandlerAdapter()).connect(server.localAddress());
        assertTrue(abandoned.await(timeoutMillis * 10L), "the second connect neither failed nor timed out");
        // A timeout here; a device's connection manager may give up first, and report it as its own connect failure.
        assertTrue(abandoned.cause() instanceof ConnectException,
                "the second connect, never answered, failed: " + abandoned.cause());
        // The tear-down closes the listener, shuts the loops down and checks that nothing is left: the abandoned
        // connection's id and the event channel it lives on included.
    }

    /** Writes {@code size} random bytes and waits for the same bytes to come back, however they were split. */
    private static void echo(Channel client, BlockingQueue<byte[]> echoed, Random random, int size)
            throws Exception {
        byte[] data = new byte[size];
        random.nextBytes(data);
        client.writeAndFlush(client.alloc().directBuffer(size).writeBytes(data)).sync();
        ByteArrayOutputStream back = new ByteArrayOutputStream();
        long deadline = System.nanoTime() + DeviceUnderTest.scaled(Duration.ofSeconds(10)).toNanos();
        while (back.size() < size) {
            byte[] part = echoed.poll(Math.max(1, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
            assertTrue(part != null, "echo of " + size + " bytes: " + back.size() + " came back in time");
            back.write(part);
        }
        assertArrayEquals(data, back.toByteArray(), "echo of " + size + " bytes");
    }
}
