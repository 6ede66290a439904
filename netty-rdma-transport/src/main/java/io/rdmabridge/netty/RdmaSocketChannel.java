package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelFutureListener;
import io.netty.channel.ChannelOutboundBuffer;
import io.netty.channel.ChannelPromise;
import io.netty.channel.ConnectTimeoutException;
import io.netty.channel.DefaultFileRegion;
import io.netty.channel.EventLoop;
import io.netty.channel.FileRegion;
import io.netty.channel.IoEvent;
import io.netty.channel.IoRegistration;
import io.netty.channel.RecvByteBufAllocator;
import io.netty.channel.socket.ServerSocketChannel;
import io.netty.channel.socket.SocketChannel;
import io.netty.util.internal.logging.InternalLogger;
import io.netty.util.internal.logging.InternalLoggerFactory;
import io.rdmabridge.connection.ConnectionConfig;
import io.rdmabridge.connection.Handshake;
import io.rdmabridge.connection.RdmaConnection;
import io.rdmabridge.connection.ReceiveBuffers;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.DeviceAttributes;
import io.rdmabridge.verbs.QpCapabilities;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaException;

import java.io.IOException;
import java.net.BindException;
import java.net.ConnectException;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.NotYetConnectedException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

/**
 * A {@link SocketChannel} over an RDMA reliable-connected queue pair.
 * <pre>
 * new Bootstrap().group(group).channel(RdmaSocketChannel.class)
 * </pre>
 *
 * <h2>Local address</h2>
 * {@code bind(localAddress)} before connecting, or {@code connect(remote, local)}, binds the channel's
 * connection-manager id ({@code rdma_bind_addr}), so the connection leaves from that address as a bound NIO client's
 * does; {@link #localAddress()} reports it from the bind on. A bind that fails (the address is in use or not of this
 * host) fails with a {@link java.net.BindException} carrying the provider's error; the channel stays open and
 * unbound.
 *
 * <h2>Writes</h2>
 * Completion-based, like Netty's io_uring transport: flushed buffers are posted as eager SENDs (small ones gathered
 * into one frame) or advertised for rendezvous, and stay in the {@link ChannelOutboundBuffer} until their completion
 * (or, for a rendezvous, the peer's acknowledgement) arrives; then their bytes are removed and their promises
 * complete. Buffers in registered memory (the channel's default {@link RdmaByteBufAllocator}) go out without a copy;
 * any other buffer is copied once into registered memory and counted in {@link RdmaChannelMetrics#copiedBytes()}.
 * Each flush posts at most {@code WRITE_SPIN_COUNT} work requests before it yields to the other channels of the loop.
 *
 * <h2>Reads</h2>
 * Eager frames are handed up as the receive buffers they landed in; releasing them reposts the receive and returns a
 * credit. With {@code autoRead=false} and no read pending, nothing is reposted, so the peer runs out of credits and
 * stops: back-pressure reaches the sender's {@code isWritable()}. One read hands up at most the
 * {@link RecvByteBufAllocator.Handle#guess() guess()} of the channel's {@link RecvByteBufAllocator} in bytes, as a
 * stream socket does; the default {@link RdmaRecvByteBufAllocator} guesses {@link RdmaChannelOption#MAX_MESSAGE_SIZE},
 * so each message goes up whole. A smaller guess (Netty's {@code AdaptiveRecvByteBufAllocator}, say) makes the
 * reads hand up slices of the received buffer, still without a copy; it is reposted once every slice is released.
 *
 * <h2>Closing</h2>
 * A graceful close sends end of stream after everything posted (as TCP's FIN) and destroys the queue pair once that
 * has completed (bounded linger); the peer sees {@code ChannelInputShutdownEvent} with {@code ALLOW_HALF_CLOSURE},
 * otherwise a clean close. {@code SO_LINGER=0} closes abortively: a disconnect without end of stream, which the peer,
 * like a peer whose process died, reports as an {@link IOException} "connection reset by peer" before
 * {@code channelInactive}. An accepted channel closed while its handshake is still ending (its peer may count itself
 * connected already) closes gracefully once established, within the same linger bound. {@code shutdownOutput()} sends
 * end of stream once every posted write has completed; a write issued after it fails at once with
 * {@link ClosedChannelException}, as NIO's does.
 *
 * <h2>Threading</h2>
 * One event-loop thread owns the queue pair, its completion queue and all state here; other threads only read the
 * volatile state flags and addresses, and a released received buffer hops its repost to that thread. The hot paths
 * (write, completion, receive) allocate nothing per message and take no locks. For an accepted channel the
 * connection-manager id belongs to the listener's loop: operations on it hop there, and its events hop back.
 */
public final class RdmaSocketChannel extends AbstractRdmaChannel implements SocketChannel {
    private static final InternalLogger logger = InternalLoggerFactory.getInstance(RdmaSocketChannel.class);
    private static final int CONTROL_CREDITS = 8;
    private static final long CLOSE_LINGER_MILLIS = 2000;

    static final int STATE_OPEN = 0;
    static final int STATE_CONNECTING = 1;
    static final int STATE_ACTIVE = 2;
    static final int STATE_CLOSED = 3;

    private final RdmaChannelConfig config;
    private final RdmaChannelMetrics metrics = new RdmaChannelMetrics();
    volatile int state;

    volatile RdmaDomain domain;

    // Connection-manager side; for an accepted channel the id is owned by the listener's handler.
    private RdmaCmId id;
    private RdmaIoHandler idOwner;
    private ConnectionConfig connectionConfig;
    private CompletionQueue cq;
    private volatile QueuePair qp;
    private ReceiveBuffers recv;
    RdmaConnection connection;
    volatile InetSocketAddress remote;
    private ChannelPromise connectPromise;
    private ScheduledFuture<?> connectTimeoutFuture;
    // An accepted channel once it has answered the connect request: the peer may count itself connected.
    private boolean acceptIssued;
    private InetSocketAddress requestedRemote;

    boolean peerGone;
    volatile boolean outputShutdown;

    private final RdmaChannelInbound inbound;
    private final RdmaChannelOutbound outbound;

    // Close and shutdownOutput wait for posted work to complete (its memory must outlive the work request).
    boolean closeRequested;
    private ChannelPromise delayedClosePromise;
    private Throwable delayedCloseCause;
    private ClosedChannelException delayedCloseClosedCause;
    private ChannelPromise delayedShutdownPromise;
    private ScheduledFuture<?> lingerFuture;

    /** Creates an unconnected channel (the {@code Bootstrap.channel(RdmaSocketChannel.class)} way). */
    public RdmaSocketChannel() {
        super(null);
        config = new RdmaChannelConfig(this);
        inbound = new RdmaChannelInbound(this);
        outbound = new RdmaChannelOutbound(this);
    }

    /** An accepted channel: the connect request is not yet answered; accepting happens once registered. */
    RdmaSocketChannel(RdmaServerSocketChannel parent, RdmaCmId id, RdmaIoHandler idOwner) {
        super(parent);
        config = new RdmaChannelConfig(this);
        inbound = new RdmaChannelInbound(this);
        outbound = new RdmaChannelOutbound(this);
        this.id = id;
        this.idOwner = idOwner;
        state = STATE_CONNECTING;
        local = id.localAddress();
        remote = id.remoteAddress();
    }

    @Override
    public ServerSocketChannel parent() {
        return (ServerSocketChannel) super.parent();
    }

    @Override
    public RdmaChannelConfig config() {
        return config;
    }

    /** This channel's counters. */
    public RdmaChannelMetrics metrics() {
        return metrics;
    }

    /** The counters of all channels of this channel's event loop; {@code null} before registration. */
    public RdmaChannelMetrics eventLoopMetrics() {
        RdmaIoHandler h = handler;
        return h == null ? null : h.metrics();
    }

    RdmaByteBufAllocator registeredAllocator() {
        RdmaDomain d = domain;
        return d == null ? null : d.allocator;
    }

    /** The queue pair, once connected (tests inject faults on it). */
    QueuePair queuePair() {
        return qp;
    }

    @Override
    public boolean isOpen() {
        return state != STATE_CLOSED;
    }

    @Override
    public boolean isActive() {
        return state == STATE_ACTIVE;
    }

    @Override
    public boolean isInputShutdown() {
        return inbound.isInputShutdown() || !isActive() && state != STATE_OPEN && state != STATE_CONNECTING;
    }

    @Override
    public boolean isOutputShutdown() {
        return outputShutdown || !isActive() && state != STATE_OPEN && state != STATE_CONNECTING;
    }

    @Override
    public boolean isShutdown() {
        return isInputShutdown() && isOutputShutdown() || !isActive() && state == STATE_CLOSED;
    }

    @Override
    public InetSocketAddress remoteAddress() {
        return (InetSocketAddress) super.remoteAddress();
    }

    @Override
    protected SocketAddress remoteAddress0() {
        return remote;
    }

    @Override
    protected AbstractUnsafe newUnsafe() {
        return new RdmaSocketUnsafe();
    }

    @Override
    void registered(ChannelPromise promise) {
        // The registered allocator must be there for handlerAdded; an accepted channel accepts once its handlers
        // (and the options they set) are in.
        domain = handler.domain();
        promise.setSuccess();
        if (id != null && connection == null && qp == null && state == STATE_CONNECTING) {
            startAccept();
        }
    }

    @Override
    protected void doBind(SocketAddress localAddress) throws Exception {
        bindId(localAddress);
    }

    /** Creates the id on this loop's event channel and binds it; a later connect resolves from it. */
    private void bindId(SocketAddress localAddress) throws Exception {
        if (!(localAddress instanceof InetSocketAddress)) {
            throw new IllegalArgumentException("localAddress: " + localAddress + " (expected: an InetSocketAddress)");
        }
        InetSocketAddress requested = (InetSocketAddress) localAddress;
        if (id != null || state != STATE_OPEN) {
            throw new BindException("cannot bind to " + requested + ": the channel is already "
                    + (id != null && state == STATE_OPEN ? "bound to " + local : "connecting or connected")
                    + " (expected: one bind, before connect)");
        }
        RdmaCmId created = null;
        try {
            created = handler.eventChannel().createId();
            local = created.bind(requested);
        } catch (RdmaException | RuntimeException e) {
            if (created != null) {
                created.close();
            }
            BindException bindException = new BindException("cannot bind to " + requested + ": " + e.getMessage());
            bindException.initCause(e);
            throw bindException;
        }
        id = created;
        idOwner = handler;
        created.attach(unsafe());
    }

    @Override
    protected void doDisconnect() throws Exception {
        doClose();
    }

    @Override
    protected Object filterOutboundMessage(Object msg) throws ClosedChannelException {
        if (delayedShutdownPromise != null) {
            // shutdownOutput() waits for posted work; what is written after it fails now, as NIO's does.
            throw new ClosedChannelException();
        }
        if (msg instanceof ByteBuf || msg instanceof FileRegion) {
            return msg;
        }
        throw new UnsupportedOperationException("unsupported message type: " + msg.getClass().getSimpleName()
                + " (expected: ByteBuf or FileRegion)");
    }

    // ---------------------------------------------------------------------------------------------- connecting

    /** Creates the completion queue, receive buffers and queue pair on {@code cmId}; posts the receives. */
    private void createQueuePair() throws RdmaException {
        RdmaDomain d = domain;
        connectionConfig = config.connectionConfig();
        DeviceAttributes attributes = d.device.attributes();
        int sendDepth = Math.min(connectionConfig.sendQueueDepth(), Integer.highestOneBit(attributes.maxQpWr()));
        int recvDepth = connectionConfig.receiveQueueDepth() + CONTROL_CREDITS;
        if (recvDepth > attributes.maxQpWr()) {
            throw new RdmaException("RECEIVE_QUEUE_DEPTH: " + connectionConfig.receiveQueueDepth() + " (expected: <= "
                    + (attributes.maxQpWr() - CONTROL_CREDITS) + ", the limit of device " + attributes.name() + ")");
        }
        int inline = Math.min(config.inlineThreshold(), attributes.maxInlineData());
        QpCapabilities caps = new QpCapabilities(sendDepth, recvDepth, Math.min(16, attributes.maxSge()), 1, inline);
        cq = d.device.createCompletionQueue(sendDepth + recvDepth, handler.notifier());
        recv = new ReceiveBuffers(d.memory, connectionConfig.receiveBufferSize(), recvDepth);
    }

    private Handshake localHandshake() {
        ConnectionConfig c = connectionConfig;
        return new Handshake(c.receiveBufferSize(), c.receiveQueueDepth(), CONTROL_CREDITS, c.maxMessageSize());
    }

    private QpCapabilities capabilities() {
        DeviceAttributes attributes = domain.device.attributes();
        int sendDepth = Math.min(connectionConfig.sendQueueDepth(), Integer.highestOneBit(attributes.maxQpWr()));
        int inline = Math.min(config.inlineThreshold(), attributes.maxInlineData());
        return new QpCapabilities(sendDepth, recv.count(), Math.min(16, attributes.maxSge()), 1, inline);
    }

    /** Accepted channel, on its own loop: prepare, then let the id's owner create the queue pair and accept. */
    private void startAccept() {
        try {
            createQueuePair();
        } catch (RdmaException | RuntimeException e) {
            rejectAndClose(e);
            return;
        }
        QpCapabilities caps = capabilities();
        RdmaDomain d = domain;
        CompletionQueue completionQueue = cq;
        ReceiveBuffers receiveBuffers = recv;
        acceptIssued = true;
        int timeout = config.getConnectTimeoutMillis();
        if (timeout > 0) {
            // A peer that connects and never sends its HELLO must not hold a queue pair for ever.
            connectTimeoutFuture = eventLoop().schedule(() -> {
                if (state == STATE_CONNECTING) {
                    failConnect(new ConnectTimeoutException("no rdma-bridge handshake from " + remote + " within "
                            + timeout + " ms (CONNECT_TIMEOUT_MILLIS of the server's child options): closing the "
                            + "accepted connection; is the peer an rdma-bridge endpoint?"));
                }
            }, timeout, TimeUnit.MILLISECONDS);
        }
        runOnIdOwner(() -> {
            try {
                QueuePair created = id.createQueuePair(d.pd, completionQueue, completionQueue, caps);
                qp = created;
                RdmaConnection.postReceives(created, receiveBuffers);
                id.accept(ConnectionParameters.DEFAULT);
            } catch (RdmaException | RuntimeException e) {
                eventLoop().execute(() -> rejectAndClose(e));
            }
        });
    }

    private void rejectAndClose(Throwable cause) {
        logger.debug("Accepting an RDMA connection from {} failed", remote, cause);
        pipeline().fireExceptionCaught(cause);
        forceClose();
    }

    private void runOnIdOwner(Runnable task) {
        RdmaIoHandler owner = idOwner;
        if (owner == null || owner.inLoop()) {
            task.run();
            return;
        }
        try {
            owner.execute(task);
        } catch (RejectedExecutionException e) {
            // The listener's loop is gone (group shutting down): nobody else uses the id any more.
            task.run();
        }
    }

    private void connectEvent(RdmaCmIoEvent event) {
        switch (event.type()) {
            case ADDR_RESOLVED:
                if (state != STATE_CONNECTING) {
                    return;
                }
                try {
                    createQueuePair();
                    qp = id.createQueuePair(domain.pd, cq, cq, capabilities());
                    RdmaConnection.postReceives(qp, recv);
                    id.connect(ConnectionParameters.DEFAULT);
                } catch (RdmaException | RuntimeException e) {
                    failConnect(connectException("cannot set up the queue pair for " + requestedRemote + ": "
                            + e.getMessage(), e));
                }
                return;
            case ESTABLISHED:
                established();
                return;
            case REJECTED:
                failConnect(connectException("connection refused: " + requestedRemote
                        + (event.detail() != null ? " (" + event.detail() + ")" : ""), null));
                return;
            case UNREACHABLE:
                failConnect(new ConnectTimeoutException("connection timed out: " + requestedRemote
                        + (event.detail() != null ? " (" + event.detail() + ")" : "")));
                return;
            case ADDR_ERROR:
            case CONNECT_ERROR:
                failConnect(connectException("cannot connect to " + requestedRemote + ": " + event.describe(), null));
                return;
            case DISCONNECTED:
            case DEVICE_REMOVAL:
                if (state == STATE_CONNECTING && connection != null) {
                    // The peer's HELLO, and what it sent after it, may have landed before it disconnected (a server
                    // that closes in channelActive): deliver that first, as TCP delivers data before the FIN.
                    pollConnection();
                }
                if (state == STATE_CONNECTING) {
                    failConnect(connectException("connection to " + remote + " lost while connecting: "
                            + event.describe(), null));
                } else {
                    peerGone = true;
                    pollConnection();
                }
                return;
            default:
                logger.debug("Unexpected connection-manager event on {}: {}", this, event.describe());
        }
    }

    private static ConnectException connectException(String message, Throwable cause) {
        ConnectException e = new ConnectException(message);
        if (cause != null) {
            e.initCause(cause);
        }
        return e;
    }

    /**
     * The connection manager says the queue pair is connected: send this side's HELLO. The channel becomes active
     * once the peer's HELLO has arrived ({@link #activate()}), which may already have happened.
     */
    private void established() {
        if (state != STATE_CONNECTING || connection != null) {
            return;
        }
        try {
            connection = new RdmaConnection(qp, cq, recv, domain.memory, localHandshake(), connectionConfig,
                    outbound);
            connection.start();
        } catch (RdmaException | RuntimeException e) {
            failConnect(connectException("cannot set up the connection to " + remote + ": " + e.getMessage(), e));
            return;
        }
        // The peer's HELLO (and frames after it) may have landed before the event reached this loop.
        pollConnection();
    }

    /** Both handshakes are done: the channel becomes active. */
    private void activate() {
        outbound.activate(connectionConfig.sendQueueDepth());
        inbound.activate(recv, connectionConfig.receiveQueueDepth());
        InetSocketAddress l = id.localAddress();
        InetSocketAddress r = id.remoteAddress();
        if (l != null) {
            local = l;
        }
        if (r != null) {
            remote = r;
        }
        state = STATE_ACTIVE;
        handler.updateBusyPoll();
        cancelConnectTimeout();
        ChannelPromise promise = connectPromise;
        connectPromise = null;
        if (promise != null) {
            // Like NIO: fire channelActive even when the user cancelled the promise meanwhile, then close.
            boolean promiseSet = promise.trySuccess();
            pipeline().fireChannelActive();
            if (!promiseSet) {
                unsafe().close(voidPromise());
            }
        } else {
            pipeline().fireChannelActive();
            if (delayedClosePromise != null && !closeRequested) {
                // Closed while the handshake was ending: now the graceful close can send end of stream.
                ChannelPromise p = delayedClosePromise;
                delayedClosePromise = null;
                cancelLinger();
                ((RdmaSocketUnsafe) unsafe()).close(p, delayedCloseCause, delayedCloseClosedCause);
            }
        }
    }

    private void failConnect(Throwable cause) {
        ChannelPromise promise = connectPromise;
        connectPromise = null;
        cancelConnectTimeout();
        if (promise != null) {
            promise.tryFailure(cause);
            unsafe().close(voidPromise());
        } else if (state == STATE_CONNECTING) {
            // An accepted channel whose handshake did not complete.
            rejectAndClose(cause);
        }
    }

    private void cancelLinger() {
        if (lingerFuture != null) {
            lingerFuture.cancel(false);
            lingerFuture = null;
        }
    }

    private void cancelConnectTimeout() {
        if (connectTimeoutFuture != null) {
            connectTimeoutFuture.cancel(false);
            connectTimeoutFuture = null;
        }
    }

    // ---------------------------------------------------------------------------------------------- polling

    private int pollConnection() {
        RdmaConnection c = connection;
        if (c == null || c.isDestroyed()) {
            return 0;
        }
        int events = c.poll(handler.completions(), 4);
        if (state == STATE_CONNECTING) {
            if (!c.isReady()) {
                if (c.failure() != null || c.isLost()) {
                    String cause = c.failure() != null ? c.failure().getMessage() : "the queue pair was disconnected";
                    failConnect(connectException("handshake with " + remote + " failed: " + cause, c.failure()));
                    return 1;
                }
                return events != 0 ? 1 : 0;
            }
            // Frames that came right behind the peer's HELLO (even its end of stream or a disconnect) are handled
            // below, as on any later poll.
            activate();
        }
        outbound.accountFlowControl(c);
        if ((events & RdmaConnection.EVENT_FAILED) != 0 && c.failure() != null) {
            connectionFailed(c.failure());
            return 1;
        }
        if (state == STATE_CLOSED) {
            return events != 0 ? 1 : 0;
        }
        if ((events & RdmaConnection.EVENT_INBOUND) != 0 || inbound.isReadingRendezvous()) {
            if (inbound.isReadPending()) {
                inbound.readNow();
            } else {
                inbound.endOfStreamIfNext(c);
            }
        }
        if ((events & (RdmaConnection.EVENT_SENT | RdmaConnection.EVENT_CREDITS)) != 0) {
            outbound.writeMore();
        }
        if (c.isLost() || peerGone) {
            peerGone = true;
            if (!inbound.isReadPending()) {
                inbound.endOfStreamIfNext(c);
            }
            if (state == STATE_CLOSED) {
                return 1;
            }
            if (!inbound.hasInbound(c) || inbound.isInputShutdown()) {
                closeAfterPeerGone();
            } else if (inbound.isReadPending()) {
                inbound.readNow();
            }
        }
        checkDelayed();
        return events != 0 ? 1 : 0;
    }

    /** The connection failed (a work request failed, or no memory for a rendezvous): tell the pipeline, close. */
    void connectionFailed(RdmaException cause) {
        if (state == STATE_CLOSED) {
            return;
        }
        pipeline().fireExceptionCaught(cause);
        forceClose();
    }

    /** The peer disconnected and nothing it sent is left to hand up: close, as a reset unless it ended cleanly. */
    void closeAfterPeerGone() {
        if (state == STATE_CLOSED) {
            return;
        }
        RdmaConnection c = connection;
        if (!config.isAutoClose()) {
            // As a write to a reset TCP socket: the writes fail and, with AUTO_CLOSE off, Netty shuts the output
            // down (ChannelOutputShutdownEvent) before the channel closes.
            outbound.writeMore();
        }
        if (!closeRequested && c != null && c.failure() == null && !c.isEndOfStreamReceived()) {
            // No end of stream before the disconnect: the peer closed abortively (SO_LINGER=0) or died. TCP calls
            // that a reset, and so do we.
            pipeline().fireExceptionCaught(new IOException("connection reset by peer " + remote + ": it disconnected"
                    + " without shutting its output down (an abortive close with SO_LINGER=0, or the peer died)"));
        }
        forceClose();
    }

    private void forceClose() {
        closeRequested = true;
        if (delayedClosePromise != null) {
            ChannelPromise p = delayedClosePromise;
            delayedClosePromise = null;
            ((RdmaSocketUnsafe) unsafe()).closeNow(p, delayedCloseCause, delayedCloseClosedCause);
        } else {
            unsafe().close(voidPromise());
        }
    }

    /** Whether a graceful close may destroy the queue pair: every operation and the end of stream completed. */
    private static boolean drained(RdmaConnection c) {
        return c.operationsInFlight() == 0 && c.isSendQueueIdle() && (!c.isOutputShutdown() || c.isEndOfStreamSent());
    }

    private void checkDelayed() {
        RdmaConnection c = connection;
        boolean lost = c == null || c.isLost();
        if (delayedShutdownPromise != null && (lost || c.operationsInFlight() == 0)) {
            ChannelPromise p = delayedShutdownPromise;
            delayedShutdownPromise = null;
            ((AbstractUnsafe) unsafe()).shutdownOutput(p);
        }
        if (delayedClosePromise != null && (lost || drained(c))) {
            ChannelPromise p = delayedClosePromise;
            delayedClosePromise = null;
            ((RdmaSocketUnsafe) unsafe()).closeNow(p, delayedCloseCause, delayedCloseClosedCause);
        }
    }

    // ---------------------------------------------------------------------------------------------- reading

    @Override
    protected void doBeginRead() {
        inbound.beginRead();
    }

    /** {@code autoRead} was turned off (any thread). */
    void clearReadPending() {
        inbound.clearReadPending();
    }

    /** Receive buffers handed up and not yet released (tests); call on the event loop. */
    int heldReceiveBuffers() {
        return recv == null ? 0 : recv.held();
    }

    // ---------------------------------------------------------------------------------------------- writing

    @Override
    protected void doWrite(ChannelOutboundBuffer in) throws Exception {
        outbound.write(in);
    }

    /** Flushes now (the write path posts more once completions or credits made room). */
    void flushNow() {
        ((RdmaSocketUnsafe) unsafe()).flushNow();
    }

    /** Netty's check of a file region against its file, for the write path. */
    void checkFileRegion(DefaultFileRegion region, long position) throws IOException {
        validateFileRegion(region, position);
    }

    // ---------------------------------------------------------------------------------------------- closing

    @Override
    public ChannelFuture shutdownOutput() {
        return shutdownOutput(newPromise());
    }

    @Override
    public ChannelFuture shutdownOutput(ChannelPromise promise) {
        EventLoop loop = eventLoop();
        if (loop.inEventLoop()) {
            shutdownOutput0(promise);
        } else {
            loop.execute(() -> shutdownOutput0(promise));
        }
        return promise;
    }

    private void shutdownOutput0(ChannelPromise promise) {
        RdmaConnection c = connection;
        if (c != null && c.operationsInFlight() > 0 && !c.isLost()) {
            // Posted buffers must outlive their work requests; Netty fails (and frees) the outbound buffer.
            if (delayedShutdownPromise == null) {
                delayedShutdownPromise = promise;
            } else {
                // As Netty's channels: the output is already being shut down.
                promise.setFailure(new ClosedChannelException());
            }
            return;
        }
        ((AbstractUnsafe) unsafe()).shutdownOutput(promise);
    }

    @Override
    protected void doShutdownOutput() throws Exception {
        if (state != STATE_ACTIVE) {
            throw state == STATE_CLOSED ? new ClosedChannelException() : new NotYetConnectedException();
        }
        outputShutdown = true;
        connection.shutdownOutput();
    }

    @Override
    public ChannelFuture shutdownInput() {
        return shutdownInput(newPromise());
    }

    @Override
    public ChannelFuture shutdownInput(ChannelPromise promise) {
        EventLoop loop = eventLoop();
        if (loop.inEventLoop()) {
            shutdownInput0(promise);
        } else {
            loop.execute(() -> shutdownInput0(promise));
        }
        return promise;
    }

    private void shutdownInput0(ChannelPromise promise) {
        if (!isOpen()) {
            promise.setFailure(new ClosedChannelException());
            return;
        }
        if (!isActive()) {
            promise.setFailure(new NotYetConnectedException());
            return;
        }
        inbound.shutdownInput();
        promise.setSuccess();
    }

    @Override
    public ChannelFuture shutdown() {
        return shutdown(newPromise());
    }

    @Override
    public ChannelFuture shutdown(ChannelPromise promise) {
        ChannelFuture output = shutdownOutput();
        output.addListener((ChannelFutureListener) f -> {
            ChannelFuture input = shutdownInput();
            input.addListener((ChannelFutureListener) f2 -> {
                Throwable cause = f.cause() != null ? f.cause() : f2.cause();
                if (cause != null) {
                    promise.setFailure(cause);
                } else {
                    promise.setSuccess();
                }
            });
        });
        return promise;
    }

    @Override
    protected void doClose() throws Exception {
        int previous = state;
        state = STATE_CLOSED;
        closeRequested = true;
        cancelConnectTimeout();
        cancelLinger();
        ChannelPromise promise = connectPromise;
        connectPromise = null;
        if (promise != null) {
            promise.tryFailure(new ClosedChannelException());
        }
        if (previous != STATE_CLOSED) {
            releaseResources();
        }
    }

    /** Destroys the queue pair, completion queue and id; the receive slab follows when its buffers come back. */
    private void releaseResources() {
        RdmaConnection c = connection;
        if (c != null) {
            c.closing();
            c.destroy();
        } else {
            QueuePair q = qp;
            if (q != null) {
                q.close();
            }
            if (recv != null) {
                recv.close();
            }
        }
        inbound.releaseBuffers();
        outbound.releaseOperations();
        if (cq != null) {
            try {
                cq.close();
            } catch (RuntimeException e) {
                logger.warn("Failed to destroy the completion queue of {}", this, e);
            }
            cq = null;
        }
        RdmaCmId cmId = id;
        id = null;
        if (cmId != null) {
            runOnIdOwner(() -> {
                try {
                    cmId.disconnect();
                } catch (RuntimeException e) {
                    logger.debug("Disconnecting {} failed", cmId, e);
                }
                try {
                    cmId.close();
                } catch (RuntimeException e) {
                    logger.debug("Destroying {} failed", cmId, e);
                }
            });
        }
    }

    private final class RdmaSocketUnsafe extends AbstractRdmaUnsafe {

        @Override
        public void connect(SocketAddress remoteAddress, SocketAddress localAddress, ChannelPromise promise) {
            // The promise stays cancellable: the connection manager's connect is non-blocking, and cancelling it
            // closes the channel (the listener below), as Netty's NIO and epoll channels do.
            if (promise.isDone() || !ensureOpen(promise)) {
                return;
            }
            if (connectPromise != null) {
                promise.setFailure(new java.nio.channels.ConnectionPendingException());
                return;
            }
            if (state == STATE_ACTIVE) {
                promise.setFailure(new java.nio.channels.AlreadyConnectedException());
                return;
            }
            if (!(remoteAddress instanceof InetSocketAddress)) {
                promise.setFailure(new IllegalArgumentException("remoteAddress: " + remoteAddress
                        + " (expected: an InetSocketAddress)"));
                return;
            }
            InetSocketAddress target = (InetSocketAddress) remoteAddress;
            if (target.isUnresolved()) {
                promise.setFailure(new java.nio.channels.UnresolvedAddressException());
                return;
            }
            if (localAddress != null) {
                // Like NIO: bind first; a failure fails the connect and leaves the channel open and unbound.
                try {
                    bindId(localAddress);
                } catch (Exception e) {
                    promise.setFailure(e);
                    return;
                }
            }
            requestedRemote = target;
            remote = target;
            int timeout = config.getConnectTimeoutMillis();
            try {
                if (id == null) {
                    id = handler.eventChannel().createId();
                    idOwner = handler;
                    id.attach(this);
                }
                state = STATE_CONNECTING;
                id.resolve(target, timeout > 0 ? timeout : 30_000);
            } catch (RdmaException | RuntimeException e) {
                promise.tryFailure(annotateConnectException(
                        connectException("cannot connect to " + target + ": " + e.getMessage(), e), target));
                close(voidPromise());
                return;
            }
            connectPromise = promise;
            if (timeout > 0) {
                connectTimeoutFuture = eventLoop().schedule(() -> {
                    ChannelPromise p = connectPromise;
                    if (p != null && !p.isDone() && p.tryFailure(new ConnectTimeoutException(
                            "connection timed out after " + timeout + " ms: " + target))) {
                        connectPromise = null;
                        close(voidPromise());
                    }
                }, timeout, TimeUnit.MILLISECONDS);
            }
            promise.addListener((ChannelFutureListener) future -> {
                if (future.isCancelled()) {
                    cancelConnectTimeout();
                    connectPromise = null;
                    close(voidPromise());
                }
            });
        }

        @Override
        protected void close(ChannelPromise promise, Throwable cause, ClosedChannelException closeCause) {
            RdmaConnection c = connection;
            if (c != null && state == STATE_ACTIVE && !c.isLost() && !handler.isShuttingDown()) {
                if (!closeRequested) {
                    closeRequested = true;
                    if (config.getSoLinger() == 0) {
                        // Abortive: no end of stream; the peer sees the bare disconnect as a reset.
                        RdmaCmId cmId = id;
                        if (cmId != null) {
                            runOnIdOwner(cmId::disconnect);
                        }
                    } else {
                        // Graceful: end of stream after everything posted so far, as TCP's FIN.
                        c.shutdownOutput();
                    }
                }
                if (drained(c)) {
                    closeAll(promise, cause, closeCause);
                    return;
                }
                // Posted buffers must outlive their work requests: close once they complete (bounded linger).
                delayClose(promise, cause, closeCause);
                return;
            }
            if ((c == null || !c.isReady()) && acceptIssued && state == STATE_CONNECTING && !closeRequested
                    && config.getSoLinger() != 0 && !handler.isShuttingDown()) {
                // The connect request is answered and the peer may already count itself connected: a disconnect
                // now would reach it as a reset. Close gracefully once established (bounded linger), as TCP's FIN
                // after its kernel completed the handshake.
                delayClose(promise, cause, closeCause);
                return;
            }
            closeAll(promise, cause, closeCause);
        }

        private void delayClose(ChannelPromise promise, Throwable cause, ClosedChannelException closeCause) {
            if (delayedClosePromise == null) {
                delayedClosePromise = promise;
                delayedCloseCause = cause;
                delayedCloseClosedCause = closeCause;
                lingerFuture = eventLoop().schedule(() -> {
                    lingerFuture = null;
                    forceClose();
                }, CLOSE_LINGER_MILLIS, TimeUnit.MILLISECONDS);
            } else if (!promise.isVoid()) {
                closeFuture().addListener((ChannelFutureListener) f -> promise.setSuccess());
            }
        }

        /** Closes now, completing a delayed close's promise too. */
        private void closeAll(ChannelPromise promise, Throwable cause, ClosedChannelException closeCause) {
            ChannelPromise delayed = delayedClosePromise;
            if (delayed != null) {
                delayedClosePromise = null;
                super.close(delayed, delayedCloseCause, delayedCloseClosedCause);
            }
            super.close(promise, cause, closeCause);
        }

        void closeNow(ChannelPromise promise, Throwable cause, ClosedChannelException closeCause) {
            super.close(promise, cause, closeCause);
        }

        void flushNow() {
            flush0();
        }

        @Override
        public void handle(IoRegistration registration, IoEvent event) {
            RdmaCmIoEvent e = (RdmaCmIoEvent) event;
            EventLoop loop = eventLoop();
            if (isRegistered() && !loop.inEventLoop()) {
                try {
                    loop.execute(() -> connectEvent(e));
                } catch (RejectedExecutionException ignored) {
                    // Shutting down: the loop's destroy releases everything.
                }
                return;
            }
            connectEvent(e);
        }

        @Override
        public int poll(RdmaIoHandler h) {
            return pollConnection();
        }

        @Override
        public void arm() {
            CompletionQueue q = cq;
            if (q != null && connection != null) {
                q.requestNotify();
            }
        }

        @Override
        public void destroyNow() {
            if (state != STATE_CLOSED) {
                state = STATE_CLOSED;
                releaseResources();
            }
        }

        @Override
        public long busyPollBudgetNanos() {
            return config.busyPollBudgetNanos();
        }
    }
}
