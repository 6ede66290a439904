package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;
import java.util.concurrent.atomic.AtomicBoolean;

/** A registered memory region of the software device; its keys die at {@link #close()}. Thread-safe. */
final class SoftMemoryRegion implements MemoryRegion {
    final SoftProtectionDomain pd;
    final long address;
    final long length;
    final int access;
    private final int lkey;
    private final int rkey;
    private final AtomicBoolean closed = new AtomicBoolean();

    SoftMemoryRegion(SoftProtectionDomain pd, long address, long length, int access, int lkey, int rkey) {
        this.pd = pd;
        this.address = address;
        this.length = length;
        this.access = access;
        this.lkey = lkey;
        this.rkey = rkey;
    }

    /** Whether {@code [addr, addr + len)} lies inside the region and the region grants {@code needed} access. */
    boolean permits(SoftProtectionDomain domain, long addr, long len, int needed) {
        return domain == pd && (access & needed) == needed && len >= 0 && addr >= address
                && addr - address <= length - len;
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
        if (closed.compareAndSet(false, true)) {
            pd.engine.deregister(this);
            pd.memoryRegions.decrementAndGet();
        }
    }

    @Override
    public String toString() {
        return "SoftMemoryRegion{address=0x" + Long.toHexString(address) + ", length=" + length + ", access="
                + Access.toString(access) + (closed.get() ? ", closed" : "") + '}';
    }
}
