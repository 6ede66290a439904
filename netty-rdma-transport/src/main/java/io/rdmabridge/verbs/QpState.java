package io.rdmabridge.verbs;

/** Queue-pair states, as {@code enum ibv_qp_state} (the states a reliable-connected QP passes through here). */
public enum QpState {
    /** Created; receives may be posted, sends may not. */
    INIT,
    /** Ready to send: the connection is established. */
    RTS,
    /** Failed or disconnected: every outstanding and every newly posted work request completes flushed. */
    ERROR,
    /** Destroyed with {@link QueuePair#close()}. */
    DESTROYED
}
