package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.SimpleChannelInboundHandler;
import io.rdmabridge.verbs.RdmaProviders;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The echo example of the README, as written there but bound to loopback (tests never leave this host); the
 * provider comes from {@code rdmabridge.provider}, set to soft for the tests.
 */
class ReadmeEchoExampleTest {

    @Test
    @Timeout(30)
    void theReadmeEchoExampleEchoes() throws Exception {
        String line;
        // From the README, unchanged but for the address.
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(RdmaIoHandler.newFactory());
        try {
            Channel server = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
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

            CompletableFuture<String> echo = new CompletableFuture<>();
            Channel client = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new SimpleChannelInboundHandler<ByteBuf>() {
                        @Override
                        protected void channelRead0(ChannelHandlerContext ctx, ByteBuf msg) {
                            echo.complete(msg.toString(StandardCharsets.UTF_8));
                        }
                    })
                    .connect(server.localAddress()).sync().channel();
            client.writeAndFlush(Unpooled.copiedBuffer("hello over RDMA", StandardCharsets.UTF_8));
            line = echo.get(10, TimeUnit.SECONDS);
            client.close().sync();
            server.close().sync();
        } finally {
            group.shutdownGracefully().sync();
        }

        assertEquals("hello over RDMA", line);
        assertTrue(RdmaProviders.byName("soft").resourceUsage().isZero(),
                "leaked: " + RdmaProviders.byName("soft").resourceUsage());
    }
}
