package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
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
import io.netty.channel.socket.ChannelInputShutdownEvent;
import io.netty.channel.socket.ChannelInputShutdownReadComplete;
import io.netty.channel.socket.ServerSocketChannel;
import io.netty.channel.socket.SocketChannel;
import io.netty.util.internal.logging.InternalLogger;
import io.netty.util.internal.logging.InternalLoggerFactory;
import io.rdmabridge.connection.ConnectionConfig;
import io.rdmabridge.connection.FileChunkCache;
import io.rdmabridge.connection.FrameHeader;
import io.rdmabridge.connection.Handshake;
import io.rdmabridge.connection.RdmaConnection;
import io.rdmabridge.connection.ReceiveBuffers;
import io.rdmabridge.connection.RegisteredMemory;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.DeviceAttributes;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.QpCapabilities;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaException;

import java.io.IOException;
import java.net.BindException;
import java.net.ConnectException;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.NotYetConnectedException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicIntegerArray;

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

    private static final int STATE_OPEN = 0;
    private static final int STATE_CONNECTING = 1;
    private static final int STATE_ACTIVE = 2;
    private static final int STATE_CLOSED = 3;

    private final RdmaChannelConfig config;
    private final RdmaChannelMetrics metrics = new RdmaChannelMetrics();
    private volatile int state;

    private volatile RdmaDomain domain;

    // Connection-manager side; for an accepted channel the id is owned by the listener's handler.
    private RdmaCmId id;
    private RdmaIoHandler idOwner;
    private ConnectionConfig connectionConfig;
    private CompletionQueue cq;
    private volatile QueuePair qp;
    private ReceiveBuffers recv;
    private RdmaConnection connection;
    private volatile InetSocketAddress remote;
    private ChannelPromise connectPromise;
    private ScheduledFuture<?> connectTimeoutFuture;
    // An accepted channel once it has answered the connect request: the peer may count itself connected.
    private boolean acceptIssued;
    private InetSocketAddress requestedRemote;

    // Reading.
    private boolean readPending;
    private boolean readScheduled;
    private RdmaReceivedByteBuf[] slotBuffers;
    private ByteBuf rendezvousTarget;
    // A received message handed up in part (the read's guess() was smaller): its rest goes up with the next reads.
    private ByteBuf partial;
    private boolean peerGone;
    private volatile boolean inputShutdown;
    private volatile boolean outputShutdown;
    private boolean inputEndSeen;
    private final Runnable readTask = this::scheduledRead;
    // Received buffers released on other threads, reposted by one task on the loop.
    private volatile AtomicIntegerArray releasedElsewhere;
    private final AtomicBoolean releaseScheduled = new AtomicBoolean();
    private final Runnable releaseTask = this::releaseMarkedSlots;

    // Flow-control counters of the connection already added to the metrics.
    private long reportedStalls;
    private long reportedRnr;

    // Writing: per operation, the outbound bytes it carries and the staging block (a copy) it holds, if any.
    private long[] opBytes;
    private Object[] opRelease;
    private boolean[] opFile;
    private int opMask;
    private long postedBytes;
    private boolean flushScheduled;
    private final Runnable flushTask = this::scheduledFlush;
    private final WriteProcessor writeProcessor = new WriteProcessor();

    // Close and shutdownOutput wait for posted work to complete (its memory must outlive the work request).
    private boolean closeRequested;
    private ChannelPromise delayedClosePromise;
    private Throwable delayedCloseCause;
    private ClosedChannelException delayedCloseClosedCause;
    private ChannelPromise delayedShutdownPromise;
    private ScheduledFuture<?> lingerFuture;

    /** Creates an unconnected channel (the {@code Bootstrap.channel(RdmaSocketChannel.class)} way). */
    public RdmaSocketChannel() {
        super(null);
        config = new RdmaChannelConfig(this);
    }

    /** An accepted channel: the connect request is not yet answered; accepting happens once registered. */
    RdmaSocketChannel(RdmaServerSocketChannel parent, RdmaCmId id, RdmaIoHandler idOwner) {
        super(parent);
        config = new RdmaChannelConfig(this);
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
        return inputShutdown || !isActive() && state != STATE_OPEN && state != STATE_CONNECTING;
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
                    this::sendCompleted);
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
        int opCapacity = Integer.highestOneBit(connectionConfig.sendQueueDepth()) * 2;
        opBytes = new long[opCapacity];
        opRelease = new Object[opCapacity];
        opFile = new boolean[opCapacity];
        opMask = opCapacity - 1;
        ByteBufAllocator alloc = config.getAllocator();
        slotBuffers = new RdmaReceivedByteBuf[recv.count()];
        releasedElsewhere = new AtomicIntegerArray(recv.count());
        for (int i = 0; i < slotBuffers.length; i++) {
            slotBuffers[i] = new RdmaReceivedByteBuf(alloc, recv.payloadView(i), this, i);
        }
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
        if (c.creditStalls() != reportedStalls || c.receiverNotReady() != reportedRnr) {
            accountFlowControl(c);
        }
        if ((events & RdmaConnection.EVENT_FAILED) != 0 && c.failure() != null) {
            connectionFailed(c.failure());
            return 1;
        }
        if (state == STATE_CLOSED) {
            return events != 0 ? 1 : 0;
        }
        if ((events & RdmaConnection.EVENT_INBOUND) != 0 || rendezvousTarget != null) {
            if (readPending) {
                readNow();
            } else {
                endOfStreamIfNext(c);
            }
        }
        if ((events & (RdmaConnection.EVENT_SENT | RdmaConnection.EVENT_CREDITS)) != 0) {
            writeMore();
        }
        if (c.isLost() || peerGone) {
            peerGone = true;
            if (!readPending) {
                endOfStreamIfNext(c);
            }
            if (state == STATE_CLOSED) {
                return 1;
            }
            if (!hasInbound(c) || inputShutdown) {
                closeAfterPeerGone();
            } else if (readPending) {
                readNow();
            }
        }
        checkDelayed();
        return events != 0 ? 1 : 0;
    }

    private void accountFlowControl(RdmaConnection c) {
        long stalls = c.creditStalls() - reportedStalls;
        long rnr = c.receiverNotReady() - reportedRnr;
        reportedStalls = c.creditStalls();
        reportedRnr = c.receiverNotReady();
        if (stalls > 0) {
            metrics.addCreditStalls(stalls);
            handler.metrics().addCreditStalls(stalls);
        }
        if (rnr > 0) {
            metrics.addReceiverNotReady(rnr);
            handler.metrics().addReceiverNotReady(rnr);
        }
    }

    private void connectionFailed(RdmaException cause) {
        if (state == STATE_CLOSED) {
            return;
        }
        pipeline().fireExceptionCaught(cause);
        forceClose();
    }

    /**
     * Like epoll's RDHUP: the peer's end of stream is told at once when every byte before it has been read, even
     * with no read pending ({@code autoRead=false}).
     */
    private void endOfStreamIfNext(RdmaConnection c) {
        if (state == STATE_ACTIVE && !inputEndSeen && partial == null && c.endOfStreamNext()) {
            c.pollInbound();
            inputEnded();
        }
    }

    private void closeAfterPeerGone() {
        if (state == STATE_CLOSED) {
            return;
        }
        RdmaConnection c = connection;
        if (!config.isAutoClose()) {
            // As a write to a reset TCP socket: the writes fail and, with AUTO_CLOSE off, Netty shuts the output
            // down (ChannelOutputShutdownEvent) before the channel closes.
            writeMore();
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
        if (inputShutdown && inputEndSeen) {
            return;
        }
        readPending = true;
        RdmaConnection c = connection;
        if (c != null && (hasInbound(c) || peerGone) && !readScheduled) {
            readScheduled = true;
            eventLoop().execute(readTask);
        }
    }

    void clearReadPending() {
        if (isRegistered() && eventLoop().inEventLoop()) {
            readPending = false;
        } else if (isRegistered()) {
            eventLoop().execute(() -> readPending = false);
        } else {
            readPending = false;
        }
    }

    private void scheduledRead() {
        readScheduled = false;
        if (readPending && state == STATE_ACTIVE) {
            readNow();
            if (peerGone && connection != null && !hasInbound(connection)) {
                closeAfterPeerGone();
            }
        }
    }

    /** Whether a message, or the rest of one, waits to be handed up. */
    private boolean hasInbound(RdmaConnection c) {
        return partial != null || c.hasInbound();
    }

    private void readNow() {
        RdmaConnection c = connection;
        if (inputShutdown) {
            dropInbound(c);
            return;
        }
        RecvByteBufAllocator.Handle allocHandle = unsafe().recvBufAllocHandle();
        allocHandle.reset(config);
        boolean delivered = false;
        boolean endOfStream = false;
        do {
            ByteBuf buf = partial;
            partial = null;
            if (buf == null) {
                int kind = c.pollInbound();
                if (kind == RdmaConnection.NONE) {
                    break;
                }
                if (kind == RdmaConnection.END_OF_STREAM) {
                    endOfStream = true;
                    break;
                }
                if (kind == RdmaConnection.RENDEZVOUS) {
                    if (!startRendezvousRead(c)) {
                        break;
                    }
                    continue;
                }
                buf = received(c, kind);
            }
            delivered = true;
            fireRead(buf, allocHandle);
            if (state != STATE_ACTIVE) {
                break;
            }
        } while (allocHandle.continueReading());
        if (delivered) {
            allocHandle.readComplete();
            pipeline().fireChannelReadComplete();
        }
        if (endOfStream) {
            inputEnded();
        }
    }

    /** The message {@code pollInbound()} just returned as {@code kind}, as a buffer to hand up. */
    private ByteBuf received(RdmaConnection c, int kind) {
        int length = c.inboundLength();
        ByteBuf buf;
        if (kind == RdmaConnection.DATA) {
            buf = slotBuffers[c.inboundSlot()].reuse(length);
            if (recv.held() > pressureThreshold()) {
                // The application holds most receive buffers: copy, so the peer keeps its credits.
                ByteBuf copy;
                try {
                    copy = config.getAllocator().buffer(length);
                } catch (Throwable t) {
                    // Out of memory, say: the receive buffer goes back before the channel fails.
                    buf.release();
                    throw t;
                }
                copy.writeBytes(buf);
                buf.release();
                buf = copy;
                metrics.addReceivedCopied(length);
                handler.metrics().addReceivedCopied(length);
            }
        } else {
            buf = rendezvousTarget;
            rendezvousTarget = null;
            buf.writerIndex(length);
        }
        metrics.addReceived(length);
        handler.metrics().addReceived(length);
        return buf;
    }

    /** Input shut down: drops everything that has arrived, so the peer gets its credits back, up to end of stream. */
    private void dropInbound(RdmaConnection c) {
        if (partial != null) {
            partial.release();
            partial = null;
        }
        for (;;) {
            int kind = c.pollInbound();
            if (kind == RdmaConnection.NONE) {
                return;
            }
            if (kind == RdmaConnection.END_OF_STREAM) {
                inputEnded();
                return;
            }
            if (kind == RdmaConnection.RENDEZVOUS) {
                c.discardRendezvous();
            } else if (kind == RdmaConnection.DATA) {
                c.releaseReceive(c.inboundSlot());
            } else {
                rendezvousTarget.release();
                rendezvousTarget = null;
            }
        }
    }

    /** Hands up {@code buf}, or its first {@code guess()} bytes as a slice when it holds more (the rest waits). */
    private void fireRead(ByteBuf buf, RecvByteBufAllocator.Handle allocHandle) {
        int guess = Math.max(1, allocHandle.guess());
        ByteBuf piece = buf;
        if (buf.readableBytes() > guess) {
            piece = buf.readRetainedSlice(guess);
            partial = buf;
        }
        int bytes = piece.readableBytes();
        allocHandle.attemptedBytesRead(bytes);
        allocHandle.lastBytesRead(bytes);
        allocHandle.incMessagesRead(1);
        readPending = false;
        pipeline().fireChannelRead(piece);
    }

    private int pressureThreshold() {
        return Math.max(1, connectionConfig.receiveQueueDepth() * 3 / 4);
    }

    /** Allocates a registered buffer for the pending rendezvous and posts the READ. */
    private boolean startRendezvousRead(RdmaConnection c) {
        int length = c.inboundLength();
        if (rendezvousTarget == null) {
            ByteBuf target = domain.allocator.directBuffer(length, length);
            MemoryRegion mr = domain.memory.regions().find(ByteBufAddress.of(target, 0, length), length);
            if (mr == null) {
                target.release();
                connectionFailed(new RdmaException("no registered memory for a rendezvous of " + length
                        + " bytes (the device refused the registration); closing"));
                return false;
            }
            rendezvousTarget = target;
        }
        long address = ByteBufAddress.of(rendezvousTarget, 0, length);
        MemoryRegion mr = domain.memory.regions().find(address, length);
        return c.readRendezvous(address, mr.lkey());
    }

    private void inputEnded() {
        inputEndSeen = true;
        if (config.isAllowHalfClosure()) {
            if (!inputShutdown) {
                inputShutdown = true;
                pipeline().fireUserEventTriggered(ChannelInputShutdownEvent.INSTANCE);
            }
            pipeline().fireUserEventTriggered(ChannelInputShutdownReadComplete.INSTANCE);
            if (outputShutdown) {
                unsafe().close(voidPromise());
            }
        } else {
            inputShutdown = true;
            unsafe().close(voidPromise());
        }
    }

    /** A received buffer was released (any thread). */
    void receiveReleased(int slot) {
        EventLoop loop = eventLoop();
        if (loop.inEventLoop()) {
            releaseSlot(slot);
            return;
        }
        // Mark the slot and wake the loop with the one shared task: no object per released buffer.
        releasedElsewhere.set(slot, 1);
        if (!releaseScheduled.compareAndSet(false, true)) {
            return;
        }
        try {
            loop.execute(releaseTask);
        } catch (RejectedExecutionException e) {
            // The loop is gone; nothing else touches the connection now.
            releaseMarkedSlots();
        }
    }

    private void releaseMarkedSlots() {
        releaseScheduled.set(false);
        AtomicIntegerArray marked = releasedElsewhere;
        for (int i = 0; i < marked.length(); i++) {
            if (marked.get(i) != 0 && marked.getAndSet(i, 0) != 0) {
                releaseSlot(i);
            }
        }
    }

    /** Receive buffers handed up and not yet released (tests); call on the event loop. */
    int heldReceiveBuffers() {
        return recv == null ? 0 : recv.held();
    }

    private void releaseSlot(int slot) {
        connection.releaseReceive(slot);
    }

    // ---------------------------------------------------------------------------------------------- writing

    @Override
    protected void doWrite(ChannelOutboundBuffer in) throws Exception {
        RdmaConnection c = connection;
        if (c == null || closeRequested || outputShutdown) {
            return;
        }
        if (c.isLost() || peerGone) {
            throw new IOException("connection reset by peer " + remote + ": the queue pair is disconnected, nothing"
                    + " more can be sent");
        }
        if (postedBytes == 0) {
            removeEmptyHead(in);
        }
        if (in.isEmpty()) {
            return;
        }
        writeProcessor.start(c, in, config.getWriteSpinCount());
        in.forEachFlushedMessage(writeProcessor);
        writeProcessor.finish();
        c.flush();
        if (c.failure() != null) {
            throw c.failure();
        }
        if (writeProcessor.yielded && !flushScheduled) {
            // Spin count used up with work left: let the loop's other channels go first.
            flushScheduled = true;
            eventLoop().execute(flushTask);
        }
    }

    private void scheduledFlush() {
        flushScheduled = false;
        writeMore();
    }

    private void writeMore() {
        ChannelOutboundBuffer in = unsafe().outboundBuffer();
        if (in != null && !in.isEmpty() && isActive()) {
            ((RdmaSocketUnsafe) unsafe()).flushNow();
        }
    }

    private void record(long op, long bytes, Object release, boolean file) {
        int i = (int) (op & opMask);
        opBytes[i] = bytes;
        opRelease[i] = release;
        opFile[i] = file;
        postedBytes += bytes;
    }

    /** The connection reports operation {@code op} done, in posting order. */
    private void sendCompleted(long op) {
        int i = (int) (op & opMask);
        long bytes = opBytes[i];
        Object release = opRelease[i];
        if (release != null) {
            opRelease[i] = null;
            release(release);
        }
        ChannelOutboundBuffer in = unsafe().outboundBuffer();
        if (in == null) {
            postedBytes -= bytes;
            return;
        }
        if (opFile[i]) {
            removeEmptyHead(in);
            fileProgress(in, bytes);
        } else {
            removeSent(in, bytes);
        }
        removeEmptyHead(in);
    }

    /**
     * Removes {@code bytes} sent bytes from the head of {@code in}, as {@link ChannelOutboundBuffer#removeBytes}
     * does, but keeps {@link #postedBytes} in step before each message's promise completes: a listener may write and
     * flush at once, and the {@link #doWrite} it runs skips exactly the bytes still posted.
     */
    private void removeSent(ChannelOutboundBuffer in, long bytes) {
        while (bytes > 0) {
            Object msg = in.current();
            if (!(msg instanceof ByteBuf)) {
                // Posted bytes are always flushed buffer bytes; only a close (which failed them) gets here.
                postedBytes -= bytes;
                return;
            }
            ByteBuf buf = (ByteBuf) msg;
            int readable = buf.readableBytes();
            if (readable <= bytes) {
                bytes -= readable;
                postedBytes -= readable;
                in.progress(readable);
                in.remove();
            } else {
                buf.readerIndex(buf.readerIndex() + (int) bytes);
                postedBytes -= bytes;
                in.progress(bytes);
                return;
            }
        }
    }

    /** Empty buffers and regions carry no bytes, so no completion will ever remove them: remove them at the head. */
    private void removeEmptyHead(ChannelOutboundBuffer in) {
        for (;;) {
            Object msg = in.current();
            if (msg instanceof ByteBuf && !((ByteBuf) msg).isReadable()) {
                in.remove();
            } else if (msg instanceof FileRegion && ((FileRegion) msg).count() == 0) {
                in.remove();
            } else {
                return;
            }
        }
    }

    private long fileSent;

    private void fileProgress(ChannelOutboundBuffer in, long bytes) {
        postedBytes -= bytes;
        Object msg = in.current();
        if (msg instanceof FileRegion) {
            FileRegion region = (FileRegion) msg;
            fileSent += bytes;
            in.progress(bytes);
            if (fileSent >= region.count()) {
                fileSent = 0;
                in.remove();
            }
        }
    }

    private static void release(Object o) {
        if (o instanceof RegisteredMemory.Block) {
            ((RegisteredMemory.Block) o).free();
        } else {
            ((FileChunkCache.Chunk) o).release();
        }
    }

    /** Frees every staging copy and file chunk still held by posted operations (the queue pair is gone). */
    private void releaseOperations() {
        if (opRelease != null) {
            for (int i = 0; i < opRelease.length; i++) {
                if (opRelease[i] != null) {
                    release(opRelease[i]);
                    opRelease[i] = null;
                }
            }
        }
        postedBytes = 0;
        if (fileWriter != null) {
            fileWriter.close();
        }
    }

    /**
     * Walks the flushed messages after those already posted and posts frames for them: registered memory by
     * reference, anything else copied into registered memory first.
     */
    private final class WriteProcessor implements ChannelOutboundBuffer.MessageProcessor, RdmaFileWriter.Sink {
        private RdmaConnection c;
        private boolean first;
        private long skip;
        private int budget;
        private boolean yielded;
        private boolean framing;
        private int frameBytes;
        private int frameCopied;
        private RegisteredMemory.Block frameStaging;
        private int stagingUsed;

        void start(RdmaConnection c, ChannelOutboundBuffer in, int spinCount) {
            this.c = c;
            skip = postedBytes;
            first = true;
            budget = Math.max(1, spinCount);
            yielded = false;
            framing = false;
        }

        @Override
        public boolean processMessage(Object msg) throws Exception {
            boolean head = first;
            first = false;
            if (msg instanceof ByteBuf) {
                ByteBuf buf = (ByteBuf) msg;
                int readable = buf.readableBytes();
                if (skip >= readable) {
                    skip -= readable;
                    return true;
                }
                int index = buf.readerIndex() + (int) skip;
                int length = readable - (int) skip;
                skip = 0;
                return writeBytes(buf, index, length);
            }
            if (msg instanceof FileRegion) {
                FileRegion region = (FileRegion) msg;
                // Completed bytes of the head region were reported with progress(), not removed.
                long done = head ? fileSent : 0;
                long remaining = region.count() - done;
                if (skip >= remaining) {
                    skip -= remaining;
                    return true;
                }
                long offset = done + skip;
                skip = 0;
                endFrame();
                if (region instanceof DefaultFileRegion) {
                    if (offset == 0) {
                        // A region made from a File opens its FileChannel lazily; validation reads the channel's size.
                        ((DefaultFileRegion) region).open();
                        validateFileRegion((DefaultFileRegion) region, region.transferred());
                    }
                    return fileWriter().write((DefaultFileRegion) region, offset, this);
                }
                // Other regions can only be copied out in order through transferTo(), once they are at the head.
                return head && writeCustomRegion(region, offset);
            }
            return false;
        }

        private boolean spend() {
            if (budget == 0) {
                yielded = true;
                return false;
            }
            budget--;
            return true;
        }

        private boolean writeBytes(ByteBuf buf, int index, int length) throws RdmaException {
            while (length > 0) {
                if (length >= config.rendezvousThreshold()) {
                    endFrame();
                    if (!c.canSendData() || !spend()) {
                        return false;
                    }
                    // The peer announced the largest message it accepts: a larger write goes as several.
                    int part = Math.min(length, c.maxRendezvousLength());
                    long address = ByteBufAddress.of(buf, index, part);
                    MemoryRegion mr = address == 0 ? null : domain.memory.regions().find(address, part);
                    RegisteredMemory.Block staging = null;
                    if (mr == null) {
                        staging = domain.memory.allocate(part);
                        copy(buf, index, part, staging.buffer(), 0);
                        address = staging.address();
                        mr = staging.memoryRegion();
                        copied(part);
                    }
                    long op = c.sendRendezvous(address, part, mr.rkey());
                    record(op, part, staging, false);
                    metrics.addRendezvous(part);
                    handler.metrics().addRendezvous(part);
                    index += part;
                    length -= part;
                    continue;
                }
                if (!framing) {
                    if (!c.canSendData() || !spend()) {
                        return false;
                    }
                    c.beginData();
                    framing = true;
                    frameBytes = 0;
                    frameCopied = 0;
                    frameStaging = null;
                    stagingUsed = 0;
                }
                int chunk = Math.min(length, c.framePayloadRemaining());
                if (!addToFrame(buf, index, chunk)) {
                    endFrame();
                    continue;
                }
                frameBytes += chunk;
                index += chunk;
                length -= chunk;
                if (c.framePayloadRemaining() == 0) {
                    endFrame();
                }
            }
            return true;
        }

        /** @return {@code false} when the frame cannot take this chunk (out of segments or staging room) */
        private boolean addToFrame(ByteBuf buf, int index, int chunk) throws RdmaException {
            long address = ByteBufAddress.of(buf, index, chunk);
            MemoryRegion mr = address == 0 ? null : domain.memory.regions().find(address, chunk);
            if (mr != null) {
                if (!c.hasSegmentRoom()) {
                    return false;
                }
                c.addSegment(address, chunk, mr.lkey());
                return true;
            }
            if (frameStaging == null && chunk <= c.scratchRemaining()) {
                if (!c.hasSegmentRoom() && frameCopied == 0) {
                    return false;
                }
                copy(buf, index, chunk, c.scratchBuffer(), c.scratchOffset());
                c.addScratch(chunk);
                frameCopied += chunk;
                copied(chunk);
                return true;
            }
            if (frameStaging == null) {
                if (!c.hasSegmentRoom()) {
                    return false;
                }
                frameStaging = domain.memory.allocate(c.framePayloadRemaining());
                stagingUsed = 0;
            } else if (frameStaging.capacity() - stagingUsed < chunk) {
                return false;
            }
            copy(buf, index, chunk, frameStaging.buffer(), stagingUsed);
            c.addSegment(frameStaging.address() + stagingUsed, chunk, frameStaging.memoryRegion().lkey());
            stagingUsed += chunk;
            copied(chunk);
            return true;
        }

        /**
         * A {@link FileRegion} of unknown kind can only be read through {@code transferTo}: copy it into registered
         * staging memory, piece by piece (counted as copied).
         */
        private boolean writeCustomRegion(FileRegion region, long offset) throws IOException {
            // transferTo() must be called at transferred(): the region tracks its own progress.
            while (region.transferred() < region.count()) {
                if (!canSend()) {
                    return false;
                }
                long before = region.transferred();
                int chunk = (int) Math.min(region.count() - before,
                        Math.min(RegisteredMemory.maxPooledSize(), c.maxRendezvousLength()));
                RegisteredMemory.Block block = domain.memory.allocate(chunk);
                StagingChannel target = stagingChannel.reset(block.buffer(), chunk);
                try {
                    region.transferTo(target, before);
                } catch (IOException | RuntimeException e) {
                    block.free();
                    throw e;
                }
                int length = target.written();
                if (length <= 0) {
                    block.free();
                    unspend();
                    return false;
                }
                copied(length);
                long op;
                if (length >= config.rendezvousThreshold() || length > c.maxFramePayload()) {
                    op = c.sendRendezvous(block.address(), length, block.memoryRegion().rkey());
                    metrics.addRendezvous(length);
                    handler.metrics().addRendezvous(length);
                } else {
                    c.beginData();
                    c.addSegment(block.address(), length, block.memoryRegion().lkey());
                    op = c.sendData();
                    countEager(length);
                }
                metrics.addFile(length);
                handler.metrics().addFile(length);
                // Progress is what the region reports: a framing or encrypting region may count more (or fewer)
                // bytes than it wrote, and must never be called again once transferred() reached count().
                record(op, region.transferred() - before, block, true);
            }
            return true;
        }

        @Override
        public boolean canSend() {
            return c.canSendData() && spend();
        }

        @Override
        public void unspend() {
            budget++;
        }

        @Override
        public int maxFramePayload() {
            return c.maxFramePayload();
        }

        @Override
        public int maxRendezvousLength() {
            return c.maxRendezvousLength();
        }

        @Override
        public void send(long address, int length, FileChunkCache.Chunk chunk, boolean rendezvous) {
            long op;
            if (rendezvous) {
                op = c.sendRendezvous(address, length, chunk.memoryRegion().rkey());
                metrics.addRendezvous(length);
                handler.metrics().addRendezvous(length);
            } else {
                c.beginData();
                c.addSegment(address, length, chunk.memoryRegion().lkey());
                op = c.sendData();
                countEager(length);
            }
            metrics.addFile(length);
            handler.metrics().addFile(length);
            record(op, length, chunk, true);
        }

        private void copied(int n) {
            metrics.addCopied(n);
            handler.metrics().addCopied(n);
        }

        private void countEager(int payload) {
            if (payload + FrameHeader.HEADER_LENGTH <= config.inlineThreshold()
                    && payload + FrameHeader.HEADER_LENGTH
                    <= domain.device.attributes().maxInlineData()) {
                metrics.addInline(payload);
                handler.metrics().addInline(payload);
            } else {
                metrics.addEager(payload);
                handler.metrics().addEager(payload);
            }
        }

        void endFrame() {
            if (!framing) {
                return;
            }
            framing = false;
            long op = c.sendData();
            record(op, frameBytes, frameStaging, false);
            countEager(frameBytes);
            frameStaging = null;
        }

        void finish() {
            endFrame();
        }
    }

    private RdmaFileWriter fileWriter;
    private final StagingChannel stagingChannel = new StagingChannel();

    /** Lets {@code FileRegion.transferTo} write into a registered staging block. */
    private static final class StagingChannel implements java.nio.channels.WritableByteChannel {
        private ByteBuffer target;

        StagingChannel reset(ByteBuffer buffer, int limit) {
            target = buffer;
            buffer.clear().limit(limit);
            return this;
        }

        int written() {
            return target.position();
        }

        @Override
        public int write(ByteBuffer src) {
            int n = Math.min(src.remaining(), target.remaining());
            ByteBuffer part = src.duplicate();
            part.limit(part.position() + n);
            target.put(part);
            src.position(src.position() + n);
            return n;
        }

        @Override
        public boolean isOpen() {
            return true;
        }

        @Override
        public void close() {
        }
    }

    private RdmaFileWriter fileWriter() {
        if (fileWriter == null) {
            fileWriter = new RdmaFileWriter(domain.memory, config.rendezvousThreshold());
        }
        return fileWriter;
    }

    private static void copy(ByteBuf src, int index, int length, ByteBuffer dst, int dstOffset) {
        dst.clear().position(dstOffset).limit(dstOffset + length);
        src.getBytes(index, dst);
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
        inputShutdown = true;
        // Drop what has arrived so the peer keeps its credits; later frames are dropped as they come.
        RdmaConnection c = connection;
        if (c != null) {
            readNow();
        }
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
        if (rendezvousTarget != null) {
            rendezvousTarget.release();
            rendezvousTarget = null;
        }
        if (partial != null) {
            partial.release();
            partial = null;
        }
        releaseOperations();
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

        @Override
        void abort() {
            // Without end of stream: the peer sees a reset, never a clean end of a stream that lost bytes.
            forceClose();
        }
    }
}
