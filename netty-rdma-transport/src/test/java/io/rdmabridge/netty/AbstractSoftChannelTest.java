package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandler;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.EventLoopGroup;
import io.netty.util.ReferenceCountUtil;
import io.rdmabridge.verbs.RdmaProviders;
import io.rdmabridge.verbs.soft.SoftProvider;

import java.net.InetSocketAddress;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.function.BiConsumer;

/**
 * Channel tests on the soft provider, over loopback ({@link AbstractChannelTest}), with its fault injection and
 * counters at hand.
 */
abstract class AbstractSoftChannelTest extends AbstractChannelTest {
    final SoftProvider provider;

    AbstractSoftChannelTest() {
        this((SoftProvider) RdmaProviders.byName("soft"));
    }

    private AbstractSoftChannelTest(SoftProvider provider) {
        super(provider);
        this.provider = provider;
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

    /** A raw verbs peer listening on 127.0.0.1, any port; {@link #connectToRaw} connects a channel to it. */
    RawVerbsPeer listenRaw() throws Exception {
        return RawVerbsPeer.listen(provider, new InetSocketAddress("127.0.0.1", 0));
    }

    /**
     * Starts connecting {@code bootstrap} (handler and options set, no group, no channel) to the raw listener
     * {@code raw} and has {@code raw} accept it; the connect completes once {@code raw} sends its HELLO.
     */
    ChannelFuture connectToRaw(Bootstrap bootstrap, RawVerbsPeer raw) throws Exception {
        ChannelFuture connecting = startConnect(bootstrap, raw.listenAddress());
        raw.acceptOne();
        return connecting;
    }

    /**
     * Binds, on 127.0.0.1, a listener on {@code loop} whose accepted channels post {@code receiveQueueDepth} receives
     * and hand every message they read, with themselves, to {@code onRead} (on their loop).
     */
    static Channel listenWithReceiveDepth(EventLoopGroup loop, int receiveQueueDepth,
            BiConsumer<RdmaSocketChannel, Object> onRead) throws InterruptedException {
        return new ServerBootstrap().group(loop).channel(RdmaServerSocketChannel.class)
                .childOption(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, receiveQueueDepth)
                .childHandler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public void channelRead(ChannelHandlerContext ctx, Object msg) {
                        onRead.accept((RdmaSocketChannel) ctx.channel(), msg);
                    }
                }).bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();
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
