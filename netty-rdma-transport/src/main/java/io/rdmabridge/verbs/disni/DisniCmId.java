package io.rdmabridge.verbs.disni;

import com.ibm.disni.verbs.IbvContext;
import com.ibm.disni.verbs.IbvQP;
import com.ibm.disni.verbs.IbvQPInitAttr;
import com.ibm.disni.verbs.RdmaConnParam;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.QpCapabilities;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RdmaException;
import java.io.IOException;
import java.net.Inet4Address;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.ByteBuffer;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A connection-manager id over DiSNI's {@code RdmaCmId}. Every operation returns at once; outcomes arrive as events
 * on the channel. See {@link DisniProvider} for what DiSNI 2.1 cannot do here (private data on accept and in events,
 * reject with private data, IPv6).
 *
 * <p>Threading: owned by the thread that owns its event channel, except that an accepted id's queue pair is destroyed
 * on the thread that owns the queue pair; the native calls that touch the queue pair are serialized (see
 * {@code nativeLock}).
 */
final class DisniCmId implements RdmaCmId {
    private final DisniEventChannel channel;
    private final com.ibm.disni.verbs.RdmaCmId id;
    private final long handle;
    private DisniQueuePair queuePair;
    private DisniDevice device;
    private ByteBuffer connectData;
    private InetSocketAddress remote;
    private int resolveTimeoutMillis;
    /** What bind or listen bound this id to; {@code null} on a fresh id. */
    private InetSocketAddress bound;
    private Object attachment;
    private boolean disconnected;
    /**
     * From {@code rdma_connect}, or from the queue pair of a peer's connect request, until the event thread has taken
     * this id's answer: while set, librdmacm may modify the queue pair inside {@code rdma_get_cm_event} on the event
     * thread (to RTR and RTS on a connect response; to ERROR on a reject, which reaches a requested id too when its
     * connector gave up, before or after the accept), so the queue pair is destroyed only while that thread is outside
     * the call. A failed accept leaves it set: the connector's reject may still be on its way.
     */
    volatile boolean connectPending;
    /**
     * Serializes this id's native calls that touch its queue pair: an accepted id's disconnect runs on the thread that
     * owns the event channel (the listener's), its queue pair's destroy on the channel's own loop, and librdmacm's
     * {@code rdma_disconnect} modifies {@code id->qp} without a lock while {@code rdma_destroy_qp} frees it and sets
     * it to {@code NULL}. Taken only when connecting and tearing down.
     */
    private final Object nativeLock = new Object();
    private volatile boolean nativeDestroyed;
    private boolean closed;
    // What was asked of this id: an event it cannot have caused is a destroyed id's whose address it reuses.
    private boolean resolveIssued;
    private boolean connectIssued;
    /** Made for a peer's connect request (the passive side). */
    private boolean requested;
    /** A listener's backlog: how many connect requests the event thread may queue for the owner's poll. */
    private volatile int listenBacklog;
    /** A listener's bound address, for the event thread's messages (which must not call into the native id). */
    private volatile InetSocketAddress listening;
    /** A listener's connect requests queued by the event thread and not yet polled. */
    private final AtomicInteger unpolledRequests = new AtomicInteger();

    DisniCmId(DisniEventChannel channel, com.ibm.disni.verbs.RdmaCmId id, long handle) {
        this.channel = channel;
        this.id = id;
        this.handle = handle;
    }

    long handle() {
        return handle;
    }

    @Override
    public RdmaEventChannel eventChannel() {
        return channel;
    }

    @Override
    public InetSocketAddress listen(InetSocketAddress address, int backlog) throws RdmaException {
        checkOpen("listen");
        checkIpv4("listen", address);
        if (backlog <= 0) {
            throw new IllegalArgumentException("backlog: " + backlog + " (expected: > 0)");
        }
        checkFresh("listen", address);
        try {
            id.bindAddr(address);
        } catch (IOException e) {
            throw new RdmaException("rdma_bind_addr(" + address + ") failed: " + DisniErrors.clean(e)
                    + " (expected: a free port on a local IPv4 address served by an RDMA device, or 0.0.0.0)", e);
        }
        bound = address;
        listenBacklog = backlog;
        try {
            id.listen(backlog);
        } catch (IOException e) {
            throw new RdmaException("rdma_listen(" + address + ") failed: " + DisniErrors.clean(e), e);
        }
        InetSocketAddress actual = localAddress();
        listening = actual != null ? actual : address;
        return listening;
    }

    /**
     * Event thread: takes a place for a connect request to this listener in the queue the owner polls, or answers
     * {@code false} when as many as its backlog wait there. The kernel counts the requests not yet taken from an
     * event channel against the backlog of {@code rdma_listen}; the event thread takes each at once, so this count
     * keeps that bound.
     */
    boolean takeRequestPlace() {
        if (unpolledRequests.incrementAndGet() > listenBacklog) {
            unpolledRequests.decrementAndGet();
            return false;
        }
        return true;
    }

    /** The owner polled a connect request that {@link #takeRequestPlace} admitted. */
    void requestPolled() {
        unpolledRequests.decrementAndGet();
    }

    int listenBacklog() {
        return listenBacklog;
    }

    InetSocketAddress listeningAddress() {
        return listening;
    }

    /** {@code rdma_bind_addr} on an active id; {@link #resolve} passes no source address, so rdma_cm uses this one. */
    @Override
    public InetSocketAddress bind(InetSocketAddress address) throws RdmaException {
        if (address == null) {
            throw new IllegalArgumentException("address: null (expected: an address of this host; port 0 picks one)");
        }
        checkOpen("bind");
        checkIpv4("bind", address);
        checkFresh("bind", address);
        try {
            id.bindAddr(address);
        } catch (IOException e) {
            throw new RdmaException("rdma_bind_addr(" + address + ") failed: " + DisniErrors.clean(e)
                    + " (expected: a free port on an address of this host served by an RDMA device, or 0.0.0.0)", e);
        }
        bound = address;
        InetSocketAddress actual = localAddress();
        return actual != null ? actual : address;
    }

    @Override
    public void resolve(InetSocketAddress remote, int timeoutMillis) throws RdmaException {
        checkOpen("resolve");
        checkIpv4("resolve", remote);
        if (timeoutMillis <= 0) {
            throw new IllegalArgumentException("timeoutMillis: " + timeoutMillis + " (expected: > 0)");
        }
        this.remote = remote;
        this.resolveTimeoutMillis = timeoutMillis;
        resolveIssued = true;
        try {
            id.resolveAddr(null, remote, timeoutMillis);
        } catch (IOException e) {
            throw new RdmaException("rdma_resolve_addr(" + remote + ") failed: " + DisniErrors.clean(e), e);
        }
    }

    /** Second half of {@link #resolve}: called on the owner thread when the address is resolved. */
    void resolveRoute() throws RdmaException {
        try {
            id.resolveRoute(resolveTimeoutMillis);
        } catch (IOException e) {
            throw new RdmaException("rdma_resolve_route(" + remote + ") failed: " + DisniErrors.clean(e), e);
        }
    }

    /** {@code null} before resolution and for a listener bound to the wildcard address (no device chosen yet). */
    @Override
    public RdmaDevice device() {
        if (device == null && !closed && !nativeDestroyed) {
            try {
                IbvContext context = id.getVerbs();
                if (context != null) {
                    InetSocketAddress local = localAddress();
                    device = channel.disniProvider().deviceFor(context, local == null ? null : local.getAddress());
                }
            } catch (IOException e) {
                return null;
            }
        }
        return device;
    }

    @Override
    public QueuePair createQueuePair(ProtectionDomain pd, CompletionQueue sendCq, CompletionQueue recvCq,
                                     QpCapabilities capabilities) throws RdmaException {
        checkOpen("createQueuePair");
        if (queuePair != null) {
            throw new RdmaException("createQueuePair: this id already has queue pair " + queuePair.qpNumber());
        }
        RdmaDevice dev = device();
        if (dev == null) {
            throw new RdmaException("createQueuePair: the id has no device yet (expected: after ADDR_RESOLVED, or on"
                    + " the id of a CONNECT_REQUEST)");
        }
        DisniProtectionDomain disniPd = own(pd, DisniProtectionDomain.class, "pd", dev);
        DisniCompletionQueue disniSendCq = own(sendCq, DisniCompletionQueue.class, "sendCq", dev);
        DisniCompletionQueue disniRecvCq = own(recvCq, DisniCompletionQueue.class, "recvCq", dev);
        if (disniPd.isClosed() || disniSendCq.isClosed() || disniRecvCq.isClosed()) {
            // Their native objects are freed (a completion queue's shortly after its close): never hand them to verbs.
            throw new RdmaException("createQueuePair with a closed protection domain or completion queue (expected:"
                    + " open ones)");
        }
        capabilities.checkAgainst(dev.attributes());
        if (!disniPd.queuePairStarting()) {
            throw new RdmaException("createQueuePair with a closed protection domain (expected: an open one)");
        }
        try {
            return createQueuePair(dev, disniPd, disniSendCq, disniRecvCq, capabilities);
        } catch (RdmaException | RuntimeException | Error e) {
            disniPd.queuePairClosed();
            throw e;
        }
    }

    private DisniQueuePair createQueuePair(RdmaDevice dev, DisniProtectionDomain disniPd,
                                           DisniCompletionQueue disniSendCq, DisniCompletionQueue disniRecvCq,
                                           QpCapabilities capabilities) throws RdmaException {
        IbvQPInitAttr attr = new IbvQPInitAttr();
        attr.setQp_type(IbvQP.IBV_QPT_RC);
        attr.setSend_cq(disniSendCq.cq());
        attr.setRecv_cq(disniRecvCq.cq());
        attr.cap().setMax_send_wr(capabilities.maxSendWr());
        attr.cap().setMax_recv_wr(capabilities.maxRecvWr());
        attr.cap().setMax_send_sge(capabilities.maxSendSge());
        attr.cap().setMax_recv_sge(capabilities.maxRecvSge());
        attr.cap().setMax_inline_data(capabilities.maxInlineData());
        if (requested) {
            // From now on a reject of the request makes librdmacm move this queue pair to ERROR on the event thread.
            connectPending = true;
        }
        IbvQP qp;
        try {
            qp = id.createQP(disniPd.pd(), attr);
        } catch (IOException e) {
            throw new RdmaException("rdma_create_qp(" + capabilities + ") on " + dev.name() + " failed: "
                    + DisniErrors.clean(e), e);
        }
        if (qp == null) {
            throw new RdmaException("rdma_create_qp(" + capabilities + ") on " + dev.name() + " failed");
        }
        DisniQueuePair created;
        try {
            created = new DisniQueuePair(this, qp, disniPd, disniSendCq, disniRecvCq, capabilities);
        } catch (RdmaException | RuntimeException | Error e) {
            destroyNativeQueuePair();
            throw e;
        } catch (IOException e) {
            destroyNativeQueuePair();
            throw new RdmaException("cannot prepare queue pair: " + DisniErrors.clean(e), e);
        }
        queuePair = created;
        disniSendCq.attach(created);
        if (disniRecvCq != disniSendCq) {
            disniRecvCq.attach(created);
        }
        channel.disniProvider().usage().queuePairs(1);
        return created;
    }

    private static <T> T own(Object resource, Class<T> type, String name, RdmaDevice device) {
        if (!type.isInstance(resource)) {
            throw new IllegalArgumentException(name + ": " + resource + " (expected: a " + type.getSimpleName()
                    + " of the disni provider)");
        }
        RdmaDevice of = resource instanceof DisniProtectionDomain ? ((DisniProtectionDomain) resource).device()
                : ((DisniCompletionQueue) resource).device();
        if (of != device) {
            throw new IllegalArgumentException(name + ": belongs to device " + of.name() + " (expected: device "
                    + device.name() + " of this id)");
        }
        return type.cast(resource);
    }

    /** Called by the queue pair's close. */
    void destroyQueuePair() {
        queuePair = null;
        destroyNativeQueuePair();
    }

    private void destroyNativeQueuePair() {
        if (nativeDestroyed || id.getQp() == null || !id.getQp().isOpen()) {
            return;
        }
        if (connectPending) {
            // Closed while connecting or accepting: librdmacm may be modifying this queue pair on the event thread
            // right now (it crashed the JVM in ibv_query_ece on rxe when the queue pair went in between).
            channel.outsideEventWait(this::destroyQp);
        } else {
            destroyQp();
        }
    }

    private void destroyQp() {
        synchronized (nativeLock) {
            try {
                id.destroyQP();
            } catch (IOException e) {
                throw new IllegalStateException("rdma_destroy_qp failed: " + DisniErrors.clean(e), e);
            }
        }
    }

    @Override
    public QueuePair queuePair() {
        return queuePair;
    }

    /**
     * Connects. {@code responderResources} and {@code initiatorDepth} are not passed on: DiSNI 2.1 sets both to the
     * device's maximum.
     */
    @Override
    public void connect(ConnectionParameters parameters) throws RdmaException {
        checkOpen("connect");
        checkQueuePair("connect");
        byte[] data = parameters.privateData();
        if (data.length > ConnectionParameters.MAX_CONNECT_PRIVATE_DATA) {
            throw new RdmaException("privateData: " + data.length + " bytes (expected: <= "
                    + ConnectionParameters.MAX_CONNECT_PRIVATE_DATA + " on connect)");
        }
        RdmaConnParam param = connParam(parameters);
        if (data.length > 0) {
            if (connectData == null) {
                connectData = ByteBuffer.allocateDirect(ConnectionParameters.MAX_CONNECT_PRIVATE_DATA);
            }
            connectData.clear();
            connectData.put(data);
            try {
                param.setPrivate_data(DirectMemory.address(connectData));
            } catch (IOException e) {
                throw new RdmaException("connect: " + DisniErrors.clean(e), e);
            }
            param.setPrivate_data_len((byte) data.length);
        }
        connectPending = true;
        connectIssued = true;
        try {
            id.connect(param);
        } catch (IOException e) {
            connectPending = false;
            throw new RdmaException("rdma_connect(" + remote + ") failed: " + DisniErrors.clean(e), e);
        }
    }

    /**
     * Accepts.
     *
     * @throws RdmaException also when {@code parameters} carry private data: DiSNI 2.1's accept sends none
     */
    @Override
    public void accept(ConnectionParameters parameters) throws RdmaException {
        checkOpen("accept");
        checkQueuePair("accept");
        int length = parameters.privateData().length;
        if (length != 0) {
            throw new RdmaException("privateData: " + length + " bytes on accept (expected: 0 with the disni provider:"
                    + " DiSNI 2.1's rdma_accept sends no private data; exchange it in the first message instead)");
        }
        try {
            id.accept(connParam(parameters));
        } catch (IOException e) {
            throw new RdmaException("rdma_accept failed: " + DisniErrors.clean(e), e);
        }
        // librdmacm's rdma_accept moves the passive side's queue pair through RTR to RTS before it replies, so work
        // may be posted from here on, as with the soft provider; waiting for ESTABLISHED raced a peer that posts at
        // once (seen on rxe: "queue pair is INIT" in shouldCarryTrafficOnManyQueuePairs).
        queuePair.established();
    }

    private static RdmaConnParam connParam(ConnectionParameters parameters) throws RdmaException {
        RdmaConnParam param = new RdmaConnParam();
        try {
            param.setRetry_count((byte) parameters.retryCount());
        } catch (IOException e) {
            throw new RdmaException("retryCount: " + DisniErrors.clean(e), e);
        }
        param.setRnr_retry_count((byte) parameters.rnrRetryCount());
        return param;
    }

    /**
     * Rejects by destroying the id: DiSNI 2.1 has no {@code rdma_reject}, and destroying an id that holds an
     * unanswered request makes the kernel reject it, so the peer sees {@code REJECTED}, without private data. A
     * queue pair created on this id is destroyed with it.
     */
    @Override
    public void reject(byte[] privateData) throws RdmaException {
        checkOpen("reject");
        if (queuePair != null) {
            queuePair.close();
        }
        destroyNative();
    }

    @Override
    public void disconnect() {
        if (disconnected || closed || nativeDestroyed) {
            return;
        }
        disconnected = true;
        shutdown();
    }

    /**
     * {@code rdma_disconnect}: sends a DREQ, or the DREP that answers the peer's, and moves the queue pair to ERROR,
     * "which will flush any posted work requests" (rdma_disconnect(3)). It is also how work posted once the queue
     * pair is in ERROR gets flushed: devices differ there (rxe's user-space provider writes a receive into the queue
     * without telling the kernel, so nothing ever flushes it), but a transition to ERROR flushes what the queues
     * hold, ERROR to ERROR included (the InfiniBand QP state machine allows it from every state), and librdmacm
     * makes that transition on every call before it asks the kernel to disconnect. A repeated call's kernel part
     * fails (nothing is left to disconnect) and changes nothing, so the result is not looked at.
     */
    void shutdown() {
        synchronized (nativeLock) {
            if (!closed && !nativeDestroyed) {
                channel.disniProvider().dispatcher()._disconnect(handle);
            }
        }
    }

    /** Always {@code null}: DiSNI 2.1 does not pass the peer's connection parameters on. */
    @Override
    public ConnectionParameters peerParameters() {
        return null;
    }

    @Override
    public InetSocketAddress localAddress() {
        return address(true);
    }

    @Override
    public InetSocketAddress remoteAddress() {
        InetSocketAddress peer = address(false);
        return peer != null ? peer : remote;
    }

    private InetSocketAddress address(boolean local) {
        if (closed || nativeDestroyed) {
            return null;
        }
        try {
            SocketAddress a = local ? id.getSource() : id.getDestination();
            return a instanceof InetSocketAddress ? (InetSocketAddress) a : null;
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    @Override
    public void attach(Object attachment) {
        this.attachment = attachment;
    }

    @Override
    public Object attachment() {
        return attachment;
    }

    /**
     * Whether this id can have caused an event of rdma_cm's {@code type} (resolution events only after a resolve,
     * connection events only after a connect or accept). librdmacm acknowledges an event before DiSNI returns it, so
     * an id may be destroyed, and its address reused by a new id, while an event of the old one is still queued here.
     */
    boolean expects(boolean resolution) {
        return resolution ? resolveIssued : connectIssued;
    }

    /** An id made for a peer's connect request is part of a connection from the start. */
    void requested() {
        connectIssued = true;
        requested = true;
    }

    /** The connection is up; called on the owner thread. */
    void established() {
        if (queuePair != null) {
            queuePair.established();
        }
    }

    /** rdma_cm moved the queue pair to the error state; called on the owner thread. */
    void failed() {
        if (queuePair != null) {
            queuePair.failed();
        }
    }

    /**
     * The peer or we disconnected; called on the owner thread. rdma_cm leaves the answer to a peer's DREQ to the
     * application: without our {@code rdma_disconnect} the peer waits for its DREQ to time out, and our queue pair
     * stays in RTS with its work requests unflushed. After our own disconnect the call flushes what was posted since.
     */
    void disconnected() {
        disconnected = true;
        shutdown();
        failed();
    }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        if (queuePair != null) {
            queuePair.close();
        }
        closed = true;
        try {
            destroyNative();
        } finally {
            channel.idClosed(this);
        }
    }

    private void destroyNative() {
        if (nativeDestroyed) {
            return;
        }
        int result;
        synchronized (nativeLock) {
            nativeDestroyed = true;
            channel.forget(this);
            try {
                result = id.destroyId();
            } catch (IOException e) {
                throw new IllegalStateException("rdma_destroy_id failed: " + DisniErrors.clean(e), e);
            }
        }
        if (result != 0) {
            // DiSNI returns librdmacm's result instead of throwing.
            throw new IllegalStateException("rdma_destroy_id returned " + result + ": the id is left allocated");
        }
    }

    private void checkOpen(String operation) throws RdmaException {
        if (closed || nativeDestroyed) {
            throw new RdmaException(operation + ": the id is " + (closed ? "closed" : "rejected")
                    + " (expected: an open id)");
        }
    }

    /** rdma_cm binds an id once and resolves it after any bind: say which step came first. */
    private void checkFresh(String operation, InetSocketAddress address) throws RdmaException {
        if (bound != null || remote != null) {
            throw new RdmaException(operation + "(" + address + "): the id is already " + (remote != null
                    ? "resolving " + remote : "bound to " + bound) + " (expected: a fresh id, before resolve or"
                    + " listen)");
        }
    }

    private void checkQueuePair(String operation) throws RdmaException {
        if (queuePair == null) {
            throw new RdmaException(operation + ": the id has no queue pair (expected: createQueuePair first)");
        }
    }

    private static void checkIpv4(String operation, InetSocketAddress address) throws RdmaException {
        if (address == null || address.isUnresolved()) {
            throw new RdmaException(operation + ": " + address + " (expected: a resolved IPv4 address)");
        }
        if (!(address.getAddress() instanceof Inet4Address)) {
            throw new RdmaException(operation + ": " + address + " (expected: an IPv4 address; DiSNI 2.1 supports"
                    + " IPv4 only)");
        }
    }

    @Override
    public String toString() {
        return "DisniCmId{0x" + Long.toHexString(handle) + (remote != null ? ", remote=" + remote : "")
                + (queuePair != null ? ", qp=" + queuePair.qpNumber() : "") + '}';
    }
}
