package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.WcStatus;

/**
 * The scatter/gather lists of one work queue's slots (send or receive), copied out of the work requests at post time:
 * slot {@code i} holds up to {@code maxSge} entries of address, length and lkey. Preallocated parallel arrays, so
 * posting and moving bytes allocate nothing. Threading is its queue's (see {@link SoftQueuePair}): a slot is written
 * when a work request is posted into it and read by whoever executes or consumes that work request.
 */
final class ScatterGatherLists {
    final int maxSge;
    private final int[] numSge;
    private final long[] address;
    private final int[] length;
    private final int[] lkey;

    ScatterGatherLists(int slots, int maxSge) {
        this.maxSge = maxSge;
        numSge = new int[slots];
        address = new long[slots * maxSge];
        length = new int[slots * maxSge];
        lkey = new int[slots * maxSge];
    }

    /** Writes entry {@code j} of slot {@code i}; {@link #setNumSge} says how many count. */
    void set(int i, int j, long address, int length, int lkey) {
        int k = i * maxSge + j;
        this.address[k] = address;
        this.length[k] = length;
        this.lkey[k] = lkey;
    }

    void setNumSge(int i, int n) {
        numSge[i] = n;
    }

    int numSge(int i) {
        return numSge[i];
    }

    long address(int i, int j) {
        return address[i * maxSge + j];
    }

    int length(int i, int j) {
        return length[i * maxSge + j];
    }

    /**
     * {@link WcStatus#LOC_PROT_ERR} when a non-empty entry of slot {@code i} does not lie in a region of {@code pd},
     * found by its lkey, that grants {@code access}; otherwise {@link WcStatus#SUCCESS}. An unknown lkey is
     * LOC_PROT_ERR too, as ibv_poll_cq(3) and mlx5 have it; rxe says LOC_QP_OP_ERR there, and the conformance suite
     * accepts both, but the status that names the cause is the one to test applications against.
     */
    int check(int i, MemoryKeyTable keys, SoftProtectionDomain pd, int access) {
        int base = i * maxSge;
        for (int j = 0, n = numSge[i]; j < n; j++) {
            int len = length[base + j];
            if (len == 0) {
                continue;
            }
            if (!keys.permits(lkey[base + j], pd, address[base + j], len, access)) {
                return WcStatus.LOC_PROT_ERR;
            }
        }
        return WcStatus.SUCCESS;
    }

    /** Copies {@code len} bytes of slot {@code i}'s list, from byte {@code offset} of it, to native {@code dst}. */
    void gather(int i, long offset, long dst, int len) {
        copy(i, offset, dst, len, false);
    }

    /** Copies {@code len} bytes from native {@code src} into slot {@code i}'s list at byte {@code offset}. */
    void scatter(int i, long offset, long src, int len) {
        copy(i, offset, src, len, true);
    }

    /**
     * Walks slot {@code i}'s entries from byte {@code offset}; the caller has checked the list holds the bytes. Past
     * the list's last entry it throws rather than use another work request's entries.
     */
    private void copy(int i, long offset, long memory, int len, boolean intoList) {
        int base = i * maxSge;
        for (int j = 0, n = numSge[i]; len > 0; j++) {
            if (j == n) {
                throw new IllegalStateException("scatter/gather list " + i + " is " + len + " bytes short of a copy"
                        + " its caller checked (a provider bug)");
            }
            int l = length[base + j];
            if (offset >= l) {
                offset -= l;
                continue;
            }
            int c = (int) Math.min(l - offset, len);
            long entry = address[base + j] + offset;
            if (intoList) {
                DirectMemory.copy(memory, entry, c);
            } else {
                DirectMemory.copy(entry, memory, c);
            }
            memory += c;
            len -= c;
            offset = 0;
        }
    }
}
