package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaException;
import java.nio.ByteBuffer;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A protection domain of the software device. Thread-safe. Registering and deregistering take the engine's key lock
 * for a few array writes (a device serialises its key table too) and, when a closed region is reused
 * ({@link #registerReusing}), allocate nothing: the rendezvous of the channel register per transfer.
 */
final class SoftProtectionDomain implements ProtectionDomain {
    final SoftEngine engine;
    private final SoftDevice device;
    /** Names the domain in the shared key table ({@link SharedKeyTable}). */
    final int id;
    final AtomicInteger memoryRegions = new AtomicInteger();
    final AtomicInteger queuePairs = new AtomicInteger();
    private final AtomicBoolean closed = new AtomicBoolean();

    SoftProtectionDomain(SoftDevice device, SoftEngine engine) {
        this.device = device;
        this.engine = engine;
        id = engine.nextDomainId();
        engine.usage.protectionDomains(1);
    }

    @Override
    public RdmaDevice device() {
        return device;
    }

    @Override
    public MemoryRegion register(long address, long length, int access) throws RdmaException {
        validate(address, length, access);
        SoftMemoryRegion mr = new SoftMemoryRegion(this);
        open(mr, address, length, access);
        return mr;
    }

    /**
     * Registers {@code closed} again, its object reused, so that a registration per transfer allocates nothing; a
     * region of another domain or provider is not reused (a new one is registered).
     */
    @Override
    public MemoryRegion registerReusing(MemoryRegion closed, long address, long length, int access)
            throws RdmaException {
        if (!(closed instanceof SoftMemoryRegion) || ((SoftMemoryRegion) closed).pd != this) {
            return register(address, length, access);
        }
        SoftMemoryRegion mr = (SoftMemoryRegion) closed;
        if (!mr.isClosed()) {
            throw new IllegalArgumentException("region to reuse is still registered: " + mr
                    + " (expected: a region its owner closed and no longer uses)");
        }
        validate(address, length, access);
        open(mr, address, length, access);
        return mr;
    }

    /** Notes the file behind the mapping, so a same-host peer can read the file itself ({@link MappedFileLinks}). */
    @Override
    public MemoryRegion registerFileMapping(long address, long length, long fileOffset) throws RdmaException {
        validate(address, length, 0);
        if (fileOffset < 0) {
            throw new IllegalArgumentException("fileOffset: " + fileOffset + " (expected: >= 0)");
        }
        SoftMemoryRegion mr = new SoftMemoryRegion(this);
        open(mr, address, length, 0, fileOffset);
        return mr;
    }

    /** In a shared file a same-host peer can map, when {@value SharedMemoryFiles#SAME_HOST_PROPERTY} is shm. */
    @Override
    public ByteBuffer allocateMemory(int capacity) {
        return engine.sharedMemory.allocate(capacity);
    }

    @Override
    public void freeMemory(ByteBuffer memory) {
        engine.sharedMemory.free(memory);
    }

    private void validate(long address, long length, int access) throws RdmaException {
        Access.validate(access);
        long max = SoftDevice.ATTRIBUTES.maxMrSize();
        if (length < 1 || length > max) {
            throw new IllegalArgumentException("length: " + length + " (expected: 1.." + max + ")");
        }
        if (address == 0 || address < 0 || Long.MAX_VALUE - length < address) {
            throw new IllegalArgumentException("address: 0x" + Long.toHexString(address) + " with length " + length
                    + " (expected: a non-null native address whose range does not wrap)");
        }
        if (engine.faults.takeRegistrationFailure()) {
            throw new RdmaException("injected fault: registration of " + length
                    + " bytes refused (SoftFaults.failRegistrations)");
        }
    }

    private void open(SoftMemoryRegion mr, long address, long length, int access) throws RdmaException {
        open(mr, address, length, access, -1);
    }

    /**
     * Counts the region before it looks at {@code closed}, as {@link #close()} marks the domain closed before it
     * reads the counts: of a registration and a close on two threads, one always sees the other.
     */
    private void open(SoftMemoryRegion mr, long address, long length, int access, long fileOffset)
            throws RdmaException {
        memoryRegions.incrementAndGet();
        try {
            if (closed.get()) {
                throw new RdmaException("protection domain is closed (expected: register before closing it)");
            }
            engine.register(mr, address, length, access, fileOffset);
        } catch (RdmaException | RuntimeException e) {
            memoryRegions.decrementAndGet();
            throw e;
        }
    }

    /**
     * Counts a queue pair about to be created on this domain, or refuses it when the domain is closed ({@link
     * #open(SoftMemoryRegion, long, long, int, long)}'s order); {@link #queuePairGone()} undoes it.
     */
    void queuePairStarting() throws RdmaException {
        queuePairs.incrementAndGet();
        if (closed.get()) {
            queuePairs.decrementAndGet();
            throw new RdmaException("createQueuePair with a closed protection domain (expected: create queue pairs"
                    + " before closing it)");
        }
    }

    void queuePairGone() {
        queuePairs.decrementAndGet();
    }

    @Override
    public void close() {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        int mrs = memoryRegions.get();
        int qps = queuePairs.get();
        if (mrs != 0 || qps != 0) {
            closed.set(false);
            throw new IllegalStateException("protection domain still has " + mrs + " memory region(s) and " + qps
                    + " queue pair(s) (expected: close them before the protection domain)");
        }
        engine.usage.protectionDomains(-1);
    }

    boolean isClosed() {
        return closed.get();
    }

    @Override
    public String toString() {
        return "SoftProtectionDomain{mrs=" + memoryRegions.get() + ", qps=" + queuePairs.get() + '}';
    }
}
