package io.rdmabridge.kafka;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelFutureListener;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.ChannelOption;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.WriteBufferWaterMark;
import io.netty.channel.socket.ChannelInputShutdownEvent;
import io.netty.util.concurrent.DefaultThreadFactory;
import io.netty.util.concurrent.ScheduledFuture;
import io.rdmabridge.connection.ConnectionConfig;
import io.rdmabridge.netty.RdmaChannelOption;
import io.rdmabridge.netty.RdmaIoHandler;
import io.rdmabridge.netty.RdmaServerSocketChannel;
import io.rdmabridge.netty.RdmaSocketChannel;
import io.rdmabridge.verbs.RateLimitedWarning;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.SourceShares;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.EnumMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@link RdmaStreamTransport} over the project's Netty RDMA channel: one small event loop group owned by the plugin,
 * an {@link RdmaServerSocketChannel} on the leader's inter-broker host, and {@link RdmaSocketChannel}s to leaders.
 *
 * <p>The token: the follower's first 8 bytes on the RDMA stream (big-endian) are the one-time token the leader sent in
 * its preamble reply over TCP, or {@link Preamble#PROBE_TOKEN}, which the leader answers with its broker id
 * ({@link Preamble#probeAnswer}) before closing the connection. The leader acknowledges a token it expects with the
 * same 8 bytes, and the follower's {@link #connect} completes only then, and only when they name the broker it
 * expects: a connection that presented the token first (it crosses the network in clear) leaves the follower's
 * connect failing, not succeeding on a stream the leader then refuses. Until a connection has presented a token the
 * leader expects, it carries no Kafka byte: an unknown token closes it at once, a missing one after the handshake
 * timeout, and at most {@code maxUnidentified} such connections exist at a time, at most half of them from one source
 * address (more are refused before they are accepted, so they cost no queue pair; a follower asks again). A probe's
 * connection counts as one until it is closed: once its answer is delivered, or at the handshake timeout.
 *
 * <p>Thread-safe.
 */
final class RdmaChannelTransport implements RdmaStreamTransport {
    /** Largest message either side of a replication connection accepts from the other. */
    static final int MAX_MESSAGE_SIZE = 1024 * 1024;
    private static final Logger LOG = LoggerFactory.getLogger(RdmaChannelTransport.class);
    /** At most one refusal line of each {@link Refusal} kind per this many milliseconds. */
    static final long WARN_INTERVAL_MS = 1000;
    static final int TOKEN_LENGTH = 8;

    /** Why the leader closes a connection that carries no Kafka byte yet; each kind has its own line limit. */
    enum Refusal {
        /** Beyond {@code rdma.handshake.max.in.progress}, or this source's share of it. */
        OVER_CAP,
        /** No token, or a probe's answer not delivered, within {@code rdma.handshake.timeout.ms}. */
        NO_TOKEN,
        /** A token no replication connection expects. */
        UNKNOWN_TOKEN,
        /**
         * Failed by the transport before its token, while it held a place: its own handshake failed (the peer gave
         * up, or the loop's {@code rdmabridge.handshakeMemoryBytes} was spent), or the connection broke.
         */
        TRANSPORT
    }

    private final RdmaProvider provider;
    private final EventLoopGroup group;
    private final Channel server;
    private final int handshakeTimeoutMs;
    private final int sendQueueDepth;
    private final int receiveQueueDepth;
    private final int brokerId;
    /** Accepted connections that have not presented a token yet. */
    private final SourceAdmission unidentified;
    private final Map<Long, CompletableFuture<RdmaStream>> expected = new ConcurrentHashMap<>();
    /**
     * Anyone who reaches the RDMA port can make these lines: limited per kind, so that a flood of one hides no
     * other.
     */
    private final Map<Refusal, RateLimitedWarning> refusalLines = new EnumMap<>(Refusal.class);

    private RdmaChannelTransport(RdmaProvider provider, EventLoopGroup group, Channel server, int handshakeTimeoutMs,
                                 int sendQueueDepth, int receiveQueueDepth, int maxUnidentified, int brokerId,
                                 long warnIntervalMs) {
        this.brokerId = brokerId;
        this.provider = provider;
        this.group = group;
        this.server = server;
        this.handshakeTimeoutMs = handshakeTimeoutMs;
        this.sendQueueDepth = sendQueueDepth;
        this.receiveQueueDepth = receiveQueueDepth;
        this.unidentified = SourceAdmission.handshakes(maxUnidentified, "RDMA connections without a token");
        for (Refusal kind : Refusal.values()) {
            refusalLines.put(kind, new RateLimitedWarning(LOG, warnIntervalMs));
        }
    }

    /**
     * Starts the event loop and the listener on {@code host:port} (port 0: ephemeral, for tests).
     *
     * @param brokerId this broker's id, the answer to a follower's probe
     * @throws IOException naming the address when the listener cannot be bound
     */
    static RdmaChannelTransport open(RdmaProvider provider, int brokerId, String host, int port,
                                     int handshakeTimeoutMs, int sendQueueDepth, int receiveQueueDepth,
                                     int maxUnidentified) throws IOException {
        return open(provider, brokerId, host, port, handshakeTimeoutMs, sendQueueDepth, receiveQueueDepth,
                maxUnidentified, WARN_INTERVAL_MS);
    }

    /** As the other {@code open}, with refusal lines limited to one per {@code warnIntervalMs} of each kind. */
    static RdmaChannelTransport open(RdmaProvider provider, int brokerId, String host, int port,
                                     int handshakeTimeoutMs, int sendQueueDepth, int receiveQueueDepth,
                                     int maxUnidentified, long warnIntervalMs) throws IOException {
        int sendDepth = sendQueueDepthFor(sendQueueDepth);
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, new DefaultThreadFactory("rdma-replication", true),
                RdmaIoHandler.newFactory(provider, handshakeMemoryBytes(receiveQueueDepth, maxUnidentified)));
        InetSocketAddress address = host == null || host.isEmpty() ? new InetSocketAddress(port)
                : new InetSocketAddress(host, port);
        RdmaChannelTransport[] self = new RdmaChannelTransport[1];
        ChannelFuture bound = new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                .childOption(ChannelOption.AUTO_READ, false)
                .childOption(ChannelOption.ALLOW_HALF_CLOSURE, true)
                .childOption(ChannelOption.WRITE_BUFFER_WATER_MARK, waterMark())
                .childOption(RdmaChannelOption.SEND_QUEUE_DEPTH, sendDepth)
                .childOption(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, receiveQueueDepth)
                // Anyone who reaches this port may announce a message before the token is checked: bound what one
                // announcement can make the broker allocate (the stream writes at most 256 KiB per message anyway).
                .childOption(RdmaChannelOption.MAX_MESSAGE_SIZE, MAX_MESSAGE_SIZE)
                // A connection that never completes the transport's own handshake holds its queue pair and receive
                // buffers until this: the same bound as a token's (Netty's default would be 30 s).
                .childOption(ChannelOption.CONNECT_TIMEOUT_MILLIS, handshakeTimeoutMs)
                .childHandler(new ChannelInitializer<Channel>() {
                    @Override
                    protected void initChannel(Channel ch) {
                        ch.pipeline().addLast(self[0].new TokenReader((RdmaSocketChannel) ch));
                    }
                })
                .bind(address);
        boolean done = bound.awaitUninterruptibly(handshakeTimeoutMs, TimeUnit.MILLISECONDS);
        if (!done || !bound.isSuccess()) {
            bound.channel().close();
            group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
            Throwable cause = done ? bound.cause() : null;
            throw new IOException("cannot listen for RDMA replication connections on " + address + " with provider "
                    + provider.name() + ": " + (cause == null ? "bind did not complete within " + handshakeTimeoutMs
                    + " ms" : cause.toString()) + " (free that port, or move it with "
                    + RdmaReplicationConfig.RDMA_PORT_OFFSET + " on every broker; or check the RDMA device)", cause);
        }
        RdmaChannelTransport t = new RdmaChannelTransport(provider, group, bound.channel(), handshakeTimeoutMs,
                sendDepth, receiveQueueDepth, maxUnidentified, brokerId, warnIntervalMs);
        self[0] = t;
        return t;
    }

    /**
     * The receive buffers the event loop may commit to accepted connections whose transport handshake has not
     * completed: enough for {@code maxUnidentified} of them (each is counted from its accept), since a place the
     * plugin grants must not be refused by the transport; at least {@code rdmabridge.handshakeMemoryBytes} (the
     * transport's default when unset). The transport's default alone, 64 MiB, held only 14 of the default 16.
     */
    static long handshakeMemoryBytes(int receiveQueueDepth, int maxUnidentified) {
        // The listener's children keep the transport's receive buffer size and control credits.
        ConnectionConfig defaults = ConnectionConfig.DEFAULT;
        long perConnection = (long) (receiveQueueDepth + defaults.controlCredits()) * defaults.receiveBufferSize();
        return Math.max(maxUnidentified * perConnection,
                Long.getLong(RdmaIoHandler.HANDSHAKE_MEMORY_PROPERTY, RdmaIoHandler.DEFAULT_HANDSHAKE_MEMORY));
    }

    /** The connection core wants a power of two, at least twice its completion-signal interval. */
    static int sendQueueDepthFor(int requested) {
        int depth = Math.max(32, requested);
        return Integer.bitCount(depth) == 1 ? depth : Integer.highestOneBit(depth) << 1;
    }

    private static WriteBufferWaterMark waterMark() {
        return new WriteBufferWaterMark(RdmaChannelStream.MAX_WRITE, 4 * RdmaChannelStream.MAX_WRITE);
    }

    private int highBuffers() {
        // Below the channel's own pressure mark (three quarters of the receive buffers), so it never copies.
        return Math.max(1, receiveQueueDepth / 2);
    }

    @Override
    public boolean isAvailable() {
        return server.isActive();
    }

    @Override
    public String unavailabilityCause() {
        return server.isActive() ? null : "the RDMA listener " + server + " is closed";
    }

    @Override
    public int listenPort() {
        return ((InetSocketAddress) server.localAddress()).getPort();
    }

    @Override
    public int brokerId() {
        return brokerId;
    }

    @Override
    public CompletableFuture<RdmaStream> expect(long token) {
        CompletableFuture<RdmaStream> f = new CompletableFuture<>();
        if (expected.putIfAbsent(token, f) != null) {
            return CompletableFuture.failedFuture(new IOException("token already expected"));
        }
        f.whenComplete((s, e) -> expected.remove(token, f));
        return f;
    }

    @Override
    public CompletableFuture<RdmaStream> connect(InetSocketAddress leader, long token, int leaderBrokerId) {
        CompletableFuture<RdmaStream> f = new CompletableFuture<>();
        RdmaChannelStream[] stream = new RdmaChannelStream[1];
        ChannelFuture connected = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                .option(ChannelOption.CONNECT_TIMEOUT_MILLIS, handshakeTimeoutMs)
                .option(ChannelOption.ALLOW_HALF_CLOSURE, true)
                .option(ChannelOption.WRITE_BUFFER_WATER_MARK, waterMark())
                .option(RdmaChannelOption.SEND_QUEUE_DEPTH, sendQueueDepth)
                .option(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, receiveQueueDepth)
                .option(RdmaChannelOption.MAX_MESSAGE_SIZE, MAX_MESSAGE_SIZE)
                .handler(new ChannelInitializer<Channel>() {
                    @Override
                    protected void initChannel(Channel ch) {
                        stream[0] = new RdmaChannelStream((RdmaSocketChannel) ch, provider.name(), highBuffers());
                        ch.pipeline().addLast(new TokenAckReader(leader, leaderBrokerId, stream[0], f), stream[0]);
                    }
                })
                .connect(leader);
        connected.addListener((ChannelFuture cf) -> {
            if (!cf.isSuccess()) {
                f.completeExceptionally(cf.cause());
                return;
            }
            Channel ch = cf.channel();
            ByteBuf t = ch.alloc().directBuffer(TOKEN_LENGTH).writeLong(token);
            ch.writeAndFlush(t).addListener((ChannelFuture wf) -> {
                if (!wf.isSuccess()) {
                    f.completeExceptionally(wf.cause());
                    ch.close();
                }
            });
        });
        // A cancelled or timed-out attempt must not leave a connection behind.
        f.whenComplete((s, e) -> {
            if (e != null) {
                connected.cancel(false);
                connected.channel().close();
            }
        });
        return f;
    }

    @Override
    public CompletableFuture<Integer> probe(InetSocketAddress leaderRdma) {
        CompletableFuture<Integer> f = new CompletableFuture<>();
        ChannelFuture connected = new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                .option(ChannelOption.CONNECT_TIMEOUT_MILLIS, handshakeTimeoutMs)
                .option(RdmaChannelOption.SEND_QUEUE_DEPTH, sendQueueDepth)
                .option(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, receiveQueueDepth)
                .option(RdmaChannelOption.MAX_MESSAGE_SIZE, MAX_MESSAGE_SIZE)
                .handler(new ProbeAnswerReader(leaderRdma, f))
                .connect(leaderRdma);
        connected.addListener((ChannelFuture cf) -> {
            if (!cf.isSuccess()) {
                f.completeExceptionally(cf.cause());
                return;
            }
            ByteBuf t = cf.channel().alloc().directBuffer(TOKEN_LENGTH).writeLong(Preamble.PROBE_TOKEN);
            cf.channel().writeAndFlush(t).addListener((ChannelFuture wf) -> {
                if (!wf.isSuccess()) {
                    f.completeExceptionally(wf.cause());
                }
            });
        });
        // The probe's connection never carries anything else: close it however the probe ends.
        f.whenComplete((id, e) -> {
            connected.cancel(false);
            connected.channel().close();
        });
        return f;
    }

    @Override
    public String providerName() {
        return provider.name();
    }

    /**
     * Closes the listener, cancels the handshakes still waiting for their stream and stops the event loop, whose
     * connections close with it. Waits at most {@code rdma.handshake.timeout.ms} in all: one deadline for both waits,
     * since a broker stopping, or Kafka removing the reporter, waits for this (each wait had the whole timeout, so a
     * stuck event loop held the caller twice it). What is left then finishes on the loop's own daemon thread.
     */
    @Override
    public void close() {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(handshakeTimeoutMs);
        server.close().awaitUninterruptibly(handshakeTimeoutMs, TimeUnit.MILLISECONDS);
        for (CompletableFuture<RdmaStream> f : expected.values()) {
            f.cancel(false);
        }
        // Started even with no time left (then not waited for): the group must stop in any case.
        group.shutdownGracefully(0, 2, TimeUnit.SECONDS)
                .awaitUninterruptibly(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
    }

    /**
     * Follower side, the only handler of a probe's connection: completes the probe with the broker id of a valid
     * answer, or exceptionally when the connection ends or answers something else. Event loop only.
     */
    private static final class ProbeAnswerReader extends ChannelInboundHandlerAdapter {
        private final InetSocketAddress leaderRdma;
        private final CompletableFuture<Integer> result;
        private long answer;
        private int answerBytes;
        private boolean connected;

        ProbeAnswerReader(InetSocketAddress leaderRdma, CompletableFuture<Integer> result) {
            this.leaderRdma = leaderRdma;
            this.result = result;
        }

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ByteBuf buf = (ByteBuf) msg;
            while (answerBytes < Preamble.PROBE_ANSWER_LENGTH && buf.isReadable()) {
                answer = answer << 8 | buf.readUnsignedByte();
                answerBytes++;
            }
            buf.release();
            if (answerBytes < Preamble.PROBE_ANSWER_LENGTH) {
                return;
            }
            int magic = (int) (answer >>> 32);
            if (magic != Preamble.MAGIC) {
                result.completeExceptionally(new IOException(leaderRdma + " answered the RDMA probe with magic 0x"
                        + Integer.toHexString(magic) + " (expected: 0x" + Integer.toHexString(Preamble.MAGIC)
                        + "): something other than the RDMA replication plugin listens there"));
            } else {
                result.complete((int) answer);
            }
            ctx.close();
        }

        @Override
        public void channelActive(ChannelHandlerContext ctx) {
            connected = true;
            ctx.fireChannelActive();
        }

        @Override
        public void channelInactive(ChannelHandlerContext ctx) {
            result.completeExceptionally(refused("closed the RDMA probe"));
            ctx.fireChannelInactive();
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            // Past the transport's own handshake a listener of this transport took the connection: a failure now says
            // it did not answer, not that nothing listens.
            result.completeExceptionally(connected ? refused("failed the RDMA probe (" + cause + ")") : cause);
            ctx.close();
        }

        private ProbeRefusedException refused(String how) {
            return new ProbeRefusedException(leaderRdma + " " + how + " after " + answerBytes + " of "
                    + Preamble.PROBE_ANSWER_LENGTH + " answer bytes: its plugin is closing, or gave up on the probe "
                    + "(the leader's log names why)");
        }
    }

    /**
     * Follower side, first handler of a stream's connection: completes the connect with the stream once the leader
     * has acknowledged the token as the broker the follower expects, then leaves the connection to the stream; fails
     * it when the leader closes the connection first (it refused the token) or answers something else. Event loop
     * only.
     */
    private static final class TokenAckReader extends ChannelInboundHandlerAdapter {
        private final InetSocketAddress leader;
        private final int leaderBrokerId;
        private final RdmaChannelStream stream;
        private final CompletableFuture<RdmaStream> result;
        private long ack;
        private int ackBytes;

        TokenAckReader(InetSocketAddress leader, int leaderBrokerId, RdmaChannelStream stream,
                       CompletableFuture<RdmaStream> result) {
            this.leader = leader;
            this.leaderBrokerId = leaderBrokerId;
            this.stream = stream;
            this.result = result;
        }

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ByteBuf buf = (ByteBuf) msg;
            while (ackBytes < Preamble.TOKEN_ACK_LENGTH && buf.isReadable()) {
                ack = ack << 8 | buf.readUnsignedByte();
                ackBytes++;
            }
            if (ackBytes < Preamble.TOKEN_ACK_LENGTH) {
                buf.release();
                return;
            }
            int magic = (int) (ack >>> 32);
            if (magic != Preamble.MAGIC) {
                buf.release();
                fail(ctx, leader + " acknowledged the RDMA stream's token with magic 0x" + Integer.toHexString(magic)
                        + " (expected: 0x" + Integer.toHexString(Preamble.MAGIC) + ")");
                return;
            }
            if ((int) ack != leaderBrokerId) {
                buf.release();
                fail(ctx, leader + " acknowledged the RDMA stream's token as broker " + (int) ack + " (expected: "
                        + "leader " + leaderBrokerId + ", which answered the probe): another broker's plugin listens "
                        + "there, or the leader is broken");
                return;
            }
            ctx.pipeline().remove(this);
            if (buf.isReadable()) {
                stream.offer(buf);
            } else {
                buf.release();
            }
            if (!result.complete(stream)) {
                // Given up meanwhile (deadline, cancel): its own listener closes the connection.
                stream.close();
            }
        }

        @Override
        public void userEventTriggered(ChannelHandlerContext ctx, Object evt) {
            if (evt instanceof ChannelInputShutdownEvent) {
                fail(ctx, refused("ended"));
                return;
            }
            ctx.fireUserEventTriggered(evt);
        }

        @Override
        public void channelInactive(ChannelHandlerContext ctx) {
            result.completeExceptionally(new IOException(refused("closed")));
            ctx.fireChannelInactive();
        }

        private String refused(String how) {
            return leader + " " + how + " the RDMA stream after " + ackBytes + " of " + Preamble.TOKEN_ACK_LENGTH
                    + " token acknowledgement bytes: it refused the token (another connection presented it first, "
                    + "or the handshake had expired; the leader's log names it)";
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            result.completeExceptionally(cause);
            ctx.close();
        }

        private void fail(ChannelHandlerContext ctx, String why) {
            result.completeExceptionally(new IOException(why));
            ctx.close();
        }
    }

    /** Accepted connections that have not presented a token yet (rdma.handshake.max.in.progress bounds them). */
    int unidentifiedConnections() {
        return unidentified.held();
    }

    /** The line limit of one kind of refusal, for its counts. */
    RateLimitedWarning refusalLines(Refusal kind) {
        return refusalLines.get(kind);
    }

    /**
     * Leader side, first handler of an accepted connection: reads the token, then hands the channel to the
     * {@link RdmaChannelStream} the matching {@link #expect} is waiting for. Event loop only.
     */
    private final class TokenReader extends ChannelInboundHandlerAdapter {
        private final RdmaSocketChannel channel;
        private long token;
        private int tokenBytes;
        private boolean counted;
        private InetAddress source;
        private ScheduledFuture<?> deadline;

        TokenReader(RdmaSocketChannel channel) {
            this.channel = channel;
        }

        /**
         * Counted from the moment the connection is accepted, not from its activation: its queue pair and receive
         * buffers exist from then on, and a peer that never completes the transport's handshake is never active.
         */
        @Override
        public void handlerAdded(ChannelHandlerContext ctx) {
            InetAddress from = SourceShares.sourceOf(ctx.channel().remoteAddress());
            String refused = unidentified.admit(from);
            if (refused != null) {
                reject(ctx, refused, Refusal.OVER_CAP);
                return;
            }
            source = from;
            counted = true;
            deadline = ctx.executor().schedule(() -> reject(ctx, (tokenBytes < TOKEN_LENGTH ? "no token"
                    : "its probe answer was not delivered") + " within " + handshakeTimeoutMs + " ms "
                    + "(rdma.handshake.timeout.ms)", Refusal.NO_TOKEN), handshakeTimeoutMs, TimeUnit.MILLISECONDS);
        }

        @Override
        public void handlerRemoved(ChannelHandlerContext ctx) {
            uncount();
        }

        @Override
        public void channelActive(ChannelHandlerContext ctx) {
            if (counted) {
                ctx.read();
            }
            ctx.fireChannelActive();
        }

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ByteBuf buf = (ByteBuf) msg;
            while (tokenBytes < TOKEN_LENGTH && buf.isReadable()) {
                token = token << 8 | buf.readUnsignedByte();
                tokenBytes++;
            }
            if (tokenBytes < TOKEN_LENGTH) {
                buf.release();
                ctx.read();
                return;
            }
            if (token == Preamble.PROBE_TOKEN) {
                // Still counted, and still under the deadline, until the channel is inactive: a peer that never
                // takes the answer must not keep the connection open outside rdma.handshake.max.in.progress.
                buf.release();
                ByteBuf answer = ctx.alloc().directBuffer(Preamble.PROBE_ANSWER_LENGTH)
                        .writeBytes(Preamble.probeAnswer(brokerId));
                ctx.writeAndFlush(answer).addListener(ChannelFutureListener.CLOSE);
                return;
            }
            uncount();
            CompletableFuture<RdmaStream> f = expected.remove(token);
            if (f == null) {
                buf.release();
                reject(ctx, "it presented a token no replication connection expects", Refusal.UNKNOWN_TOKEN);
                return;
            }
            RdmaChannelStream stream = new RdmaChannelStream(channel, provider.name(), highBuffers());
            ctx.pipeline().replace(this, "stream", stream);
            if (buf.isReadable()) {
                stream.offer(buf);
            } else {
                buf.release();
            }
            if (!f.complete(stream)) {
                // The handshake gave up meanwhile: no acknowledgement, so the follower's connect fails.
                stream.close();
                return;
            }
            // Still ahead of every byte of Kafka's: the leader writes only in answer to the follower's requests, which
            // follow this acknowledgement, and a write from another thread would queue behind this task anyway.
            channel.writeAndFlush(channel.alloc().directBuffer(Preamble.TOKEN_ACK_LENGTH)
                    .writeBytes(Preamble.probeAnswer(brokerId)));
            channel.config().setAutoRead(true);
        }

        @Override
        public void channelInactive(ChannelHandlerContext ctx) {
            uncount();
            ctx.fireChannelInactive();
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            if (counted) {
                // The transport refused it (its handshake memory, say) or it broke: a peer can make this over and
                // over, and an operator must see it, unlike the failures of a connection already refused or ended.
                reject(ctx, "the RDMA transport failed it before it presented its token: " + cause,
                        Refusal.TRANSPORT);
                return;
            }
            LOG.debug("RDMA replication connection {} failed before presenting its token", ctx.channel(), cause);
            ctx.close();
        }

        private void uncount() {
            if (deadline != null) {
                deadline.cancel(false);
                deadline = null;
            }
            if (counted) {
                counted = false;
                unidentified.release(source);
            }
        }

        private void reject(ChannelHandlerContext ctx, String why, Refusal kind) {
            uncount();
            refusalLines.get(kind).warn("Closing RDMA replication connection: {}: {}", ctx.channel().remoteAddress(),
                    why);
            ctx.close();
        }
    }
}
