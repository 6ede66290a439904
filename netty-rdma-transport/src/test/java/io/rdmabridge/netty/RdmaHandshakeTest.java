package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import io.netty.channel.ConnectTimeoutException;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.SimpleChannelInboundHandler;
import io.rdmabridge.connection.FrameHeader;
import io.rdmabridge.connection.Handshake;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.WcStatus;
import org.junit.jupiter.api.Test;
import org.junitpioneer.jupiter.SetSystemProperty;

import java.net.ConnectException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The channel's handshake runs on the queue pair (a HELLO frame each way), never in connection-manager private data,
 * so it works on providers that deliver none (DiSNI 2.1). A peer that speaks raw verbs tries what a foreign or hostile
 * endpoint would: another frame first, a bad HELLO, a second HELLO, no HELLO at all. Each attempt fails that one
 * connection with the cause named, the listener keeps serving a good client, and every resource returns to zero.
 */
class RdmaHandshakeTest extends AbstractSoftChannelTest {

    /** Server whose children echo and report their failures. */
    private final LinkedBlockingQueue<Throwable> childFailures = new LinkedBlockingQueue<>();
    private final LinkedBlockingQueue<Channel> childrenClosed = new LinkedBlockingQueue<>();

    private Channel echoServer(int handshakeTimeoutMillis) throws InterruptedException {
        return echoServer(handshakeTimeoutMillis, false);
    }

    private Channel echoServer(int handshakeTimeoutMillis, boolean halfClosure) throws InterruptedException {
        return listen(echoBootstrap(handshakeTimeoutMillis, halfClosure));
    }

    private ServerBootstrap echoBootstrap(int handshakeTimeoutMillis, boolean halfClosure) {
        return new ServerBootstrap()
                .childOption(ChannelOption.CONNECT_TIMEOUT_MILLIS, handshakeTimeoutMillis)
                .childOption(ChannelOption.ALLOW_HALF_CLOSURE, halfClosure)
                .childHandler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public void channelRead(ChannelHandlerContext ctx, Object msg) {
                        ctx.writeAndFlush(msg);
                    }

                    @Override
                    public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
                        childFailures.add(cause);
                        ctx.close();
                    }

                    @Override
                    public void channelUnregistered(ChannelHandlerContext ctx) {
                        childrenClosed.add(ctx.channel());
                    }

                    @Override
                    public boolean isSharable() {
                        return true;
                    }
                });
    }

    /** A good client still gets its echo: the listener and its loop survived. */
    private void assertEchoes(Channel server) throws Exception {
        CompletableFuture<String> echo = new CompletableFuture<>();
        RdmaSocketChannel client = connect(new Bootstrap().handler(new SimpleChannelInboundHandler<ByteBuf>() {
            @Override
            protected void channelRead0(ChannelHandlerContext ctx, ByteBuf msg) {
                echo.complete(msg.toString(StandardCharsets.UTF_8));
            }
        }), server);
        client.writeAndFlush(Unpooled.copiedBuffer("still serving", StandardCharsets.UTF_8));
        assertEquals("still serving", echo.get(10, TimeUnit.SECONDS));
    }

    private static byte[] hello(Handshake h) {
        return h.encode();
    }

    private Throwable awaitChildFailure() throws InterruptedException {
        Throwable cause = childFailures.poll(10, TimeUnit.SECONDS);
        assertNotNull(cause, "the accepted channel reported no failure within 10 s");
        Channel closed = childrenClosed.poll(10, TimeUnit.SECONDS);
        assertNotNull(closed, "the accepted channel was not closed within 10 s");
        assertFalse(closed.isOpen());
        return cause;
    }

    /**
     * Connects a raw peer to {@code server}, has {@code send} send its frames, and returns the failure of the
     * connection it was accepted on ({@link #awaitChildFailure()}); the peer is closed again.
     */
    private Throwable failureOfRawPeer(Channel server, Consumer<RawVerbsPeer> send) throws Exception {
        try (RawVerbsPeer raw = RawVerbsPeer.connect(provider, server)) {
            send.accept(raw);
            return awaitChildFailure();
        }
    }

    @Test
    void shouldConnectWithoutAnyPrivateData() throws Exception {
        // The soft provider delivers private data; the channel must not need it: it sends none (the raw listener
        // sees an empty connect request) and still connects to a listener that accepts with none.
        try (RawVerbsPeer raw = listenRaw()) {
            ChannelFuture connecting = connectToRaw(new Bootstrap().handler(new ChannelInboundHandlerAdapter()), raw);
            assertEquals(0, raw.lastEventPrivateDataLength(), "private data in the channel's connect request");
            // Not active until the peer's HELLO has arrived.
            assertFalse(connecting.channel().isActive());
            assertEquals(WcStatus.SUCCESS, raw.sendFrame(FrameHeader.HELLO,
                    hello(new Handshake(4096, 4, 4, 1 << 20))));
            assertTrue(connecting.await(10, TimeUnit.SECONDS));
            assertTrue(connecting.isSuccess(), () -> "connect failed: " + connecting.cause());
            assertTrue(connecting.channel().isActive());
            assertEquals(FrameHeader.HELLO, raw.receivedFrameType(), "the channel's first frame");
        }
    }

    @Test
    void shouldCloseAnAcceptedConnectionWhoseFirstFrameIsNotAHello() throws Exception {
        Channel server = echoServer(10_000);
        Throwable cause = failureOfRawPeer(server,
                raw -> raw.sendFrame(FrameHeader.DATA, "no hello".getBytes(StandardCharsets.UTF_8)));
        assertInstanceOf(ConnectException.class, cause);
        assertTrue(cause.getMessage().contains("the first frame from the peer is DATA (expected: HELLO"),
                cause.getMessage());
        assertEchoes(server);
    }

    @Test
    void shouldCloseAnAcceptedConnectionWhoseHelloIsBad() throws Exception {
        Channel server = echoServer(10_000);
        byte[] foreign = hello(new Handshake(4096, 4, 4, 1 << 20));
        foreign[0] ^= 0x55;
        Throwable cause = failureOfRawPeer(server, raw -> raw.sendFrame(FrameHeader.HELLO, foreign));
        assertTrue(cause.getMessage().contains("handshake failed: handshake magic"), cause.getMessage());
        assertEchoes(server);
    }

    @Test
    void shouldFailTheConnectionOnASecondHello() throws Exception {
        Channel server = echoServer(10_000);
        byte[] hello = hello(new Handshake(4096, 4, 4, 1 << 20));
        Throwable cause = failureOfRawPeer(server, raw -> {
            raw.sendFrame(FrameHeader.HELLO, hello);
            raw.sendFrame(FrameHeader.HELLO, hello);
        });
        assertTrue(cause.getMessage().contains("a second HELLO frame"), cause.getMessage());
        assertEchoes(server);
    }

    /**
     * A HELLO whose header returns credits the peer cannot hold fails the handshake: the connect fails and the
     * channel never becomes active. It used to succeed, fire channelActive, and only then fail the channel.
     */
    @Test
    void shouldFailTheConnectWhenTheServersHelloReturnsCreditsItDoesNotHold() throws Exception {
        try (RawVerbsPeer raw = listenRaw()) {
            AtomicBoolean active = new AtomicBoolean();
            ChannelFuture connecting = connectToRaw(new Bootstrap().handler(new ChannelInboundHandlerAdapter() {
                @Override
                public void channelActive(ChannelHandlerContext ctx) {
                    active.set(true);
                }
            }), raw);
            assertEquals(WcStatus.SUCCESS, raw.sendFrame(FrameHeader.HELLO, 1, 0, 0,
                    hello(new Handshake(4096, 4, 4, 1 << 20))));
            assertTrue(connecting.await(10, TimeUnit.SECONDS));
            assertInstanceOf(ConnectException.class, connecting.cause());
            assertTrue(connecting.cause().getMessage().contains("peer returned 1 data credits but holds only 0"),
                    connecting.cause()::toString);
            assertTrue(connecting.channel().closeFuture().await(10, TimeUnit.SECONDS), "the channel did not close");
            assertFalse(active.get(), "channelActive fired");
        }
    }

    @Test
    void shouldCloseAnAcceptedConnectionWhoseHelloAcknowledgesARendezvousNeverSent() throws Exception {
        Channel server = echoServer(10_000);
        byte[] hello = hello(new Handshake(4096, 4, 4, 1 << 20));
        Throwable cause = failureOfRawPeer(server,
                raw -> assertEquals(WcStatus.SUCCESS, raw.sendFrame(FrameHeader.HELLO, 0, 0, 1, hello)));
        assertInstanceOf(ConnectException.class, cause);
        assertTrue(cause.getMessage().contains("peer acknowledged 1 rendezvous but only 0 are outstanding"),
                cause.getMessage());
        assertEchoes(server);
    }

    @Test
    void shouldFailTheConnectionWhenAnRdmaWriteWithImmediateTakesAReceive() throws Exception {
        // Of no bytes it needs no rkey, and it takes a receive all the same: what the slot holds is no frame.
        Channel server = echoServer(10_000);
        Throwable cause = failureOfRawPeer(server, raw -> {
            raw.sendFrame(FrameHeader.HELLO, hello(new Handshake(4096, 4, 4, 1 << 20)));
            assertEquals(WcStatus.SUCCESS, raw.writeWithImmediate(7));
        });
        assertTrue(cause.getMessage().contains("the peer consumed a receive with RECV_RDMA_WITH_IMM (expected: RECV"),
                cause.getMessage());
        assertEchoes(server);
    }

    @Test
    void shouldFailTheConnectionOnASecondShutdown() throws Exception {
        // With half-closure the channel stays open after the peer's end of stream; each further SHUTDOWN was taken
        // as one more end of stream, told to the application each time.
        Channel server = echoServer(10_000, true);
        Throwable cause = failureOfRawPeer(server, raw -> {
            raw.sendFrame(FrameHeader.HELLO, hello(new Handshake(4096, 4, 4, 1 << 20)));
            raw.sendFrame(FrameHeader.SHUTDOWN, new byte[0]);
            raw.sendFrame(FrameHeader.SHUTDOWN, new byte[0]);
        });
        assertTrue(cause.getMessage().contains("SHUTDOWN frame after SHUTDOWN"), cause.getMessage());
        assertEchoes(server);
    }

    @Test
    void shouldTimeOutAnAcceptedConnectionThatNeverSendsItsHello() throws Exception {
        Channel server = echoServer(300);
        Throwable cause = failureOfRawPeer(server, raw -> { });
        assertInstanceOf(ConnectTimeoutException.class, cause);
        assertTrue(cause.getMessage().startsWith("no rdma-bridge handshake from"), cause.getMessage());
        assertEchoes(server);
    }

    @Test
    void shouldFailTheConnectWhenTheServerNeverSendsItsHello() throws Exception {
        try (RawVerbsPeer raw = listenRaw()) {
            ChannelFuture connecting = connectToRaw(new Bootstrap().option(ChannelOption.CONNECT_TIMEOUT_MILLIS, 300)
                    .handler(new ChannelInboundHandlerAdapter()), raw);
            assertTrue(connecting.await(10, TimeUnit.SECONDS));
            assertInstanceOf(ConnectTimeoutException.class, connecting.cause());
            assertTrue(connecting.cause().getMessage().contains(
                    ", but no rdma-bridge handshake came within 300 ms (CONNECT_TIMEOUT_MILLIS)"),
                    connecting.cause()::toString);
            assertTrue(connecting.channel().closeFuture().await(10, TimeUnit.SECONDS), "the channel did not close");
        }
    }

    @Test
    @SetSystemProperty(key = RdmaChannelSetup.HANDSHAKE_TIMEOUT_PROPERTY, value = "300")
    void shouldFailAConnectWithoutTimeoutOnceConnectedToAServerThatNeverSendsItsHello() throws Exception {
        // CONNECT_TIMEOUT_MILLIS 0 waits as long as the connection manager takes, as NIO waits for the kernel's
        // connect; once connected, the handshake is bounded, as the accepted side's is.
        try (RawVerbsPeer raw = listenRaw()) {
            ChannelFuture connecting = connectToRaw(new Bootstrap().option(ChannelOption.CONNECT_TIMEOUT_MILLIS, 0)
                    .handler(new ChannelInboundHandlerAdapter()), raw);
            assertTrue(connecting.await(10, TimeUnit.SECONDS),
                    "a connect without a timeout waited for ever for a HELLO that never came");
            assertInstanceOf(ConnectTimeoutException.class, connecting.cause());
            assertTrue(connecting.cause().getMessage().contains(", but no rdma-bridge handshake came within 300 ms"
                    + " (CONNECT_TIMEOUT_MILLIS is 0: rdmabridge.handshakeTimeoutMillis)"),
                    connecting.cause()::toString);
            assertTrue(connecting.channel().closeFuture().await(10, TimeUnit.SECONDS), "the channel did not close");
        }
    }

    @Test
    void shouldBoundAcceptedConnectionsWhoseHelloHasNotArrivedBySoBacklog() throws Exception {
        // Each accepted connection holds a queue pair and its receive buffers until its HELLO arrives or the
        // handshake times out; with autoRead on, the children left the backlog at once and nothing bounded them.
        Channel server = listen(new ServerBootstrap().option(ChannelOption.SO_BACKLOG, 2)
                .childHandler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public boolean isSharable() {
                        return true;
                    }
                }));
        InetSocketAddress address = (InetSocketAddress) server.localAddress();
        long logged = RdmaServerSocketChannel.REFUSALS.emitted();
        long suppressed = RdmaServerSocketChannel.REFUSALS.suppressed();
        try (RawVerbsPeer first = RawVerbsPeer.connect(provider, address);
             RawVerbsPeer second = RawVerbsPeer.connect(provider, address);
             RawVerbsPeer third = RawVerbsPeer.attempt(provider, address, () -> { })) {
            assertEquals(CmEventType.REJECTED, third.outcome(),
                    "a third connection was accepted while two had not sent their HELLO (SO_BACKLOG 2)");
        }
        // The operator is told (at most a line per 10 s): the peer may never see the reject's reason.
        assertTrue(RdmaServerSocketChannel.REFUSALS.emitted() > logged
                || RdmaServerSocketChannel.REFUSALS.suppressed() > suppressed, "the refusal was not logged");
        // Once they are gone (their children close on the disconnect), the listener takes connections again.
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        CmEventType outcome;
        do {
            try (RawVerbsPeer again = RawVerbsPeer.attempt(provider, address, () -> { })) {
                outcome = again.outcome();
            }
        } while (outcome != CmEventType.ESTABLISHED && System.nanoTime() < deadline);
        assertEquals(CmEventType.ESTABLISHED, outcome, "the listener stayed full");
    }

    /**
     * An accepted channel posts its receive buffers (about 1.5 MiB with the default options) before it accepts, and a
     * peer that never sends its HELLO holds them until the handshake times out: within SO_BACKLOG, enough such peers
     * exhausted direct memory and stalled every loop. With 2 MiB of handshake memory the children's loop takes one.
     */
    @Test
    @SetSystemProperty(key = RdmaIoHandler.HANDSHAKE_MEMORY_PROPERTY, value = "2097152")
    void shouldRejectAcceptedConnectionsPastTheLoopsHandshakeMemory() throws Exception {
        EventLoopGroup children = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
        try {
            Channel server = listen(echoBootstrap(30_000, false), children);
            InetSocketAddress address = (InetSocketAddress) server.localAddress();
            try (RawVerbsPeer silent = RawVerbsPeer.connect(provider, address);
                 RawVerbsPeer next = RawVerbsPeer.attempt(provider, address, () -> { })) {
                assertEquals(CmEventType.REJECTED, next.outcome(), "a second connection was accepted while the"
                        + " first held the loop's handshake memory");
                Throwable cause = childFailures.poll(10, TimeUnit.SECONDS);
                assertNotNull(cause, "the refused child reported no failure");
                assertTrue(cause.getMessage().contains(RdmaIoHandler.HANDSHAKE_MEMORY_PROPERTY), cause.getMessage());
            }
            // The silent peer is gone, and its child with it: its handshake memory came back, or this client's
            // child would be refused too.
            assertEchoes(server);
        } finally {
            children.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        }
    }

    /**
     * A peer that gives up its connect request while the request waits in the listener's backlog (autoRead off): on a
     * device the passive id gets REJECTED before the channel has a loop. Handling it there threw (the pipeline of an
     * unregistered channel cannot run), the event was lost, and the channel was accepted once read.
     */
    @Test
    void shouldCloseAnAcceptedChannelWhosePeerGaveUpWhileItWaitedInTheBacklog() throws Exception {
        Channel server = listen(echoBootstrap(30_000, false).option(ChannelOption.AUTO_READ, false));
        provider.faults().abandonConnectRequests(1);
        ChannelFuture connecting = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                .option(ChannelOption.CONNECT_TIMEOUT_MILLIS, 2000).handler(new ChannelInboundHandlerAdapter())
                .connect(server.localAddress());
        channels.add(connecting.channel());
        // The request and its end reach the listener before it reads.
        Thread.sleep(300);
        server.read();
        Throwable cause = childFailures.poll(10, TimeUnit.SECONDS);
        assertNotNull(cause, "the child whose peer gave up reported nothing");
        assertTrue(cause.getMessage().contains("ended before it was accepted"), cause.getMessage());
        assertNotNull(childrenClosed.poll(10, TimeUnit.SECONDS), "the child did not close");
        assertTrue(connecting.await(10, TimeUnit.SECONDS), "the connect did not end");
        assertFalse(connecting.isSuccess(), "the connection was accepted after its peer gave it up");
    }

    @Test
    void shouldCountAcceptedConnectionsAgainstSoBacklogWhileTheirOwnLoopIsBusy() throws Exception {
        // Children on a loop of their own: between the listener's read and their registration there, a burst of
        // requests must not slip past SO_BACKLOG, for each will hold a queue pair and its receive buffers.
        EventLoopGroup children = new MultiThreadIoEventLoopGroup(1, RdmaIoHandler.newFactory(provider));
        ExecutorService clients = Executors.newFixedThreadPool(8);
        CountDownLatch busy = new CountDownLatch(1);
        List<Future<RawVerbsPeer>> attempts = new ArrayList<>();
        try {
            Channel server = listen(new ServerBootstrap().option(ChannelOption.SO_BACKLOG, 2)
                    .childHandler(new ChannelInboundHandlerAdapter() {
                        @Override
                        public boolean isSharable() {
                            return true;
                        }
                    }), children);
            children.execute(() -> {
                try {
                    busy.await();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            });
            InetSocketAddress address = (InetSocketAddress) server.localAddress();
            for (int i = 0; i < 8; i++) {
                attempts.add(clients.submit(() -> RawVerbsPeer.attempt(provider, address, () -> { })));
            }
            // The refused ones end while the children's loop is still busy; the two admitted wait for it.
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(8);
            int rejected;
            do {
                rejected = 0;
                for (Future<RawVerbsPeer> f : attempts) {
                    if (f.isDone() && outcome(f) == CmEventType.REJECTED) {
                        rejected++;
                    }
                }
                Thread.sleep(20);
            } while (rejected < 6 && System.nanoTime() < deadline);
            assertEquals(6, rejected, "connection requests refused by a listener with SO_BACKLOG 2 while its "
                    + "children's loop was busy");
            busy.countDown();
            int established = 0;
            for (Future<RawVerbsPeer> f : attempts) {
                if (f.get(10, TimeUnit.SECONDS).outcome() == CmEventType.ESTABLISHED) {
                    established++;
                }
            }
            assertEquals(2, established, "connections accepted once the children's loop was free");
        } finally {
            busy.countDown();
            for (Future<RawVerbsPeer> f : attempts) {
                try {
                    f.get(15, TimeUnit.SECONDS).close();
                } catch (ExecutionException e) {
                    // The attempt itself failed; the assertions above name it.
                }
            }
            clients.shutdown();
            children.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        }
    }

    /** How a finished attempt ended; {@code null} when the attempt itself failed (the test's assertions name it). */
    private static CmEventType outcome(Future<RawVerbsPeer> attempt) throws InterruptedException {
        try {
            return attempt.get().outcome();
        } catch (ExecutionException e) {
            return null;
        }
    }
}
