package io.rdmabridge.verbs;

/** Connection-manager events ({@code enum rdma_cm_event_type}), the ones a reliable-connected endpoint sees. */
public enum CmEventType {
    /** {@link RdmaCmId#resolve} found the device and route to the peer; create the queue pair, then connect. */
    ADDR_RESOLVED,
    /** Address or route resolution failed or timed out. */
    ADDR_ERROR,
    /** A peer asks to connect to a listening id; {@link CmEvent#id()} is the new id to accept or reject. */
    CONNECT_REQUEST,
    /** The connection is up; the queue pair is in {@link QpState#RTS}. */
    ESTABLISHED,
    /** The peer rejected the request, or nothing listens at that port; {@link CmEvent#privateData()} may say why. */
    REJECTED,
    /** The peer did not answer in time. */
    UNREACHABLE,
    /** The handshake failed for another reason; {@link CmEvent#detail()} names it. */
    CONNECT_ERROR,
    /** Either side disconnected or the peer vanished; the queue pair is in {@link QpState#ERROR}. */
    DISCONNECTED,
    /** The device went away. */
    DEVICE_REMOVAL
}
