package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandler;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.util.ReferenceCountUtil;
import io.rdmabridge.verbs.RdmaProviders;
import io.rdmabridge.verbs.soft.SoftProvider;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;

import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Channel tests on the soft provider, over loopback: each test gets an event loop group of two loops; afterwards the
 * channels it made are closed (clients before listeners), the group is shut down, and every verbs resource, registered
 * bytes included, must be back to zero.
 */
abstract class AbstractSoftChannelTest {
    final SoftProvider provider = (SoftProvider) RdmaProviders.byName("soft");
    EventLoopGroup group;
    /** Closed in this order after the test. */
    final List<Channel> channels = new ArrayList<>();

    @BeforeEach
    void startGroup() {
        group = new MultiThreadIoEventLoopGroup(2, RdmaIoHandler.newFactory(provider));
    }

    @AfterEach
    void closeAndCheckNothingLeaked() throws Exception {
        for (Channel ch : channels) {
            ch.close().sync();
        }
        group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        assertTrue(provider.resourceUsage().isZero(), "leaked: " + provider.resourceUsage());
    }

    /** Binds {@code bootstrap} (handlers and options set, no group, no channel) on 127.0.0.1, any port. */
    Channel listen(ServerBootstrap bootstrap) throws InterruptedException {
        Channel ch = bootstrap.group(group).channel(RdmaServerSocketChannel.class)
                .bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();
        channels.add(ch);
        return ch;
    }

    /** Connects {@code bootstrap} (handler and options set, no group, no channel) to {@code server}. */
    RdmaSocketChannel connect(Bootstrap bootstrap, Channel server) throws InterruptedException {
        RdmaSocketChannel ch = (RdmaSocketChannel) bootstrap.group(group).channel(RdmaSocketChannel.class)
                .connect(server.localAddress()).sync().channel();
        channels.add(0, ch);
        return ch;
    }

    /**
     * Binds an {@link Echo} server and connects to it a client that releases whatever it reads and completes
     * {@code echoed} on its first read.
     */
    RdmaSocketChannel connectToEcho(CompletableFuture<Void> echoed) throws InterruptedException {
        Channel server = listen(new ServerBootstrap().childHandler(new Echo()));
        return connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter() {
            @Override
            public void channelRead(ChannelHandlerContext ctx, Object msg) {
                ReferenceCountUtil.release(msg);
                echoed.complete(null);
            }
        }), server);
    }

    /** Writes back every buffer it reads, as it is (registered memory, so without a copy). */
    @ChannelHandler.Sharable
    static final class Echo extends ChannelInboundHandlerAdapter {
        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ctx.writeAndFlush(msg);
        }
    }

    static byte[] randomBytes(int length, long seed) {
        byte[] b = new byte[length];
        new Random(seed).nextBytes(b);
        return b;
    }
}
