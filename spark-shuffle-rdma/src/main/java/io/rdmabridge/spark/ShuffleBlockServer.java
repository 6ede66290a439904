package io.rdmabridge.spark;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFutureListener;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.DefaultFileRegion;
import io.netty.channel.SimpleChannelInboundHandler;
import io.netty.handler.codec.CorruptedFrameException;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.spark.network.buffer.FileSegmentManagedBuffer;
import org.apache.spark.network.buffer.ManagedBuffer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * An executor's shuffle block server: answers FETCH frames with the block's bytes, taken from the shuffle files as
 * file regions (never read into the JVM heap), after the peer has passed the {@link PeerAuthenticator} challenge.
 *
 * <p>Pinned memory: the bytes of responses handed to the transport and not yet completed never exceed
 * {@code pinnedMemoryCap} (one response larger than the cap is let through alone), so the registered chunks an RDMA
 * channel maps for them stay bounded; further requests wait in a queue, in arrival order.
 *
 * <p>Threading: each connection's handler runs on its channel's event loop; the in-flight accounting and the waiting
 * queue are shared lock-free across connections.
 */
final class ShuffleBlockServer implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(ShuffleBlockServer.class);

    private final BlockSource source;
    private final PeerAuthenticator authenticator;
    private final RdmaShuffleMetrics metrics;
    private final long pinnedMemoryCap;
    private final AtomicLong inFlightBytes = new AtomicLong();
    private final AtomicLong peakInFlightBytes = new AtomicLong();
    private final ConcurrentLinkedQueue<Response> waiting = new ConcurrentLinkedQueue<>();
    private final Channel serverChannel;

    ShuffleBlockServer(BlockTransport transport, String host, int port, BlockSource source,
                       PeerAuthenticator authenticator, long pinnedMemoryCap, RdmaShuffleMetrics metrics) {
        this.source = source;
        this.authenticator = authenticator;
        this.metrics = metrics;
        this.pinnedMemoryCap = pinnedMemoryCap;
        ServerBootstrap bootstrap = transport.newServerBootstrap()
                .childHandler(new ChannelInitializer<>() {
                    @Override
                    protected void initChannel(Channel ch) {
                        transport.track(ch);
                        ch.pipeline().addLast(BlockFrame.newFrameDecoder(BlockFrame.MAX_REQUEST_FRAME_LENGTH),
                                new ConnectionHandler());
                    }
                });
        serverChannel = bootstrap.bind(host, port).syncUninterruptibly().channel();
    }

    InetSocketAddress localAddress() {
        return (InetSocketAddress) serverChannel.localAddress();
    }

    /** The most response bytes that were ever in flight at once, for tests of the cap. */
    long peakInFlightBytes() {
        return peakInFlightBytes.get();
    }

    @Override
    public void close() {
        serverChannel.close().syncUninterruptibly();
    }

    private void submit(Response response) {
        if (tryReserve(response.length)) {
            send(response);
        } else {
            waiting.add(response);
            // A completion may have drained the queue between the failed reservation and the add.
            drain();
        }
    }

    private boolean tryReserve(long length) {
        while (true) {
            long current = inFlightBytes.get();
            if (current > 0 && current + length > pinnedMemoryCap) {
                return false;
            }
            if (inFlightBytes.compareAndSet(current, current + length)) {
                peakInFlightBytes.accumulateAndGet(current + length, Math::max);
                return true;
            }
        }
    }

    private void drain() {
        Response next;
        while ((next = waiting.peek()) != null && tryReserve(next.length)) {
            if (waiting.remove(next)) {
                send(next);
            } else {
                inFlightBytes.addAndGet(-next.length);
            }
        }
    }

    private void send(Response response) {
        Channel ch = response.channel;
        // Header and payload must be adjacent on the wire: write both from one task on the channel's event loop.
        ch.eventLoop().execute(() -> {
            ch.write(BlockFrame.blockHeader(ch.alloc(), response.requestId, response.length));
            ch.writeAndFlush(response.payload).addListener(f -> {
                inFlightBytes.addAndGet(-response.length);
                if (f.isSuccess()) {
                    metrics.blocksServed.inc();
                    metrics.bytesServed.inc(response.length);
                } else {
                    LOG.warn("Shuffle block server: sending {} bytes to {} failed", response.length,
                            ch.remoteAddress(), f.cause());
                }
                drain();
            });
        });
    }

    private static Object payloadOf(ManagedBuffer block) throws IOException {
        if (block instanceof FileSegmentManagedBuffer segment) {
            // Zero-copy: the transport moves the file's bytes (sendfile, or mapped and registered for RDMA).
            return new DefaultFileRegion(segment.getFile(), segment.getOffset(), segment.getLength());
        }
        return Unpooled.wrappedBuffer(block.nioByteBuffer());
    }

    private record Response(Channel channel, long requestId, long length, Object payload) {
    }

    /** One peer connection; confined to its event loop. */
    private final class ConnectionHandler extends SimpleChannelInboundHandler<ByteBuf> {
        private final byte[] nonce = PeerAuthenticator.newNonce();
        private boolean authenticated;
        private boolean refused;

        @Override
        public void channelActive(ChannelHandlerContext ctx) {
            ctx.writeAndFlush(BlockFrame.challenge(ctx.alloc(), authenticator.isRequired(), nonce));
            ctx.fireChannelActive();
        }

        @Override
        protected void channelRead0(ChannelHandlerContext ctx, ByteBuf frame) {
            if (refused) {
                // The connection is closing; whatever the peer pipelined after its answer is not even looked at.
                return;
            }
            byte type = BlockFrame.readType(frame);
            if (type == BlockFrame.RESPONSE && !authenticated) {
                byte[] answer = BlockFrame.readExact(frame, BlockFrame.MAC_LENGTH, "mac");
                if (authenticator.isRequired() && !authenticator.verify(nonce, answer)) {
                    metrics.authFailures.inc();
                    refuse(ctx, "authentication failed: the peer does not hold this application's secret "
                            + "(spark.authenticate=true)", null);
                    return;
                }
                authenticated = true;
            } else if (type == BlockFrame.FETCH && authenticated) {
                long requestId = BlockFrame.readRequestId(frame);
                String blockId = BlockFrame.readBlockId(frame);
                serve(ctx, requestId, blockId);
            } else {
                throw new CorruptedFrameException("type=" + type + (authenticated ? " after" : " before")
                        + " authentication (expected: RESPONSE first, then FETCH)");
            }
        }

        private void serve(ChannelHandlerContext ctx, long requestId, String blockId) {
            ManagedBuffer block;
            Object payload;
            try {
                block = source.open(blockId);
                payload = payloadOf(block);
            } catch (Exception e) {
                ctx.writeAndFlush(BlockFrame.failure(ctx.alloc(), requestId, "cannot serve " + blockId + ": " + e));
                return;
            }
            long length = block.size();
            if (length > BlockFrame.MAX_BLOCK_LENGTH) {
                io.netty.util.ReferenceCountUtil.release(payload);
                ctx.writeAndFlush(BlockFrame.failure(ctx.alloc(), requestId, "cannot serve " + blockId + ": "
                        + length + " bytes (expected: at most " + BlockFrame.MAX_BLOCK_LENGTH + " in one block)"));
                return;
            }
            submit(new Response(ctx.channel(), requestId, length, payload));
        }

        private void refuse(ChannelHandlerContext ctx, String reason, Throwable cause) {
            refused = true;
            LOG.warn("Shuffle block server: closing connection from {}: {}", ctx.channel().remoteAddress(), reason,
                    cause);
            ctx.writeAndFlush(BlockFrame.failure(ctx.alloc(), BlockFrame.CONNECTION_REQUEST_ID, reason))
                    .addListener(ChannelFutureListener.CLOSE);
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            if (ctx.channel().isActive() && !refused) {
                refuse(ctx, "protocol error: " + cause.getMessage(), cause);
            } else {
                LOG.warn("Shuffle block server: error on the connection from {}", ctx.channel().remoteAddress(), cause);
            }
        }
    }
}
