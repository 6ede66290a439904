package io.rdmabridge.verbs;

/**
 * Work-completion status codes, with the values of {@code enum ibv_wc_status}, so that a provider backed by real
 * hardware passes them through unchanged and log lines read like the verbs documentation.
 */
public final class WcStatus {
    public static final int SUCCESS = 0;
    public static final int LOC_LEN_ERR = 1;
    public static final int LOC_QP_OP_ERR = 2;
    public static final int LOC_EEC_OP_ERR = 3;
    public static final int LOC_PROT_ERR = 4;
    public static final int WR_FLUSH_ERR = 5;
    public static final int MW_BIND_ERR = 6;
    public static final int BAD_RESP_ERR = 7;
    public static final int LOC_ACCESS_ERR = 8;
    public static final int REM_INV_REQ_ERR = 9;
    public static final int REM_ACCESS_ERR = 10;
    public static final int REM_OP_ERR = 11;
    public static final int RETRY_EXC_ERR = 12;
    public static final int RNR_RETRY_EXC_ERR = 13;
    public static final int LOC_RDD_VIOL_ERR = 14;
    public static final int REM_INV_RD_REQ_ERR = 15;
    public static final int REM_ABORT_ERR = 16;
    public static final int INV_EECN_ERR = 17;
    public static final int INV_EEC_STATE_ERR = 18;
    public static final int FATAL_ERR = 19;
    public static final int RESP_TIMEOUT_ERR = 20;
    public static final int GENERAL_ERR = 21;

    private static final String[] NAMES = {
        "SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR",
        "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR",
        "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR",
        "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR",
    };

    private WcStatus() {
    }

    /**
     * What a failed status says about the connection and what to check, for error messages: {@code ": ..."}, or
     * empty for the statuses that speak for themselves.
     */
    public static String meaning(int status) {
        switch (status) {
            case RETRY_EXC_ERR:
                return ": the peer acknowledged nothing within the transport's retries (its host is down or cut off, "
                        + "or its adapter stopped; on the soft provider also a stopped peer process); check the peer "
                        + "and the network path to it";
            case RNR_RETRY_EXC_ERR:
                return ": the peer had no receive posted within its receiver-not-ready retries (it stopped taking "
                        + "messages)";
            case REM_ACCESS_ERR:
                return ": the peer refused the remote key, address range or access right of a one-sided request";
            default:
                return "";
        }
    }

    /** The {@code IBV_WC_*} name of a status, e.g. {@code REM_ACCESS_ERR}; unknown values print as a number. */
    public static String name(int status) {
        return status >= 0 && status < NAMES.length ? NAMES[status] : "UNKNOWN(" + status + ")";
    }
}
