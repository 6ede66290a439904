package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandler;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import io.netty.channel.WriteBufferWaterMark;
import io.netty.channel.socket.ChannelInputShutdownEvent;
import io.netty.channel.socket.DuplexChannel;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.ByteArrayOutputStream;
import java.nio.channels.ClosedChannelException;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The behaviours Netty's {@code SocketShutdownOutputBySelfTest} checks, RDMA x RDMA: Netty's peer there is a
 * {@code java.net.ServerSocket}, which cannot talk to a queue pair, so the peer here is an accepted
 * {@link RdmaSocketChannel} ({@code ALLOW_HALF_CLOSURE} on) that records the bytes it receives and those it had when
 * the end of stream arrived. Runs on the soft provider; every verbs resource is back to zero after each test.
 */
class RdmaShutdownOutputBySelfTest extends AbstractSoftChannelTest {
    /** The accepted side: what arrived, what had arrived when the stream ended, and any failure. */
    private static final class Peer extends ChannelInboundHandlerAdapter {
        private final ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        final CountDownLatch active = new CountDownLatch(1);
        final CountDownLatch endOfStream = new CountDownLatch(1);
        final CountDownLatch inactive = new CountDownLatch(1);
        final AtomicReference<byte[]> atEndOfStream = new AtomicReference<>();
        final AtomicReference<Throwable> failure = new AtomicReference<>();
        volatile DuplexChannel channel;

        @Override
        public void channelActive(ChannelHandlerContext ctx) {
            channel = (DuplexChannel) ctx.channel();
            active.countDown();
        }

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ByteBuf buf = (ByteBuf) msg;
            byte[] piece = new byte[buf.readableBytes()];
            buf.readBytes(piece);
            buf.release();
            synchronized (bytes) {
                bytes.write(piece, 0, piece.length);
            }
        }

        @Override
        public void userEventTriggered(ChannelHandlerContext ctx, Object evt) {
            if (evt instanceof ChannelInputShutdownEvent) {
                atEndOfStream.set(received());
                endOfStream.countDown();
            }
        }

        @Override
        public void channelInactive(ChannelHandlerContext ctx) {
            inactive.countDown();
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            failure.compareAndSet(null, cause);
        }

        byte[] received() {
            synchronized (bytes) {
                return bytes.toByteArray();
            }
        }

        DuplexChannel awaitChannel() throws InterruptedException {
            assertTrue(active.await(10, TimeUnit.SECONDS), "the peer never accepted the connection");
            return channel;
        }

        byte[] awaitEndOfStream() throws InterruptedException {
            assertTrue(endOfStream.await(10, TimeUnit.SECONDS), "the peer never saw end of stream");
            return atEndOfStream.get();
        }
    }

    /** The channel under test's handler: the bytes it reads, its writability changes, any failure. */
    private static final class Self extends ChannelInboundHandlerAdapter {
        final LinkedBlockingQueue<Byte> received = new LinkedBlockingQueue<>();
        final LinkedBlockingQueue<Boolean> writability = new LinkedBlockingQueue<>();
        final AtomicReference<Throwable> failure = new AtomicReference<>();

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ByteBuf buf = (ByteBuf) msg;
            while (buf.isReadable()) {
                received.add(buf.readByte());
            }
            buf.release();
        }

        @Override
        public void channelWritabilityChanged(ChannelHandlerContext ctx) {
            writability.add(ctx.channel().isWritable());
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            failure.compareAndSet(null, cause);
        }
    }

    private Channel server(Peer peer) throws InterruptedException {
        return listen(new ServerBootstrap().childOption(ChannelOption.ALLOW_HALF_CLOSURE, true).childHandler(peer));
    }

    private static Bootstrap clientBootstrap(ChannelHandler handler) {
        return new Bootstrap().handler(handler);
    }

    private static ByteBuf direct(Channel ch, byte[] bytes) {
        return ch.alloc().directBuffer(bytes.length).writeBytes(bytes);
    }

    private static byte[] concat(byte[]... parts) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        for (byte[] part : parts) {
            out.write(part, 0, part.length);
        }
        return out.toByteArray();
    }

    /** A write after shutdownOutput fails as NIO's does, releases its buffer and reaches nobody. */
    private static void assertWriteFails(Channel ch) throws InterruptedException {
        ByteBuf late = ch.alloc().directBuffer(1).writeByte(42);
        ChannelFuture write = ch.writeAndFlush(late).await();
        assertInstanceOf(ClosedChannelException.class, write.cause());
        assertEquals(0, late.refCnt(), "the failed write kept its buffer");
    }

    /** The peer writes to the half-closed channel: input still works. */
    private static void assertInputStillWorks(Peer peer, Self self) throws InterruptedException {
        peer.channel.writeAndFlush(Unpooled.wrappedBuffer(new byte[] {7, 8, 9})).sync();
        for (byte expected = 7; expected <= 9; expected++) {
            assertEquals(Byte.valueOf(expected), self.received.poll(10, TimeUnit.SECONDS));
        }
    }

    @Test
    @Timeout(30)
    void shouldEndTheStreamAfterEveryEarlierByteAndKeepTheInputOpen() throws Exception {
        Peer peer = new Peer();
        Channel server = server(peer);
        Self self = new Self();
        RdmaSocketChannel ch = connect(clientBootstrap(self), server);
        assertTrue(ch.isActive());
        assertFalse(ch.isOutputShutdown());
        DuplexChannel child = peer.awaitChannel();

        // One byte as Netty's test writes, then an eager and a rendezvous message.
        byte[] one = {1};
        byte[] eager = randomBytes(4096, 1);
        byte[] large = randomBytes(256 * 1024, 2);
        ChannelFuture first = ch.write(direct(ch, one));
        ChannelFuture second = ch.write(direct(ch, eager));
        ch.writeAndFlush(direct(ch, large)).sync();
        assertTrue(first.isSuccess() && second.isSuccess());

        ch.shutdownOutput().sync();
        assertTrue(ch.isOpen());
        assertTrue(ch.isActive());
        assertFalse(ch.isInputShutdown());
        assertTrue(ch.isOutputShutdown());

        assertArrayEquals(concat(one, eager, large), peer.awaitEndOfStream(), "bytes before the end of stream");
        assertTrue(child.isActive());
        assertTrue(child.isInputShutdown());
        assertFalse(child.isOutputShutdown());

        assertWriteFails(ch);
        assertTrue(ch.isActive(), "a failed write after shutdownOutput must not close the channel");
        assertInputStillWorks(peer, self);
        assertArrayEquals(concat(one, eager, large), peer.received(), "a write after the end of stream arrived");
        assertNull(self.failure.get());
        assertNull(peer.failure.get());
    }

    @Test
    @Timeout(30)
    void shouldEndTheStreamOnlyAfterAWriteStillInFlight() throws Exception {
        Peer peer = new Peer();
        Channel server = server(peer);
        Self self = new Self();
        RdmaSocketChannel ch = connect(clientBootstrap(self), server);
        peer.awaitChannel();

        // shutdownOutput() in the same loop task as the write: the rendezvous is advertised, and its completion
        // cannot have been polled yet, so the shutdown has to wait for it.
        byte[] large = randomBytes(512 * 1024, 3);
        AtomicReference<ChannelFuture> write = new AtomicReference<>();
        ChannelFuture shutdown = ch.eventLoop().submit(() -> {
            write.set(ch.writeAndFlush(direct(ch, large)));
            return ch.shutdownOutput();
        }).get();
        shutdown.sync();
        assertTrue(write.get().isSuccess(), String.valueOf(write.get().cause()));
        assertTrue(ch.isOutputShutdown());

        assertArrayEquals(large, peer.awaitEndOfStream(), "bytes before the end of stream");
        assertInputStillWorks(peer, self);
    }

    @Test
    @Timeout(30)
    void shouldFailWritesIssuedAfterShutdownOutputWhileItWaitsForAWriteInFlight() throws Exception {
        Peer peer = new Peer();
        Channel server = server(peer);
        Self self = new Self();
        RdmaSocketChannel ch = connect(clientBootstrap(self), server);
        peer.awaitChannel();

        // All in one loop task, so the shutdown surely waits for the rendezvous: what comes after shutdownOutput()
        // fails as NIO's does at once, even though the end of stream is not yet sent.
        byte[] large = randomBytes(512 * 1024, 5);
        ByteBuf lateBuffer = direct(ch, new byte[] {42});
        List<ChannelFuture> futures = ch.eventLoop().submit(() -> List.of(
                ch.writeAndFlush(direct(ch, large)),
                ch.shutdownOutput(),
                ch.writeAndFlush(lateBuffer),
                ch.shutdownOutput())).get();
        ChannelFuture write = futures.get(0);
        ChannelFuture shutdown = futures.get(1);
        ChannelFuture late = futures.get(2);
        ChannelFuture secondShutdown = futures.get(3);

        shutdown.sync();
        assertTrue(write.isSuccess(), String.valueOf(write.cause()));
        assertInstanceOf(ClosedChannelException.class, late.await().cause());
        assertEquals(0, lateBuffer.refCnt(), "the failed write kept its buffer");
        assertInstanceOf(ClosedChannelException.class, secondShutdown.await().cause(),
                "a second shutdownOutput() fails, as Netty's once the output is shut down");

        assertArrayEquals(large, peer.awaitEndOfStream(), "bytes before the end of stream");
        assertInputStillWorks(peer, self);
        assertArrayEquals(large, peer.received(), "a write issued after shutdownOutput() reached the peer");
    }

    @Test
    @Timeout(30)
    void shouldFailAShutdownStillWaitingForAWriteWhenTheChannelCloses() throws Exception {
        // The peer never reads, so the rendezvous it was offered is never pulled and the shutdown waits for it; the
        // close (graceful, then forced after its linger) must end that wait rather than leave the future pending.
        Peer peer = new Peer();
        Channel server = listen(new ServerBootstrap().childOption(ChannelOption.ALLOW_HALF_CLOSURE, true)
                .childOption(ChannelOption.AUTO_READ, false).childHandler(peer));
        RdmaSocketChannel ch = connect(clientBootstrap(new Self()), server);
        peer.awaitChannel();

        byte[] large = randomBytes(512 * 1024, 6);
        List<ChannelFuture> futures = ch.eventLoop().submit(() -> List.of(
                ch.writeAndFlush(direct(ch, large)),
                ch.shutdownOutput())).get();
        ChannelFuture shutdown = futures.get(1);
        assertFalse(shutdown.await(300, TimeUnit.MILLISECONDS), "the shutdown did not wait for the write");

        ch.close();
        assertTrue(shutdown.await(10, TimeUnit.SECONDS), "the shutdown's future stayed pending after the close");
        assertInstanceOf(ClosedChannelException.class, shutdown.cause());
        assertTrue(String.valueOf(shutdown.cause().getCause()).contains("await the shutdown's future"),
                String.valueOf(shutdown.cause().getCause()));
        assertTrue(futures.get(0).await(10, TimeUnit.SECONDS), "the write's future stayed pending after the close");
        assertFalse(futures.get(0).isSuccess(), "a write the peer never read succeeded");
    }

    @Test
    @Timeout(30)
    void shouldFailShutdownOfAClosedChannel() throws Exception {
        Peer peer = new Peer();
        Channel server = server(peer);
        RdmaSocketChannel ch = connect(clientBootstrap(new Self()), server);
        assertTrue(ch.isActive());
        peer.awaitChannel();

        ch.close().sync();
        assertInstanceOf(ClosedChannelException.class, ch.shutdownInput().await().cause());
        assertInstanceOf(ClosedChannelException.class, ch.shutdownOutput().await().cause());
        assertInstanceOf(ClosedChannelException.class, ch.shutdown().await().cause());
    }

    @Test
    @Timeout(30)
    void shouldNotChangeWritabilityOnAWriteAfterShutdownOutput() throws Exception {
        Peer peer = new Peer();
        Channel server = server(peer);
        Self self = new Self();
        RdmaSocketChannel ch = connect(clientBootstrap(self)
                .option(ChannelOption.WRITE_BUFFER_WATER_MARK, new WriteBufferWaterMark(8, 16)), server);
        peer.awaitChannel();

        // Above the high water mark until flushed and completed: unwritable, then writable again. Written on the
        // loop: a write from another thread also counts its queued task, which adds writability changes of its own.
        byte[] bytes = randomBytes(32, 4);
        ChannelFuture write = ch.eventLoop().submit(() -> ch.write(direct(ch, bytes))).get();
        assertEquals(Boolean.FALSE, self.writability.poll(10, TimeUnit.SECONDS));
        ch.flush();
        write.sync();
        assertEquals(Boolean.TRUE, self.writability.poll(10, TimeUnit.SECONDS));

        ch.shutdownOutput().sync();
        assertArrayEquals(bytes, peer.awaitEndOfStream());
        assertWriteFails(ch);
        // Writability events fire on the loop, some later than the write: a task queued behind them lets them out.
        ch.eventLoop().submit(() -> { }).sync();
        assertNull(self.writability.poll(), "channelWritabilityChanged fired by shutdownOutput or the later write");
        assertTrue(ch.isActive());
    }

    @Test
    @Timeout(30)
    void shouldShutDownOutputThenCloseWithSoLinger() throws Exception {
        shutDownThenCloseWithSoLinger(false);
    }

    @Test
    @Timeout(30)
    void shouldShutDownThenCloseWithSoLinger() throws Exception {
        shutDownThenCloseWithSoLinger(true);
    }

    /**
     * Netty's {@code SocketShutdownOutputBySelfTest} guards against an {@code AssertionError} on the event loop when
     * SO_LINGER is set (NIO shuts down off the loop then); here every step must succeed and nothing may reach either
     * pipeline, and the close stays graceful: the peer sees end of stream, never a reset.
     */
    private void shutDownThenCloseWithSoLinger(boolean bothDirections) throws Exception {
        Peer peer = new Peer();
        Channel server = server(peer);
        Self self = new Self();
        RdmaSocketChannel ch = connect(clientBootstrap(self).option(ChannelOption.SO_LINGER, 1), server);
        assertEquals(1, ch.config().getSoLinger());
        peer.awaitChannel();

        ChannelFuture shutdown = bothDirections ? ch.shutdown() : ch.shutdownOutput();
        shutdown.await();
        assertNull(shutdown.cause());
        assertTrue(ch.isOutputShutdown());
        assertEquals(bothDirections, ch.isInputShutdown());
        assertNotNull(peer.awaitEndOfStream());

        ChannelFuture close = ch.close().await();
        assertNull(close.cause());
        assertTrue(peer.inactive.await(10, TimeUnit.SECONDS), "the peer never saw the close");
        assertNull(self.failure.get());
        assertNull(peer.failure.get(), "SO_LINGER=1 closes gracefully: the peer must not see a reset");
    }
}
