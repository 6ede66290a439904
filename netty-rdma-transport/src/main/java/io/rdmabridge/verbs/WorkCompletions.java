package io.rdmabridge.verbs;

/**
 * A reusable array of work completions ({@code struct ibv_wc[]}), filled by {@link CompletionQueue#poll}. Stored as
 * parallel primitive arrays so polling allocates nothing. Not thread-safe: one per polling thread.
 */
public final class WorkCompletions {
    /** {@link #flags(int)} bit: {@link #immData(int)} is valid ({@code IBV_WC_WITH_IMM}). */
    public static final int WITH_IMM = 1 << 1;

    private final long[] wrId;
    private final int[] status;
    private final int[] opcode;
    private final int[] byteLen;
    private final int[] immData;
    private final int[] qpNum;
    private final int[] flags;
    private final int[] vendorErr;

    public WorkCompletions(int capacity) {
        if (capacity <= 0) {
            throw new IllegalArgumentException("capacity: " + capacity + " (expected: > 0)");
        }
        wrId = new long[capacity];
        status = new int[capacity];
        opcode = new int[capacity];
        byteLen = new int[capacity];
        immData = new int[capacity];
        qpNum = new int[capacity];
        flags = new int[capacity];
        vendorErr = new int[capacity];
    }

    public int capacity() {
        return wrId.length;
    }

    /** The caller's 64-bit tag from the work request. */
    public long wrId(int i) {
        return wrId[i];
    }

    /** A {@link WcStatus} value. */
    public int status(int i) {
        return status[i];
    }

    /** A {@link WcOpcode} value. Only meaningful when {@link #status(int)} is {@link WcStatus#SUCCESS}. */
    public int opcode(int i) {
        return opcode[i];
    }

    /** Bytes received (receives) or read (RDMA READ); not set for sends and writes. Only meaningful on success. */
    public int byteLength(int i) {
        return byteLen[i];
    }

    /** The immediate, in host order, when {@code (flags(i) & WITH_IMM) != 0}. */
    public int immData(int i) {
        return immData[i];
    }

    /** The local queue pair number the completion belongs to. */
    public int qpNumber(int i) {
        return qpNum[i];
    }

    public int flags(int i) {
        return flags[i];
    }

    public boolean hasImmediate(int i) {
        return (flags[i] & WITH_IMM) != 0;
    }

    /** A provider-specific detail for errors (a hardware vendor syndrome); always 0 from the soft provider. */
    public int vendorError(int i) {
        return vendorErr[i];
    }

    /** Provider side: writes entry {@code i}. */
    public void set(int i, long wrId, int status, int opcode, int byteLength, int qpNumber, int flags, int immData,
                    int vendorError) {
        this.wrId[i] = wrId;
        this.status[i] = status;
        this.opcode[i] = opcode;
        this.byteLen[i] = byteLength;
        this.qpNum[i] = qpNumber;
        this.flags[i] = flags;
        this.immData[i] = immData;
        this.vendorErr[i] = vendorError;
    }

    /** Entry {@code i} as text, for logs and test failures (allocates). */
    public String toString(int i) {
        return "wc{wrId=" + wrId[i] + ", status=" + WcStatus.name(status[i]) + ", opcode=" + WcOpcode.name(opcode[i])
                + ", byteLen=" + byteLen[i] + ", qp=" + qpNum[i]
                + (hasImmediate(i) ? ", imm=0x" + Integer.toHexString(immData[i]) : "")
                + (vendorErr[i] != 0 ? ", vendorErr=" + vendorErr[i] : "") + '}';
    }
}
