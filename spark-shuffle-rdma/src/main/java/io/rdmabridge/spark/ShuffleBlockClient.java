package io.rdmabridge.spark;

import io.netty.bootstrap.Bootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.ChannelOption;
import io.netty.channel.SimpleChannelInboundHandler;
import io.netty.handler.codec.CorruptedFrameException;
import io.netty.util.AttributeKey;
import io.netty.util.concurrent.Future;
import io.netty.util.concurrent.Promise;
import io.netty.util.concurrent.ScheduledFuture;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Predicate;
import java.util.function.ToLongFunction;
import org.apache.spark.network.client.ChunkFetchFailureException;
import org.apache.spark.network.shuffle.BlockFetchingListener;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Fetches shuffle blocks from other executors' {@link ShuffleBlockServer}s: one connection per server, shared by all
 * tasks of this executor, requests pipelined on it. Every block asked for gets exactly one callback, success or
 * failure; a connection that closes, errs, sends no challenge within the fetch timeout or stays silent past it with
 * fetches outstanding fails them all with an {@link IOException}, which Spark's retries take for transient (see
 * {@link RoutingBlockStoreClient}); a block the server reports it cannot serve fails alone, with a
 * {@link ChunkFetchFailureException}, which they do not. Each frame's header is checked as soon as it arrives, so a
 * peer cannot make this side buffer a frame it would refuse, nor a block larger than Spark would fetch into memory.
 * Where a budget per connection is set, nor can it make this side hold much more than that (received bytes, and
 * blocks Spark has not released yet): once past it, by about a block, the client stops reading the connection, so
 * that the transport's credits hold the server back as a full TCP window would, and reads again once Spark has
 * released enough. Spark counts its fetches in flight by the sizes it asked for, and a server may answer each with
 * far more.
 *
 * <p>Threading: {@link #fetch} may be called from any thread; each connection's state lives on its event loop, but
 * for the bytes of its blocks, which Spark releases on its own threads.
 */
final class ShuffleBlockClient implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(ShuffleBlockClient.class);
    /** How long a server that refused a connection for its cap is not dialled again; its fetches go elsewhere. */
    static final long BUSY_BACKOFF_NANOS = TimeUnit.SECONDS.toNanos(5);
    /** Why a connection closed, kept on the channel for fetches that reach it after its handlers are gone. */
    private static final AttributeKey<IOException> CLOSED_CAUSE = AttributeKey.valueOf(ShuffleBlockClient.class,
            "closedCause");

    private final BlockTransport transport;
    private final Bootstrap bootstrap;
    private final PeerAuthenticator authenticator;
    private final RdmaShuffleMetrics metrics;
    private final long fetchTimeoutNanos;
    private final ToLongFunction<String> maxBlockLength;
    private final long maxHeldBytes;
    private final Map<Target, Future<Channel>> connections = new ConcurrentHashMap<>();
    /** Servers that refused a connection for their cap, until when ({@link System#nanoTime}) they are not dialled. */
    private final Map<Target, Long> busyUntil = new ConcurrentHashMap<>();

    /**
     * @param maxBlockLength the largest block taken for a block id, {@link RdmaShuffleConf#maxFetchedBlockLength}
     * @param maxHeldBytes the budget of each connection, {@link RdmaShuffleConf#maxFetchedBytesPerConnection}
     */
    ShuffleBlockClient(BlockTransport transport, PeerAuthenticator authenticator, int connectTimeoutMillis,
                       long fetchTimeoutMillis, ToLongFunction<String> maxBlockLength, long maxHeldBytes,
                       RdmaShuffleMetrics metrics) {
        this.transport = transport;
        this.authenticator = authenticator;
        this.metrics = metrics;
        this.fetchTimeoutNanos = TimeUnit.MILLISECONDS.toNanos(fetchTimeoutMillis);
        this.maxBlockLength = maxBlockLength;
        this.maxHeldBytes = maxHeldBytes;
        bootstrap = transport.newBootstrap()
                .option(ChannelOption.CONNECT_TIMEOUT_MILLIS, connectTimeoutMillis);
    }

    /**
     * Fetches {@code blockIds} from executor {@code executorId}'s block server at {@code address}, reporting each to
     * {@code listener}. The handshake binds the executor id: a server that is not that executor's fails it.
     */
    void fetch(String executorId, InetSocketAddress address, String[] blockIds, BlockFetchingListener listener) {
        fetch(executorId, address, blockIds, listener, null);
    }

    /**
     * As {@link #fetch(String, InetSocketAddress, String[], BlockFetchingListener)}, but when no connection to the
     * server can be made (refused, timed out, or closed before its challenge), nothing was asked of it and
     * {@code unreachable} is offered the cause first: when it answers {@code true} it has taken the fetch elsewhere,
     * and {@code listener} hears nothing from here. So is a server that is not the one meant: its challenge shows a
     * {@code spark.authenticate} other than this executor's (Spark gives every executor of an application the same
     * settings), or it fails to prove that it serves {@code executorId} with the application's secret. That is most
     * likely another application's or executor's block server on a port the executor held before it went. Declined,
     * its blocks fail at once with that cause, which is no {@link IOException}: Spark does not retry it, as it does
     * not retry a failed authentication on its own transport. A server that refuses the connection before its
     * challenge (it holds {@code spark.shuffle.rdma.maxConnections}, or this host's share) is offered as a
     * {@link ServerBusy}: it is alive, so the executor's own Spark transport can serve the blocks. Fetches are sent
     * only once the server has proven itself.
     */
    void fetch(String executorId, InetSocketAddress address, String[] blockIds, BlockFetchingListener listener,
               Predicate<IOException> unreachable) {
        Target server = new Target(executorId, address);
        Long busy = busyUntil.get(server);
        if (busy != null) {
            if (System.nanoTime() - busy < 0) {
                // Not dialled again so soon: each refused connection costs the full server a queue pair.
                ServerBusy refused = new ServerBusy("shuffle block server " + server + " refused a connection less "
                        + "than " + TimeUnit.NANOSECONDS.toMillis(BUSY_BACKOFF_NANOS) + " ms ago for its connection "
                        + "cap (" + RdmaShuffleConf.MAX_CONNECTIONS + ")");
                elsewhereOrFail(unreachable, refused, refused, blockIds, listener);
                return;
            }
            busyUntil.remove(server, busy);
        }
        connection(server).addListener(f -> {
            if (f.isSuccess()) {
                Channel ch = (Channel) f.getNow();
                ch.eventLoop().execute(() -> {
                    // A channel that closed meanwhile has already lost its handlers.
                    ConnectionHandler handler = ch.pipeline().get(ConnectionHandler.class);
                    if (handler == null) {
                        // Say why it closed (the server refused us, say), not only that it did.
                        IOException why = ch.attr(CLOSED_CAUSE).get();
                        failAll(blockIds, listener, why != null ? why : new IOException("connection to shuffle block"
                                + " server " + server + " closed before the fetch was sent"));
                    } else {
                        handler.send(blockIds, listener);
                    }
                });
            } else if (f.cause() instanceof WrongServer wrong) {
                elsewhereOrFail(unreachable, new IOException(wrong.getMessage(), wrong), wrong, blockIds, listener);
            } else if (f.cause() instanceof ServerBusy refused) {
                busyUntil.put(server, System.nanoTime() + BUSY_BACKOFF_NANOS);
                elsewhereOrFail(unreachable, refused, refused, blockIds, listener);
            } else {
                IOException cause = new IOException("cannot reach shuffle block server " + server + ": "
                        + f.cause().getMessage(), f.cause());
                elsewhereOrFail(unreachable, cause, cause, blockIds, listener);
            }
        });
    }

    private Future<Channel> connection(Target server) {
        while (true) {
            Future<Channel> existing = connections.get(server);
            if (existing != null && (!existing.isDone() || existing.isSuccess() && existing.getNow().isActive())) {
                return existing;
            }
            Promise<Channel> ready = bootstrap.config().group().next().newPromise();
            if (existing == null ? connections.putIfAbsent(server, ready) == null
                    : connections.replace(server, existing, ready)) {
                connect(server, ready);
                return ready;
            }
        }
    }

    private void connect(Target server, Promise<Channel> ready) {
        ChannelFuture connected = bootstrap.clone().handler(new ChannelInitializer<>() {
            @Override
            protected void initChannel(Channel ch) {
                transport.track(ch);
                ConnectionHandler handler = new ConnectionHandler(server, ready);
                ch.pipeline().addLast(handler.decoder, handler);
            }
        }).connect(server.address());
        connected.addListener(f -> {
            if (!f.isSuccess()) {
                ready.tryFailure(f.cause());
                connections.remove(server, ready);
            } else {
                connected.channel().closeFuture().addListener(c -> connections.remove(server, ready));
            }
        });
    }

    /** Offers {@code offered} to {@code unreachable}; unless it took the fetch elsewhere, fails every block. */
    private void elsewhereOrFail(Predicate<IOException> unreachable, IOException offered, Throwable failure,
                                 String[] blockIds, BlockFetchingListener listener) {
        if (unreachable == null || !unreachable.test(offered)) {
            failAll(blockIds, listener, failure);
        }
    }

    private void failAll(String[] blockIds, BlockFetchingListener listener, Throwable cause) {
        for (String blockId : blockIds) {
            metrics.fetchFailures.inc();
            listener.onBlockFetchFailure(blockId, cause);
        }
    }

    @Override
    public void close() {
        for (Future<Channel> f : connections.values()) {
            if (f.isSuccess()) {
                f.getNow().close();
            }
        }
        connections.clear();
    }

    private record Pending(String blockId, long maxLength, BlockFetchingListener listener, long sentNanos) {
    }

    /** A block server as a reducer dials it: the executor it must prove to be, and its address. */
    private record Target(String executorId, InetSocketAddress address) {
        @Override
        public String toString() {
            return "of executor " + executorId + " at " + address;
        }
    }

    /** One connection to a block server; confined to its event loop, but for {@link #blockReleased}. */
    private final class ConnectionHandler extends SimpleChannelInboundHandler<ByteBuf> {
        private final Target server;
        private final Promise<Channel> ready;
        final BlockFrame.CheckedFrameDecoder decoder = BlockFrame.newFrameDecoder(this::checkHeader);
        /** Bytes of the blocks handed to Spark that it has not released yet; they go down on its threads. */
        private final AtomicLong blockBytes = new AtomicLong();
        /** Set while reading is stopped for the budget; read by the threads that release blocks. */
        private volatile boolean paused;
        private long pausedNanos;
        private boolean pauseWarned;
        private final Map<Long, Pending> pending = new HashMap<>();
        private long nextRequestId;
        private long lastReadNanos = System.nanoTime();
        private long activeNanos;
        private Throwable failure;
        private ScheduledFuture<?> timeoutCheck;
        /** Both nonces of the handshake, kept from the CHALLENGE to check the server's PROOF. */
        private byte[] serverNonce;
        private byte[] clientNonce;
        /** Set once this side has answered the server's CHALLENGE. */
        private boolean challenged;
        /** Set once the server's PROOF has verified (or, with no secret here, arrived): fetches go from here. */
        private boolean proven;

        ConnectionHandler(Target server, Promise<Channel> ready) {
            this.server = server;
            this.ready = ready;
        }

        void send(String[] blockIds, BlockFetchingListener listener) {
            Channel ch = ready.getNow();
            if (!ch.isActive()) {
                failAll(blockIds, listener, closedCause());
                return;
            }
            long now = System.nanoTime();
            if (pending.isEmpty()) {
                lastReadNanos = now;
            }
            for (String blockId : blockIds) {
                long requestId = nextRequestId;
                ByteBuf fetch;
                try {
                    fetch = BlockFrame.fetch(ch.alloc(), requestId, blockId);
                } catch (IllegalArgumentException e) {
                    // Before it is pending: thrown out of here, the id and those after it never got their callback.
                    listener.onBlockFetchFailure(blockId, e);
                    continue;
                }
                nextRequestId++;
                pending.put(requestId, new Pending(blockId, maxBlockLength.applyAsLong(blockId), listener, now));
                ch.write(fetch, ch.voidPromise());
            }
            ch.flush();
        }

        @Override
        public void channelActive(ChannelHandlerContext ctx) {
            activeNanos = System.nanoTime();
            long period = Math.max(TimeUnit.MILLISECONDS.toNanos(100), fetchTimeoutNanos / 4);
            timeoutCheck = ctx.executor().scheduleAtFixedRate(() -> {
                long now = System.nanoTime();
                // Fetches wait for the challenge outside pending: without this, a peer that never sends one holds
                // them (and Spark's reader) for ever.
                if (!ready.isDone() && now - activeNanos > fetchTimeoutNanos) {
                    exceptionCaught(ctx, new IOException("no " + (challenged ? "PROOF" : "CHALLENGE")
                            + " from shuffle block server " + server
                            + " within " + TimeUnit.NANOSECONDS.toMillis(fetchTimeoutNanos) + " ms ("
                            + RdmaShuffleConf.FETCH_TIMEOUT + "): it is not an rdma-bridge block server, or it is "
                            + "stalled"));
                } else if (paused) {
                    // Silence is this side's own doing, not the server's: no timeout while paused.
                    if (!pauseWarned && now - pausedNanos > fetchTimeoutNanos) {
                        pauseWarned = true;
                        LOG.warn("Not reading shuffle block server {} for {} ms: Spark holds {} bytes of its blocks, "
                                + "and {} bytes have arrived undecoded, past {}={} with {} fetches outstanding; if "
                                + "tasks wait for them meanwhile, raise it", server,
                                TimeUnit.NANOSECONDS.toMillis(now - pausedNanos), blockBytes.get(),
                                decoder.bufferedBytes(), RdmaShuffleConf.MAX_FETCHED_BYTES_PER_CONNECTION,
                                maxHeldBytes, pending.size());
                    }
                } else if (!pending.isEmpty() && now - lastReadNanos > fetchTimeoutNanos) {
                    exceptionCaught(ctx, new IOException("no data from shuffle block server " + server + " for "
                            + TimeUnit.NANOSECONDS.toMillis(fetchTimeoutNanos) + " ms with " + pending.size()
                            + " fetches outstanding (" + RdmaShuffleConf.FETCH_TIMEOUT + ")"));
                }
            }, period, period, TimeUnit.NANOSECONDS);
            ctx.fireChannelActive();
        }

        /**
         * Refuses a frame at its header, before its body is buffered: a peer could otherwise make this executor hold up
         * to 2 GiB before it has even sent its challenge, for a request never made, as a failure message, or as a
         * block larger than any Spark fetches into memory.
         */
        void checkHeader(int length, byte type, long requestId) {
            if (!challenged) {
                if (type == BlockFrame.CHALLENGE ? length != BlockFrame.CHALLENGE_FRAME_LENGTH
                        : type != BlockFrame.FAILURE) {
                    throw new CorruptedFrameException("type=" + type + " length=" + length + " from " + server
                            + " before its CHALLENGE (expected: a CHALLENGE of length "
                            + BlockFrame.CHALLENGE_FRAME_LENGTH + ", or a FAILURE): it is not an rdma-bridge block "
                            + "server");
                }
            } else if (!proven) {
                if (type == BlockFrame.PROOF ? length != BlockFrame.PROOF_FRAME_LENGTH
                        : type != BlockFrame.FAILURE || requestId != BlockFrame.CONNECTION_REQUEST_ID) {
                    throw new CorruptedFrameException("type=" + type + " length=" + length + " from " + server
                            + " before its PROOF (expected: a PROOF of length " + BlockFrame.PROOF_FRAME_LENGTH
                            + ", or a FAILURE of the connection): it is not this application's block server");
                }
            } else if (type != BlockFrame.BLOCK && type != BlockFrame.FAILURE) {
                throw new CorruptedFrameException("type=" + type + " from " + server + " (expected: CHALLENGE, then "
                        + "PROOF, then BLOCK or FAILURE)");
            }
            if (type == BlockFrame.FAILURE && length > BlockFrame.MAX_FAILURE_FRAME_LENGTH) {
                throw new CorruptedFrameException("FAILURE length=" + length + " from " + server + " (expected: at "
                        + "most " + BlockFrame.MAX_FAILURE_FRAME_LENGTH + ": a message of at most "
                        + BlockFrame.MAX_FAILURE_MESSAGE_LENGTH + " bytes)");
            }
            boolean fetchResponse = type == BlockFrame.BLOCK
                    || type == BlockFrame.FAILURE && requestId != BlockFrame.CONNECTION_REQUEST_ID;
            if (fetchResponse && !pending.containsKey(requestId)) {
                throw new CorruptedFrameException("requestId=" + requestId + " from " + server
                        + " (expected: one of the " + pending.size() + " outstanding fetches)");
            }
            if (type == BlockFrame.BLOCK) {
                Pending p = pending.get(requestId);
                long blockLength = (long) length - BlockFrame.TYPE_LENGTH - BlockFrame.REQUEST_ID_LENGTH;
                if (blockLength > p.maxLength) {
                    throw new CorruptedFrameException("BLOCK length=" + length + " from shuffle block server " + server
                            + ": " + p.blockId + " of " + blockLength + " bytes (expected: at most " + p.maxLength
                            + ", the most Spark fetches into memory as this block, by "
                            + RdmaShuffleConf.MAX_REMOTE_BLOCK_SIZE_FETCH_TO_MEM + " and "
                            + RdmaShuffleConf.ACCURATE_BLOCK_THRESHOLD + "): the server sends more than the "
                            + "map output reported; if it is this application's and its blocks are genuine, raise "
                            + RdmaShuffleConf.ACCURATE_BLOCK_THRESHOLD);
                }
            }
        }

        /** Type, length and request id were checked on arrival, by {@link #checkHeader}. */
        @Override
        protected void channelRead0(ChannelHandlerContext ctx, ByteBuf frame) {
            lastReadNanos = System.nanoTime();
            byte type = BlockFrame.readType(frame);
            if (type == BlockFrame.CHALLENGE) {
                boolean authRequired = (frame.readByte() & BlockFrame.FLAG_AUTH_REQUIRED) != 0;
                byte[] nonce = BlockFrame.readExact(frame, BlockFrame.NONCE_LENGTH, "nonce");
                if (authRequired != authenticator.isRequired()) {
                    metrics.authFailures.inc();
                    throw new WrongServer("shuffle block server " + server + (authRequired
                            ? " requires authentication but this executor has no secret"
                            : " does not require authentication but this executor does")
                            + " (set spark.authenticate=true on every process of the application)");
                }
                serverNonce = nonce;
                clientNonce = PeerAuthenticator.newNonce();
                ctx.writeAndFlush(BlockFrame.response(ctx.alloc(), authenticator.clientAnswer(server.executorId(),
                        serverNonce, clientNonce), clientNonce));
                challenged = true;
            } else if (type == BlockFrame.PROOF) {
                byte[] proof = BlockFrame.readExact(frame, BlockFrame.MAC_LENGTH, "proof");
                if (authenticator.isRequired()
                        && !authenticator.verifyServer(server.executorId(), serverNonce, clientNonce, proof)) {
                    metrics.authFailures.inc();
                    throw new WrongServer("shuffle block server " + server + " failed to prove it holds this "
                            + "application's secret and serves executor " + server.executorId() + ": it is another "
                            + "application's block server, another executor's, or a process that took the port of an "
                            + "executor that is gone (spark.authenticate=true)");
                }
                proven = true;
                // Only now: a fetch sent before would tell a server that is not the one meant which blocks we want,
                // and, failed with the connection, be retried against it.
                ready.trySuccess(ctx.channel());
            } else if (type == BlockFrame.BLOCK) {
                Pending p = pending.remove(BlockFrame.readRequestId(frame));
                long size = frame.readableBytes();
                blockBytes.addAndGet(size);
                FetchedBlockBuffer block = new FetchedBlockBuffer(frame.retainedSlice(), () -> blockReleased(size));
                metrics.blocksFetched.inc();
                metrics.bytesFetched.inc(block.size());
                metrics.fetchWaitNanos.inc(lastReadNanos - p.sentNanos);
                try {
                    p.listener.onBlockFetchSuccess(p.blockId, block);
                } finally {
                    // Spark retained what it keeps; this releases the transport's own reference.
                    block.release();
                }
                pauseIfOverBudget(ctx.channel());
            } else {
                long requestId = BlockFrame.readRequestId(frame);
                String message = BlockFrame.readMessage(frame);
                if (requestId == BlockFrame.CONNECTION_REQUEST_ID) {
                    if (!challenged) {
                        // Before its challenge a server refuses only for its connection cap (or this host's share of
                        // it): it is alive and busy.
                        throw new PeerFailure(new ServerBusy("shuffle block server " + server + " refused the "
                                + "connection: " + message));
                    }
                    throw new PeerFailure("shuffle block server " + server + " closed the connection: " + message);
                }
                Pending p = pending.remove(requestId);
                metrics.fetchFailures.inc();
                // Not an IOException: Spark retries those, and a block the server cannot serve stays unservable.
                p.listener.onBlockFetchFailure(p.blockId, new ChunkFetchFailureException("shuffle block server "
                        + server + ": " + message));
            }
        }

        /** Bytes held for this connection: blocks Spark has not released, and what arrived of the next frame. */
        private long heldBytes() {
            return blockBytes.get() + decoder.bufferedBytes();
        }

        /**
         * Stops reading once the connection holds more than its budget. Only while Spark holds some of it: otherwise
         * all of it is the next frame, not complete before more is read, and nothing released would ever resume.
         */
        private void pauseIfOverBudget(Channel ch) {
            if (paused || heldBytes() <= maxHeldBytes || blockBytes.get() == 0) {
                return;
            }
            paused = true;
            // A block released meanwhile on another thread may not have seen paused set: look again.
            if (heldBytes() <= maxHeldBytes || blockBytes.get() == 0) {
                paused = false;
                return;
            }
            pausedNanos = System.nanoTime();
            pauseWarned = false;
            ch.config().setAutoRead(false);
        }

        /** On the thread of Spark's last release of a block: resumes reading, on the event loop, if it was paused. */
        private void blockReleased(long size) {
            blockBytes.addAndGet(-size);
            Channel ch = ready.getNow();
            if (paused && ch != null && ch.isActive()) {
                try {
                    ch.eventLoop().execute(() -> resumeWithinBudget(ch));
                } catch (RejectedExecutionException e) {
                    // The event loop has shut down, and the connection with it: nothing to resume.
                }
            }
        }

        private void resumeWithinBudget(Channel ch) {
            if (paused && ch.isActive() && (heldBytes() <= maxHeldBytes || blockBytes.get() == 0)) {
                paused = false;
                // The server could not send while this side did not read: its silence counts from now.
                lastReadNanos = System.nanoTime();
                ch.config().setAutoRead(true);
            }
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            if (failure == null) {
                failure = cause;
                if (cause instanceof PeerFailure p && p.getCause() instanceof ServerBusy) {
                    // Expected when a server is full; the server warns, rate-limited, and the fetch goes elsewhere.
                    LOG.debug("Closing connection to shuffle block server {}: {}", server, cause.getMessage());
                } else {
                    LOG.warn("Closing connection to shuffle block server {}", server, cause);
                }
            }
            ctx.close();
        }

        @Override
        public void channelInactive(ChannelHandlerContext ctx) {
            if (timeoutCheck != null) {
                timeoutCheck.cancel(false);
            }
            IOException cause = closedCause();
            ctx.channel().attr(CLOSED_CAUSE).set(cause);
            ready.tryFailure(failure instanceof WrongServer ? failure
                    : failure instanceof PeerFailure p && p.getCause() instanceof ServerBusy busy ? busy : cause);
            List<Pending> failed = new ArrayList<>(pending.values());
            pending.clear();
            for (Pending p : failed) {
                metrics.fetchFailures.inc();
                p.listener.onBlockFetchFailure(p.blockId, cause);
            }
            ctx.fireChannelInactive();
        }

        private IOException closedCause() {
            return failure == null ? new IOException("connection to shuffle block server " + server + " closed")
                    : new IOException("connection to shuffle block server " + server + " failed: "
                    + failure.getMessage(), failure);
        }
    }

    /**
     * The server is not the one meant: its challenge says its {@code spark.authenticate} differs from this
     * executor's, or it failed to prove that it serves the executor asked for with the application's secret.
     */
    private static final class WrongServer extends RuntimeException {
        WrongServer(String message) {
            super(message);
        }
    }

    /**
     * The server refused the connection before its challenge, which it does only when it holds as many connections as
     * {@link RdmaShuffleConf#MAX_CONNECTIONS} allows, or as many from this host as its share of them: it is alive, and
     * nothing was asked of it.
     */
    static final class ServerBusy extends IOException {
        ServerBusy(String message) {
            super(message);
        }
    }

    /** A failure reported by the peer or the handshake; unchecked so that it reaches exceptionCaught. */
    private static final class PeerFailure extends RuntimeException {
        PeerFailure(String message) {
            super(message);
        }

        PeerFailure(ServerBusy busy) {
            super(busy.getMessage(), busy);
        }
    }
}
