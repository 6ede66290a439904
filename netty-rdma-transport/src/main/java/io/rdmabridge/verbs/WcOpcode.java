package io.rdmabridge.verbs;

/** Work-completion opcodes, with the values of {@code enum ibv_wc_opcode}. */
public final class WcOpcode {
    public static final int SEND = 0;
    public static final int RDMA_WRITE = 1;
    public static final int RDMA_READ = 2;
    /** A receive consumed by a SEND or SEND_WITH_IMM. */
    public static final int RECV = 128;
    /** A receive consumed by an RDMA_WRITE_WITH_IMM; only the immediate and the length are delivered. */
    public static final int RECV_RDMA_WITH_IMM = 129;

    private WcOpcode() {
    }

    public static String name(int opcode) {
        switch (opcode) {
            case SEND:
                return "SEND";
            case RDMA_WRITE:
                return "RDMA_WRITE";
            case RDMA_READ:
                return "RDMA_READ";
            case RECV:
                return "RECV";
            case RECV_RDMA_WITH_IMM:
                return "RECV_RDMA_WITH_IMM";
            default:
                return "UNKNOWN(" + opcode + ")";
        }
    }
}
