package io.rdmabridge.verbs;

import java.net.InetSocketAddress;

/**
 * A connection-manager identifier ({@code rdma_cm_id}): a listener, or one end of a connection together with its
 * queue pair. Every operation is non-blocking and reports its outcome as a {@link CmEvent} on the event channel.
 * Owned by the thread that owns its event channel.
 *
 * <h2>Active side</h2>
 * [{@link #bind} →] {@link #resolve} → {@link CmEventType#ADDR_RESOLVED} → {@link #createQueuePair} →
 * {@link #connect} → {@link CmEventType#ESTABLISHED} (or REJECTED / UNREACHABLE / CONNECT_ERROR).
 * <h2>Passive side</h2>
 * {@link #listen} → {@link CmEventType#CONNECT_REQUEST} carrying a new id → on it {@link #createQueuePair} →
 * {@link #accept} → {@link CmEventType#ESTABLISHED}; or {@link #reject}.
 * <h2>Teardown</h2>
 * {@link #disconnect} on either side → {@link CmEventType#DISCONNECTED} on both; the queue pairs enter
 * {@link QpState#ERROR} and flush. Then close the queue pair and the id.
 */
public interface RdmaCmId extends AutoCloseable {

    RdmaEventChannel eventChannel();

    /**
     * Binds and listens ({@code rdma_bind_addr} + {@code rdma_listen}).
     *
     * @param address port 0 picks a free port
     * @param backlog how many connect requests may wait for the owner to poll them (> 0); past it a request is
     *                rejected (the kernel's rdma_cm bounds the requests not yet taken from the event channel so,
     *                and leaves one past it for the connector to send again)
     * @return the address actually bound
     * @throws RdmaException when the address is in use or not local; the message names the address
     */
    InetSocketAddress listen(InetSocketAddress address, int backlog) throws RdmaException;

    /**
     * Binds an id that will connect to a local address ({@code rdma_bind_addr} before {@code rdma_resolve_addr}):
     * the connection leaves from that address, so once it is established {@link #localAddress()} here and the
     * peer's {@link #remoteAddress()} name it. Until then {@link #localAddress()} answers the bound address.
     *
     * <p>Only on a fresh id, once: before {@link #resolve}, and never on an id that {@link #listen}s (listen binds
     * itself). The port stays reserved until the id is closed, as a bound TCP socket's does, so a second bind to
     * the same address fails. Binding sends nothing to the network.
     *
     * @param address an address of this host, or the wildcard address (routing then picks the source address);
     *                port 0 picks a free port
     * @return the address actually bound, with the port chosen
     * @throws IllegalArgumentException when {@code address} is {@code null}
     * @throws RdmaException when the address is in use or not an address of this host (the message names the
     *                       address), when the id is not fresh (the message names its phase), or when the provider
     *                       cannot bind active ids
     */
    default InetSocketAddress bind(InetSocketAddress address) throws RdmaException {
        // Providers written before this method existed keep compiling; both in-tree providers override it.
        throw new RdmaException("bind(" + address + "): provider " + eventChannel().provider().name()
                + " cannot bind an active id (expected: connect without a local address)");
    }

    /**
     * Starts address and route resolution ({@code rdma_resolve_addr} + {@code rdma_resolve_route}); the source
     * address is the one given to {@link #bind}, if any.
     */
    void resolve(InetSocketAddress remote, int timeoutMillis) throws RdmaException;

    /** The device this id is bound to: after {@link CmEventType#ADDR_RESOLVED}, for a listener, or a request's id. */
    RdmaDevice device();

    /** Creates this id's queue pair ({@code rdma_create_qp}); state {@link QpState#INIT}. */
    QueuePair createQueuePair(ProtectionDomain pd, CompletionQueue sendCq, CompletionQueue recvCq,
                              QpCapabilities capabilities) throws RdmaException;

    /** This id's queue pair, or {@code null}. */
    QueuePair queuePair();

    /** Asks the resolved peer to connect ({@code rdma_connect}). */
    void connect(ConnectionParameters parameters) throws RdmaException;

    /** Accepts a {@link CmEventType#CONNECT_REQUEST} ({@code rdma_accept}). */
    void accept(ConnectionParameters parameters) throws RdmaException;

    /** Rejects a {@link CmEventType#CONNECT_REQUEST} ({@code rdma_reject}); the peer sees REJECTED. */
    void reject(byte[] privateData) throws RdmaException;

    /** Starts a disconnect ({@code rdma_disconnect}); idempotent. */
    void disconnect();

    /** The parameters the peer sent with connect or accept; {@code null} before. */
    ConnectionParameters peerParameters();

    InetSocketAddress localAddress();

    InetSocketAddress remoteAddress();

    /** Caller state, as the {@code context} pointer of {@code rdma_cm_id}. */
    void attach(Object attachment);

    Object attachment();

    /** Destroys the id ({@code rdma_destroy_id}), disconnecting first if connected; the queue pair must be closed. */
    @Override
    void close();
}
