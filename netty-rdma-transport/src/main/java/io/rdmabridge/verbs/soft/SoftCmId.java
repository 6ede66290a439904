package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.QpCapabilities;
import io.rdmabridge.verbs.QpState;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RdmaException;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.StandardSocketOptions;
import java.nio.channels.SelectionKey;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A connection-manager id of the software device: a listener (a real TCP port), or one end of a connection.
 *
 * <p>An active id {@link #bind bound} to a local address holds a real bound socket from then on, so the port is
 * reserved in the operating system as a TCP client's is. The TCP path connects from that very socket (the link takes
 * it over); the direct path uses the bound address as its local address, and the socket keeps the port reserved
 * until the id closes.
 *
 * <p>Threading: the public methods belong to the owner of the event channel; the engine and the in-JVM peer change
 * the phase under this object's monitor and report through the channel.
 */
final class SoftCmId implements RdmaCmId {
    /** CM reject reason "consumer reject" (IB CM REJ reason 28). */
    static final int REJECT_CONSUMER = 28;
    /** CM reject reason "invalid service id": nothing listens there (IB CM REJ reason 8). */
    static final int REJECT_NO_LISTENER = 8;
    static final int DEFAULT_TIMEOUT_MILLIS = 5000;

    enum Phase { IDLE, BOUND, LISTENING, RESOLVED, CONNECTING, REQUESTED, CONNECTED, DISCONNECTED, CLOSED }

    final SoftEventChannel channel;
    final SoftEngine engine;
    Phase phase = Phase.IDLE;
    private volatile InetSocketAddress local;
    private volatile InetSocketAddress remote;
    private int timeoutMillis = DEFAULT_TIMEOUT_MILLIS;
    private volatile SoftQueuePair qp;
    private volatile ConnectionParameters peerParams;
    private volatile Object attachment;
    private final AtomicBoolean disconnectedReported = new AtomicBoolean();
    private final AtomicBoolean closed = new AtomicBoolean();

    // listener
    private ServerSocketChannel server;
    // active id bound to a local address: what bind asked for, and the socket reserving its port until the TCP
    // path takes it over
    private InetSocketAddress bound;
    private SocketChannel reservation;
    // passive side of a request, or active side of a connection
    SoftCmId listenId;
    SoftCmId directPeer;
    TcpLink tcpLink;
    /** A listener's accepted sockets still waiting for their connect request (see TcpLink.accepted). */
    final AtomicInteger pendingHandshakes = new AtomicInteger();
    /** A listener's backlog: how many of its connect requests may wait for the owner's poll ({@link #requested}). */
    private volatile int listenBacklog;
    /** A listener's connect requests reported on its channel and not yet polled. */
    private final AtomicInteger unpolledRequests = new AtomicInteger();
    // The connect timeout, cancelled once the attempt ends so that the timer does not keep this id (and its link).
    private volatile java.util.concurrent.ScheduledFuture<?> connectTimeout;

    SoftCmId(SoftEventChannel channel) {
        this.channel = channel;
        this.engine = channel.engine;
        channel.ids.add(this);
        engine.usage.cmIds(1);
    }

    /** A passive id for a connect request arriving at {@code listener}. */
    static SoftCmId passive(SoftCmId listener, InetSocketAddress local, InetSocketAddress remote,
                            ConnectionParameters peerParams) {
        SoftCmId id = new SoftCmId(listener.channel);
        id.phase = Phase.REQUESTED;
        id.listenId = listener;
        id.local = local;
        id.remote = remote;
        id.peerParams = peerParams;
        return id;
    }

    void emit(CmEventType type, byte[] privateData, int status, String detail) {
        channel.emit(type, this, type == CmEventType.CONNECT_REQUEST ? listenId : null, privateData, status, detail);
    }

    /**
     * Reports this passive id's connect request to its listener ({@link SoftFaults#abandonConnectRequests}), or, when
     * as many requests as the listener's backlog wait for its owner's poll, rejects it and closes this id: the
     * kernel's rdma_cm counts the connect requests not yet taken from an event channel against the backlog given to
     * {@code rdma_listen} (and leaves the rest for their connectors to send again), so a listener whose owner is busy
     * cannot be flooded. This provider rejects, as the DiSNI provider must once its event thread has taken a request
     * from the kernel.
     *
     * @return whether the request was reported
     */
    boolean requested(byte[] privateData) {
        SoftCmId listener = listenId;
        int backlog = listener.listenBacklog;
        if (listener.unpolledRequests.incrementAndGet() > backlog) {
            listener.unpolledRequests.decrementAndGet();
            TcpLink.REFUSALS.warn("soft0: refusing a connection request from {} to {}: {} requests wait for the"
                    + " listener's owner to poll them, its backlog (raise the backlog, e.g. SO_BACKLOG, or keep the"
                    + " thread that polls the listener's events free)", remote, listener.local, backlog);
            closeId();
            return false;
        }
        emit(CmEventType.CONNECT_REQUEST, privateData, 0, null);
        if (engine.faults.takeAbandonedConnectRequest()) {
            emit(CmEventType.REJECTED, null, 0, "injected fault: the peer gave up its connect request"
                    + " (SoftFaults.abandonConnectRequests)");
        }
        return true;
    }

    /** The owner polled a connect request for this listener: it no longer counts against the backlog. */
    void requestPolled() {
        unpolledRequests.decrementAndGet();
    }

    // ------------------------------------------------------------------ passive

    @Override
    public InetSocketAddress listen(InetSocketAddress address, int backlog) throws RdmaException {
        if (address == null) {
            throw new IllegalArgumentException("address: null (expected: a local address; port 0 picks one)");
        }
        if (backlog <= 0) {
            throw new IllegalArgumentException("backlog: " + backlog + " (expected: > 0)");
        }
        synchronized (this) {
            if (phase != Phase.IDLE) {
                throw new RdmaException("listen in phase " + phase + " (expected: a fresh id)");
            }
        }
        listenBacklog = backlog;
        ServerSocketChannel ssc = null;
        try {
            ssc = ServerSocketChannel.open();
            ssc.setOption(StandardSocketOptions.SO_REUSEADDR, true);
            ssc.bind(address, backlog);
            ssc.configureBlocking(false);
            InetSocketAddress bound = (InetSocketAddress) ssc.getLocalAddress();
            synchronized (this) {
                server = ssc;
                local = bound;
                phase = Phase.LISTENING;
            }
            engine.listeners.put(bound.getPort(), this);
            Listener l = new Listener(ssc);
            final ServerSocketChannel s = ssc;
            java.nio.channels.Selector selector = engine.selector();
            engine.execute(() -> {
                try {
                    if (s.isOpen()) {
                        s.register(selector, SelectionKey.OP_ACCEPT, l);
                    }
                } catch (IOException e) {
                    SoftEngine.logger.warn("soft0: cannot watch listener {}: {}", bound, e.toString());
                }
            });
            return bound;
        } catch (IOException e) {
            closeQuietly(ssc);
            throw new RdmaException("cannot listen on " + address + ": " + e.getMessage()
                    + " (expected: a free port on a local address)", e);
        }
    }

    /** How long a listener whose accept failed stops accepting. */
    static final long ACCEPT_BACKOFF_MILLIS = 1000;

    private final class Listener implements SoftEngine.Handler {
        private final ServerSocketChannel ssc;

        Listener(ServerSocketChannel ssc) {
            this.ssc = ssc;
        }

        @Override
        public void onSelected(SelectionKey key) {
            for (int i = 0; i < 64; i++) {
                SocketChannel ch;
                try {
                    if (engine.faults.takeAcceptFailure()) {
                        throw new IOException("injected fault: accept refused (SoftFaults.failAccepts)");
                    }
                    ch = ssc.accept();
                } catch (IOException e) {
                    // Out of descriptors, say: the connection stays in the backlog and the selector reports it again
                    // at once. Stop watching for a while, as Netty's acceptor does, instead of spinning.
                    TcpLink.REFUSALS.warn("soft0: accept on {} failed, not accepting for {} ms: {}", local,
                            ACCEPT_BACKOFF_MILLIS, e.toString());
                    key.interestOps(0);
                    engine.schedule(() -> engine.execute(() -> {
                        if (key.isValid()) {
                            key.interestOps(SelectionKey.OP_ACCEPT);
                        }
                    }), TimeUnit.MILLISECONDS.toNanos(ACCEPT_BACKOFF_MILLIS));
                    return;
                }
                if (ch == null) {
                    return;
                }
                TcpLink.accepted(SoftCmId.this, ch);
            }
        }

        @Override
        public void onFailure(Throwable cause) {
        }

        @Override
        public String toString() {
            return "listener " + local;
        }
    }

    boolean isListening() {
        synchronized (this) {
            return phase == Phase.LISTENING;
        }
    }

    // ------------------------------------------------------------------ active

    @Override
    public InetSocketAddress bind(InetSocketAddress address) throws RdmaException {
        if (address == null) {
            throw new IllegalArgumentException("address: null (expected: an address of this host; port 0 picks one)");
        }
        synchronized (this) {
            if (phase != Phase.IDLE) {
                throw new RdmaException("bind to " + address + " in phase " + phase
                        + " (expected: a fresh id, before resolve or listen)");
            }
        }
        if (address.isUnresolved() || !SoftEngine.isLocal(address.getAddress())) {
            throw new RdmaException("cannot bind to " + address + ": not an address of this host (expected: an"
                    + " address of this host, or the wildcard address)");
        }
        SocketChannel socket = null;
        try {
            // No SO_REUSEADDR: a second bind to this address must fail, as it does for TCP clients.
            socket = SocketChannel.open();
            socket.bind(address);
            InetSocketAddress actual = (InetSocketAddress) socket.getLocalAddress();
            synchronized (this) {
                bound = address.getPort() == 0 ? new InetSocketAddress(address.getAddress(), actual.getPort())
                        : address;
                reservation = socket;
                local = actual;
                phase = Phase.BOUND;
            }
            return actual;
        } catch (IOException e) {
            closeQuietly(socket);
            throw new RdmaException("cannot bind to " + address + ": " + e.getMessage()
                    + " (expected: a free port on an address of this host; port 0 picks one)", e);
        }
    }

    /**
     * The socket the TCP path connects from; engine thread. A bound id hands over its reservation (the link owns it
     * from then on), or, when an earlier failed attempt used that up, a new socket bound to the same address.
     */
    SocketChannel connectSocket() throws IOException {
        SocketChannel socket;
        InetSocketAddress address;
        synchronized (this) {
            if (phase == Phase.CLOSED) {
                throw new java.nio.channels.ClosedChannelException();
            }
            socket = reservation;
            reservation = null;
            address = bound;
        }
        if (socket != null) {
            return socket;
        }
        socket = SocketChannel.open();
        if (address != null) {
            try {
                socket.bind(address);
            } catch (IOException e) {
                closeQuietly(socket);
                throw new java.net.BindException("cannot bind to " + address + " again: " + e.getMessage());
            }
        }
        return socket;
    }

    /** The direct path's local address: the bound one (from loopback when bound to the wildcard), else a label. */
    private InetSocketAddress directLocalAddress() {
        InetSocketAddress b;
        synchronized (this) {
            b = bound;
        }
        if (b == null) {
            return new InetSocketAddress(InetAddress.getLoopbackAddress(), engine.nextDirectPort());
        }
        return b.getAddress().isAnyLocalAddress() ? new InetSocketAddress(InetAddress.getLoopbackAddress(),
                b.getPort()) : b;
    }

    @Override
    public void resolve(InetSocketAddress remoteAddress, int timeoutMillis) throws RdmaException {
        if (remoteAddress == null) {
            throw new IllegalArgumentException("remote: null (expected: the peer's address and port)");
        }
        synchronized (this) {
            if (phase != Phase.IDLE && phase != Phase.BOUND && phase != Phase.RESOLVED) {
                throw new RdmaException("resolve in phase " + phase + " (expected: a fresh or bound id)");
            }
            if (remoteAddress.isUnresolved()) {
                channel.emit(CmEventType.ADDR_ERROR, this, null, null, -1, "cannot resolve host "
                        + remoteAddress.getHostString() + " (expected: a resolvable host name or an IP address)");
                return;
            }
            this.timeoutMillis = timeoutMillis > 0 ? timeoutMillis : DEFAULT_TIMEOUT_MILLIS;
            remote = remoteAddress;
            phase = Phase.RESOLVED;
        }
        emit(CmEventType.ADDR_RESOLVED, null, 0, null);
    }

    @Override
    public RdmaDevice device() {
        synchronized (this) {
            return phase == Phase.IDLE || phase == Phase.BOUND || phase == Phase.CLOSED ? null : channel.device;
        }
    }

    @Override
    public QueuePair createQueuePair(ProtectionDomain pd, CompletionQueue sendCq, CompletionQueue recvCq,
                                     QpCapabilities capabilities) throws RdmaException {
        if (!(pd instanceof SoftProtectionDomain) || !(sendCq instanceof SoftCompletionQueue)
                || !(recvCq instanceof SoftCompletionQueue)) {
            throw new IllegalArgumentException("pd/sendCq/recvCq: not of the soft provider (expected: resources of"
                    + " device soft0)");
        }
        capabilities.checkAgainst(SoftDevice.ATTRIBUTES);
        SoftProtectionDomain spd = (SoftProtectionDomain) pd;
        SoftCompletionQueue scq = (SoftCompletionQueue) sendCq;
        SoftCompletionQueue rcq = (SoftCompletionQueue) recvCq;
        // Counted before the queue pair exists, so that a close of any of the three on another thread either sees
        // it or is seen: the domain and queues are never closed under it.
        spd.queuePairStarting();
        int counted = 1;
        boolean created = false;
        try {
            scq.userStarting();
            counted = 2;
            rcq.userStarting();
            counted = 3;
            synchronized (this) {
                if (phase != Phase.RESOLVED && phase != Phase.REQUESTED) {
                    throw new RdmaException("createQueuePair in phase " + phase
                            + " (expected: after ADDR_RESOLVED, or on a CONNECT_REQUEST's id)");
                }
                if (qp != null) {
                    throw new RdmaException("this id already has queue pair " + qp.qpn
                            + " (expected: one queue pair per id)");
                }
                qp = new SoftQueuePair(engine, this, spd, scq, rcq, capabilities);
                created = true;
                return qp;
            }
        } finally {
            if (!created) {
                spd.queuePairGone();
                if (counted >= 2) {
                    scq.users.decrementAndGet();
                }
                if (counted == 3) {
                    rcq.users.decrementAndGet();
                }
            }
        }
    }

    @Override
    public QueuePair queuePair() {
        SoftQueuePair q = qp;
        return q == null || q.state == QpState.DESTROYED ? null : q;
    }

    SoftQueuePair softQueuePair() {
        return qp;
    }

    @Override
    public void connect(ConnectionParameters parameters) throws RdmaException {
        checkPrivateData(parameters, ConnectionParameters.MAX_CONNECT_PRIVATE_DATA, "connect");
        SoftQueuePair q;
        InetSocketAddress target;
        synchronized (this) {
            if (phase != Phase.RESOLVED) {
                throw new RdmaException("connect in phase " + phase + " (expected: after ADDR_RESOLVED)");
            }
            q = qp;
            if (q == null || q.state == QpState.DESTROYED) {
                throw new RdmaException("connect without a queue pair (expected: createQueuePair first)");
            }
            phase = Phase.CONNECTING;
            target = remote;
        }
        q.localParams = parameters;
        SoftCmId listener = SoftEngine.loopbackIsDirect() ? engine.localListener(target) : null;
        if (listener != null) {
            local = directLocalAddress();
            SoftCmId passive;
            synchronized (listener) {
                if (listener.phase != Phase.LISTENING) {
                    listener = null;
                    passive = null;
                } else {
                    passive = passive(listener, listener.localAddress(), local, parameters);
                    passive.directPeer = this;
                }
            }
            if (passive != null) {
                if (passive.requested(parameters.privateData())) {
                    connectTimeout = engine.schedule(this::connectTimedOut, timeoutMillis * 1_000_000L);
                }
                return;
            }
        }
        TcpLink.connect(this, target, parameters, timeoutMillis);
    }

    /** The connect attempt got no answer in time. */
    void connectTimedOut() {
        TcpLink link;
        synchronized (this) {
            if (phase != Phase.CONNECTING) {
                return;
            }
            phase = Phase.RESOLVED;
            link = tcpLink;
            tcpLink = null;
        }
        if (link != null) {
            link.abortHandshake();
        }
        emit(CmEventType.UNREACHABLE, null, 110, "no answer from " + remote + " within " + timeoutMillis
                + " ms (expected: a soft RDMA listener at that address)");
    }

    void connectTimeout(java.util.concurrent.ScheduledFuture<?> timeout) {
        connectTimeout = timeout;
    }

    private void connectAttemptEnded() {
        java.util.concurrent.ScheduledFuture<?> timeout = connectTimeout;
        if (timeout != null) {
            connectTimeout = null;
            timeout.cancel(false);
        }
    }

    /** The active side's connect failed: REJECTED or CONNECT_ERROR. */
    void connectFailed(CmEventType type, byte[] privateData, int status, String detail) {
        synchronized (this) {
            if (phase != Phase.CONNECTING) {
                return;
            }
            phase = Phase.RESOLVED;
            tcpLink = null;
        }
        connectAttemptEnded();
        emit(type, privateData, status, detail);
    }

    /** Called by the engine when the passive side accepted over TCP. */
    boolean connectAccepted(TcpLink link, ConnectionParameters peer, InetSocketAddress localAddress) {
        synchronized (this) {
            if (phase != Phase.CONNECTING || tcpLink != link) {
                return false;
            }
            // From here the queue pair holds the link; the id must not keep it (or a closed one) reachable.
            tcpLink = null;
            phase = Phase.CONNECTED;
            peerParams = peer;
            local = localAddress;
        }
        connectAttemptEnded();
        return true;
    }

    @Override
    public void accept(ConnectionParameters parameters) throws RdmaException {
        checkPrivateData(parameters, ConnectionParameters.MAX_ACCEPT_PRIVATE_DATA, "accept");
        int length = parameters.privateData().length;
        if (length != 0 && !channel.deliversPrivateData()) {
            // DiSNI 2.1's accept has no private data argument; this mode refuses it the same way.
            throw new RdmaException("privateData: " + length + " bytes on accept (expected: 0 with "
                    + SoftProvider.PRIVATE_DATA_PROPERTY + "=none, which behaves like DiSNI 2.1: exchange it in the"
                    + " first message instead)");
        }
        SoftQueuePair q;
        synchronized (this) {
            if (phase != Phase.REQUESTED) {
                throw new RdmaException("accept in phase " + phase + " (expected: on the id of a CONNECT_REQUEST)");
            }
            q = qp;
            if (q == null || q.state == QpState.DESTROYED) {
                throw new RdmaException("accept without a queue pair (expected: createQueuePair first)");
            }
        }
        q.localParams = parameters;
        q.peerParams = peerParams;
        SoftCmId active = directPeer;
        if (active != null) {
            SoftQueuePair aq;
            synchronized (active) {
                aq = active.qp;
                if (active.phase != Phase.CONNECTING || aq == null || aq.state == QpState.DESTROYED) {
                    synchronized (this) {
                        phase = Phase.DISCONNECTED;
                    }
                    throw new RdmaException("the connecting peer gave up (it timed out, disconnected or closed)"
                            + " before accept");
                }
                active.phase = Phase.CONNECTED;
                active.peerParams = parameters;
            }
            active.connectAttemptEnded();
            synchronized (this) {
                phase = Phase.CONNECTED;
            }
            aq.peerParams = parameters;
            DirectLink link = new DirectLink(engine, aq, q);
            aq.markReadyToSend(link);
            q.markReadyToSend(link);
            active.emit(CmEventType.ESTABLISHED, parameters.privateData(), 0, null);
            emit(CmEventType.ESTABLISHED, null, 0, null);
            return;
        }
        TcpLink link;
        synchronized (this) {
            phase = Phase.CONNECTED;
            link = tcpLink;
            // The queue pair holds the link from now on.
            tcpLink = null;
        }
        link.accept(this, q, parameters);
    }

    @Override
    public void reject(byte[] privateData) throws RdmaException {
        byte[] data = privateData == null ? new byte[0] : privateData.clone();
        if (data.length > ConnectionParameters.MAX_REJECT_PRIVATE_DATA) {
            throw new IllegalArgumentException("privateData: " + data.length + " bytes (expected: <= "
                    + ConnectionParameters.MAX_REJECT_PRIVATE_DATA + " on reject)");
        }
        synchronized (this) {
            if (phase != Phase.REQUESTED) {
                throw new RdmaException("reject in phase " + phase + " (expected: on the id of a CONNECT_REQUEST)");
            }
            phase = Phase.DISCONNECTED;
        }
        // DiSNI 2.1 rejects without private data (it destroys the request's id); this mode sends none either.
        rejectPeer(channel.deliversPrivateData() ? data : new byte[0]);
    }

    private void rejectPeer(byte[] data) {
        SoftCmId active = directPeer;
        if (active != null) {
            active.connectFailed(CmEventType.REJECTED, data, REJECT_CONSUMER, "rejected by the peer at " + local);
        } else if (tcpLink != null) {
            tcpLink.reject(data);
        }
    }

    private static void checkPrivateData(ConnectionParameters parameters, int max, String what) {
        if (parameters == null) {
            throw new IllegalArgumentException("parameters: null (expected: e.g. ConnectionParameters.DEFAULT)");
        }
        int n = parameters.privateData().length;
        if (n > max) {
            throw new IllegalArgumentException("privateData: " + n + " bytes (expected: <= " + max + " on " + what
                    + ")");
        }
    }

    // ------------------------------------------------------------------ teardown

    @Override
    public void disconnect() {
        Phase p;
        TcpLink pending = null;
        synchronized (this) {
            p = phase;
            if (p == Phase.CONNECTING) {
                phase = Phase.RESOLVED;
                pending = tcpLink;
                tcpLink = null;
            } else if (p == Phase.REQUESTED) {
                phase = Phase.DISCONNECTED;
            }
        }
        switch (p) {
            case CONNECTED: {
                SoftQueuePair q = qp;
                SoftLink link = q == null ? null : q.link;
                // Both ends of a DirectLink get this reason, so it names the queue pair rather than "local".
                String reason = q == null ? "disconnected by the application"
                        : "queue pair " + q.qpn + " disconnected by its application";
                if (link != null) {
                    link.disconnect(reason);
                } else {
                    onDisconnected(reason);
                }
                break;
            }
            case CONNECTING:
                connectAttemptEnded();
                if (pending != null) {
                    pending.abortHandshake();
                }
                break;
            case REQUESTED:
                rejectPeer(new byte[0]);
                break;
            default:
                break;
        }
    }

    /** The connection is gone: report DISCONNECTED once. */
    void onDisconnected(String reason) {
        synchronized (this) {
            if (phase == Phase.CLOSED) {
                return;
            }
            phase = Phase.DISCONNECTED;
        }
        if (disconnectedReported.compareAndSet(false, true)) {
            emit(CmEventType.DISCONNECTED, null, 0, reason);
        }
    }

    /** {@code null} also when the provider delivers no private data: the peer's parameters travel with it. */
    @Override
    public ConnectionParameters peerParameters() {
        return channel.deliversPrivateData() ? peerParams : null;
    }

    @Override
    public InetSocketAddress localAddress() {
        return local;
    }

    @Override
    public InetSocketAddress remoteAddress() {
        return remote;
    }

    void addresses(InetSocketAddress localAddress, InetSocketAddress remoteAddress) {
        local = localAddress;
        remote = remoteAddress;
    }

    @Override
    public RdmaEventChannel eventChannel() {
        return channel;
    }

    @Override
    public void attach(Object attachment) {
        this.attachment = attachment;
    }

    @Override
    public Object attachment() {
        return attachment;
    }

    @Override
    public void close() {
        SoftQueuePair q = qp;
        if (q != null && q.state != QpState.DESTROYED) {
            throw new IllegalStateException("id still has open queue pair " + q.qpn
                    + " (expected: close the queue pair, then the id)");
        }
        closeId();
    }

    /** Closes the id and, unlike {@link #close()}, its queue pair too (event channel close). */
    void forceClose() {
        SoftQueuePair q = qp;
        if (q != null) {
            q.close();
        }
        closeId();
    }

    private void closeId() {
        if (closed.get()) {
            return;
        }
        disconnect();
        ServerSocketChannel ssc;
        SocketChannel reserved;
        synchronized (this) {
            phase = Phase.CLOSED;
            ssc = server;
            server = null;
            reserved = reservation;
            reservation = null;
        }
        closeQuietly(reserved);
        if (ssc != null) {
            engine.listeners.remove(local.getPort(), this);
            closeQuietly(ssc);
        }
        if (closed.compareAndSet(false, true)) {
            channel.ids.remove(this);
            engine.usage.cmIds(-1);
        }
    }

    private static void closeQuietly(java.io.Closeable c) {
        if (c != null) {
            try {
                c.close();
            } catch (IOException ignored) {
                // Nothing to release beyond the descriptor.
            }
        }
    }

    @Override
    public String toString() {
        return "SoftCmId{" + phase + ", local=" + local + ", remote=" + remote + '}';
    }
}
