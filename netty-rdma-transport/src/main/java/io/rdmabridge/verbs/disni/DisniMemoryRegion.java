package io.rdmabridge.verbs.disni;

import com.ibm.disni.verbs.IbvMr;
import com.ibm.disni.verbs.SVCDeregMr;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;
import java.io.IOException;
import java.util.concurrent.atomic.AtomicBoolean;

/** A memory region over DiSNI's {@link IbvMr}. Thread-safe. */
final class DisniMemoryRegion implements MemoryRegion {
    private final DisniProtectionDomain pd;
    private final IbvMr mr;
    private final long address;
    private final long length;
    private final int access;
    private final AtomicBoolean closed = new AtomicBoolean();

    DisniMemoryRegion(DisniProtectionDomain pd, IbvMr mr, long address, long length, int access) {
        this.pd = pd;
        this.mr = mr;
        this.address = address;
        this.length = length;
        this.access = access;
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
        return mr.getLkey();
    }

    @Override
    public int rkey() {
        return mr.getRkey();
    }

    @Override
    public int access() {
        return access;
    }

    /**
     * Deregisters. The region counts as gone even when {@code ibv_dereg_mr} fails (only a dead device makes it
     * fail); the failure is then thrown.
     */
    @Override
    public void close() {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        try {
            SVCDeregMr call = mr.deregMr();
            try {
                call.execute();
            } finally {
                call.free();
            }
        } catch (IOException e) {
            throw new IllegalStateException("ibv_dereg_mr(rkey=0x" + Integer.toHexString(rkey()) + ") failed: "
                    + DisniErrors.clean(e), e);
        } finally {
            pd.memoryRegionClosed();
            pd.device().provider().resourceUsage().memoryDeregistered(length);
        }
    }

    @Override
    public String toString() {
        return "DisniMemoryRegion{address=0x" + Long.toHexString(address) + ", length=" + length + ", lkey=0x"
                + Integer.toHexString(lkey()) + ", rkey=0x" + Integer.toHexString(rkey()) + '}';
    }
}
