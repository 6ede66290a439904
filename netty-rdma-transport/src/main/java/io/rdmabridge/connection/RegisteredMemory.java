package io.rdmabridge.connection;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.RdmaException;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReferenceArray;

/**
 * The registered memory of one protection domain: an arena of size-classed blocks carved from slabs that are
 * registered once ({@link #allocate(int)}), plus single registrations ({@link #register(ByteBuffer)}) for receive
 * buffers and large or foreign memory. Every region is entered in one {@link MemoryRegionMap}, so a buffer's keys are
 * found by its address.
 *
 * <p>None of these regions grants a peer anything: they are registered for local access only. A rendezvous exposes
 * exactly the bytes it advertises, for as long as it is in flight, through a region of its own
 * ({@link #exposeForRead}, withdrawn with {@link #withdraw}). The reason: an rkey is valid for every queue pair of
 * the protection domain (every connection of the event loop group), over its whole region, until the region is
 * deregistered; a slab registered for remote read would let any connection that saw one advertisement READ every
 * block of the slab, other connections' bytes included, for as long as the slab lives. Registering per transfer
 * costs an {@code ibv_reg_mr} (pinning, microseconds on a NIC) per rendezvous, which only messages above the
 * rendezvous threshold pay; memory windows bound to a queue pair would avoid it but DiSNI has no verb to bind them.
 *
 * <p>Blocks are handed out and given back lock-free ({@link IndexQueue} per slab) by any thread; a slab is
 * deregistered and freed when the arena is closed and its last block has come back, so memory a peer may still read
 * is never reused under it. Registered memory is pinned (counted against memlock on hardware), so a slab that no one
 * has used for {@link #IDLE_RELEASE_PROPERTY} milliseconds (default {@value #DEFAULT_IDLE_RELEASE_MILLIS}) is
 * deregistered and freed by {@link #trimIdle(long)}: a burst of connections does not pin its peak for ever. Growing
 * the arena (a new slab) takes a lock; that happens a bounded number of times.
 *
 * <p>An allocation above {@link #maxPooledSize()} gets a registration of its own. Making one is dear (on a NIC
 * {@code ibv_reg_mr} pins every page; on the soft provider it creates, commits and maps a shared file), and a stream of
 * large messages (rendezvous targets of a few MiB) would pay it per message; so a freed one is kept registered for
 * reuse, within {@value #LARGE_BLOCK_CACHE_PROPERTY} bytes (default 16 MiB) and up to {@value #LARGE_BLOCK_SLOTS}
 * blocks, and served to a later allocation it fits without wasting more than half of it. Kept blocks go back at
 * {@link #trimIdle} when unused for an idle period, and at {@link #close()}; they count in {@link #dedicatedBytes()}.
 *
 * <p>Thread-safe; once its slabs exist, allocating and freeing a block (the allocator's hot path) allocates nothing and
 * takes no lock, large blocks kept for reuse included.
 */
public final class RegisteredMemory implements AutoCloseable {
    /** Access of the slabs and single registrations: local write (receives, READ targets), nothing remote. */
    public static final int ACCESS = Access.LOCAL_WRITE;

    static final int MIN_BLOCK_SHIFT = 8;   // 256 B
    static final int MAX_BLOCK_SHIFT = 20;  // 1 MiB
    private static final int SLAB_TARGET = 1024 * 1024;
    private static final VarHandle HELD;

    static {
        try {
            HELD = MethodHandles.lookup().findVarHandle(Block.class, "held", boolean.class);
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError(e);
        }
    }
    /** System property: milliseconds a slab stays registered with none of its blocks used; 0 keeps slabs for ever. */
    public static final String IDLE_RELEASE_PROPERTY = "rdmabridge.memory.idleReleaseMillis";
    public static final long DEFAULT_IDLE_RELEASE_MILLIS = 30_000;
    /**
     * System property: bytes of freed large blocks (above {@link #maxPooledSize()}) kept registered for reuse, per
     * arena; 0 frees each at once.
     */
    public static final String LARGE_BLOCK_CACHE_PROPERTY = "rdmabridge.memory.largeBlockCacheBytes";
    public static final long DEFAULT_LARGE_BLOCK_CACHE_BYTES = 16L * 1024 * 1024;
    static final int LARGE_BLOCK_SLOTS = 8;

    private final ProtectionDomain pd;
    private final MemoryRegionMap regions = new MemoryRegionMap();
    private final SizeClass[] classes = new SizeClass[MAX_BLOCK_SHIFT - MIN_BLOCK_SHIFT + 1];
    private final AtomicLong pooledBytes = new AtomicLong();
    private final AtomicLong dedicatedBytes = new AtomicLong();
    private final AtomicInteger exposedRegions = new AtomicInteger();
    private volatile boolean closed;
    private volatile Runnable onReleased;
    private final long idleReleaseNanos;
    private final AtomicLong lastTrim = new AtomicLong(System.nanoTime());
    // Freed large blocks kept for reuse: a slot is taken or filled with one compare-and-set.
    private final AtomicReferenceArray<Block> spareLarge = new AtomicReferenceArray<>(LARGE_BLOCK_SLOTS);
    private final AtomicLong spareBytes = new AtomicLong();
    private final long largeBlockCacheBytes;

    public RegisteredMemory(ProtectionDomain pd) {
        this(pd, Long.getLong(IDLE_RELEASE_PROPERTY, DEFAULT_IDLE_RELEASE_MILLIS),
                Long.getLong(LARGE_BLOCK_CACHE_PROPERTY, DEFAULT_LARGE_BLOCK_CACHE_BYTES));
    }

    /** @param idleReleaseMillis how long an unused slab stays registered; 0: for ever */
    public RegisteredMemory(ProtectionDomain pd, long idleReleaseMillis) {
        this(pd, idleReleaseMillis, Long.getLong(LARGE_BLOCK_CACHE_PROPERTY, DEFAULT_LARGE_BLOCK_CACHE_BYTES));
    }

    /**
     * @param idleReleaseMillis    how long an unused slab or kept large block stays registered; 0: for ever
     * @param largeBlockCacheBytes bytes of freed large blocks kept registered for reuse; 0: none
     */
    public RegisteredMemory(ProtectionDomain pd, long idleReleaseMillis, long largeBlockCacheBytes) {
        if (idleReleaseMillis < 0) {
            throw new IllegalArgumentException(IDLE_RELEASE_PROPERTY + ": " + idleReleaseMillis + " (expected: >= 0)");
        }
        if (largeBlockCacheBytes < 0) {
            throw new IllegalArgumentException(LARGE_BLOCK_CACHE_PROPERTY + ": " + largeBlockCacheBytes
                    + " (expected: >= 0)");
        }
        this.pd = pd;
        idleReleaseNanos = idleReleaseMillis * 1_000_000L;
        this.largeBlockCacheBytes = largeBlockCacheBytes;
        for (int i = 0; i < classes.length; i++) {
            classes[i] = new SizeClass(1 << (MIN_BLOCK_SHIFT + i));
        }
    }

    public ProtectionDomain protectionDomain() {
        return pd;
    }

    public MemoryRegionMap regions() {
        return regions;
    }

    /** The largest allocation served from pooled blocks; larger ones get a registration of their own. */
    public static int maxPooledSize() {
        return 1 << MAX_BLOCK_SHIFT;
    }

    /**
     * The bytes an {@link #allocate}{@code (size)} takes: its pooled block's size class (a power of two), or
     * {@code size} itself above {@link #maxPooledSize()}.
     */
    public static int blockCapacity(int size) {
        return size > maxPooledSize() ? size : 1 << blockShift(size);
    }

    private static int blockShift(int size) {
        return Math.max(MIN_BLOCK_SHIFT, 32 - Integer.numberOfLeadingZeros(Math.max(1, size) - 1));
    }

    public boolean isClosed() {
        return closed;
    }

    /** Bytes of slab memory registered for pooled blocks. */
    public long pooledBytes() {
        return pooledBytes.get();
    }

    /** Bytes registered for single (dedicated) registrations, freed large blocks kept for reuse included. */
    public long dedicatedBytes() {
        return dedicatedBytes.get();
    }

    /**
     * A registered block of at least {@code size} bytes. Free it with {@link Block#free()} from any thread.
     *
     * @throws RdmaException when the arena is closed or the device refuses the registration
     */
    public Block allocate(int size) throws RdmaException {
        if (size < 0) {
            throw new IllegalArgumentException("size: " + size + " (expected: >= 0)");
        }
        if (closed) {
            throw new RdmaException("registered memory is closed (its event loop group was shut down)");
        }
        if (size > maxPooledSize()) {
            return dedicated(size);
        }
        return classes[blockShift(size) - MIN_BLOCK_SHIFT].allocate();
    }

    private Block dedicated(int size) throws RdmaException {
        Block spare = takeSpare(size);
        if (spare != null) {
            return spare;
        }
        ByteBuffer memory = pd.allocateMemory(size);
        MemoryRegion mr;
        try {
            mr = pd.register(memory, ACCESS);
        } catch (RdmaException | RuntimeException e) {
            pd.freeMemory(memory);
            throw e;
        }
        regions.add(mr);
        dedicatedBytes.addAndGet(size);
        return new Block(null, 0, memory, mr);
    }

    /**
     * Registers a whole direct buffer the caller owns (receive slabs). Give it back with {@link #deregister}.
     */
    public MemoryRegion register(ByteBuffer directBuffer) throws RdmaException {
        MemoryRegion mr = pd.register(directBuffer, ACCESS);
        regions.add(mr);
        return mr;
    }

    /**
     * Registers {@code [address, address + length)}, a read-only mapping of a file the caller owns from
     * {@code fileOffset}, for the device
     * to read only (file chunks: the device sends from them, nothing writes them; a rendezvous exposes its part with
     * {@link #exposeForRead}, which a same-host peer of the soft provider then reads from the file itself:
     * {@link ProtectionDomain#registerFileMapping}).
     */
    public MemoryRegion registerFileMapping(long address, long length, long fileOffset) throws RdmaException {
        MemoryRegion mr = pd.registerFileMapping(address, length, fileOffset);
        regions.add(mr);
        return mr;
    }

    /**
     * Registers exactly {@code [address, address + length)} for remote read, the bytes one rendezvous advertises;
     * withdraw it with {@link #withdraw} as soon as the transfer ends. The memory must stay allocated until then.
     * Not entered in {@link #regions()} (local work requests use the memory's own region). Allocates nothing on the
     * soft provider when {@code reuse} is the caller's previous, withdrawn region.
     *
     * @param reuse a region this caller withdrew and no longer uses, or {@code null}
     */
    public MemoryRegion exposeForRead(MemoryRegion reuse, long address, int length) throws RdmaException {
        MemoryRegion mr = pd.registerReusing(reuse, address, length, Access.REMOTE_READ);
        exposedRegions.incrementAndGet();
        return mr;
    }

    /** Deregisters a region of {@link #exposeForRead}: its rkey fails every later READ, from any queue pair. */
    public void withdraw(MemoryRegion exposed) {
        exposed.close();
        exposedRegions.decrementAndGet();
        regionRemoved();
    }

    /** Regions of {@link #exposeForRead} not yet withdrawn: rendezvous in flight. */
    public int exposedRegions() {
        return exposedRegions.get();
    }

    public void deregister(MemoryRegion mr) {
        regions.remove(mr);
        mr.close();
        regionRemoved();
    }

    /**
     * Runs {@code action} once, when the memory is closed and its last region has been deregistered (then the
     * protection domain may be deallocated). Runs at once if that is already the case.
     */
    public void whenReleased(Runnable action) {
        onReleased = action;
        regionRemoved();
    }

    private void regionRemoved() {
        if (closed && regions.size() == 0 && exposedRegions.get() == 0) {
            Runnable action;
            synchronized (this) {
                action = onReleased;
                onReleased = null;
            }
            if (action != null) {
                action.run();
            }
        }
    }

    /**
     * Stops handing out blocks and deregisters every slab whose blocks have all come back; the others are
     * deregistered when their last block is freed. Idempotent.
     */
    @Override
    public void close() {
        closed = true;
        for (SizeClass c : classes) {
            for (Slab slab : c.slabs) {
                slab.releaseIfIdle();
            }
        }
        for (int i = 0; i < LARGE_BLOCK_SLOTS; i++) {
            releaseSpare(i);
        }
        regionRemoved();
    }

    /** A kept large block of at least {@code size} bytes and at most twice that, taken out of the cache; or null. */
    private Block takeSpare(int size) {
        if (spareBytes.get() == 0) {
            return null;
        }
        for (int i = 0; i < LARGE_BLOCK_SLOTS; i++) {
            Block b = spareLarge.get(i);
            if (b != null && b.capacity() >= size && b.capacity() <= 2L * size
                    && spareLarge.compareAndSet(i, b, null)) {
                spareBytes.addAndGet(-b.capacity());
                return b.hold();
            }
        }
        return null;
    }

    /** Keeps a freed large block for reuse if the cache has room; whether it did (else the caller releases it). */
    private boolean keepSpare(Block b) {
        int capacity = b.capacity();
        if (closed || capacity > largeBlockCacheBytes) {
            return false;
        }
        if (spareBytes.addAndGet(capacity) > largeBlockCacheBytes) {
            spareBytes.addAndGet(-capacity);
            return false;
        }
        b.touched = true;
        for (int i = 0; i < LARGE_BLOCK_SLOTS; i++) {
            if (spareLarge.compareAndSet(i, null, b)) {
                if (closed) {
                    // close() may have emptied the slots before this one was filled: whoever takes it releases it.
                    releaseSpare(i);
                }
                return true;
            }
        }
        spareBytes.addAndGet(-capacity);
        return false;
    }

    /** Deregisters and frees the kept block in slot {@code i}, if it is still there; the bytes it freed. */
    private long releaseSpare(int i) {
        Block b = spareLarge.get(i);
        if (b == null || !spareLarge.compareAndSet(i, b, null)) {
            return 0;
        }
        spareBytes.addAndGet(-b.capacity());
        b.release();
        return b.capacity();
    }

    /** Releases the kept large blocks that no allocation took since the previous trim. */
    private long trimSpare() {
        long released = 0;
        for (int i = 0; i < LARGE_BLOCK_SLOTS; i++) {
            Block b = spareLarge.get(i);
            if (b != null) {
                if (b.touched) {
                    b.touched = false;
                } else {
                    released += releaseSpare(i);
                }
            }
        }
        return released;
    }

    /**
     * Nanoseconds until {@link #trimIdle} has work to do, for a caller that sleeps: {@link Long#MAX_VALUE} when no
     * slab is registered or idle release is off.
     */
    public long nanosUntilTrim(long nowNanos) {
        if (idleReleaseNanos == 0 || pooledBytes.get() == 0 && spareBytes.get() == 0) {
            return Long.MAX_VALUE;
        }
        return Math.max(0, lastTrim.get() + idleReleaseNanos - nowNanos);
    }

    /**
     * Deregisters and frees every slab none of whose blocks was taken since the previous trim, and every kept large
     * block no allocation took since then, at most once per idle period (cheap to call often: any thread, e.g. each
     * event loop before it sleeps). A slab is first retired, so a
     * concurrent allocation that reaches it backs off to another slab, and freed only if it is still unused.
     *
     * @return bytes deregistered
     */
    public long trimIdle(long nowNanos) {
        long last = lastTrim.get();
        if (idleReleaseNanos == 0 || nowNanos - last < idleReleaseNanos || !lastTrim.compareAndSet(last, nowNanos)) {
            return 0;
        }
        long released = 0;
        for (SizeClass c : classes) {
            released += c.trim();
        }
        return released + trimSpare();
    }

    /** Whether every slab has been deregistered and every exposed region withdrawn (nothing is still allocated). */
    public boolean isReleased() {
        return pooledBytes.get() == 0 && dedicatedBytes.get() == 0 && exposedRegions.get() == 0;
    }

    private final class SizeClass {
        final int blockSize;
        final int blocksPerSlab;
        // Grown under the lock, read without it; an array, so that a lookup creates no iterator.
        volatile Slab[] slabs = new Slab[0];

        SizeClass(int blockSize) {
            this.blockSize = blockSize;
            blocksPerSlab = Math.max(4, Math.min(256, SLAB_TARGET / blockSize));
        }

        /** Frees the slabs that were not touched since the last trim. */
        synchronized long trim() {
            Slab[] current = slabs;
            Slab[] kept = new Slab[current.length];
            int n = 0;
            long released = 0;
            for (Slab slab : current) {
                boolean untouched = !slab.touched;
                slab.touched = false;
                if (untouched && !closed && slab.retire()) {
                    released += slab.memory.capacity();
                } else {
                    kept[n++] = slab;
                }
            }
            if (n < current.length) {
                slabs = Arrays.copyOf(kept, n);
            }
            return released;
        }

        Block allocate() throws RdmaException {
            for (;;) {
                for (Slab slab : slabs) {
                    Block b = slab.take();
                    if (b != null) {
                        return b;
                    }
                }
                synchronized (this) {
                    // Another thread may have grown the class while this one waited.
                    for (Slab slab : slabs) {
                        Block b = slab.take();
                        if (b != null) {
                            return b;
                        }
                    }
                    if (closed) {
                        throw new RdmaException("registered memory is closed (its event loop group was shut down)");
                    }
                    Slab[] grown = Arrays.copyOf(slabs, slabs.length + 1);
                    grown[grown.length - 1] = new Slab(blockSize, blocksPerSlab);
                    slabs = grown;
                }
            }
        }
    }

    private final class Slab {
        // What inUse holds once retire() has claimed the idle slab: negative however many take() calls count on it.
        private static final int RETIRED = Integer.MIN_VALUE / 2;
        final ByteBuffer memory;
        final MemoryRegion mr;
        final Block[] blocks;
        final IndexQueue free;
        // Blocks out plus allocations under way: counted before the free list is polled, so retire() sees them;
        // RETIRED from the moment retire() claims the slab.
        final AtomicInteger inUse = new AtomicInteger();
        final AtomicInteger released = new AtomicInteger();
        // Set on every take, cleared by each trim; a racy hint is enough for "idle for a while".
        boolean touched = true;

        Slab(int blockSize, int count) throws RdmaException {
            memory = pd.allocateMemory(blockSize * count);
            try {
                mr = pd.register(memory, ACCESS);
            } catch (RdmaException | RuntimeException e) {
                pd.freeMemory(memory);
                throw e;
            }
            regions.add(mr);
            pooledBytes.addAndGet(memory.capacity());
            blocks = new Block[count];
            free = new IndexQueue(count);
            for (int i = 0; i < count; i++) {
                ByteBuffer view = memory.duplicate().position(i * blockSize).limit((i + 1) * blockSize).slice();
                blocks[i] = new Block(this, i, view, mr);
                free.offer(i);
            }
        }

        Block take() {
            if (inUse.getAndIncrement() < 0) {
                // Retired: its memory is freed or being freed.
                inUse.decrementAndGet();
                return null;
            }
            int i = free.poll();
            if (i < 0) {
                backOff();
                return null;
            }
            touched = true;
            return blocks[i].hold();
        }

        /** Under the class lock: frees this slab if nothing uses it, for good; {@code false} if something does. */
        boolean retire() {
            // In one step, and only while idle: a take() counted first (and this fails) or sees the claim and backs
            // off. (A flag set, then the count read, then read again before freeing let a take() slip in between:
            // the slab left the class unfreed, registered for good.)
            if (!inUse.compareAndSet(0, RETIRED)) {
                return false;
            }
            release();
            return true;
        }

        void give(int index) {
            free.offer(index);
            backOff();
        }

        private void backOff() {
            if (inUse.decrementAndGet() == 0 && closed) {
                releaseIfIdle();
            }
        }

        void releaseIfIdle() {
            // Claimed in one step, as retire() does: a take() between a read of zero and the release would get a
            // block whose memory is freed.
            if (inUse.compareAndSet(0, RETIRED)) {
                release();
            }
        }

        private void release() {
            if (released.compareAndSet(0, 1)) {
                regions.remove(mr);
                mr.close();
                pooledBytes.addAndGet(-memory.capacity());
                pd.freeMemory(memory);
                regionRemoved();
            }
        }
    }

    /**
     * A registered piece of memory: a pooled block or a dedicated registration. Owned by whoever allocated it until
     * {@link #free()}.
     */
    public final class Block {
        private final Slab slab;
        private final int index;
        private final ByteBuffer buffer;
        private final MemoryRegion mr;
        private final long address;
        private Object attachment;
        // A kept large block: set when it is kept, cleared by each trim; a racy hint, as a slab's.
        boolean touched;
        // Whether someone holds the block: a second free() would hand it to two owners (their bytes mixed, maybe
        // two connections'), so it throws instead.
        private volatile boolean held;

        Block(Slab slab, int index, ByteBuffer buffer, MemoryRegion mr) {
            this.slab = slab;
            this.index = index;
            this.buffer = buffer;
            this.mr = mr;
            address = DirectMemory.address(buffer);
            held = slab == null;
        }

        /** Hands the block out of a free list or the kept blocks. */
        Block hold() {
            if (!HELD.compareAndSet(this, false, true)) {
                throw new IllegalStateException("registered block at 0x" + Long.toHexString(address)
                        + " handed out while held (a bug: it was freed twice)");
            }
            return this;
        }

        /** The block's memory, position 0, limit = capacity; big-endian, as a fresh direct buffer. */
        public ByteBuffer buffer() {
            return buffer;
        }

        public long address() {
            return address;
        }

        public int capacity() {
            return buffer.capacity();
        }

        public MemoryRegion memoryRegion() {
            return mr;
        }

        /** Caller state kept with a pooled block across uses (e.g. an adapter object), or {@code null}. */
        public Object attachment() {
            return attachment;
        }

        public void attach(Object attachment) {
            this.attachment = attachment;
        }

        /**
         * Gives the block back (pooled), keeps it for reuse or deregisters and frees it (dedicated). Any thread; once
         * per allocation.
         */
        public void free() {
            if (!HELD.compareAndSet(this, true, false)) {
                throw new IllegalStateException("registered block at 0x" + Long.toHexString(address)
                        + " freed twice (expected: one free() per allocation)");
            }
            if (slab != null) {
                slab.give(index);
            } else if (!keepSpare(this)) {
                release();
            }
        }

        private void release() {
            regions.remove(mr);
            mr.close();
            dedicatedBytes.addAndGet(-buffer.capacity());
            pd.freeMemory(buffer);
            regionRemoved();
        }
    }
}
