package io.rdmabridge.verbs.soft;

import java.security.SecureRandom;
import java.util.Arrays;

/**
 * The software device's memory keys, laid out as a device lays out its own: a key is a slot number (its low
 * {@value #SLOT_BITS} bits) and a tag (the high bits), and the slot's tag changes every time the slot is given to a
 * registration. So a key dies with its registration, and, because free slots are handed out oldest first and a
 * quarter of the slots are always kept free, it names a region again only after {@value #TAGS} registrations of
 * that slot, each after every other free slot was used: a peer that kept a dead key cannot hope to see it revived
 * soon (hardware varies the key's low byte the same way). Keys are not secret; what a key lets a peer do is scoped
 * by what is registered, and for how long.
 *
 * <p>Lookups ({@link #permits}) are lock-free and allocation-free from any thread. Adding and removing are
 * serialised by the caller and allocate nothing once the table has grown to the peak number of live regions, so a
 * registration per transfer that reuses its region object ({@link SoftProtectionDomain#registerReusing}) allocates
 * nothing.
 */
final class MemoryKeyTable {
    static final int SLOT_BITS = 20;
    private static final int SLOT_MASK = (1 << SLOT_BITS) - 1;
    private static final int TAGS = 1 << (32 - SLOT_BITS);
    /** Slot 0 is never used, so key 0 never names a region. */
    static final int MAX_REGIONS = SLOT_MASK;
    private static final int INITIAL_SLOTS = 1024;

    private final SecureRandom random = new SecureRandom();
    // Read without a lock: a stale array only ever holds regions whose live key no longer matches.
    private volatile SoftMemoryRegion[] slots = new SoftMemoryRegion[0];
    private int[] tags = new int[0];
    // Free slots, oldest first: a ring of freeCount entries from freeHead.
    private int[] free = new int[0];
    private int freeHead;
    private int freeCount;

    /**
     * Whether {@code key} names a live region of {@code pd} that holds {@code [addr, addr + len)} and grants
     * {@code access}. Any thread.
     */
    boolean permits(int key, SoftProtectionDomain pd, long addr, long len, int access) {
        SoftMemoryRegion mr = region(key);
        return mr != null && mr.permits(key, pd, addr, len, access);
    }

    /**
     * Starts a peer's RDMA WRITE or READ ({@code access}) of the live region {@code key} names, if it permits one at
     * {@code [addr, addr + len)} ({@link SoftMemoryRegion#beginRemoteAccess}); any thread.
     *
     * @return the region, whose {@link SoftMemoryRegion#endRemoteAccess()} must follow the copy; or null
     */
    SoftMemoryRegion beginRemoteAccess(int key, SoftProtectionDomain pd, long addr, long len, int access) {
        SoftMemoryRegion mr = region(key);
        return mr != null && mr.beginRemoteAccess(key, pd, addr, len, access) ? mr : null;
    }

    /** The region in {@code key}'s slot, whatever its live key (the caller checks that), or null. */
    private SoftMemoryRegion region(int key) {
        int slot = key & SLOT_MASK;
        SoftMemoryRegion[] s = slots;
        return slot == 0 || slot >= s.length ? null : s[slot];
    }

    /**
     * Enters {@code mr} under a fresh key and returns the key. Caller holds the engine's key lock.
     *
     * @return the key, or 0 when {@value #MAX_REGIONS} regions are live already
     */
    int add(SoftMemoryRegion mr) {
        if (freeCount * 4 < slots.length || freeCount == 0) {
            grow();
            if (freeCount == 0) {
                return 0;
            }
        }
        int slot = free[freeHead];
        freeHead = (freeHead + 1) % free.length;
        freeCount--;
        int tag = tags[slot];
        tags[slot] = (tag + 1) & (TAGS - 1);
        slots[slot] = mr;
        return tag << SLOT_BITS | slot;
    }

    /** Frees the slot of {@code key} (the region's key was already cleared). Caller holds the engine's key lock. */
    void remove(int key) {
        int slot = key & SLOT_MASK;
        slots[slot] = null;
        free[(freeHead + freeCount) % free.length] = slot;
        freeCount++;
    }

    /**
     * Empties the slot of {@code key} for good: a same-host peer's hold on it never ended, so its shared entry cannot
     * guard another registration. Caller holds the engine's key lock.
     */
    void retire(int key) {
        slots[key & SLOT_MASK] = null;
    }

    private void grow() {
        int capacity = slots.length;
        if (capacity == MAX_REGIONS + 1) {
            return;
        }
        int grown = capacity == 0 ? INITIAL_SLOTS : Math.min(capacity * 2, MAX_REGIONS + 1);
        int[] ring = new int[grown];
        for (int i = 0; i < freeCount; i++) {
            ring[i] = free[(freeHead + i) % free.length];
        }
        // Slot 0 is never handed out.
        for (int slot = Math.max(1, capacity); slot < grown; slot++) {
            ring[freeCount++] = slot;
        }
        int[] grownTags = Arrays.copyOf(tags, grown);
        for (int slot = capacity; slot < grown; slot++) {
            // Each new slot starts at a random tag, so keys do not repeat from one process to the next.
            grownTags[slot] = random.nextInt(TAGS);
        }
        tags = grownTags;
        free = ring;
        freeHead = 0;
        slots = Arrays.copyOf(slots, grown);
    }
}
