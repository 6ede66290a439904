package io.rdmabridge.verbs;

/**
 * A reusable send work request ({@code struct ibv_send_wr} with its scatter/gather list). The caller keeps one per
 * posting slot and rewrites it; {@link QueuePair#postSend(SendWorkRequest)} copies what it needs, so the object may
 * be rewritten as soon as the call returns. Not thread-safe.
 *
 * <p>For SEND and RDMA WRITE the list gathers the local source; for RDMA READ it scatters into local memory, which
 * must be registered with {@link Access#LOCAL_WRITE}. RDMA READ and WRITE name the peer's memory with
 * {@link #remoteAddress()} and {@link #rkey()}.
 */
public final class SendWorkRequest extends WorkRequest {
    /** Generate a completion on success ({@code IBV_SEND_SIGNALED}). Errors always complete. */
    public static final int SIGNALED = 1 << 1;
    /** Wait for earlier RDMA READs before this one starts ({@code IBV_SEND_FENCE}). */
    public static final int FENCE = 1 << 0;
    /** Wake an armed-for-solicited receiver ({@code IBV_SEND_SOLICITED}). */
    public static final int SOLICITED = 1 << 2;
    /**
     * Copy the payload at post time ({@code IBV_SEND_INLINE}); lkeys are ignored and the buffers are free once
     * {@code postSend} returns. At most {@link DeviceAttributes#maxInlineData()} bytes; SEND and WRITE only.
     */
    public static final int INLINE = 1 << 3;

    private int opcode = WrOpcode.SEND;
    private int flags;
    private int immData;
    private long remoteAddress;
    private int rkey;

    /** @param maxSge scatter/gather entries this request can hold */
    public SendWorkRequest(int maxSge) {
        super(maxSge, "scatter/gather list");
    }

    /** Clears the scatter/gather list and every field, ready for the next use. */
    public SendWorkRequest reset() {
        clear();
        opcode = WrOpcode.SEND;
        flags = 0;
        immData = 0;
        remoteAddress = 0;
        rkey = 0;
        return this;
    }

    public SendWorkRequest wrId(long wrId) {
        this.wrId = wrId;
        return this;
    }

    /** A {@link WrOpcode} value. */
    public SendWorkRequest opcode(int opcode) {
        WrOpcode.completionOpcode(opcode); // validates
        this.opcode = opcode;
        return this;
    }

    /** A combination of {@link #SIGNALED}, {@link #INLINE}, {@link #SOLICITED}, {@link #FENCE}. */
    public SendWorkRequest flags(int flags) {
        this.flags = flags;
        return this;
    }

    /** The immediate for {@code *_WITH_IMM} opcodes (host order; providers convert). */
    public SendWorkRequest immData(int immData) {
        this.immData = immData;
        return this;
    }

    /** The peer's memory for RDMA READ and WRITE. */
    public SendWorkRequest remote(long remoteAddress, int rkey) {
        this.remoteAddress = remoteAddress;
        this.rkey = rkey;
        return this;
    }

    /** Appends a scatter/gather entry. */
    public SendWorkRequest addSge(long address, int length, int lkey) {
        appendSge(address, length, lkey);
        return this;
    }

    /** Appends the whole of a memory region's {@code [address, address + length)} as a scatter/gather entry. */
    public SendWorkRequest addSge(MemoryRegion mr, long address, int length) {
        return addSge(address, length, mr.lkey());
    }

    public int opcode() {
        return opcode;
    }

    public int flags() {
        return flags;
    }

    public boolean isSignaled() {
        return (flags & SIGNALED) != 0;
    }

    public boolean isInline() {
        return (flags & INLINE) != 0;
    }

    public int immData() {
        return immData;
    }

    public long remoteAddress() {
        return remoteAddress;
    }

    public int rkey() {
        return rkey;
    }

    @Override
    public String toString() {
        return "SendWorkRequest{wrId=" + wrId + ", opcode=" + WrOpcode.name(opcode) + ", flags=" + flags
                + ", numSge=" + numSge() + ", length=" + totalLength() + ", remote=0x" + Long.toHexString(remoteAddress)
                + ", rkey=0x" + Integer.toHexString(rkey) + '}';
    }
}
