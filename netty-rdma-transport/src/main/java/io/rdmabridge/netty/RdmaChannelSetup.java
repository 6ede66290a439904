package io.rdmabridge.netty;

import io.netty.channel.ChannelFutureListener;
import io.netty.channel.ChannelPromise;
import io.netty.channel.ConnectTimeoutException;
import io.netty.channel.EventLoop;
import io.netty.util.internal.SystemPropertyUtil;
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
import java.nio.channels.AlreadyConnectedException;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.ConnectionPendingException;
import java.nio.channels.UnresolvedAddressException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Connection establishment of an {@link RdmaSocketChannel}: binding and resolving its connection-manager id,
 * connecting, accepting (for a channel of an {@link RdmaServerSocketChannel}), creating the completion queue,
 * receive buffers and queue pair, the HELLO handshake on the queue pair, the connect and handshake timeouts, and
 * activation once both sides' HELLOs are in. Owns the id, the queue pair, its completion queue and receive buffers,
 * and destroys them when the channel closes.
 *
 * <p>Threading: the channel's event loop. For an accepted channel the id belongs to the listener's loop: operations
 * on it hop there ({@link #runOnIdOwner}), and its events hop back before they reach {@link #connectEvent}. The
 * listener's event channel, on which the id lives, stays open until the id is closed, also when the listener's loop
 * has shut down first (then the id's last operations run here).
 *
 * <p>It does not read, write or decide how to close: on activation it hands the receive buffers and queue depths
 * to the inbound and outbound paths, and a failed set-up closes through the channel's unsafe or
 * {@link RdmaChannelClosing}.
 */
final class RdmaChannelSetup {
    // Logs under the channel's name, the one users configure.
    private static final InternalLogger logger = InternalLoggerFactory.getInstance(RdmaSocketChannel.class);
    /**
     * System property: how long a channel whose {@code CONNECT_TIMEOUT_MILLIS} is 0 waits for the peer's handshake
     * (HELLO) once the connection manager has connected it (default 30 s, Netty's default connect timeout). A peer
     * that connects and never speaks must not hold a queue pair and its receive buffers for ever, on either side.
     */
    static final String HANDSHAKE_TIMEOUT_PROPERTY = "rdmabridge.handshakeTimeoutMillis";
    static final int DEFAULT_HANDSHAKE_TIMEOUT_MILLIS = 30_000;
    static final int CONTROL_CREDITS = 8;

    private final RdmaSocketChannel channel;
    // Connection-manager side; for an accepted channel the id is owned by the listener's handler.
    private RdmaCmId id;
    private RdmaIoHandler idOwner;
    // An accepted channel's id lives on the listener's event channel, which the channel keeps open from its
    // registration until it has closed the id (one never registered is closed with that event channel).
    private boolean eventChannelRetained;
    // Events of an accepted channel's id taken by the listener's loop and not yet here.
    private final AtomicInteger eventsInFlight = new AtomicInteger();
    private ConnectionConfig connectionConfig;
    private CompletionQueue cq;
    private volatile QueuePair qp;
    private ReceiveBuffers recv;
    private ChannelPromise connectPromise;
    private ScheduledFuture<?> connectTimeoutFuture;
    // An accepted channel once it has answered the connect request: the peer may count itself connected.
    private boolean acceptIssued;
    /**
     * Orders an accepted channel's accept task, which runs on the listener's loop (queue pair on this channel's
     * completion queue, its receive buffers posted), against this channel's release of them on its own loop: a close
     * before the listener's loop got to the task used to leave it creating a queue pair on a closed completion queue
     * and posting freed buffers. Taken once by each, on those paths only.
     */
    private final Object acceptLock = new Object();
    /** Set under {@link #acceptLock} once this channel released what its accept task would use. */
    private boolean acceptAbandoned;
    /** Whether this accepted channel counts against its listener's backlog: from its read until active or closed. */
    private final AtomicBoolean handshakeCounted = new AtomicBoolean();
    // What ended this accepted channel's request before it had a loop (set on the listener's loop), or null.
    private volatile String endedBeforeRegistration;
    // The receive buffers an accepted channel took from its loop's handshake memory, until the handshake ends.
    private long handshakeMemory;
    private RdmaIoHandler handshakeLoop;
    private InetSocketAddress requestedRemote;

    /** For an unconnected channel ({@code id} {@code null}), or an accepted one whose id {@code idOwner} owns. */
    RdmaChannelSetup(RdmaSocketChannel channel, RdmaCmId id, RdmaIoHandler idOwner) {
        this.channel = channel;
        this.id = id;
        this.idOwner = idOwner;
    }

    /** The queue pair, once created. */
    QueuePair queuePair() {
        return qp;
    }

    /** Receive buffers handed up and not yet released; call on the event loop. */
    int heldReceiveBuffers() {
        return recv == null ? 0 : recv.held();
    }

    /**
     * Whether connection-manager events of this channel's id may wait unread: on the event channel they arrive on
     * (the listener's, polled by the listener's loop, for an accepted channel), or on their way from that loop to
     * this one. Any event of that channel counts, whichever id it concerns.
     */
    boolean connectionEventsMayWait() {
        RdmaIoHandler owner = idOwner;
        return eventsInFlight.get() != 0 || owner != null && owner.eventChannel().hasPendingEvents();
    }

    /** Hands an event of the id from the listener's loop to {@code loop}, this channel's, for {@link #connectEvent}. */
    void handOver(EventLoop loop, RdmaCmIoEvent event) {
        eventsInFlight.incrementAndGet();
        try {
            loop.execute(() -> {
                eventsInFlight.decrementAndGet();
                try {
                    connectEvent(event);
                } catch (Throwable t) {
                    // Out of direct memory while the connection is set up, say: this channel fails alone, as it
                    // does when its poll meets the error (rather than wait for its handshake timeout).
                    ((RdmaIoHandle) channel.unsafe()).failed(t);
                }
            });
        } catch (RejectedExecutionException e) {
            // Shutting down: the loop's destroy releases everything.
            eventsInFlight.decrementAndGet();
        }
    }

    /** Whether this accepted channel has answered its connect request (its peer may count itself connected). */
    boolean isAcceptIssued() {
        return acceptIssued;
    }

    /**
     * A connection-manager event for this accepted channel before it was registered with a loop (listener's loop).
     * Before the accept only an end can come (a device's peer that gave up its request gets a REJECTED, a
     * DISCONNECTED or an UNREACHABLE on the passive id): it is kept, and the channel closes when it is registered,
     * where its pipeline can hear why. Firing it here threw ("not registered"), the event was lost, and the channel
     * was accepted later anyway.
     */
    void eventBeforeRegistration(RdmaCmIoEvent event) {
        if (endedBeforeRegistration == null) {
            endedBeforeRegistration = event.describe();
        }
        EventLoop loop = channel.firstLoop();
        if (loop != null) {
            // Registered meanwhile, maybe after registered() looked: the loop handles the event too.
            handOver(loop, event);
        }
    }

    /** Registered, with the handlers in: an accepted channel (the only kind with an id by now) accepts now. */
    void registered() {
        String ended = endedBeforeRegistration;
        if (ended != null && channel.state == RdmaSocketChannel.STATE_CONNECTING) {
            rejectAndClose(new IOException("connection from " + channel.remote + " ended before it was accepted ("
                    + ended + "): the peer gave up its connection request while it waited in the listener's backlog"));
            return;
        }
        if (id != null && channel.connection == null && qp == null
                && channel.state == RdmaSocketChannel.STATE_CONNECTING) {
            if (!eventChannelRetained) {
                if (!idOwner.retainEventChannel()) {
                    rejectAndClose(new IOException("connection from " + channel.remote + " dropped: its listener's "
                            + "event loop shut down before the connection was registered with a loop of its own"));
                    return;
                }
                eventChannelRetained = true;
            }
            startAccept();
        }
    }

    /** Creates the id on this loop's event channel and binds it; a later connect resolves from it. */
    void bind(SocketAddress localAddress) throws Exception {
        if (!(localAddress instanceof InetSocketAddress)) {
            throw new IllegalArgumentException("localAddress: " + localAddress + " (expected: an InetSocketAddress)");
        }
        InetSocketAddress requested = (InetSocketAddress) localAddress;
        int state = channel.state;
        if (id != null || state != RdmaSocketChannel.STATE_OPEN) {
            throw new BindException("cannot bind to " + requested + ": the channel is already "
                    + (id != null && state == RdmaSocketChannel.STATE_OPEN ? "bound to " + channel.local
                            : "connecting or connected")
                    + " (expected: one bind, before connect)");
        }
        RdmaCmId created = null;
        try {
            created = channel.handler.eventChannel().createId();
            channel.local = created.bind(requested);
        } catch (RdmaException | RuntimeException e) {
            if (created != null) {
                created.close();
            }
            BindException bindException = new BindException("cannot bind to " + requested + ": " + e.getMessage());
            bindException.initCause(e);
            throw bindException;
        }
        id = created;
        idOwner = channel.handler;
        created.attach(channel.unsafe());
    }

    /** The unsafe's connect, once the promise is known uncancelled and the channel open. */
    void connect(SocketAddress remoteAddress, SocketAddress localAddress, ChannelPromise promise) {
        // The promise stays cancellable: the connection manager's connect is non-blocking, and cancelling it
        // closes the channel (the listener below), as Netty's NIO and epoll channels do.
        if (connectPromise != null) {
            promise.setFailure(new ConnectionPendingException());
            return;
        }
        if (channel.state == RdmaSocketChannel.STATE_ACTIVE) {
            promise.setFailure(new AlreadyConnectedException());
            return;
        }
        if (!(remoteAddress instanceof InetSocketAddress)) {
            promise.setFailure(new IllegalArgumentException("remoteAddress: " + remoteAddress
                    + " (expected: an InetSocketAddress)"));
            return;
        }
        InetSocketAddress target = (InetSocketAddress) remoteAddress;
        if (target.isUnresolved()) {
            promise.setFailure(new UnresolvedAddressException());
            return;
        }
        if (localAddress != null) {
            // Like NIO: bind first; a failure fails the connect and leaves the channel open and unbound.
            try {
                bind(localAddress);
            } catch (Exception e) {
                promise.setFailure(e);
                return;
            }
        }
        requestedRemote = target;
        channel.remote = target;
        int timeout = channel.config().getConnectTimeoutMillis();
        try {
            if (id == null) {
                id = channel.handler.eventChannel().createId();
                idOwner = channel.handler;
                id.attach(channel.unsafe());
            }
            channel.state = RdmaSocketChannel.STATE_CONNECTING;
            id.resolve(target, timeout > 0 ? timeout : 30_000);
        } catch (RdmaException | RuntimeException e) {
            promise.tryFailure(channel.annotateConnectException(
                    connectException("cannot connect to " + target + ": " + e.getMessage(), e), target));
            channel.unsafe().close(channel.voidPromise());
            return;
        }
        connectPromise = promise;
        if (timeout > 0) {
            scheduleConnectTimeout(timeout, true);
        }
        promise.addListener((ChannelFutureListener) future -> {
            if (future.isCancelled()) {
                cancelConnectTimeout();
                connectPromise = null;
                channel.unsafe().close(channel.voidPromise());
            }
        });
    }

    /**
     * Fails the connect after {@code timeout} ms; {@code configured}: the channel's {@code CONNECT_TIMEOUT_MILLIS}
     * rather than the handshake's default. The message says whether the connection manager had connected.
     */
    private void scheduleConnectTimeout(int timeout, boolean configured) {
        InetSocketAddress target = requestedRemote;
        connectTimeoutFuture = channel.eventLoop().schedule(() -> {
            ChannelPromise p = connectPromise;
            if (p == null || p.isDone()) {
                return;
            }
            String limit = timeout + " ms (" + (configured ? "CONNECT_TIMEOUT_MILLIS" : "CONNECT_TIMEOUT_MILLIS is 0: "
                    + HANDSHAKE_TIMEOUT_PROPERTY) + ")";
            String message = channel.connection == null ? "connection timed out after " + limit + ": " + target
                    : "connected to " + target + ", but no rdma-bridge handshake came within " + limit
                    + "; is the peer an rdma-bridge endpoint, and is its event loop responsive?";
            if (p.tryFailure(new ConnectTimeoutException(message))) {
                connectPromise = null;
                channel.unsafe().close(channel.voidPromise());
            }
        }, timeout, TimeUnit.MILLISECONDS);
    }

    /** The handshake timeout of a channel whose {@code CONNECT_TIMEOUT_MILLIS} is 0 (see the property). */
    static int defaultHandshakeTimeoutMillis() {
        int millis = SystemPropertyUtil.getInt(HANDSHAKE_TIMEOUT_PROPERTY, DEFAULT_HANDSHAKE_TIMEOUT_MILLIS);
        return millis > 0 ? millis : DEFAULT_HANDSHAKE_TIMEOUT_MILLIS;
    }

    /** Creates the completion queue, receive buffers and queue pair on {@code cmId}; posts the receives. */
    private void createQueuePair() throws RdmaException {
        RdmaDomain d = channel.domain;
        d.checkServes(id.device(), id.remoteAddress());
        DeviceAttributes attributes = d.device.attributes();
        // Capped here once, so that the queue pair, the connection and the outbound arrays agree on the depth.
        connectionConfig = channel.config().connectionConfig(Integer.highestOneBit(attributes.maxQpWr()));
        int sendDepth = connectionConfig.sendQueueDepth();
        int recvDepth = connectionConfig.receiveQueueDepth() + CONTROL_CREDITS;
        if (recvDepth > attributes.maxQpWr()) {
            throw new RdmaException("RECEIVE_QUEUE_DEPTH: " + connectionConfig.receiveQueueDepth() + " (expected: <= "
                    + (attributes.maxQpWr() - CONTROL_CREDITS) + ", the limit of device " + attributes.name() + ")");
        }
        if (channel.parent() != null) {
            long bytes = (long) recvDepth * connectionConfig.receiveBufferSize();
            String refusal = channel.handler.reserveHandshake(bytes);
            if (refusal != null) {
                throw new RdmaException("cannot accept the connection from " + channel.remote + ": " + refusal);
            }
            handshakeMemory = bytes;
            handshakeLoop = channel.handler;
        }
        cq = d.device.createCompletionQueue(sendDepth + recvDepth, channel.handler.notifier());
        recv = new ReceiveBuffers(d.memory, connectionConfig.receiveBufferSize(), recvDepth);
    }

    private Handshake localHandshake() {
        ConnectionConfig c = connectionConfig;
        return new Handshake(c.receiveBufferSize(), c.receiveQueueDepth(), CONTROL_CREDITS, c.maxMessageSize());
    }

    private QpCapabilities capabilities() {
        DeviceAttributes attributes = channel.domain.device.attributes();
        int sendDepth = connectionConfig.sendQueueDepth();
        int inline = Math.min(channel.config().inlineThreshold(), attributes.maxInlineData());
        return new QpCapabilities(sendDepth, recv.count(), Math.min(RdmaConnection.MAX_SGE, attributes.maxSge()), 1,
                inline);
    }

    /** Accepted channel, on its own loop: prepare, then let the id's owner create the queue pair and accept. */
    private void startAccept() {
        try {
            createQueuePair();
        } catch (Throwable e) {
            // Out of memory included: this connection fails and releases what it has; its peer sees a reject.
            rejectAndClose(e);
            return;
        }
        QpCapabilities caps = capabilities();
        RdmaDomain d = channel.domain;
        CompletionQueue completionQueue = cq;
        ReceiveBuffers receiveBuffers = recv;
        acceptIssued = true;
        // A peer that connects and never sends its HELLO must not hold a queue pair and the loop's handshake memory
        // for ever: a child's CONNECT_TIMEOUT_MILLIS of 0 ("none" for a connect) stands for Netty's default here.
        int configured = channel.config().getConnectTimeoutMillis();
        int timeout = configured > 0 ? configured : defaultHandshakeTimeoutMillis();
        connectTimeoutFuture = channel.eventLoop().schedule(() -> {
            if (channel.state == RdmaSocketChannel.STATE_CONNECTING) {
                failConnect(new ConnectTimeoutException("no rdma-bridge handshake from " + channel.remote
                        + " within " + timeout + " ms (CONNECT_TIMEOUT_MILLIS of the server's child options"
                        + (configured > 0 ? "" : "; 0 stands for " + HANDSHAKE_TIMEOUT_PROPERTY)
                        + "): closing the accepted connection; is the peer an rdma-bridge endpoint?"));
            }
        }, timeout, TimeUnit.MILLISECONDS);
        RdmaCmId passive = id;
        runOnIdOwner(() -> {
            synchronized (acceptLock) {
                if (acceptAbandoned) {
                    return; // closed meanwhile: its release destroys the id, which rejects the request
                }
                try {
                    QueuePair created = passive.createQueuePair(d.pd, completionQueue, completionQueue, caps);
                    qp = created;
                    RdmaConnection.postReceives(created, receiveBuffers);
                    passive.accept(ConnectionParameters.DEFAULT);
                } catch (Throwable e) {
                    channel.eventLoop().execute(() -> rejectAndClose(e));
                }
            }
        });
    }

    private void rejectAndClose(Throwable cause) {
        logger.debug("Accepting an RDMA connection from {} failed", channel.remote, cause);
        channel.pipeline().fireExceptionCaught(cause);
        channel.closing.forceClose();
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

    /** An event of the id, on the channel's loop. */
    void connectEvent(RdmaCmIoEvent event) {
        switch (event.type()) {
            case ADDR_RESOLVED:
                if (channel.state != RdmaSocketChannel.STATE_CONNECTING) {
                    return;
                }
                try {
                    createQueuePair();
                    qp = id.createQueuePair(channel.domain.pd, cq, cq, capabilities());
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
                failConnect(connectException("connection refused: " + peer()
                        + (event.detail() != null ? " (" + event.detail() + ")" : ""), null));
                return;
            case UNREACHABLE:
                // On an accepted channel: the peer never confirmed the accept (the connection manager's RTU).
                failConnect(new ConnectTimeoutException("connection timed out: " + peer()
                        + (channel.parent() != null ? ", which never confirmed the accept" : "")
                        + (event.detail() != null ? " (" + event.detail() + ")" : "")));
                return;
            case ADDR_ERROR:
            case CONNECT_ERROR:
                failConnect(connectException("cannot connect to " + peer() + ": " + event.describe(), null));
                return;
            case DISCONNECTED:
            case DEVICE_REMOVAL:
                if (channel.state == RdmaSocketChannel.STATE_CONNECTING && channel.connection != null) {
                    // The peer's HELLO, and what it sent after it, may have landed before it disconnected (a server
                    // that closes in channelActive): deliver that first, as TCP delivers data before the FIN.
                    channel.pollConnection();
                }
                if (channel.state == RdmaSocketChannel.STATE_CONNECTING) {
                    failConnect(connectException("connection to " + channel.remote + " lost while connecting: "
                            + event.describe(), null));
                } else {
                    channel.closing.peerGone();
                    channel.pollConnection();
                }
                return;
            default:
                logger.debug("Unexpected connection-manager event on {}: {}", channel, event.describe());
        }
    }

    /** The address connected to, or for an accepted channel the peer's. */
    private SocketAddress peer() {
        return requestedRemote != null ? requestedRemote : channel.remote;
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
        if (channel.state != RdmaSocketChannel.STATE_CONNECTING || channel.connection != null) {
            return;
        }
        try {
            RdmaConnection c = new RdmaConnection(qp, cq, recv, channel.domain.memory, localHandshake(),
                    connectionConfig, channel.outbound);
            channel.connection = c;
            c.start();
        } catch (RdmaException | RuntimeException e) {
            failConnect(connectException("cannot set up the connection to " + channel.remote + ": "
                    + e.getMessage(), e));
            return;
        }
        if (channel.parent() == null && connectTimeoutFuture == null) {
            // Connected with no connect timeout: a server that never sends its HELLO must not hold this side's queue
            // pair and receive buffers for ever, nor keep channelActive (and idle handlers) from ever running.
            scheduleConnectTimeout(defaultHandshakeTimeoutMillis(), false);
        }
        // The peer's HELLO (and frames after it) may have landed before the event reached this loop.
        channel.pollConnection();
    }

    /**
     * A poll while connecting found the peer's HELLO missing: fails the connect if it never comes.
     *
     * @return whether the handshake failed
     */
    boolean handshakeFailed(RdmaConnection c) {
        if (c.failure() == null && !c.isLost()) {
            return false;
        }
        String cause = c.failure() != null ? c.failure().getMessage() : "the queue pair was disconnected";
        failConnect(connectException("handshake with " + channel.remote + " failed: " + cause, c.failure()));
        return true;
    }

    /** Both handshakes are done: the channel becomes active. */
    void activate() {
        handshakeEnded();
        channel.outbound.activate(connectionConfig.sendQueueDepth());
        channel.inbound.activate(recv, connectionConfig.receiveQueueDepth());
        InetSocketAddress l = id.localAddress();
        InetSocketAddress r = id.remoteAddress();
        if (l != null) {
            channel.local = l;
        }
        if (r != null) {
            channel.remote = r;
        }
        channel.state = RdmaSocketChannel.STATE_ACTIVE;
        channel.handler.updateBusyPoll();
        cancelConnectTimeout();
        ChannelPromise promise = connectPromise;
        connectPromise = null;
        if (promise != null) {
            // Like NIO: fire channelActive even when the user cancelled the promise meanwhile, then close.
            boolean promiseSet = promise.trySuccess();
            channel.pipeline().fireChannelActive();
            if (!promiseSet) {
                channel.unsafe().close(channel.voidPromise());
            }
        } else {
            channel.pipeline().fireChannelActive();
            channel.closing.activated();
        }
    }

    private void failConnect(Throwable cause) {
        ChannelPromise promise = connectPromise;
        connectPromise = null;
        cancelConnectTimeout();
        if (promise != null) {
            promise.tryFailure(cause);
            channel.unsafe().close(channel.voidPromise());
        } else if (channel.state == RdmaSocketChannel.STATE_CONNECTING) {
            // An accepted channel whose handshake did not complete.
            rejectAndClose(cause);
        }
    }

    private void cancelConnectTimeout() {
        if (connectTimeoutFuture != null) {
            connectTimeoutFuture.cancel(false);
            connectTimeoutFuture = null;
        }
    }

    /** The channel closed: a connect still under way fails. */
    void closed() {
        handshakeEnded();
        cancelConnectTimeout();
        ChannelPromise promise = connectPromise;
        connectPromise = null;
        if (promise != null) {
            promise.tryFailure(new ClosedChannelException());
        }
    }

    /**
     * The handshake ended (the channel is active, or closed): the listener may take one more request, and the
     * receive buffers are the connection's, no longer the loop's handshake memory. Loop thread, as the reservation.
     */
    void handshakeEnded() {
        if (handshakeCounted.compareAndSet(true, false)) {
            ((RdmaServerSocketChannel) channel.parent()).handshakeEnded();
        }
        if (handshakeMemory != 0) {
            handshakeLoop.releaseHandshake(handshakeMemory);
            handshakeMemory = 0;
        }
    }

    /**
     * The listener read this accepted channel (its loop): from now until the channel is active or closed it counts
     * against the listener's backlog, since it will hold a queue pair and receive buffers, and its registration with
     * a loop of its own may wait behind that loop's other work.
     */
    void handshakeStarted() {
        if (handshakeCounted.compareAndSet(false, true)) {
            ((RdmaServerSocketChannel) channel.parent()).handshakeStarted();
        }
    }

    /** An abortive close: disconnects without end of stream, which the peer sees as a reset. */
    void disconnect() {
        RdmaCmId cmId = id;
        if (cmId != null) {
            runOnIdOwner(cmId::disconnect);
        }
    }

    /** Asks for a wake-up on the next completion, once connected. */
    void arm() {
        CompletionQueue q = cq;
        if (q != null && channel.connection != null) {
            q.requestNotify();
        }
    }

    /** Destroys the connection and its queue pair (or, before there is one, the queue pair and receive buffers). */
    void destroyQueuePair() {
        RdmaConnection c = channel.connection;
        if (c != null) {
            c.closing();
            c.destroy();
        } else {
            QueuePair q;
            synchronized (acceptLock) {
                acceptAbandoned = true;
                q = qp;
            }
            if (q != null) {
                q.close();
            }
            if (recv != null) {
                recv.close();
            }
        }
    }

    /** Destroys the completion queue and the id (once the queue pair is gone). */
    void destroyCompletionQueueAndId() {
        if (cq != null) {
            try {
                cq.close();
            } catch (RuntimeException e) {
                logger.warn("Failed to destroy the completion queue of {}", channel, e);
            }
            cq = null;
        }
        RdmaCmId cmId = id;
        id = null;
        if (cmId != null) {
            RdmaIoHandler owner = idOwner;
            boolean release = eventChannelRetained;
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
                if (release) {
                    owner.releaseEventChannel();
                }
            });
        }
    }
}
