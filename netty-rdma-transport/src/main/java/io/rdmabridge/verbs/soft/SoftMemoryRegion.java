package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.util.concurrent.TimeUnit;

/**
 * A registered memory region of the software device; its keys die at {@link #close()}. Thread-safe.
 *
 * <p>A closed region may be registered again by its owner ({@link SoftProtectionDomain#registerReusing}), with a
 * new range and new keys, so that a registration per transfer allocates nothing. Lookups from other threads tell
 * the registrations apart by the live key: it is cleared before the range is rewritten and set after, and a lookup
 * reads it before and after reading the range (a sequence lock), so no lookup ever pairs one registration's key
 * with another's range.
 *
 * <p>{@link #close()} returns once no peer's RDMA WRITE or READ that passed its check is still copying into or out of
 * the region ({@link #beginRemoteAccess}), as a device's deregistration waits out its DMA: the application may reuse
 * the memory at once, or unmap it (a file chunk, a freed shared file), without a copy faulting on it. (A copy still
 * running after 10 s is a stuck thread, not a transfer: the close then goes on, with a WARN.) A copy holds no lock and
 * runs no callback, so its own thread never closes a region while it copies.
 */
final class SoftMemoryRegion implements MemoryRegion {
    private static final VarHandle LIVE_KEY;
    private static final VarHandle COPIERS;
    private static final long COPIER_WAIT_NANOS = TimeUnit.SECONDS.toNanos(10);

    static {
        try {
            LIVE_KEY = MethodHandles.lookup().findVarHandle(SoftMemoryRegion.class, "liveKey", int.class);
            COPIERS = MethodHandles.lookup().findVarHandle(SoftMemoryRegion.class, "copiers", int.class);
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
    // Peers' RDMA WRITEs and READs copying into or out of the region now (beginRemoteAccess): close() waits for them.
    private volatile int copiers;

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

    /**
     * Starts a peer's RDMA WRITE into, or READ out of, {@code [addr, addr + len)} of this region under {@code key}
     * ({@code needed}: {@link Access#REMOTE_WRITE} or {@link Access#REMOTE_READ}), if {@link #permits} it; then
     * {@link #close()} waits for {@link #endRemoteAccess()}, as a device quiesces its DMA before a deregistration
     * returns, so no byte lands in, or is read from, memory the application has taken back. Any thread.
     *
     * @return whether the access may copy; only then must {@link #endRemoteAccess()} follow
     */
    boolean beginRemoteAccess(int key, SoftProtectionDomain domain, long addr, long len, int needed) {
        // Counted before the key is read, and close() clears the key before it reads the count (both volatile):
        // either this sees the key gone or close() sees this copier.
        COPIERS.getAndAdd(this, 1);
        if (permits(key, domain, addr, len, needed)) {
            return true;
        }
        COPIERS.getAndAdd(this, -1);
        return false;
    }

    /** Ends what {@link #beginRemoteAccess} started. */
    void endRemoteAccess() {
        COPIERS.getAndAdd(this, -1);
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
            // A peer's access that passed its check copies one frame (or, in this JVM, one message) at most.
            long deadline = System.nanoTime() + COPIER_WAIT_NANOS;
            for (int spins = 0; copiers != 0; spins++) {
                if (spins < 100) {
                    Thread.onSpinWait();
                } else if (System.nanoTime() - deadline < 0) {
                    Thread.yield();
                } else {
                    // A copier that never ends (a fault HotSpot raised inside it, say): better a WARN than a hang.
                    SoftEngine.logger.warn("soft0: deregistering {} while a peer's RDMA WRITE or READ copy has not"
                            + " ended after {} ms (a stuck or failed copy on the engine thread)", this,
                            TimeUnit.NANOSECONDS.toMillis(COPIER_WAIT_NANOS));
                    break;
                }
            }
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
