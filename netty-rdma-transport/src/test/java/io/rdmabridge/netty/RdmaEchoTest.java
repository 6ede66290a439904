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
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
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
    @ValueSource(ints = {1, 100, 244, 4096, 16 * 1024 - 12, 16 * 1024, 64 * 1024 - 12, 64 * 1024, 100_000, 1024 * 1024,
        8 * 1024 * 1024})
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

    /**
     * Buffers the application released on another thread during a read burst are not "held": the loop reposts them
     * before it decides that the application holds most receive buffers, instead of copying the next message.
     */
    @Test
    @Timeout(60)
    void shouldNotCopyUnderPressureForBuffersAlreadyReleasedElsewhere() throws Exception {
        int depth = 16;
        int threshold = depth * 3 / 4;
        EventLoopGroup serverLoop = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
        ExecutorService releaser = Executors.newSingleThreadExecutor();
        List<ByteBuf> held = new ArrayList<>();
        AtomicReference<RdmaSocketChannel> child = new AtomicReference<>();
        AtomicLong received = new AtomicLong();
        try {
            Channel server = AbstractSoftChannelTest.listenWithReceiveDepth(serverLoop, depth, (ch, msg) -> {
                child.set(ch);
                received.incrementAndGet();
                held.add((ByteBuf) msg);
                if (held.size() == threshold) {
                    // At the mark, not above it: all but this one go, on another thread, before the next message of
                    // this burst is handed up.
                    List<ByteBuf> others = new ArrayList<>(held.subList(0, threshold - 1));
                    held.subList(0, threshold - 1).clear();
                    try {
                        releaser.submit(() -> others.forEach(ByteBuf::release)).get(10, TimeUnit.SECONDS);
                    } catch (Exception e) {
                        throw new IllegalStateException(e);
                    }
                }
            });
            Channel client = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                    .handler(new ChannelInboundHandlerAdapter())
                    .connect(server.localAddress()).sync().channel();
            client.writeAndFlush(client.alloc().directBuffer(1).writeZero(1)).sync();
            for (int i = 0; i < 500 && received.get() < 1; i++) {
                Thread.sleep(10);
            }
            // Keep the server's loop busy while the burst lands, so that it reads the burst in one go.
            CountDownLatch unblock = new CountDownLatch(1);
            serverLoop.execute(() -> {
                try {
                    unblock.await(20, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            });
            // One SEND per message: each write's promise completes before the next is written.
            for (int i = 1; i <= threshold; i++) {
                client.writeAndFlush(client.alloc().directBuffer(1000).writeZero(1000)).sync();
            }
            unblock.countDown();
            for (int i = 0; i < 500 && received.get() < threshold + 1; i++) {
                Thread.sleep(10);
            }
            assertEquals(threshold + 1, received.get());
            assertEquals(0, child.get().metrics().receivedCopiedBytes(),
                    "copied although the application held only 2 of " + depth + " receive buffers");
            client.close().sync();
            server.close().sync();
        } finally {
            releaser.shutdown();
            assertTrue(releaser.awaitTermination(10, TimeUnit.SECONDS));
            serverLoop.submit(() -> {
                held.forEach(ByteBuf::release);
                held.clear();
            }).get(10, TimeUnit.SECONDS);
            serverLoop.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        }
    }

    /** Receive buffers released on another thread still go back (repost, credit): more frames than credits arrive. */
    @Test
    @Timeout(60)
    void shouldRepostReceivesReleasedOnAnotherThread() throws Exception {
        int messages = 2000;
        int size = 1000;
        Channel server = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                .childHandler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public void channelActive(ChannelHandlerContext ctx) {
                        for (int i = 0; i < messages; i++) {
                            ctx.write(ctx.alloc().directBuffer(size).writeZero(size));
                        }
                        ctx.flush();
                    }
                }).bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();
        ExecutorService releaser = Executors.newSingleThreadExecutor();
        Promise<Long> done = group.next().newPromise();
        AtomicLong received = new AtomicLong();
        Channel client = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                .handler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public void channelRead(ChannelHandlerContext ctx, Object msg) {
                        ByteBuf buf = (ByteBuf) msg;
                        releaser.execute(() -> {
                            long total = received.addAndGet(buf.readableBytes());
                            buf.release();
                            if (total == (long) messages * size) {
                                done.trySuccess(total);
                            }
                        });
                    }
                }).connect(server.localAddress()).sync().channel();
        try {
            assertEquals((long) messages * size, done.get(30, TimeUnit.SECONDS));
            // Every slot comes back to the loop (under pressure the loop copies instead, so arrival alone proves
            // nothing about these releases).
            RdmaSocketChannel rdmaClient = (RdmaSocketChannel) client;
            int held = -1;
            for (int i = 0; i < 500 && held != 0; i++) {
                held = client.eventLoop().submit(rdmaClient::heldReceiveBuffers).get();
                if (held != 0) {
                    Thread.sleep(10);
                }
            }
            assertEquals(0, held, "receive buffers released on another thread were not reposted");
        } finally {
            releaser.shutdown();
            assertTrue(releaser.awaitTermination(10, TimeUnit.SECONDS));
        }
        client.close().sync();
        server.close().sync();
    }
}
