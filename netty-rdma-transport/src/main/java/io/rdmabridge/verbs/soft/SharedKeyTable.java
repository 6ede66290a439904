package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.DirectMemory;
import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.locks.LockSupport;

/**
 * A process's memory keys and connected queue pairs as a same-host peer sees them: a shared file
 * ({@code rdmabridge-soft-<pid namespace>-<pid>-keys}) that the owner writes and peers map, so that a peer can check an
 * RDMA WRITE or READ against the owner's keys, bounds, access rights and queue pair itself and then copy straight into
 * or out of the owner's shared memory files, with no work on the owner's side: one-sided, as a NIC does it.
 *
 * <h2>Layout (native byte order; entries indexed by key slot and by queue pair number)</h2>
 * A header (magic, version, slot counts, committed key slots); then one 64-byte entry per key slot of {@link MemoryKeyTable}:
 * key (0 while not published), in-use count, protection-domain id, access, the region's address and length in the
 * owner, the file number and offset of its shared file, and, when that file is a link to a mapped file of the owner
 * ({@link MappedFileLinks}), the device and inode the link must lead to (0 otherwise); then one 8-byte entry per queue-pair slot
 * ({@code qpn & (QP_SLOTS - 1)}): the queue pair number (0 when none) and its domain's id.
 *
 * <h2>Deregistration against a peer's copy</h2>
 * The owner rewrites an entry only while its key is 0, and publishes the key last (release). A peer raises the
 * in-use count before it reads the key and lowers it after its copy. Withdrawing clears the key and then waits for
 * the count to reach 0, so once a deregistration returns no peer touches the memory, as with a NIC after
 * {@code ibv_dereg_mr}. Both sides use sequentially consistent accesses for this pair. A peer that stops between
 * raising and lowering (killed mid-copy) holds a withdrawal up for at most {@link #WITHDRAW_WAIT_NANOS}, then a
 * WARN names it and the slot is retired: its count can no longer be trusted, so no later registration gets it. The
 * owner takes neither field on a peer's word (any peer can write them): the wait does not depend on the key, and a
 * count below zero retires the slot at once.
 *
 * <h2>Trust</h2>
 * Peers are local processes of the same user, yet every value read from a peer's table is checked before use (see
 * {@link SharedPeer}), and anything doubtful falls back to the TCP path, where the owner decides. The table is the
 * one file a peer maps: a peer that truncates its own table while a request reads it can still make the reader fault
 * (see the package documentation); the reader checks its size before each request.
 *
 * <p>Thread-safety: the owner's writes are serialised by the engine's key lock (regions) or per queue pair; peer
 * reads are lock-free and allocation-free from any thread.
 */
final class SharedKeyTable {
    static final int MAGIC = 0x5242534b;
    static final int VERSION = 3;
    static final int REGION_SLOTS = MemoryKeyTable.MAX_REGIONS + 1;
    static final int QP_SLOTS = 1 << 16;
    static final int HEADER = 64;
    static final int REGION_ENTRY = 64;
    static final int QP_ENTRY = 8;
    static final long SIZE = HEADER + (long) REGION_SLOTS * REGION_ENTRY + (long) QP_SLOTS * QP_ENTRY;
    static final long WITHDRAW_WAIT_NANOS = 2_000_000_000L;
    /** Header field: key slots whose entries the owner has committed (published with release); peers touch no other. */
    static final int COMMITTED_SLOTS = 16;
    /** Key slots committed when the table is made; it doubles from there as registrations need more. */
    static final int INITIAL_SLOTS = 4096;

    // Entry field offsets.
    static final int KEY = 0;
    static final int IN_USE = 4;
    static final int DOMAIN = 8;
    static final int ACCESS = 12;
    static final int ADDRESS = 16;
    static final int LENGTH = 24;
    static final int FILE_NUMBER = 32;
    static final int FILE_OFFSET = 40;
    static final int FILE_DEVICE = 48;
    static final int FILE_INODE = 56;

    private static final VarHandle INT =
            MethodHandles.byteBufferViewVarHandle(int[].class, ByteOrder.nativeOrder());
    private static final VarHandle LONG =
            MethodHandles.byteBufferViewVarHandle(long[].class, ByteOrder.nativeOrder());

    private final MappedByteBuffer map;
    final Path file;
    /** Owner only: the file, kept open to commit entries as they are needed, and how many slots are committed. */
    private FileChannel owned;
    private int committed;

    private SharedKeyTable(MappedByteBuffer map, Path file) {
        this.map = map;
        this.file = file;
    }

    /** Creates the owner's table in {@code file} (owner-only); the caller deletes it at exit. */
    static SharedKeyTable create(Path file) throws IOException {
        Files.deleteIfExists(file);
        // The file stays sparse (64 MiB), but every page anyone touches is committed first: a page that tmpfs has to
        // allocate on first touch, in a full directory, faults the toucher (SIGBUS, which JDK 17 reports late).
        FileChannel ch = SharedMemoryFiles.createOwnerOnly(file);
        try {
            SharedMemoryFiles.commit(ch, 0, entry(INITIAL_SLOTS));
            SharedMemoryFiles.commit(ch, qpEntry(0), SIZE);
            SharedKeyTable t = new SharedKeyTable(ch.map(FileChannel.MapMode.READ_WRITE, 0, SIZE), file);
            t.owned = ch;
            t.committed = INITIAL_SLOTS;
            INT.set(t.map, 4, VERSION);
            INT.set(t.map, 8, REGION_SLOTS);
            INT.set(t.map, 12, QP_SLOTS);
            INT.set(t.map, COMMITTED_SLOTS, INITIAL_SLOTS);
            INT.setRelease(t.map, 0, MAGIC);
            return t;
        } catch (IOException | RuntimeException e) {
            ch.close();
            throw e;
        }
    }

    /**
     * Maps a peer's table from {@code ch}, open on {@code file}; the caller keeps the channel to check the size.
     *
     * @return the table, or {@code null} when the file is not a table of this version
     */
    static SharedKeyTable open(FileChannel ch, Path file) {
        try {
            if (ch.size() != SIZE) {
                return null;
            }
            SharedKeyTable t = new SharedKeyTable(ch.map(FileChannel.MapMode.READ_WRITE, 0, SIZE), file);
            boolean valid = (int) INT.getAcquire(t.map, 0) == MAGIC && (int) INT.get(t.map, 4) == VERSION
                    && (int) INT.get(t.map, 8) == REGION_SLOTS && (int) INT.get(t.map, 12) == QP_SLOTS;
            if (!valid) {
                DirectMemory.free(t.map);
            }
            return valid ? t : null;
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    /** The mapping; freed by {@link io.rdmabridge.verbs.DirectMemory#free} when no copy can still use it. */
    MappedByteBuffer mapping() {
        return map;
    }

    private static int entry(int slot) {
        return HEADER + slot * REGION_ENTRY;
    }

    private static int qpEntry(int qpn) {
        return (int) (HEADER + (long) REGION_SLOTS * REGION_ENTRY + (long) (qpn & (QP_SLOTS - 1)) * QP_ENTRY);
    }

    // ------------------------------------------------------------------ owner side

    /**
     * Publishes a registration under {@code key}; the slot's previous key was withdrawn. Caller holds the key lock.
     *
     * @return {@code false} when the slot's entry could not be committed (no space left): not published
     */
    boolean publish(int key, int domain, int access, long address, long length, long fileNumber, long fileOffset,
            long fileDevice, long fileInode) {
        int slot = key & (REGION_SLOTS - 1);
        if (slot >= committed) {
            int grown = Math.min(REGION_SLOTS, Math.max(committed * 2, slot + 1));
            try {
                SharedMemoryFiles.commit(owned, entry(committed), entry(grown));
            } catch (IOException e) {
                return false;
            }
            committed = grown;
            INT.setRelease(map, COMMITTED_SLOTS, grown);
        }
        int e = entry(slot);
        INT.set(map, e + DOMAIN, domain);
        INT.set(map, e + ACCESS, access);
        LONG.set(map, e + ADDRESS, address);
        LONG.set(map, e + LENGTH, length);
        LONG.set(map, e + FILE_NUMBER, fileNumber);
        LONG.set(map, e + FILE_OFFSET, fileOffset);
        LONG.set(map, e + FILE_DEVICE, fileDevice);
        LONG.set(map, e + FILE_INODE, fileInode);
        INT.setVolatile(map, e + KEY, key);
        return true;
    }

    /**
     * Withdraws {@code key}, then waits until no peer copies under it. Caller holds the key lock.
     *
     * <p>Both fields live in a file every same-host peer maps writable, so neither is taken on its word: a key a peer
     * cleared or changed does not skip the wait (another peer may still be copying under it), and an in-use count
     * below zero, which no peer that keeps to the protocol makes, spoils the slot.
     *
     * @return {@code false} when a peer still held the key after {@link #WITHDRAW_WAIT_NANOS}, or its in-use count is
     *         below zero: the slot's count is then spoiled for good (a dead holder never lowers it, a slow one would
     *         take it below zero if it were reset), and the caller must not give the slot to another registration
     */
    boolean withdraw(int key) {
        int slot = key & (REGION_SLOTS - 1);
        if (slot >= committed) {
            return true; // never published: the entry does not exist, and touching it could fault in a full directory
        }
        int e = entry(slot);
        INT.setVolatile(map, e + KEY, 0);
        long deadline = System.nanoTime() + WITHDRAW_WAIT_NANOS;
        int spins = 0;
        int inUse;
        while ((inUse = (int) INT.getVolatile(map, e + IN_USE)) != 0) {
            if (inUse < 0) {
                SoftEngine.logger.warn("soft0: a same-host peer drove the in-use count of memory key 0x{} below zero "
                        + "({}), which no peer that keeps to the protocol does; deregistering, and retiring its key "
                        + "slot", Integer.toHexString(key), inUse);
                return false;
            }
            if (System.nanoTime() - deadline > 0) {
                SoftEngine.logger.warn("soft0: a same-host peer still holds memory key 0x{} after {} ms (killed "
                        + "mid-copy?); deregistering anyway, and retiring its key slot", Integer.toHexString(key),
                        WITHDRAW_WAIT_NANOS / 1_000_000);
                return false;
            }
            if (++spins > 100) {
                LockSupport.parkNanos(10_000);
            } else {
                Thread.onSpinWait();
            }
        }
        return true;
    }

    /** Publishes connected queue pair {@code qpn} of domain {@code domain} (a later one of the same slot wins). */
    void publishQueuePair(int qpn, int domain) {
        int e = qpEntry(qpn);
        INT.setVolatile(map, e, 0);
        INT.set(map, e + 4, domain);
        INT.setVolatile(map, e, qpn);
    }

    /** Withdraws {@code qpn} when it still owns its slot. */
    void withdrawQueuePair(int qpn) {
        INT.compareAndSet(map, qpEntry(qpn), qpn, 0);
    }

    // ------------------------------------------------------------------ peer side

    /**
     * Takes a hold on the entry of {@code rkey}: the in-use count is raised and the key is live.
     *
     * @return the entry's offset for the accessors, or -1 (nothing held) when the key is not published
     */
    int acquire(int rkey) {
        int slot = rkey & (REGION_SLOTS - 1);
        if (slot == 0 || slot >= (int) INT.getAcquire(map, COMMITTED_SLOTS)) {
            return -1; // an entry the owner never committed: touching it could allocate a page of a full directory
        }
        int e = entry(slot);
        INT.getAndAdd(map, e + IN_USE, 1);
        if ((int) INT.getVolatile(map, e + KEY) != rkey) {
            INT.getAndAdd(map, e + IN_USE, -1);
            return -1;
        }
        return e;
    }

    void release(int e) {
        INT.getAndAdd(map, e + IN_USE, -1);
    }

    int domain(int e) {
        return (int) INT.get(map, e + DOMAIN);
    }

    int access(int e) {
        return (int) INT.get(map, e + ACCESS);
    }

    long address(int e) {
        return (long) LONG.get(map, e + ADDRESS);
    }

    long length(int e) {
        return (long) LONG.get(map, e + LENGTH);
    }

    long fileNumber(int e) {
        return (long) LONG.get(map, e + FILE_NUMBER);
    }

    long fileOffset(int e) {
        return (long) LONG.get(map, e + FILE_OFFSET);
    }

    long fileDevice(int e) {
        return (long) LONG.get(map, e + FILE_DEVICE);
    }

    long fileInode(int e) {
        return (long) LONG.get(map, e + FILE_INODE);
    }

    /** The domain id of connected queue pair {@code qpn}, or -1 when it is not published (gone, or in error). */
    int queuePairDomain(int qpn) {
        int e = qpEntry(qpn);
        if ((int) INT.getVolatile(map, e) != qpn || qpn == 0) {
            return -1;
        }
        int domain = (int) INT.get(map, e + 4);
        return (int) INT.getVolatile(map, e) == qpn ? domain : -1;
    }
}
