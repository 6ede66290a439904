package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.util.ReferenceCountUtil;
import io.rdmabridge.verbs.RdmaProviders;

import java.net.InetSocketAddress;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;

/**
 * Child JVM of {@link RdmaReceivedBufferLeakTest}: a server that drops its first received buffer unreleased, and a
 * client that sends until Netty's leak detector reports it (or a minute passes). Prints {@code REPORTED <type>} or
 * {@code NOT REPORTED}. A JVM of its own because the leaked receive slot stays registered for the JVM's life.
 */
final class ReceivedBufferLeakMain {
    private ReceivedBufferLeakMain() {
    }

    public static void main(String[] args) throws Exception {
        AtomicReference<String> reported = new AtomicReference<>();
        RdmaReceivedByteBuf.LEAKS.setLeakListener((type, records) -> reported.compareAndSet(null, type));
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1,
                RdmaIoHandler.newFactory(RdmaProviders.byName("soft")));
        AtomicBoolean dropped = new AtomicBoolean();
        try {
            Channel server = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                    .childHandler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public void channelRead(ChannelHandlerContext ctx, Object msg) {
                            if (dropped.compareAndSet(false, true)) {
                                return; // the application's bug under test: neither released nor passed on
                            }
                            ReferenceCountUtil.release(msg);
                        }
                    })
                    .bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();
            Channel client = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter())
                    .connect(server.localAddress()).sync().channel();
            long deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(1);
            while (reported.get() == null && System.nanoTime() < deadline) {
                // Each buffer the server receives is tracked (paranoid), and tracking reports what GC collected.
                client.writeAndFlush(Unpooled.wrappedBuffer(new byte[1024])).sync();
                System.gc();
                Thread.sleep(10);
            }
            System.out.println(reported.get() == null ? "NOT REPORTED" : "REPORTED " + reported.get());
        } finally {
            group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        }
    }
}
