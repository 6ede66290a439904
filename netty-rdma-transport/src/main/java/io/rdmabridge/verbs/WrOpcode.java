package io.rdmabridge.verbs;

/** Send work-request opcodes, with the values of {@code enum ibv_wr_opcode}. */
public final class WrOpcode {
    public static final int RDMA_WRITE = 0;
    public static final int RDMA_WRITE_WITH_IMM = 1;
    public static final int SEND = 2;
    public static final int SEND_WITH_IMM = 3;
    public static final int RDMA_READ = 4;

    private WrOpcode() {
    }

    public static String name(int opcode) {
        switch (opcode) {
            case RDMA_WRITE:
                return "RDMA_WRITE";
            case RDMA_WRITE_WITH_IMM:
                return "RDMA_WRITE_WITH_IMM";
            case SEND:
                return "SEND";
            case SEND_WITH_IMM:
                return "SEND_WITH_IMM";
            case RDMA_READ:
                return "RDMA_READ";
            default:
                return "UNKNOWN(" + opcode + ")";
        }
    }

    /** The completion opcode the initiator sees for a send work request of this opcode. */
    public static int completionOpcode(int wrOpcode) {
        switch (wrOpcode) {
            case RDMA_WRITE:
            case RDMA_WRITE_WITH_IMM:
                return WcOpcode.RDMA_WRITE;
            case SEND:
            case SEND_WITH_IMM:
                return WcOpcode.SEND;
            case RDMA_READ:
                return WcOpcode.RDMA_READ;
            default:
                throw new IllegalArgumentException("opcode: " + wrOpcode + " (expected: one of WrOpcode's constants)");
        }
    }
}
