package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.ChannelOption;
import io.netty.channel.DefaultChannelPromise;
import io.netty.channel.ChannelPromise;
import io.netty.channel.DefaultFileRegion;
import io.netty.channel.EventLoop;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.FixedRecvByteBufAllocator;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.WriteBufferWaterMark;
import io.netty.channel.local.LocalAddress;
import io.netty.util.IllegalReferenceCountException;
import io.netty.util.ReferenceCountUtil;
import io.netty.util.concurrent.ImmediateEventExecutor;
import io.rdmabridge.connection.ConnectionConfig;
import io.rdmabridge.connection.RdmaConnection;
import io.rdmabridge.verbs.QpState;
import io.rdmabridge.verbs.RdmaException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.junitpioneer.jupiter.SetSystemProperty;
import org.junit.jupiter.api.io.TempDir;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.net.BindException;
import java.net.InetSocketAddress;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.ToIntFunction;
import java.util.zip.CRC32;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/**
 * Zero-copy accounting, end-to-end back-pressure and peer death on the soft provider; every verbs resource (registered
 * bytes included) is back to zero once the event loop group has shut down.
 */
class RdmaChannelBehaviourTest extends AbstractSoftChannelTest {
    private Channel server(ChannelInboundHandlerAdapter child, boolean autoRead) throws InterruptedException {
        return listen(new ServerBootstrap().childOption(ChannelOption.AUTO_READ, autoRead).childHandler(child));
    }

    private RdmaSocketChannel client(Channel server, ChannelInboundHandlerAdapter handler) throws InterruptedException {
        return connect(new Bootstrap()
                .option(ChannelOption.WRITE_BUFFER_WATER_MARK, new WriteBufferWaterMark(32 * 1024, 64 * 1024))
                .handler(handler), server);
    }

    /** Binds a {@link #server} whose children run {@code child} and connects to it a {@link #client} with a Sink. */
    private RdmaSocketChannel connectedClient(ChannelInboundHandlerAdapter child, boolean autoRead)
            throws InterruptedException {
        return client(server(child, autoRead), new Sink());
    }

    /**
     * As with Netty's own server channels, a listener whose autoRead is turned off hands up no accepted channel until
     * it reads again; ServerBootstrap relies on it to pause accepting for a second after an accept failed. The
     * listener used to keep handing up every connection.
     */
    @Test
    @Timeout(60)
    void shouldAcceptNothingWhileTheListenersAutoReadIsOff() throws Exception {
        ChildRecorder recorder = new ChildRecorder();
        Channel server = listen(new ServerBootstrap().childHandler(recorder));
        connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter()), server);
        assertNotNull(recorder.children.poll(10, TimeUnit.SECONDS), "the first connection");
        server.config().setAutoRead(false);
        ChannelFuture second = startConnect(new Bootstrap().handler(new ChannelInboundHandlerAdapter()),
                server.localAddress());
        assertNull(recorder.children.poll(1, TimeUnit.SECONDS), "accepted while the listener's autoRead was off");
        server.config().setAutoRead(true);
        assertNotNull(recorder.children.poll(10, TimeUnit.SECONDS), "the second connection, once reading again");
        assertTrue(second.await(10, TimeUnit.SECONDS) && second.isSuccess(), () -> "second connect: " + second);
    }

    /**
     * An accepted channel whose autoRead another thread turns off reads nothing more until it reads again, although
     * its loop handles completions before the tasks handed to it. The listener's twin above: under load the next
     * message used to be read before the loop ran the task that cleared the pending read.
     */
    @Test
    @Timeout(60)
    void shouldReadNothingOnceAnotherThreadTurnedAutoReadOff() throws Exception {
        LinkedBlockingQueue<Integer> reads = new LinkedBlockingQueue<>();
        ChildRecorder recorder = new ChildRecorder();
        Channel server = listen(new ServerBootstrap().childHandler(new ChannelInitializer<Channel>() {
            @Override
            protected void initChannel(Channel ch) {
                ch.pipeline().addLast(recorder, new ChannelInboundHandlerAdapter() {
                    @Override
                    public void channelRead(ChannelHandlerContext ctx, Object msg) {
                        reads.add(((ByteBuf) msg).readableBytes());
                        ((ByteBuf) msg).release();
                    }
                });
            }
        }));
        Channel client = connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter()), server);
        Channel child = recorder.children.poll(10, TimeUnit.SECONDS);
        assertNotNull(child, "the accepted channel");
        client.writeAndFlush(Unpooled.wrappedBuffer(new byte[1])).sync();
        assertEquals(1, reads.poll(10, TimeUnit.SECONDS), "the first message");
        child.config().setAutoRead(false);
        client.writeAndFlush(Unpooled.wrappedBuffer(new byte[2])).sync();
        assertNull(reads.poll(1, TimeUnit.SECONDS), "read while the channel's autoRead was off");
        child.config().setAutoRead(true);
        assertEquals(2, reads.poll(10, TimeUnit.SECONDS), "the second message, once reading again");
    }

    /**
     * A channel's completion queue signals, and its connection-manager id reports to, the handler of the loop it was
     * first registered with: registering it again after deregister(), on that loop or another, is refused by name,
     * the channel stays with its first loop, and Netty's close of it runs there: the queue pair is destroyed before
     * Netty frees the write that was still posted, and everything is released (checked after each test). It used to
     * be accepted, and another loop slept through the channel's completions. Then the close ran on the loop offered,
     * and its graceful close waited, unpolled, for a linger timer that the group's shutdown cancelled, so the channel's
     * memory stayed allocated. The peer keeps its half of the connection open (half closure), so no disconnect from
     * it closes the channel instead.
     */
    @ParameterizedTest(name = "on the same loop: {0}")
    @ValueSource(booleans = {true, false})
    @Timeout(60)
    void shouldRefuseToRegisterAChannelAgainAfterDeregisterAndCloseItOnItsFirstLoop(boolean sameLoop)
            throws Exception {
        Channel server = listen(new ServerBootstrap().childOption(ChannelOption.ALLOW_HALF_CLOSURE, true)
                .childHandler(new ChannelInboundHandlerAdapter()));
        RdmaSocketChannel client = connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter()), server);
        EventLoop first = client.eventLoop();
        EventLoop next = group.next();
        while ((next == first) != sameLoop) {
            next = group.next();
        }
        client.deregister().sync();
        // Posted, but no loop polls its completion now: it stays in the outbound buffer until the close fails it.
        ChannelPromise write = new DefaultChannelPromise(client, ImmediateEventExecutor.INSTANCE);
        AtomicReference<Boolean> destroyedWhenFailed = new AtomicReference<>();
        AtomicReference<Thread> failedOn = new AtomicReference<>();
        write.addListener(f -> {
            RdmaConnection c = client.connection;
            destroyedWhenFailed.set(c != null && c.isDestroyed() && c.queuePair().state() == QpState.DESTROYED);
            failedOn.set(Thread.currentThread());
        });
        client.writeAndFlush(client.alloc().directBuffer(64).writeZero(64), write);

        ChannelFuture again = next.register(client).await();
        assertTrue(again.cause() instanceof UnsupportedOperationException, () -> "register again: " + again.cause());
        assertTrue(again.cause().getMessage().contains("cannot be registered again"), again.cause()::getMessage);
        assertSame(first, client.eventLoop(), "the channel's loop after the refused registration");
        assertTrue(write.await(10, TimeUnit.SECONDS), "the posted write, once the channel closed");
        assertFalse(write.isSuccess(), "the posted write of a closed channel");
        assertTrue(first.inEventLoop(failedOn.get()), () -> "failed on " + failedOn.get() + ", not the first loop");
        // Its own queue pair, not a count of the provider's: the peer's may be gone too by then (a disconnect reaches
        // it while this close runs), and was in some runs.
        assertEquals(Boolean.TRUE, destroyedWhenFailed.get(), "the client's queue pair destroyed when the write's "
                + "buffer was freed");
        channels.remove(client);
    }

    /**
     * As above, once the loop the channel was first registered with has shut down: the refusal still completes, and
     * the channel still closes and releases everything, on the loop it was offered, as nothing else is left to run the
     * close. With the first loop's tasks going nowhere, the registration's future stayed incomplete for ever.
     */
    @Test
    @Timeout(60)
    void shouldRefuseToRegisterAChannelAgainOnceItsFirstLoopHasShutDown() throws Exception {
        Channel server = listen(new ServerBootstrap().childOption(ChannelOption.ALLOW_HALF_CLOSURE, true)
                .childHandler(new ChannelInboundHandlerAdapter()));
        EventLoopGroup firstGroup = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
        try {
            RdmaSocketChannel client = (RdmaSocketChannel) new Bootstrap().group(firstGroup)
                    .channel(RdmaSocketChannel.class).handler(new ChannelInboundHandlerAdapter())
                    .connect(server.localAddress()).sync().channel();
            client.deregister().sync();
            firstGroup.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
            ChannelFuture again = group.next().register(client);
            assertTrue(again.await(10, TimeUnit.SECONDS), "the refused registration completes");
            assertTrue(again.cause() instanceof UnsupportedOperationException, () -> "register again: "
                    + again.cause());
            assertTrue(client.closeFuture().await(10, TimeUnit.SECONDS), "the channel closes");
        } finally {
            firstGroup.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        }
    }

    /**
     * A graceful close waits for the end of stream it posted to complete; deregistering the channel meanwhile leaves
     * no loop to poll for that completion, so the close goes on at once. It used to wait for its linger timer, which
     * the group's shutdown cancels, and everything the channel held stayed allocated (checked after each test).
     */
    @Test
    @Timeout(60)
    void shouldFinishAGracefulCloseWhenTheChannelIsDeregisteredWhileItWaits() throws Exception {
        Channel server = listen(new ServerBootstrap().childOption(ChannelOption.ALLOW_HALF_CLOSURE, true)
                .childHandler(new Echo()));
        RdmaSocketChannel client = connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter()), server);
        ChannelFuture closed = client.eventLoop().submit(() -> {
            ChannelFuture close = client.close();
            assertFalse(close.isDone(), "the close waits for its end of stream to complete");
            client.deregister();
            return close;
        }).get();
        channels.clear();
        server.close().sync();
        // At once, before the linger timer could close it: the shutdown cancels that timer.
        group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        assertTrue(closed.isSuccess(), () -> "the close, once the loop is gone: " + closed);
    }

    /** Binding a bound listener again fails as a JDK server channel's does; the first listener used to leak. */
    @Test
    void shouldRefuseToBindAListenerTwice() throws Exception {
        Channel server = listen(new ServerBootstrap().childHandler(new ChannelInboundHandlerAdapter()));
        ChannelFuture again = server.bind(new InetSocketAddress(DeviceUnderTest.address(), 0)).await();
        assertTrue(again.cause() instanceof java.nio.channels.AlreadyBoundException, () -> "second bind: "
                + again.cause());
        assertTrue(server.isActive(), "the listener after the refused bind");
    }

    /** Keeps the channel it became active on. */
    private static class ChannelKeeper extends ChannelInboundHandlerAdapter {
        final AtomicReference<Channel> channel = new AtomicReference<>();

        @Override
        public void channelActive(ChannelHandlerContext ctx) {
            channel.set(ctx.channel());
            ctx.fireChannelActive();
        }
    }

    /** Counts and drops what arrives. */
    private static class Sink extends ChannelKeeper {
        final AtomicLong bytes = new AtomicLong();
        final CountDownLatch inactive = new CountDownLatch(1);
        final AtomicReference<Throwable> failure = new AtomicReference<>();

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            bytes.addAndGet(((ByteBuf) msg).readableBytes());
            ((ByteBuf) msg).release();
        }

        @Override
        public void channelInactive(ChannelHandlerContext ctx) {
            inactive.countDown();
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            // Peer death is expected in some tests; the channel closes itself.
            failure.compareAndSet(null, cause);
        }
    }

    /** Copies every byte the children receive into {@code received} and counts them in {@code receivedBytes}. */
    private static ChannelInboundHandlerAdapter collector(ByteArrayOutputStream received, AtomicLong receivedBytes) {
        return new ChannelInboundHandlerAdapter() {
            @Override
            public void channelRead(ChannelHandlerContext ctx, Object msg) throws Exception {
                ByteBuf buf = (ByteBuf) msg;
                synchronized (received) {
                    buf.getBytes(buf.readerIndex(), received, buf.readableBytes());
                }
                receivedBytes.addAndGet(buf.readableBytes());
                buf.release();
            }

            @Override
            public boolean isSharable() {
                return true;
            }
        };
    }

    private static void awaitBytes(AtomicLong counter, long expected) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (counter.get() < expected && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
        assertEquals(expected, counter.get());
    }

    @Test
    @Timeout(60)
    void shouldSendAllocatorBuffersWithoutCopy() throws Exception {
        Sink sink = new Sink();
        RdmaSocketChannel client = connectedClient(sink, true);

        ByteBuf eager = client.alloc().directBuffer(4096).writeZero(4096);
        ByteBuf large = client.alloc().directBuffer(256 * 1024).writeZero(256 * 1024);
        client.write(eager);
        client.writeAndFlush(large).sync();
        awaitBytes(sink.bytes, 4096 + 256 * 1024);

        RdmaChannelMetrics m = client.metrics();
        assertEquals(0, m.copiedBytes(), m.toString());
        assertEquals(4096, m.eagerBytes(), m.toString());
        assertEquals(256 * 1024, m.rendezvousBytes(), m.toString());
        assertTrue(client.eventLoopMetrics().rendezvousBytes() >= 256 * 1024);
    }

    /** Records the size of every read and the bytes in order; releases each buffer. */
    private static final class ReadRecorder extends ChannelKeeper {
        final LinkedBlockingQueue<Integer> readSizes = new LinkedBlockingQueue<>();
        final ByteArrayOutputStream bytes = new ByteArrayOutputStream();

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ByteBuf buf = (ByteBuf) msg;
            byte[] piece = new byte[buf.readableBytes()];
            buf.readBytes(piece);
            buf.release();
            synchronized (bytes) {
                bytes.write(piece, 0, piece.length);
            }
            readSizes.add(piece.length);
        }

        byte[] received() {
            synchronized (bytes) {
                return bytes.toByteArray();
            }
        }

        /** Waits up to ten seconds until at least {@code length} bytes have arrived. */
        void awaitReceived(int length) throws InterruptedException {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (received().length < length && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
        }
    }

    @Test
    @Timeout(60)
    void shouldSendEveryByteOnceWhenAWriteListenerFlushesWhileASendCompletes() throws Exception {
        // Three writes gathered into one SEND; the first one's listener writes and flushes again while the
        // completion is still removing the other two from the outbound buffer. Regression: they were sent twice.
        ReadRecorder recorder = new ReadRecorder();
        RdmaSocketChannel client = connectedClient(recorder, true);
        byte[] a = randomBytes(100, 11);
        byte[] b = randomBytes(100, 12);
        byte[] c = randomBytes(100, 13);
        byte[] d = randomBytes(100, 14);
        byte[] e = randomBytes(100, 15);
        client.eventLoop().submit(() -> {
            client.write(Unpooled.wrappedBuffer(a)).addListener(f -> client.writeAndFlush(Unpooled.wrappedBuffer(d)));
            client.write(Unpooled.wrappedBuffer(b));
            client.write(Unpooled.wrappedBuffer(c));
            client.flush();
        }).sync();
        recorder.awaitReceived(400);
        client.writeAndFlush(Unpooled.wrappedBuffer(e)).sync();
        recorder.awaitReceived(500);
        Thread.sleep(50);
        ByteArrayOutputStream expected = new ByteArrayOutputStream();
        for (byte[] part : new byte[][] {a, b, c, d, e}) {
            expected.write(part, 0, part.length);
        }
        assertArrayEquals(expected.toByteArray(), recorder.received());
    }

    @Test
    @Timeout(60)
    void shouldHandUpEachMessageWholeWithTheDefaultRecvByteBufAllocator() throws Exception {
        ReadRecorder recorder = new ReadRecorder();
        RdmaSocketChannel client = connectedClient(recorder, true);
        assertTrue(client.config().getRecvByteBufAllocator() instanceof RdmaRecvByteBufAllocator);

        byte[] eager = randomBytes(4096, 1);
        byte[] large = randomBytes(256 * 1024, 2);
        client.write(client.alloc().directBuffer(eager.length).writeBytes(eager));
        client.writeAndFlush(client.alloc().directBuffer(large.length).writeBytes(large)).sync();

        assertEquals(eager.length, recorder.readSizes.poll(10, TimeUnit.SECONDS));
        assertEquals(large.length, recorder.readSizes.poll(10, TimeUnit.SECONDS));
        byte[] expected = new byte[eager.length + large.length];
        System.arraycopy(eager, 0, expected, 0, eager.length);
        System.arraycopy(large, 0, expected, eager.length, large.length);
        assertArrayEquals(expected, recorder.received());
    }

    @Test
    @Timeout(60)
    void shouldHandUpAtMostTheGuessPerReadAsSlicesWithoutCopy() throws Exception {
        ReadRecorder recorder = new ReadRecorder();
        Channel server = listen(new ServerBootstrap()
                .childOption(ChannelOption.RCVBUF_ALLOCATOR, new FixedRecvByteBufAllocator(1000))
                .childHandler(recorder));
        RdmaSocketChannel client = client(server, new Sink());

        byte[] eager = randomBytes(4096, 3);
        byte[] large = randomBytes(256 * 1024, 4);
        client.write(client.alloc().directBuffer(eager.length).writeBytes(eager));
        client.writeAndFlush(client.alloc().directBuffer(large.length).writeBytes(large)).sync();

        int total = eager.length + large.length;
        recorder.awaitReceived(total);
        byte[] expected = new byte[total];
        System.arraycopy(eager, 0, expected, 0, eager.length);
        System.arraycopy(large, 0, expected, eager.length, large.length);
        assertArrayEquals(expected, recorder.received());
        int reads = 0;
        for (int size : recorder.readSizes) {
            assertTrue(size <= 1000, "a read handed up " + size + " bytes (guess: 1000)");
            reads++;
        }
        // ceil(4096 / 1000) + ceil(262144 / 1000): a message is cut at the guess, never merged with the next.
        assertEquals(5 + 263, reads);
        RdmaSocketChannel child = (RdmaSocketChannel) recorder.channel.get();
        assertEquals(total, child.metrics().receivedBytes());
        assertEquals(0, child.metrics().receivedCopiedBytes(), "slices of the received buffers, not copies");
        // Every slice released: the receive buffers are all posted again.
        assertEquals(0, (int) child.eventLoop().submit(child::heldReceiveBuffers).get());
    }

    @Test
    @Timeout(60)
    void shouldSplitWritesAboveThePeersLargestMessage() throws Exception {
        int max = 64 * 1024;
        CRC32 received = new CRC32();
        AtomicLong largest = new AtomicLong();
        AtomicLong bytes = new AtomicLong();
        Channel server = listen(new ServerBootstrap()
                .childOption(RdmaChannelOption.MAX_MESSAGE_SIZE, max)
                .childHandler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public void channelRead(ChannelHandlerContext ctx, Object msg) {
                        ByteBuf buf = (ByteBuf) msg;
                        largest.accumulateAndGet(buf.readableBytes(), Math::max);
                        byte[] copy = new byte[buf.readableBytes()];
                        buf.readBytes(copy);
                        received.update(copy);
                        bytes.addAndGet(copy.length);
                        buf.release();
                    }
                }));
        // Rendezvous from the peer's largest message on, so that every part of the 1 MiB goes by READ.
        RdmaSocketChannel client = connect(new Bootstrap().option(RdmaChannelOption.RENDEZVOUS_THRESHOLD, max)
                .handler(new Sink()), server);

        byte[] payload = new byte[1024 * 1024 + 4321];
        new Random(7).nextBytes(payload);
        CRC32 sent = new CRC32();
        sent.update(payload);
        ByteBuf registered = client.alloc().directBuffer(1024 * 1024).writeBytes(payload, 0, 1024 * 1024);
        client.write(registered);
        client.writeAndFlush(Unpooled.wrappedBuffer(payload, 1024 * 1024, 4321)).sync();
        awaitBytes(bytes, payload.length);

        assertEquals(sent.getValue(), received.getValue(), "bytes arrive intact and in order");
        assertTrue(largest.get() <= max, "largest message received: " + largest.get() + " (expected: <= " + max + ")");
        RdmaChannelMetrics m = client.metrics();
        assertEquals(1024 * 1024, m.rendezvousBytes(), "the registered 1 MiB went as 16 rendezvous of 64 KiB: " + m);
        assertEquals(4321, m.copiedBytes(), "only the heap tail was copied: " + m);
    }

    @Test
    @Timeout(60)
    void shouldCountExactlyTheCopiedBytesOfHeapBuffers() throws Exception {
        Sink sink = new Sink();
        RdmaSocketChannel client = connectedClient(sink, true);

        int[] sizes = {10, 300, 5000, 20_000, 300_000};
        long total = 0;
        for (int size : sizes) {
            client.write(Unpooled.wrappedBuffer(new byte[size]));
            total += size;
        }
        client.flush();
        awaitBytes(sink.bytes, total);
        assertEquals(total, client.metrics().copiedBytes(), client.metrics().toString());
    }

    @Test
    @Timeout(60)
    void shouldCountExactlyTheCopiedBytesOfForeignDirectBuffers() throws Exception {
        // A mapped file segment or any direct ByteBuffer the allocator did not hand out: copied once, and counted.
        Sink sink = new Sink();
        RdmaSocketChannel client = connectedClient(sink, true);

        int[] sizes = {10, 5000, 300_000};
        long total = 0;
        for (int size : sizes) {
            client.write(Unpooled.wrappedBuffer(java.nio.ByteBuffer.allocateDirect(size)));
            total += size;
        }
        client.flush();
        awaitBytes(sink.bytes, total);
        assertEquals(total, client.metrics().copiedBytes(), client.metrics().toString());
        assertEquals(300_000, client.metrics().rendezvousBytes(), client.metrics().toString());
    }

    @Test
    @Timeout(60)
    void shouldStallTheSenderWhenTheReceiverDoesNotRead() throws Exception {
        Sink sink = new Sink();
        RdmaSocketChannel client = connectedClient(sink, false);
        Channel child = awaitChild(sink);

        // Write far more than the receiver's credits cover: 32 receive buffers of 16 KiB.
        int chunk = 8 * 1024;
        int count = 512;
        AtomicLong completed = new AtomicLong();
        List<ChannelFuture> futures = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            ByteBuf buf = client.alloc().directBuffer(chunk).writeZero(chunk);
            ChannelFuture f = client.writeAndFlush(buf);
            f.addListener(x -> completed.addAndGet(chunk));
            futures.add(f);
        }
        Thread.sleep(500);
        assertFalse(client.isWritable(), "sender still writable while its peer reads nothing");
        long stalledAt = completed.get();
        long creditWindow = (long) ConnectionConfig.DEFAULT.receiveQueueDepth()
                * ConnectionConfig.DEFAULT.receiveBufferSize();
        assertTrue(stalledAt <= creditWindow, "completed " + stalledAt + " bytes, more than the credit window");
        assertEquals(0, sink.bytes.get());
        assertTrue(client.metrics().creditStalls() > 0);
        Thread.sleep(300);
        assertEquals(stalledAt, completed.get(), "bytes kept completing although nobody reads");

        child.config().setAutoRead(true);
        awaitBytes(sink.bytes, (long) chunk * count);
        for (ChannelFuture f : futures) {
            assertTrue(f.await(10, TimeUnit.SECONDS) && f.isSuccess());
        }
        assertTrue(client.isWritable());
    }

    @Test
    @Timeout(60)
    void shouldKeepUnreadRendezvousBoundedByCredits() throws Exception {
        // Rendezvous advertisements are small frames; an idle reader must not take more of them than its credits.
        CRC32 receivedCrc = new CRC32();
        AtomicLong received = new AtomicLong();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        Sink sink = new Sink() {
            @Override
            public void channelRead(ChannelHandlerContext ctx, Object msg) {
                ByteBuf buf = (ByteBuf) msg;
                receivedCrc.update(buf.nioBuffer());
                received.addAndGet(buf.readableBytes());
                buf.release();
            }

            @Override
            public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
                failure.compareAndSet(null, cause);
            }
        };
        Channel server = server(sink, false);
        // 64 KiB messages by rendezvous: the threshold below their size.
        RdmaSocketChannel client = connect(new Bootstrap().option(RdmaChannelOption.RENDEZVOUS_THRESHOLD, 16 * 1024)
                .option(ChannelOption.WRITE_BUFFER_WATER_MARK, new WriteBufferWaterMark(32 * 1024, 64 * 1024))
                .handler(new Sink()), server);
        Channel child = awaitChild(sink);

        int size = 64 * 1024;
        int count = 200;
        CRC32 sentCrc = new CRC32();
        for (int i = 0; i < count; i++) {
            byte[] bytes = new byte[size];
            java.util.Arrays.fill(bytes, (byte) i);
            sentCrc.update(bytes);
            client.write(client.alloc().directBuffer(size).writeBytes(bytes));
        }
        client.flush();
        Thread.sleep(300);
        assertEquals(0, received.get());
        assertTrue(client.metrics().creditStalls() > 0, "the sender never ran out of credits");

        child.config().setAutoRead(true);
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (received.get() < (long) size * count && failure.get() == null && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
        assertEquals(null, failure.get());
        assertEquals((long) size * count, received.get());
        assertEquals(sentCrc.getValue(), receivedCrc.getValue(), "CRC-32 of the received stream");
        assertEquals((long) size * count, client.metrics().rendezvousBytes(), client.metrics().toString());
    }

    private static Channel awaitChild(Sink sink) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (sink.channel.get() == null && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
        return sink.channel.get();
    }

    @Test
    @Timeout(30)
    void shouldNoticeADroppedPeerPromptly() throws Exception {
        Sink serverSink = new Sink();
        Sink clientSink = new Sink();
        RdmaSocketChannel client = client(server(serverSink, true), clientSink);
        RdmaSocketChannel child = (RdmaSocketChannel) awaitChild(serverSink);
        child.writeAndFlush(child.alloc().directBuffer(100).writeZero(100)).sync();
        awaitBytes(clientSink.bytes, 100);

        long start = System.nanoTime();
        provider.faults().dropConnection(child.queuePair());
        assertTrue(clientSink.inactive.await(5, TimeUnit.SECONDS), "client did not notice the dead peer");
        assertTrue(serverSink.inactive.await(5, TimeUnit.SECONDS), "server child did not notice the dead peer");
        assertTrue(System.nanoTime() - start < TimeUnit.SECONDS.toNanos(2));
        assertFalse(client.isActive());
    }

    /**
     * A peer host that vanishes without a reset (power lost, cable cut): the channel's write waits for an
     * acknowledgement that never comes, so the channel closes once the transport's retries would have run out on a NIC
     * (RETRY_EXC_ERR), naming it. It used to wait for TCP's own retransmission timeout, about 15 minutes. The vanished
     * side wrote first, and sooner: a host that is gone runs no timer of its own, so nothing of its reaches the client
     * (its transport used to time out first and close the link, which the client saw as a reset).
     */
    @Test
    @Timeout(30)
    // Only a peer on another host can vanish: the TCP path as between hosts, even in this JVM.
    @SetSystemProperty(key = "rdmabridge.soft.loopback", value = "tcp")
    @SetSystemProperty(key = "rdmabridge.soft.sameHost", value = "tcp")
    @SetSystemProperty(key = "rdmabridge.soft.transportTimeoutMillis", value = "1000")
    void shouldCloseNamingRetryExceededWhenThePeerHostVanishes() throws Exception {
        Sink serverSink = new Sink();
        Sink clientSink = new Sink();
        RdmaSocketChannel client = client(server(serverSink, true), clientSink);
        RdmaSocketChannel child = (RdmaSocketChannel) awaitChild(serverSink);
        provider.faults().silence(child.queuePair());
        child.writeAndFlush(child.alloc().directBuffer(100).writeZero(100));
        Thread.sleep(600); // more than a liveness check apart: were its timer to run, it would fire first
        client.writeAndFlush(client.alloc().directBuffer(100).writeZero(100));
        assertTrue(clientSink.inactive.await(10, TimeUnit.SECONDS), "the client waited on for its vanished peer");
        Throwable failure = clientSink.failure.get();
        // The work completion's status, with what it means, not only the link's teardown reason.
        assertTrue(failure != null && failure.getMessage().contains("RETRY_EXC_ERR")
                && failure.getMessage().contains("acknowledged nothing"), String.valueOf(failure));
    }

    @Test
    @Timeout(30)
    void shouldSeeChannelInactiveWhenThePeerCloses() throws Exception {
        Sink serverSink = new Sink();
        Sink clientSink = new Sink();
        client(server(serverSink, true), clientSink);
        Channel child = awaitChild(serverSink);
        child.close().sync();
        assertTrue(clientSink.inactive.await(5, TimeUnit.SECONDS));
    }

    @Test
    @Timeout(30)
    void shouldEndTheStreamGracefullyWhenAnAcceptedChannelClosesBeforeItsHandshakeEnds() throws Exception {
        // The child gets its own loop, so holding that loop keeps the child's ESTABLISHED event queued behind the
        // close while the listener's loop accepts and the client's loop completes the connect: the order a loaded
        // machine produces by chance (Netty's SocketRstTest.testNoRstIfSoLingerOnClose closes the child as soon as
        // it is initialized).
        EventLoopGroup childGroup = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
        EventLoopGroup clientGroup = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
        try {
            CountDownLatch clientConnected = new CountDownLatch(1);
            AtomicReference<Boolean> childActiveAtClose = new AtomicReference<>();
            AtomicReference<ChannelFuture> childClose = new AtomicReference<>();
            Channel server = new ServerBootstrap().group(group, childGroup).channel(RdmaServerSocketChannel.class)
                    .childHandler(new ChannelInitializer<Channel>() {
                        @Override
                        protected void initChannel(Channel ch) {
                            // Queued behind the registration task, which ends by answering the connect request.
                            ch.eventLoop().execute(() -> {
                                try {
                                    clientConnected.await(10, TimeUnit.SECONDS);
                                } catch (InterruptedException e) {
                                    Thread.currentThread().interrupt();
                                }
                                childActiveAtClose.set(ch.isActive());
                                childClose.set(ch.close());
                            });
                        }
                    }).bind(new InetSocketAddress("127.0.0.1", 0)).sync().channel();
            channels.add(server);
            Sink clientSink = new Sink();
            Channel client = new Bootstrap().group(clientGroup).channel(RdmaSocketChannel.class).handler(clientSink)
                    .connect(server.localAddress()).addListener(f -> clientConnected.countDown()).sync().channel();

            assertTrue(clientSink.inactive.await(10, TimeUnit.SECONDS), "the client never saw the close");
            assertEquals(Boolean.FALSE, childActiveAtClose.get(), "the close did not race the child's handshake");
            assertNull(clientSink.failure.get(), "a graceful close must not look like a reset to the peer");
            assertTrue(childClose.get().await(10, TimeUnit.SECONDS));
            assertTrue(childClose.get().isSuccess(), String.valueOf(childClose.get().cause()));
            assertFalse(client.isOpen());
        } finally {
            childGroup.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
            clientGroup.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        }
    }

    @Test
    @Timeout(30)
    void shouldAcceptAConnectionWhenTheServerChannelReadsIt() throws Exception {
        // rdma_cm has no kernel backlog that completes handshakes: the connect request waits for the server's read.
        Sink sink = new Sink();
        Channel server = listen(new ServerBootstrap().option(ChannelOption.AUTO_READ, false).childHandler(sink));
        ChannelFuture connect = startConnect(new Bootstrap().handler(new Sink()), server.localAddress());

        assertFalse(connect.await(300, TimeUnit.MILLISECONDS), "connected before the server channel read");
        assertNull(sink.channel.get());
        server.read();
        assertTrue(connect.await(10, TimeUnit.SECONDS));
        assertTrue(connect.isSuccess(), String.valueOf(connect.cause()));
        connect.channel().writeAndFlush(Unpooled.wrappedBuffer(new byte[100])).sync();
        awaitBytes(sink.bytes, 100);
    }

    @Test
    @Timeout(30)
    void shouldRefuseConnectionsToAClosedPort() throws Exception {
        Channel server = server(new Sink(), true);
        InetSocketAddress address = (InetSocketAddress) server.localAddress();
        server.close().sync();
        channels.remove(server);
        ChannelFuture f = new Bootstrap().group(group).channel(RdmaSocketChannel.class).handler(new Sink())
                .connect(address).await();
        assertTrue(f.cause() instanceof java.net.ConnectException, String.valueOf(f.cause()));
        assertTrue(f.cause().getMessage().contains("connection refused"), f.cause().getMessage());
    }

    private RdmaSocketChannel boundClient(InetSocketAddress local) throws InterruptedException {
        RdmaSocketChannel ch = (RdmaSocketChannel) new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                .handler(new Sink()).bind(local).sync().channel();
        channels.add(0, ch);
        return ch;
    }

    @Test
    @Timeout(30)
    void shouldConnectFromTheAddressTheClientBoundTo() throws Exception {
        Sink serverSink = new Sink();
        Channel server = server(serverSink, true);
        RdmaSocketChannel client = boundClient(new InetSocketAddress("127.0.0.1", 0));
        InetSocketAddress bound = client.localAddress();
        assertEquals("127.0.0.1", bound.getAddress().getHostAddress(), "bound address before connect");
        assertNotEquals(0, bound.getPort(), "port 0 picks a port");
        assertFalse(client.isActive());

        client.connect(server.localAddress()).sync();
        assertEquals(bound, client.localAddress(), "the connection leaves from the bound address");
        Channel child = awaitChild(serverSink);
        assertEquals(bound, child.remoteAddress(), "the server's child sees the client's bound address");
        client.writeAndFlush(Unpooled.wrappedBuffer(new byte[1000])).sync();
        awaitBytes(serverSink.bytes, 1000);
    }

    @Test
    @Timeout(30)
    void shouldConnectFromTheLocalAddressGivenToConnect() throws Exception {
        Sink serverSink = new Sink();
        Channel server = server(serverSink, true);
        RdmaSocketChannel client = (RdmaSocketChannel) new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                .handler(new Sink()).connect(server.localAddress(), new InetSocketAddress("127.0.0.1", 0)).sync()
                .channel();
        channels.add(0, client);
        assertEquals("127.0.0.1", client.localAddress().getAddress().getHostAddress());
        assertNotEquals(0, client.localAddress().getPort());
        assertEquals(client.localAddress(), awaitChild(serverSink).remoteAddress());
    }

    @Test
    @Timeout(30)
    void shouldRefuseBindingAnAddressAnotherClientHolds() throws Exception {
        InetSocketAddress taken = boundClient(new InetSocketAddress("127.0.0.1", 0)).localAddress();
        String named = "127.0.0.1:" + taken.getPort();

        ChannelFuture bind = new Bootstrap().group(group).channel(RdmaSocketChannel.class).handler(new Sink())
                .bind(taken).await();
        assertTrue(bind.cause() instanceof BindException, String.valueOf(bind.cause()));
        assertTrue(bind.cause().getMessage().contains(named), bind.cause().getMessage());
        assertTrue(bind.cause().getCause() instanceof RdmaException, "the provider's error is attached");

        Channel server = server(new Sink(), true);
        ChannelFuture connect = new Bootstrap().group(group).channel(RdmaSocketChannel.class).handler(new Sink())
                .connect(server.localAddress(), taken).await();
        assertTrue(connect.cause() instanceof BindException, String.valueOf(connect.cause()));
        assertTrue(connect.cause().getMessage().contains(named), connect.cause().getMessage());
    }

    @Test
    @Timeout(30)
    void shouldRefuseALocalAddressThatIsNotAnInetSocketAddress() throws Exception {
        ChannelFuture bind = new Bootstrap().group(group).channel(RdmaSocketChannel.class).handler(new Sink())
                .bind(new LocalAddress("not-an-ip-address")).await();
        assertTrue(bind.cause() instanceof IllegalArgumentException, String.valueOf(bind.cause()));
        assertTrue(bind.cause().getMessage().contains("expected: an InetSocketAddress"), bind.cause().getMessage());
    }

    @Test
    @Timeout(30)
    void shouldReleaseTheIdOfABoundChannelThatNeverConnected() throws Exception {
        long idsBefore = provider.resourceUsage().cmIds();
        RdmaSocketChannel client = boundClient(new InetSocketAddress("127.0.0.1", 0));
        InetSocketAddress bound = client.localAddress();
        assertEquals(idsBefore + 1, provider.resourceUsage().cmIds(), "the bound channel holds one id");

        client.close().sync();
        assertEquals(idsBefore, provider.resourceUsage().cmIds(), "closing the channel destroys its id");
        // The port's reservation ended with the id: the same address can be bound again.
        assertEquals(bound, boundClient(bound).localAddress());
    }

    @Test
    @Timeout(60)
    void shouldReleaseReceivedBuffersHandedToAnotherThread() throws Exception {
        LinkedBlockingQueue<ByteBuf> handedOff = new LinkedBlockingQueue<>();
        RdmaSocketChannel client = connectedClient(new ChannelInboundHandlerAdapter() {
            @Override
            public void channelRead(ChannelHandlerContext ctx, Object msg) {
                handedOff.add((ByteBuf) msg);
            }
        }, true);
        long total = 0;
        for (int i = 0; i < 200; i++) {
            client.writeAndFlush(client.alloc().directBuffer(1000).writeZero(1000));
            total += 1000;
        }
        long received = 0;
        while (received < total) {
            ByteBuf b = handedOff.poll(10, TimeUnit.SECONDS);
            assertTrue(b != null, "stalled after " + received + " bytes");
            received += b.readableBytes();
            b.release();
        }
        assertEquals(total, received);
    }

    @Test
    @Timeout(30)
    void shouldSendFileRegionsByTheRendezvousThresholdSetLast(@TempDir File dir) throws Exception {
        int size = 64 * 1024;
        FileTransfer t = fileTransfer(dir, size, 5);

        // Below the default threshold (256 KiB): an eager SEND.
        t.client.writeAndFlush(new DefaultFileRegion(t.file, 0, size)).sync();
        awaitBytes(t.receivedBytes, size);
        assertEquals(0, t.client.metrics().rendezvousBytes(), t.client.metrics().toString());
        // Set on the connected channel, the threshold applies to the next region of the same file writer.
        t.client.config().setOption(RdmaChannelOption.RENDEZVOUS_THRESHOLD, 16 * 1024);
        t.client.writeAndFlush(new DefaultFileRegion(t.file, 0, size)).sync();
        awaitBytes(t.receivedBytes, 2L * size);
        assertEquals(size, t.client.metrics().rendezvousBytes(), t.client.metrics().toString());
        synchronized (t.received) {
            byte[] got = t.received.toByteArray();
            assertArrayEquals(t.content, Arrays.copyOfRange(got, 0, size));
            assertArrayEquals(t.content, Arrays.copyOfRange(got, size, 2 * size));
        }
    }

    /**
     * An empty region between two buffers of one flush (an HTTP server's empty file, then the next response): the
     * buffers are copied into one frame across it. Its completion removed the first buffer, stopped at the region, and
     * left the second in the outbound buffer as if unsent: it went out again.
     */
    @Test
    @Timeout(30)
    void shouldSendTheBuffersAroundAnEmptyFileRegionOnce(@TempDir File dir) throws Exception {
        FileTransfer t = fileTransfer(dir, 1, 9);
        byte[] before = "before the empty file|".getBytes(StandardCharsets.UTF_8);
        byte[] after = "|after it".getBytes(StandardCharsets.UTF_8);
        t.client.write(Unpooled.wrappedBuffer(before));
        ChannelFuture empty = t.client.write(new DefaultFileRegion(t.file, 0, 0));
        t.client.writeAndFlush(Unpooled.wrappedBuffer(after)).sync();
        assertTrue(empty.isSuccess(), () -> "the empty region: " + empty.cause());
        // Then one more message, so that a duplicate sent later than the second buffer is there to be seen too.
        byte[] last = "|last".getBytes(StandardCharsets.UTF_8);
        t.client.writeAndFlush(Unpooled.wrappedBuffer(last)).sync();
        awaitBytes(t.receivedBytes, before.length + after.length + last.length);
        Thread.sleep(100);
        synchronized (t.received) {
            assertEquals("before the empty file||after it|last", t.received.toString(StandardCharsets.UTF_8));
        }
    }

    /**
     * A heap buffer too large for a frame's scratch area is copied into a staging block; released by the application
     * while it was queued, it throws part-way through that frame. The staging block was never freed (its slab stayed
     * registered after the group shut down), and the half-built frame kept the connection from sending any control
     * frame: the peer never heard of the shutdown of output that Netty makes on such an error.
     */
    @Test
    @Timeout(30)
    void shouldDropTheFrameABufferReleasedWhileQueuedBrokeAndStillShutDownOutput() throws Exception {
        assertABufferReleasedWhileQueuedFailsItsWriteAndShutsOutputDown(client -> 16 * 1024);
    }

    /**
     * The same above the rendezvous threshold: a heap buffer is copied into a staging block for the peer to READ;
     * released by the application while it was queued, its copy threw and the block was never freed.
     */
    @Test
    @Timeout(30)
    void shouldFreeTheStagingBlockOfARendezvousWhoseBufferWasReleasedWhileQueued() throws Exception {
        assertABufferReleasedWhileQueuedFailsItsWriteAndShutsOutputDown(
                client -> 2 * client.config().getOption(RdmaChannelOption.RENDEZVOUS_THRESHOLD));
    }

    /**
     * Writes a heap buffer of {@code size} bytes and releases it before the flush: the write fails with the release's
     * error, Netty's shutdown of output for it reaches the peer, and (checked after the test with every other
     * registered byte) the staging memory comes back.
     */
    private void assertABufferReleasedWhileQueuedFailsItsWriteAndShutsOutputDown(
            ToIntFunction<RdmaSocketChannel> size) throws Exception {
        CompletableFuture<Void> peerSawTheEnd = new CompletableFuture<>();
        RdmaSocketChannel client = connectedClient(new ChannelInboundHandlerAdapter() {
            @Override
            public void channelRead(ChannelHandlerContext ctx, Object msg) {
                ReferenceCountUtil.release(msg);
            }

            @Override
            public void channelInactive(ChannelHandlerContext ctx) {
                peerSawTheEnd.complete(null);
            }
        }, true);
        int bytes = size.applyAsInt(client);
        ByteBuf broken = Unpooled.buffer(bytes).writeZero(bytes);
        ChannelFuture write = client.eventLoop().submit(() -> {
            ChannelFuture f = client.write(broken);
            broken.release();
            client.flush();
            return f;
        }).get(10, TimeUnit.SECONDS);
        assertTrue(write.await(10, TimeUnit.SECONDS), "the write did not complete");
        // Netty shuts output down for the error and fails the write with that, naming the error as its cause.
        assertInstanceOf(IllegalReferenceCountException.class, write.cause().getCause(),
                () -> "the write: " + write.cause());
        try {
            peerSawTheEnd.get(10, TimeUnit.SECONDS);
        } catch (TimeoutException e) {
            fail("the peer never heard of the shutdown of output within 10 s (no SHUTDOWN frame was sent)");
        }
    }

    /** A file of {@code size} random bytes, a server that collects what it reads, and a client connected to it. */
    private record FileTransfer(File file, byte[] content, ByteArrayOutputStream received, AtomicLong receivedBytes,
                                RdmaSocketChannel client) {
    }

    private FileTransfer fileTransfer(File dir, int size, long seed) throws Exception {
        byte[] content = new byte[size];
        new Random(seed).nextBytes(content);
        File file = new File(dir, "data");
        Files.write(file.toPath(), content);
        ByteArrayOutputStream received = new ByteArrayOutputStream();
        AtomicLong receivedBytes = new AtomicLong();
        return new FileTransfer(file, content, received, receivedBytes,
                connectedClient(collector(received, receivedBytes), true));
    }

    @Test
    @Timeout(30)
    void shouldSendAFileRegionMadeFromAFileThatIsNotOpenYet(@TempDir File dir) throws Exception {
        FileTransfer t = fileTransfer(dir, 300_000, 7);
        byte[] content = t.content;
        File file = t.file;
        ByteArrayOutputStream received = t.received;
        AtomicLong receivedBytes = t.receivedBytes;
        RdmaSocketChannel client = t.client;

        // DefaultFileRegion(File, ...) opens its FileChannel only when first transferred (Spark's shuffle files).
        client.write(new DefaultFileRegion(file, 1000, 100));
        client.writeAndFlush(new DefaultFileRegion(file, 5000, 200_000)).sync();
        awaitBytes(receivedBytes, 200_100);
        byte[] expected = new byte[200_100];
        System.arraycopy(content, 1000, expected, 0, 100);
        System.arraycopy(content, 5000, expected, 100, 200_000);
        synchronized (received) {
            assertArrayEquals(expected, received.toByteArray());
        }
        assertEquals(200_100, client.metrics().fileBytes(), client.metrics().toString());
    }

    @Test
    @Timeout(30)
    void shouldSendWhatWasAppendedToAFileSinceAnEarlierRegionOfTheSameChannel(@TempDir File dir) throws Exception {
        // A log that grows while it is served: the chunk mapped for the first region ends where the file ended then.
        // Reused for the second region, it held none of its bytes: an empty frame went out, and the peer closed.
        byte[] content = new byte[2000];
        new Random(11).nextBytes(content);
        File file = new File(dir, "log");
        Files.write(file.toPath(), Arrays.copyOf(content, 1000));
        ByteArrayOutputStream received = new ByteArrayOutputStream();
        AtomicLong receivedBytes = new AtomicLong();
        RdmaSocketChannel client = connectedClient(collector(received, receivedBytes), true);
        try (FileChannel log = FileChannel.open(file.toPath(), StandardOpenOption.READ)) {
            // Regions close their FileChannel when released: the first stays retained until the second is sent.
            DefaultFileRegion first = new DefaultFileRegion(log, 0, 1000);
            first.retain();
            client.writeAndFlush(first).sync();
            awaitBytes(receivedBytes, 1000);
            Files.write(file.toPath(), Arrays.copyOfRange(content, 1000, 2000), StandardOpenOption.APPEND);
            client.writeAndFlush(new DefaultFileRegion(log, 1000, 1000).retain()).sync();
            awaitBytes(receivedBytes, 2000);
            assertTrue(client.isActive(), "the connection closed");
            synchronized (received) {
                assertArrayEquals(content, received.toByteArray());
            }
            first.release();
        }
    }

    @Test
    @Timeout(30)
    void shouldSendWhatAFileHoldsWhenItsRegionIsWrittenNotWhatAnEarlierRegionRead(@TempDir File dir) throws Exception {
        // Where the kernel refuses to register file mappings (Linux before 6.2), chunks are copies: one kept for a
        // later region of the same FileChannel sent the bytes the file held before it was rewritten in place.
        byte[] before = new byte[1000];
        byte[] after = new byte[1000];
        new Random(12).nextBytes(before);
        new Random(13).nextBytes(after);
        File file = new File(dir, "data");
        Files.write(file.toPath(), before);
        ByteArrayOutputStream received = new ByteArrayOutputStream();
        AtomicLong receivedBytes = new AtomicLong();
        RdmaSocketChannel client = connectedClient(collector(received, receivedBytes), true);
        try (FileChannel data = FileChannel.open(file.toPath(), StandardOpenOption.READ)) {
            provider.faults().failRegistrations(1);
            DefaultFileRegion first = new DefaultFileRegion(data, 0, 1000);
            first.retain();
            client.writeAndFlush(first).sync();
            awaitBytes(receivedBytes, 1000);
            Files.write(file.toPath(), after, StandardOpenOption.WRITE);
            client.writeAndFlush(new DefaultFileRegion(data, 0, 1000).retain()).sync();
            awaitBytes(receivedBytes, 2000);
            byte[] expected = Arrays.copyOf(before, 2000);
            System.arraycopy(after, 0, expected, 1000, 1000);
            synchronized (received) {
                assertArrayEquals(expected, received.toByteArray());
            }
            first.release();
        } finally {
            provider.faults().reset();
        }
    }

    @Test
    @Timeout(30)
    void shouldNameTheCauseWhenAReceiveCannotBeRepostedAfterTheApplicationReleasedIt() throws Exception {
        // The application releases a received buffer between two polls; reposting it fails (ibv_post_recv's ENOMEM).
        // Polls reported a failure only in the turn it came in, so the channel closed as if its peer had gone,
        // without telling the pipeline why.
        LinkedBlockingQueue<ByteBuf> held = new LinkedBlockingQueue<>();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        AtomicReference<Channel> child = new AtomicReference<>();
        RdmaSocketChannel client = connectedClient(new ChannelInboundHandlerAdapter() {
            @Override
            public void channelActive(ChannelHandlerContext ctx) {
                child.set(ctx.channel());
            }

            @Override
            public void channelRead(ChannelHandlerContext ctx, Object msg) {
                held.add((ByteBuf) msg);
            }

            @Override
            public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
                failure.compareAndSet(null, cause);
            }
        }, true);
        client.writeAndFlush(client.alloc().directBuffer(100).writeZero(100)).sync();
        ByteBuf received = held.poll(10, TimeUnit.SECONDS);
        assertTrue(received != null, "nothing arrived");
        Channel accepted = child.get();
        try {
            provider.faults().failReceivePosts(1);
            accepted.eventLoop().submit(() -> received.release()).sync();
            assertTrue(accepted.closeFuture().await(5, TimeUnit.SECONDS),
                    "the channel stayed open after its receive could not be reposted");
        } finally {
            provider.faults().reset();
        }
        assertTrue(failure.get() != null && failure.get().getMessage().contains("reposting a receive failed"),
                () -> "the cause reported: " + failure.get());
    }
}
