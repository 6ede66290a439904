package io.rdmabridge.verbs;

/**
 * A reusable receive work request ({@code struct ibv_recv_wr}): where an incoming SEND lands. The memory must be
 * registered with {@link Access#LOCAL_WRITE}. Copied by {@link QueuePair#postRecv(RecvWorkRequest)}, so it may be
 * rewritten as soon as the call returns. Not thread-safe.
 */
public final class RecvWorkRequest extends WorkRequest {

    /** @param maxSge scatter entries this request can hold */
    public RecvWorkRequest(int maxSge) {
        super(maxSge, "scatter list");
    }

    public RecvWorkRequest reset() {
        clear();
        return this;
    }

    public RecvWorkRequest wrId(long wrId) {
        this.wrId = wrId;
        return this;
    }

    public RecvWorkRequest addSge(long address, int length, int lkey) {
        appendSge(address, length, lkey);
        return this;
    }
}
