package io.rdmabridge.verbs;

/**
 * Memory-region access flags, with the values of {@code enum ibv_access_flags}. Local read access is implied.
 */
public final class Access {
    /** The local HCA may write into the region (needed for receives and as the target of RDMA READ). */
    public static final int LOCAL_WRITE = 1;
    /** A remote peer may RDMA WRITE into the region. Requires {@link #LOCAL_WRITE}. */
    public static final int REMOTE_WRITE = 1 << 1;
    /** A remote peer may RDMA READ from the region. */
    public static final int REMOTE_READ = 1 << 2;

    /** Every flag this SPI knows. */
    public static final int ALL = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ;

    private Access() {
    }

    /**
     * Validates a combination of flags the way {@code ibv_reg_mr} does.
     *
     * @throws IllegalArgumentException when unknown bits are set or remote write is asked without local write
     */
    public static int validate(int access) {
        if ((access & ~ALL) != 0) {
            throw new IllegalArgumentException("access: 0x" + Integer.toHexString(access)
                    + " (expected: a combination of Access.LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ)");
        }
        if ((access & REMOTE_WRITE) != 0 && (access & LOCAL_WRITE) == 0) {
            throw new IllegalArgumentException("access: REMOTE_WRITE without LOCAL_WRITE"
                    + " (expected: add Access.LOCAL_WRITE, as ibv_reg_mr requires)");
        }
        return access;
    }

    /** Human-readable form, e.g. {@code LOCAL_WRITE|REMOTE_READ}. */
    public static String toString(int access) {
        if (access == 0) {
            return "LOCAL_READ";
        }
        StringBuilder sb = new StringBuilder();
        if ((access & LOCAL_WRITE) != 0) {
            sb.append("LOCAL_WRITE|");
        }
        if ((access & REMOTE_WRITE) != 0) {
            sb.append("REMOTE_WRITE|");
        }
        if ((access & REMOTE_READ) != 0) {
            sb.append("REMOTE_READ|");
        }
        sb.setLength(sb.length() - 1);
        return sb.toString();
    }
}
