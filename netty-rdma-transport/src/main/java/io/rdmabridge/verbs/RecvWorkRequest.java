package io.rdmabridge.verbs;

/**
 * A reusable receive work request ({@code struct ibv_recv_wr}): where an incoming SEND lands. The memory must be
 * registered with {@link Access#LOCAL_WRITE}. Copied by {@link QueuePair#postRecv(RecvWorkRequest)}, so it may be
 * rewritten as soon as the call returns. Not thread-safe.
 */
public final class RecvWorkRequest {
    private final long[] sgeAddress;
    private final int[] sgeLength;
    private final int[] sgeLkey;
    private int numSge;
    private long wrId;

    /** @param maxSge scatter entries this request can hold */
    public RecvWorkRequest(int maxSge) {
        if (maxSge <= 0) {
            throw new IllegalArgumentException("maxSge: " + maxSge + " (expected: > 0)");
        }
        sgeAddress = new long[maxSge];
        sgeLength = new int[maxSge];
        sgeLkey = new int[maxSge];
    }

    public RecvWorkRequest reset() {
        numSge = 0;
        wrId = 0;
        return this;
    }

    public RecvWorkRequest wrId(long wrId) {
        this.wrId = wrId;
        return this;
    }

    public RecvWorkRequest addSge(long address, int length, int lkey) {
        if (numSge == sgeAddress.length) {
            throw new IllegalStateException("scatter list full: " + numSge + " entries (expected: at most "
                    + sgeAddress.length + "; create the request with a larger maxSge)");
        }
        if (length < 0) {
            throw new IllegalArgumentException("length: " + length + " (expected: >= 0)");
        }
        sgeAddress[numSge] = address;
        sgeLength[numSge] = length;
        sgeLkey[numSge] = lkey;
        numSge++;
        return this;
    }

    public long wrId() {
        return wrId;
    }

    public int maxSge() {
        return sgeAddress.length;
    }

    public int numSge() {
        return numSge;
    }

    public long sgeAddress(int i) {
        return sgeAddress[i];
    }

    public int sgeLength(int i) {
        return sgeLength[i];
    }

    public int sgeLkey(int i) {
        return sgeLkey[i];
    }

    public long totalLength() {
        long total = 0;
        for (int i = 0; i < numSge; i++) {
            total += sgeLength[i];
        }
        return total;
    }
}
