package io.rdmabridge.netty;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandler;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;

import java.net.InetSocketAddress;
import java.util.concurrent.TimeUnit;

/**
 * The peer process of {@link RdmaCrossProcessEchoTest}: an RDMA echo server on the provider named by
 * {@code rdmabridge.provider}, bound to an ephemeral port of {@code rdmabridge.test.address} (printed as
 * {@code PORT n}; see {@link DeviceUnderTest}). It echoes every
 * received buffer as is (zero-copy: receive buffers and rendezvous targets are registered memory) and stops reading
 * while its channel is not writable, so its memory stays bounded. Runs until it is killed or its standard input
 * closes.
 */
public final class RdmaEchoPeerMain {
    private RdmaEchoPeerMain() {
    }

    public static void main(String[] args) throws Exception {
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(DeviceUnderTest.provider()));
        Channel server = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                .childHandler(new Echo())
                .bind(new InetSocketAddress(DeviceUnderTest.address(), 0)).sync().channel();
        System.out.println("PORT " + ((InetSocketAddress) server.localAddress()).getPort());
        System.out.flush();
        // The test ends this process by closing its standard input (or by killing it).
        while (System.in.read() >= 0) {
            // Nothing is expected on standard input.
        }
        server.close().sync();
        group.shutdownGracefully(0, 1, TimeUnit.SECONDS).sync();
    }

    /** Writes back what it reads; stops reading while the channel is not writable. */
    @ChannelHandler.Sharable
    private static final class Echo extends ChannelInboundHandlerAdapter {
        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ctx.write(msg);
        }

        @Override
        public void channelReadComplete(ChannelHandlerContext ctx) {
            ctx.flush();
        }

        @Override
        public void channelWritabilityChanged(ChannelHandlerContext ctx) {
            ctx.channel().config().setAutoRead(ctx.channel().isWritable());
            ctx.fireChannelWritabilityChanged();
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            cause.printStackTrace();
            ctx.close();
        }
    }
}
