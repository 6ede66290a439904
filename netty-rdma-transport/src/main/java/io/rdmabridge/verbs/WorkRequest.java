package io.rdmabridge.verbs;

/**
 * What a send and a receive work request share ({@code wr_id}, {@code sg_list} and {@code num_sge} of
 * {@code struct ibv_send_wr} and {@code struct ibv_recv_wr}): the caller's tag and a scatter/gather list kept as
 * parallel primitive arrays sized once, so that reusing a request allocates nothing. Not thread-safe.
 */
abstract class WorkRequest {
    /** How this kind of request calls its list in error messages: a receive only scatters. */
    private final String listName;
    private final long[] sgeAddress;
    private final int[] sgeLength;
    private final int[] sgeLkey;
    private int numSge;
    long wrId;

    WorkRequest(int maxSge, String listName) {
        if (maxSge <= 0) {
            throw new IllegalArgumentException("maxSge: " + maxSge + " (expected: > 0)");
        }
        this.listName = listName;
        sgeAddress = new long[maxSge];
        sgeLength = new int[maxSge];
        sgeLkey = new int[maxSge];
    }

    /** Empties the scatter/gather list and clears {@code wr_id}. */
    void clear() {
        numSge = 0;
        wrId = 0;
    }

    void appendSge(long address, int length, int lkey) {
        if (numSge == sgeAddress.length) {
            throw new IllegalStateException(listName + " full: " + numSge + " entries (expected: at most "
                    + sgeAddress.length + "; create the request with a larger maxSge)");
        }
        if (length < 0) {
            throw new IllegalArgumentException("length: " + length + " (expected: >= 0)");
        }
        sgeAddress[numSge] = address;
        sgeLength[numSge] = length;
        sgeLkey[numSge] = lkey;
        numSge++;
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

    /** Sum of the scatter/gather lengths, as a long so that overflow is detectable. */
    public long totalLength() {
        long total = 0;
        for (int i = 0; i < numSge; i++) {
            total += sgeLength[i];
        }
        return total;
    }
}
