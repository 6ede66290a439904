package io.rdmabridge.verbs.disni;

import com.ibm.disni.verbs.IbvMr;
import com.ibm.disni.verbs.IbvPd;
import com.ibm.disni.verbs.SVCRegMr;
import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaException;
import java.io.IOException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A protection domain over DiSNI's {@link IbvPd}. Registration goes through {@link SVCRegMr} with a raw address.
 * Thread-safe.
 */
final class DisniProtectionDomain implements ProtectionDomain {
    private final DisniDevice device;
    private final IbvPd pd;
    private final AtomicInteger memoryRegions = new AtomicInteger();
    private final AtomicInteger queuePairs = new AtomicInteger();
    private final AtomicBoolean closed = new AtomicBoolean();

    DisniProtectionDomain(DisniDevice device, IbvPd pd) {
        this.device = device;
        this.pd = pd;
    }

    IbvPd pd() {
        return pd;
    }

    @Override
    public RdmaDevice device() {
        return device;
    }

    /**
     * Registers with {@code ibv_reg_mr}.
     *
     * @throws IllegalArgumentException also when {@code length} exceeds 2^31-1: DiSNI 2.1 passes the length of a
     *                                  region as a Java int
     */
    @Override
    public MemoryRegion register(long address, long length, int access) throws RdmaException {
        Access.validate(access);
        if (length <= 0 || length > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("length: " + length + " (expected: 1.." + Integer.MAX_VALUE
                    + "; DiSNI 2.1 cannot register more than 2^31-1 bytes in one memory region: register larger"
                    + " memory as several regions)");
        }
        if (address == 0) {
            throw new IllegalArgumentException("address: 0 (expected: the address of allocated memory)");
        }
        if (!starting(memoryRegions)) {
            throw new RdmaException("register: protection domain is closed (expected: an open protection domain)");
        }
        IbvMr mr;
        try {
            SVCRegMr call = pd.regMr(address, (int) length, access);
            try {
                mr = call.execute().getMr();
            } finally {
                call.free();
            }
        } catch (IOException e) {
            memoryRegions.decrementAndGet();
            throw new RdmaException("ibv_reg_mr(0x" + Long.toHexString(address) + ", " + length + " bytes, "
                    + Access.toString(access) + ") on " + device.name() + " failed: " + DisniErrors.registration(e),
                    e);
        } catch (RuntimeException | Error e) {
            memoryRegions.decrementAndGet();
            throw e;
        }
        device.disniProvider().usage().memoryRegistered(length);
        return new DisniMemoryRegion(this, mr, address, length, access);
    }

    void memoryRegionClosed() {
        memoryRegions.decrementAndGet();
    }

    /**
     * Counts a queue pair about to be created on this domain, before the native call, so that {@link #close()} cannot
     * free the domain under it; {@code false} (nothing counted) when the domain is closed. {@link #queuePairClosed()}
     * takes it back, also when the creation fails.
     */
    boolean queuePairStarting() {
        return starting(queuePairs);
    }

    /**
     * Counts a resource before its native call uses the domain. Counted first, then {@code closed} read, as
     * {@link #close()} sets {@code closed} and then reads the counts: one of the two sees the other.
     */
    private boolean starting(AtomicInteger count) {
        count.incrementAndGet();
        if (closed.get()) {
            count.decrementAndGet();
            return false;
        }
        return true;
    }

    void queuePairClosed() {
        queuePairs.decrementAndGet();
    }

    boolean isClosed() {
        return closed.get();
    }

    @Override
    public void close() {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        int regions = memoryRegions.get();
        int qps = queuePairs.get();
        if (regions != 0 || qps != 0) {
            closed.set(false);
            throw new IllegalStateException("protection domain still in use: " + regions + " memory regions, " + qps
                    + " queue pairs (expected: close them first)");
        }
        int result;
        try {
            result = pd.deallocPd();
        } catch (Exception e) {
            throw new IllegalStateException("ibv_dealloc_pd on " + device.name() + " failed: "
                    + DisniErrors.clean(e), e);
        }
        // DiSNI returns the verbs' result instead of throwing: EBUSY means the kernel still holds a region or queue
        // pair of this domain, which stays allocated, and counted.
        if (result != 0) {
            throw new IllegalStateException("ibv_dealloc_pd on " + device.name() + " returned " + result
                    + ": the protection domain is left allocated (the kernel still holds a memory region or queue pair"
                    + " of it: look for a failed deregistration or rdma_destroy_qp)");
        }
        device.disniProvider().usage().protectionDomains(-1);
    }
}
