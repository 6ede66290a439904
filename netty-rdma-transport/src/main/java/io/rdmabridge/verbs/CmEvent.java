package io.rdmabridge.verbs;

/**
 * A reusable holder for one connection-manager event ({@code struct rdma_cm_event}); filled by
 * {@link RdmaEventChannel#poll(CmEvent)}. Not thread-safe.
 */
public final class CmEvent {
    private CmEventType type;
    private RdmaCmId id;
    private RdmaCmId listenId;
    private byte[] privateData = new byte[0];
    private int status;
    private String detail;

    /** Provider side: overwrites every field. */
    public CmEvent set(CmEventType type, RdmaCmId id, RdmaCmId listenId, byte[] privateData, int status,
                       String detail) {
        this.type = type;
        this.id = id;
        this.listenId = listenId;
        this.privateData = privateData == null ? new byte[0] : privateData;
        this.status = status;
        this.detail = detail;
        return this;
    }

    public CmEventType type() {
        return type;
    }

    /** The id the event is about; for {@link CmEventType#CONNECT_REQUEST}, the newly created id. */
    public RdmaCmId id() {
        return id;
    }

    /** For {@link CmEventType#CONNECT_REQUEST}: the listening id that received it; otherwise {@code null}. */
    public RdmaCmId listenId() {
        return listenId;
    }

    /** Private data from the peer's connect, accept or reject; empty when none. Do not modify. */
    public byte[] privateData() {
        return privateData;
    }

    /** Provider status code (errno-like, or the CM reject reason); 0 for success events. */
    public int status() {
        return status;
    }

    /** A sentence naming the cause for failure events; {@code null} otherwise. */
    public String detail() {
        return detail;
    }

    @Override
    public String toString() {
        return "CmEvent{" + type + ", id=" + id + (detail != null ? ", detail=" + detail : "")
                + (status != 0 ? ", status=" + status : "") + ", privateData=" + privateData.length + " bytes}";
    }
}
