package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.SimpleChannelInboundHandler;
import io.netty.util.concurrent.Promise;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RdmaProviders;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.net.InetSocketAddress;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.zip.CRC32;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Echo across message sizes, checked by CRC, on the soft provider; every verbs resource is released afterwards. */
class RdmaEchoTest {
    private final RdmaProvider provider = RdmaProviders.byName("soft");
    private EventLoopGroup group;

    @BeforeEach
    void setUp() {
        group = new MultiThreadIoEventLoopGroup(2, RdmaIoHandler.newFactory(provider));
    }

    @AfterEach
    void tearDown() throws Exception {
        group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        assertTrue(provider.resourceUsage().isZero(), "leaked: " + provider.resourceUsage());
    }

    @ParameterizedTest
    @ValueSource(ints = {1, 100, 244, 4096, 16 * 1024 - 12, 16 * 1024, 100_000, 1024 * 1024, 8 * 1024 * 1024})
    @Timeout(60)
    void shouldEchoMessageOfSize(int size) throws Exception {
        Channel server = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                .childHandler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public void channelRead(ChannelHandlerContext ctx, Object msg) {
                        ctx.writeAndFlush(msg);
                    }
                }).bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();

        byte[] data = new byte[size];
        ThreadLocalRandom.current().nextBytes(data);
        Promise<Long> done = group.next().newPromise();
        CRC32 received = new CRC32();
        long[] count = new long[1];
        Channel client = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                .handler(new SimpleChannelInboundHandler<ByteBuf>() {
                    @Override
                    protected void channelRead0(ChannelHandlerContext ctx, ByteBuf msg) {
                        byte[] bytes = new byte[msg.readableBytes()];
                        msg.readBytes(bytes);
                        received.update(bytes);
                        count[0] += bytes.length;
                        if (count[0] == size) {
                            done.trySuccess(received.getValue());
                        }
                    }

                    @Override
                    public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
                        done.tryFailure(cause);
                    }
                }).connect(server.localAddress()).sync().channel();

        ByteBuf out = client.alloc().directBuffer(size).writeBytes(data);
        client.writeAndFlush(out).sync();
        CRC32 expected = new CRC32();
        expected.update(data);
        assertEquals(expected.getValue(), done.get(30, TimeUnit.SECONDS));
        assertEquals(0, ((RdmaSocketChannel) client).metrics().copiedBytes(), "registered buffer was copied");
        client.close().sync();
        server.close().sync();
    }
}
