package io.rdmabridge.spark;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.ChannelOption;
import io.netty.channel.DefaultFileRegion;
import io.netty.channel.SimpleChannelInboundHandler;
import io.netty.handler.codec.CorruptedFrameException;
import io.netty.util.ReferenceCountUtil;
import io.netty.util.concurrent.ScheduledFuture;
import io.rdmabridge.verbs.RateLimitedWarning;
import io.rdmabridge.verbs.SourceShares;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.network.buffer.FileSegmentManagedBuffer;
import org.apache.spark.network.buffer.ManagedBuffer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * An executor's shuffle block server: answers FETCH frames with the block's bytes, taken from the shuffle files as
 * file regions (never read into the JVM heap), after the peer has passed the {@link PeerAuthenticator} challenge and
 * been sent this server's proof in turn.
 *
 * <p>Limits, each a {@code spark.shuffle.rdma.*} key (docs/spark.md, docs/security.md):
 * <ul>
 *   <li>Pinned memory: the bytes of responses handed to the transport and not yet completed never exceed
 *   {@code pinnedMemoryCap} (one response larger than the cap is let through alone), and one connection holds at most
 *   {@code pinnedMemoryPerConnection} of them (one larger response alone). Connections with responses waiting are
 *   served round-robin, one response per turn; a response that does not fit the cap keeps its turn until completions
 *   make room, so large blocks are not starved by small ones.</li>
 *   <li>Requests: a connection with {@code maxRequestsPerConnection} requests unanswered is not read (nor decoded)
 *   until half of them are; the peer's sends then wait for credits, as TCP's would for window. Nothing is refused,
 *   so Spark's own fetcher, which pipelines whatever its flow control allows, is only slowed, never failed.</li>
 *   <li>Time: a connection that has not answered the challenge within {@code authTimeout}, that has nothing
 *   outstanding and sent nothing for {@code idleTimeout}, or that has not consumed a response within
 *   {@code writeTimeout} of its sending (the peer stopped reading, or reads too slowly) is closed, the last one
 *   abortively, releasing its share.</li>
 *   <li>Connections: beyond {@code maxConnections}, or beyond half of them from one source address (so that one host
 *   cannot keep every other reducer out), a new connection gets a failure frame naming the key and is closed.</li>
 * </ul>
 * WARNs a peer can cause again and again are {@link RateLimitedWarning rate-limited}.
 *
 * <p>Threading: each connection's handler runs on its channel's event loop; the pinned-memory accounting and the
 * round-robin of waiting responses are shared across connections under one lock, held for bookkeeping only.
 */
final class ShuffleBlockServer implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(ShuffleBlockServer.class);

    private final String executorId;
    private final BlockSource source;
    private final PeerAuthenticator authenticator;
    private final RdmaShuffleMetrics metrics;
    private final RdmaShuffleConf conf;
    private final long authTimeoutNanos;
    private final long idleTimeoutNanos;
    private final long writeTimeoutNanos;
    private final long checkPeriodNanos;
    /** Connections admitted and not yet closed, by source address ({@code maxConnections}). */
    private final SourceShares connections;
    private final AtomicInteger peakOutstandingRequests = new AtomicInteger();
    private final RateLimitedWarning refusedWarning;
    private final RateLimitedWarning closedWarning;
    private final RateLimitedWarning sendFailedWarning;

    private final Object lock = new Object();
    /** Connections with responses waiting for room, in their turn; guarded by {@link #lock}. */
    private final ArrayDeque<ConnectionHandler> ready = new ArrayDeque<>();
    /** Guarded by {@link #lock}. */
    private long inFlightBytes;
    /** Guarded by {@link #lock}. */
    private long peakInFlightBytes;
    private final Channel serverChannel;

    /**
     * @param executorId this server's executor, which clients name when they authenticate (so that an answer meant
     *                   for another executor's server does not pass here)
     */
    ShuffleBlockServer(BlockTransport transport, String executorId, String host, int port, BlockSource source,
                       PeerAuthenticator authenticator, RdmaShuffleConf conf, RdmaShuffleMetrics metrics) {
        this.executorId = executorId;
        this.source = source;
        this.authenticator = authenticator;
        this.metrics = metrics;
        this.conf = conf;
        authTimeoutNanos = TimeUnit.MILLISECONDS.toNanos(conf.authTimeoutMillis);
        idleTimeoutNanos = TimeUnit.MILLISECONDS.toNanos(conf.idleTimeoutMillis);
        writeTimeoutNanos = TimeUnit.MILLISECONDS.toNanos(conf.writeTimeoutMillis);
        // A timeout fires at most a quarter late.
        checkPeriodNanos = Math.max(TimeUnit.MILLISECONDS.toNanos(10),
                Math.min(authTimeoutNanos, Math.min(idleTimeoutNanos, writeTimeoutNanos)) / 4);
        refusedWarning = new RateLimitedWarning(LOG, conf.warnIntervalMillis);
        connections = new SourceShares(conf.maxConnections);
        closedWarning = new RateLimitedWarning(LOG, conf.warnIntervalMillis);
        sendFailedWarning = new RateLimitedWarning(LOG, conf.warnIntervalMillis);
        ServerBootstrap bootstrap = transport.newServerBootstrap()
                .childHandler(new ChannelInitializer<>() {
                    @Override
                    protected void initChannel(Channel ch) {
                        transport.track(ch);
                        initConnection(ch);
                    }
                });
        serverChannel = bind(bootstrap, host, port, conf.portMaxRetries);
    }

    /**
     * Binds as Spark binds its own services: port 0 picks a free port; a given port that cannot be bound (another
     * executor of this host holds it) is followed by the next ones, up to {@code maxRetries} more, so that executors
     * sharing a host share one {@link RdmaShuffleConf#PORT} setting. Any failure counts: DiSNI does not say whether
     * {@code rdma_bind_addr} failed for a taken port, and trying more ports costs little.
     */
    private static Channel bind(ServerBootstrap bootstrap, String host, int port, int maxRetries) {
        int attempts = port == 0 ? 1 : maxRetries + 1;
        Throwable cause = null;
        for (int i = 0; i < attempts; i++) {
            // Spark's sequence: on from the given port, wrapping from 65535 to 1024.
            int tryPort = port == 0 ? 0 : (port + i - 1024) % (65536 - 1024) + 1024;
            ChannelFuture bound = bootstrap.bind(host, tryPort).awaitUninterruptibly();
            if (bound.isSuccess()) {
                if (i > 0) {
                    LOG.info("Shuffle block server: {} port(s) from {} could not be bound; bound {} instead ({})", i,
                            port, tryPort, RdmaShuffleConf.PORT_MAX_RETRIES);
                }
                return bound.channel();
            }
            cause = bound.cause();
        }
        throw new IllegalStateException("cannot bind the shuffle block server to " + host + ":" + port
                + (attempts > 1 ? " or the " + (attempts - 1) + " ports after it" : "") + " (" + RdmaShuffleConf.PORT
                + "=" + port + ", " + RdmaShuffleConf.PORT_MAX_RETRIES + "=" + maxRetries + "): " + cause
                + "; choose a free port, raise " + RdmaShuffleConf.PORT_MAX_RETRIES + ", or set "
                + RdmaShuffleConf.PORT + "=0 to pick a free one", cause);
    }

    /** Sets up an accepted connection's pipeline; any channel will do (tests use one whose writes complete at once). */
    void initConnection(Channel ch) {
        InetAddress from = SourceShares.sourceOf(ch.remoteAddress());
        SourceShares.Refusal refusal = connections.admit(from);
        if (refusal == null) {
            ch.closeFuture().addListener(f -> connections.release(from));
        }
        ConnectionHandler handler = new ConnectionHandler(ch, from, refusal);
        ch.pipeline().addLast(BlockFrame.newFrameDecoder(BlockFrame.MAX_REQUEST_FRAME_LENGTH, handler::isPaused),
                handler);
    }

    InetSocketAddress localAddress() {
        return (InetSocketAddress) serverChannel.localAddress();
    }

    /** The most response bytes that were ever in flight at once, for tests of the cap. */
    long peakInFlightBytes() {
        synchronized (lock) {
            return peakInFlightBytes;
        }
    }

    /** Response bytes in flight now, summed over connections, for tests. */
    long inFlightBytes() {
        synchronized (lock) {
            return inFlightBytes;
        }
    }

    /** The most requests one connection ever had unanswered, for tests of the per-connection bound. */
    int peakOutstandingRequests() {
        return peakOutstandingRequests.get();
    }

    /** Connections admitted and not yet closed, for tests: those refused are not counted. */
    int openConnections() {
        return connections.held();
    }

    @Override
    public void close() {
        serverChannel.close().syncUninterruptibly();
    }

    /** Queues {@code response} on its connection and sends whatever the caps let through now. */
    private void submit(Response response) {
        ConnectionHandler c = response.connection;
        List<Response> admitted;
        synchronized (lock) {
            if (c.closed) {
                admitted = null;
            } else {
                c.queue.add(response);
                if (c.queue.size() == 1) {
                    ready.add(c);
                }
                admitted = admit();
            }
        }
        if (admitted == null) {
            response.drop();
            return;
        }
        admitted.forEach(this::send);
    }

    /**
     * Takes the responses that fit, one per connection per turn. A connection at its share is passed over (the others
     * go first); a response that does not fit the cap ends the round and keeps its turn. Caller holds {@link #lock}.
     */
    private List<Response> admit() {
        List<Response> admitted = new ArrayList<>();
        int passedOver = 0;
        while (!ready.isEmpty() && passedOver < ready.size()) {
            ConnectionHandler c = ready.poll();
            Response next = c.queue.peek();
            if (c.inFlightBytes > 0 && c.inFlightBytes + next.length > conf.pinnedMemoryPerConnection) {
                ready.add(c);
                passedOver++;
                continue;
            }
            if (inFlightBytes > 0 && inFlightBytes + next.length > conf.pinnedMemoryCap) {
                ready.addFirst(c);
                break;
            }
            c.queue.poll();
            c.inFlightBytes += next.length;
            inFlightBytes += next.length;
            peakInFlightBytes = Math.max(peakInFlightBytes, inFlightBytes);
            admitted.add(next);
            if (!c.queue.isEmpty()) {
                ready.add(c);
            }
            passedOver = 0;
        }
        return admitted;
    }

    private void completed(ConnectionHandler c, long length) {
        List<Response> admitted;
        synchronized (lock) {
            c.inFlightBytes -= length;
            inFlightBytes -= length;
            admitted = admit();
        }
        admitted.forEach(this::send);
    }

    /** Drops what {@code c} still had waiting, so that its share and its place in the round go to the others. */
    private void closed(ConnectionHandler c) {
        List<Response> dropped;
        List<Response> admitted;
        synchronized (lock) {
            c.closed = true;
            ready.remove(c);
            dropped = new ArrayList<>(c.queue);
            c.queue.clear();
            admitted = admit();
        }
        dropped.forEach(Response::drop);
        admitted.forEach(this::send);
    }

    private void send(Response response) {
        ConnectionHandler c = response.connection;
        Channel ch = c.channel;
        // Header and payload must be adjacent on the wire: write both from one task on the channel's event loop.
        try {
            ch.eventLoop().execute(() -> {
                c.writeStarted();
                ch.write(BlockFrame.blockHeader(ch.alloc(), response.requestId, response.length));
                ch.writeAndFlush(response.payload).addListener(f -> {
                    if (f.isSuccess()) {
                        metrics.blocksServed.inc();
                        metrics.bytesServed.inc(response.length);
                    } else if (!c.refused) {
                        sendFailedWarning.warn("Shuffle block server: sending {} bytes to {} failed", response.length,
                                ch.remoteAddress(), f.cause());
                    }
                    // The write is done with the payload, a view of the block: the block can go too.
                    response.block.release();
                    completed(c, response.length);
                    c.responseCompleted();
                });
            });
        } catch (RejectedExecutionException e) {
            // The transport is shutting down: the connection goes with it, and the block is released here.
            response.drop();
            completed(c, response.length);
        }
    }

    private static Object payloadOf(ManagedBuffer block) throws IOException {
        if (block instanceof FileSegmentManagedBuffer segment) {
            // Zero-copy: the transport moves the file's bytes (sendfile, or mapped and registered for RDMA).
            return new DefaultFileRegion(segment.getFile(), segment.getOffset(), segment.getLength());
        }
        return Unpooled.wrappedBuffer(block.nioByteBuffer());
    }

    /** A block to send: {@code payload}, what the channel writes, is a view of {@code block}, which the server owns. */
    private record Response(ConnectionHandler connection, long requestId, long length, Object payload,
                            ManagedBuffer block) {
        /** Releases a response that will not be written. */
        void drop() {
            ReferenceCountUtil.release(payload);
            block.release();
        }
    }

    /** One peer connection; confined to its event loop, except the fields guarded by the server's lock. */
    private final class ConnectionHandler extends SimpleChannelInboundHandler<ByteBuf> {
        final Channel channel;
        /** The peer's address, where its place under {@code maxConnections} counts. */
        private final InetAddress peerAddress;
        /** Why the connection was refused, or {@code null} when it was admitted. */
        private final SourceShares.Refusal refusal;
        private final byte[] nonce = PeerAuthenticator.newNonce();
        /** Responses admitted from here wait in this queue; guarded by the server's lock, as the next two. */
        final ArrayDeque<Response> queue = new ArrayDeque<>();
        long inFlightBytes;
        boolean closed;
        private boolean authenticated;
        /** Set once this side is closing the connection: its failed sends are expected, not worth a WARN. */
        boolean refused;
        /** Requests read and not yet answered (queued, in flight, or a failure being written). */
        private int outstanding;
        /** Responses handed to the channel and not yet completed. */
        private int writing;
        /**
         * When each of those was handed to the channel, oldest at {@code writeHead}: a channel completes its writes in
         * order. Grows to the most ever in flight, at most {@code maxRequestsPerConnection}.
         */
        private long[] writeStarts = new long[8];
        private int writeHead;
        private boolean paused;
        private long openedNanos;
        private long lastReadNanos;
        private ScheduledFuture<?> limitCheck;

        ConnectionHandler(Channel channel, InetAddress peerAddress, SourceShares.Refusal refusal) {
            this.channel = channel;
            this.peerAddress = peerAddress;
            this.refusal = refusal;
        }

        boolean isPaused() {
            return paused;
        }

        @Override
        public void channelActive(ChannelHandlerContext ctx) {
            if (refusal != null) {
                metrics.connectionsRefused.inc();
                String why = refusal == SourceShares.Refusal.TOTAL
                        ? "too many connections: " + connections.max() + " open (" + RdmaShuffleConf.MAX_CONNECTIONS
                                + "; raise it if this many reducers are expected)"
                        : "too many connections from " + SourceShares.describe(peerAddress) + ": "
                                + connections.maxPerSource() + " open (one address may hold "
                                + connections.maxPerSource() + " of " + RdmaShuffleConf.MAX_CONNECTIONS + "="
                                + connections.max() + "; raise it if that host runs this many executors, or allow only "
                                + "the application's hosts to reach the port)";
                refusedWarning.warn("Shuffle block server: refusing connection from {}: {}",
                        ctx.channel().remoteAddress(), why);
                closeWith(ctx, why);
                return;
            }
            openedNanos = System.nanoTime();
            lastReadNanos = openedNanos;
            limitCheck = ctx.executor().scheduleAtFixedRate(() -> checkLimits(ctx), checkPeriodNanos,
                    checkPeriodNanos, TimeUnit.NANOSECONDS);
            ctx.writeAndFlush(BlockFrame.challenge(ctx.alloc(), authenticator.isRequired(), nonce));
            ctx.fireChannelActive();
        }

        private void checkLimits(ChannelHandlerContext ctx) {
            if (refused) {
                return;
            }
            long now = System.nanoTime();
            if (!authenticated && now - openedNanos > authTimeoutNanos) {
                timedOut(ctx, "no answer to the challenge within " + conf.authTimeoutMillis + " ms ("
                        + RdmaShuffleConf.AUTH_TIMEOUT + ")", false);
            } else if (writing > 0 && now - writeStarts[writeHead] > writeTimeoutNanos) {
                // The oldest response's age, not the time since the last completion: a peer that consumed one
                // response now and then would otherwise hold its share of pinned memory for as long as it liked.
                timedOut(ctx, "a response sent to the peer " + TimeUnit.NANOSECONDS.toMillis(now
                        - writeStarts[writeHead]) + " ms ago is not consumed yet (" + RdmaShuffleConf.WRITE_TIMEOUT
                        + "=" + conf.writeTimeoutMillis + " ms; the peer stopped reading, or reads too slowly)", true);
            } else if (outstanding == 0 && now - lastReadNanos > idleTimeoutNanos) {
                timedOut(ctx, "idle for " + conf.idleTimeoutMillis + " ms (" + RdmaShuffleConf.IDLE_TIMEOUT + ")",
                        false);
            }
        }

        private void timedOut(ChannelHandlerContext ctx, String reason, boolean abortive) {
            metrics.connectionsTimedOut.inc();
            closedWarning.warn("Shuffle block server: closing connection from {}: {}", ctx.channel().remoteAddress(),
                    reason);
            if (abortive) {
                // The peer reads nothing, so a graceful close would wait for it too: reset at once.
                refused = true;
                ctx.channel().config().setOption(ChannelOption.SO_LINGER, 0);
                ctx.close();
            } else {
                closeWith(ctx, reason);
            }
        }

        @Override
        protected void channelRead0(ChannelHandlerContext ctx, ByteBuf frame) {
            if (refused) {
                // The connection is closing; whatever the peer pipelined after its answer is not even looked at.
                return;
            }
            lastReadNanos = System.nanoTime();
            byte type = BlockFrame.readType(frame);
            if (type == BlockFrame.RESPONSE && !authenticated) {
                byte[] answer = BlockFrame.readField(frame, BlockFrame.MAC_LENGTH, BlockFrame.NONCE_LENGTH, "mac");
                byte[] clientNonce = BlockFrame.readExact(frame, BlockFrame.NONCE_LENGTH, "nonce");
                if (authenticator.isRequired() && !authenticator.verifyClient(executorId, nonce, clientNonce, answer)) {
                    metrics.authFailures.inc();
                    refuse(ctx, "authentication failed: the peer does not hold this application's secret, or "
                            + "answered for a block server other than executor " + executorId + "'s "
                            + "(spark.authenticate=true)", null);
                    return;
                }
                authenticated = true;
                // Before any response: the client takes no block from a server that has not proven itself.
                ctx.writeAndFlush(BlockFrame.proof(ctx.alloc(), authenticator.serverProof(executorId, nonce,
                        clientNonce)));
            } else if (type == BlockFrame.FETCH && authenticated) {
                long requestId = BlockFrame.readRequestId(frame);
                String blockId = BlockFrame.readBlockId(frame);
                peakOutstandingRequests.accumulateAndGet(++outstanding, Math::max);
                if (outstanding >= conf.maxRequestsPerConnection) {
                    // Back-pressure, not refusal: decode nothing more and read nothing more until half are answered.
                    paused = true;
                    ctx.channel().config().setAutoRead(false);
                }
                serve(ctx, requestId, blockId);
            } else {
                throw new CorruptedFrameException("type=" + type + (authenticated ? " after" : " before")
                        + " authentication (expected: RESPONSE first, then FETCH)");
            }
        }

        private void serve(ChannelHandlerContext ctx, long requestId, String blockId) {
            ManagedBuffer block;
            try {
                block = source.open(blockId);
            } catch (Exception e) {
                fail(ctx, requestId, "cannot serve " + blockId + ": " + e);
                return;
            }
            long length = block.size();
            if (length > BlockFrame.MAX_BLOCK_LENGTH) {
                block.release();
                fail(ctx, requestId, "cannot serve " + blockId + ": " + length + " bytes (expected: at most "
                        + BlockFrame.MAX_BLOCK_LENGTH + " in one block)");
                return;
            }
            Object payload;
            try {
                payload = payloadOf(block);
            } catch (Exception e) {
                block.release();
                fail(ctx, requestId, "cannot serve " + blockId + ": " + e);
                return;
            }
            submit(new Response(this, requestId, length, payload, block));
        }

        /** Answers one request with a failure; it stays outstanding until written, as a block would. */
        private void fail(ChannelHandlerContext ctx, long requestId, String message) {
            writeStarted();
            ctx.writeAndFlush(BlockFrame.failure(ctx.alloc(), requestId, message))
                    .addListener(f -> responseCompleted());
        }

        void writeStarted() {
            if (writing == writeStarts.length) {
                long[] grown = new long[writing * 2];
                for (int i = 0; i < writing; i++) {
                    grown[i] = writeStarts[(writeHead + i) % writing];
                }
                writeStarts = grown;
                writeHead = 0;
            }
            writeStarts[(writeHead + writing++) % writeStarts.length] = System.nanoTime();
        }

        void responseCompleted() {
            writing--;
            writeHead = (writeHead + 1) % writeStarts.length;
            outstanding--;
            if (paused && outstanding <= conf.maxRequestsPerConnection / 2 && channel.isActive()) {
                paused = false;
                // Not inline: a write can complete within channelRead0 (a failure, small: at once on a socket, or on
                // the RDMA channel once copied), while the decoder still delivers the current frame; a nested decode
                // there consumes and releases the buffer the outer one goes on reading.
                channel.eventLoop().execute(this::resume);
            }
        }

        /** Decodes what was held back first (that may pause again), then reads again if it did not. */
        private void resume() {
            if (!channel.isActive()) {
                return;
            }
            channel.pipeline().fireChannelRead(Unpooled.EMPTY_BUFFER);
            if (!paused) {
                channel.config().setAutoRead(true);
            }
        }

        private void refuse(ChannelHandlerContext ctx, String reason, Throwable cause) {
            closedWarning.warn("Shuffle block server: closing connection from {}: {}", ctx.channel().remoteAddress(),
                    reason, cause);
            closeWith(ctx, reason);
        }

        /**
         * Tells the peer why, then closes. The close does not wait for the failure frame to complete: a peer that
         * reads nothing would hold the connection open for as long as it likes.
         */
        private void closeWith(ChannelHandlerContext ctx, String reason) {
            refused = true;
            ctx.writeAndFlush(BlockFrame.failure(ctx.alloc(), BlockFrame.CONNECTION_REQUEST_ID, reason));
            ctx.close();
        }

        @Override
        public void channelInactive(ChannelHandlerContext ctx) {
            if (limitCheck != null) {
                limitCheck.cancel(false);
            }
            closed(this);
            ctx.fireChannelInactive();
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            if (ctx.channel().isActive() && !refused) {
                refuse(ctx, "protocol error: " + cause.getMessage(), cause);
            } else {
                closedWarning.warn("Shuffle block server: error on the connection from {}",
                        ctx.channel().remoteAddress(), cause);
            }
        }
    }
}
