package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;

/**
 * A registered memory region of the software device; its keys die at {@link #close()}. Thread-safe.
 *
 * <p>A closed region may be registered again by its owner ({@link SoftProtectionDomain#registerReusing}), with a
 * new range and new keys, so that a registration per transfer allocates nothing. Lookups from other threads tell
 * the registrations apart by the live key: it is cleared before the range is rewritten and set after, and a lookup
 * reads it before and after reading the range (a sequence lock), so no lookup ever pairs one registration's key
 * with another's range.
 */
final class SoftMemoryRegion implements MemoryRegion {
    private static final VarHandle LIVE_KEY;

    static {
        try {
            LIVE_KEY = MethodHandles.lookup().findVarHandle(SoftMemoryRegion.class, "liveKey", int.class);
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError(e);
        }
    }

    final SoftProtectionDomain pd;
    // The current (or last) registration; rewritten only while liveKey is 0.
    private long address;
    private long length;
    private int access;
    private int lkey;
    private int rkey;
    // The key while registered, 0 once closed.
    private volatile int liveKey;

    SoftMemoryRegion(SoftProtectionDomain pd) {
        this.pd = pd;
    }

    /** Takes a new range and key; the region must be closed. Caller holds the engine's key lock. */
    void open(long address, long length, int access, int key) {
        // The range is rewritten after the old key was cleared, never before (a lookup's first read sees 0).
        VarHandle.storeStoreFence();
        this.address = address;
        this.length = length;
        this.access = access;
        lkey = key;
        rkey = (access & (Access.REMOTE_READ | Access.REMOTE_WRITE)) != 0 ? key : 0;
        liveKey = key;
    }

    /**
     * Whether this region is still registered under {@code key}, and that registration lies in {@code domain},
     * holds {@code [addr, addr + len)} and grants {@code needed} access.
     */
    boolean permits(int key, SoftProtectionDomain domain, long addr, long len, int needed) {
        if (liveKey != key) {
            return false;
        }
        boolean ok = domain == pd && (access & needed) == needed && len >= 0 && addr >= address
                && addr - address <= length - len;
        // The range read above belongs to this key only if the key is still live after it.
        VarHandle.loadLoadFence();
        return ok && liveKey == key;
    }

    boolean isClosed() {
        return liveKey == 0;
    }

    @Override
    public ProtectionDomain protectionDomain() {
        return pd;
    }

    @Override
    public long address() {
        return address;
    }

    @Override
    public long length() {
        return length;
    }

    @Override
    public int lkey() {
        return lkey;
    }

    @Override
    public int rkey() {
        return rkey;
    }

    @Override
    public int access() {
        return access;
    }

    @Override
    public void close() {
        int key = liveKey;
        // Read before the key is cleared: from then on the owner may register the object again.
        long bytes = length;
        if (key != 0 && LIVE_KEY.compareAndSet(this, key, 0)) {
            pd.engine.deregister(key, bytes);
            pd.memoryRegions.decrementAndGet();
        }
    }

    @Override
    public String toString() {
        return "SoftMemoryRegion{address=0x" + Long.toHexString(address) + ", length=" + length + ", access="
                + Access.toString(access) + (isClosed() ? ", closed" : "") + '}';
    }
}
