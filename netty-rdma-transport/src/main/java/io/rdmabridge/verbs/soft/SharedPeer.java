package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.PeerText;
import io.rdmabridge.verbs.ResourceUsage;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WrOpcode;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The requester's side of the one-sided same-host path for one TCP link: it maps the peer's {@link SharedKeyTable},
 * opens, on first use, each of the peer's shared memory files (or, for a READ, the mapped file a link of the peer leads
 * to: {@link MappedFileLinks}), and executes an RDMA WRITE or READ by checking the
 * peer's published key, bounds, access rights and queue pair, then copying straight between our registered memory
 * and the peer's file, with no work on the peer's side. Whatever it cannot do that way (memory the peer could not
 * share, a key or queue pair not published, any value from the peer's table that does not add up) it declines, and
 * the work request takes the TCP path, where the peer's engine decides as before.
 *
 * <h2>Why positional file I/O rather than a mapping of the peer's memory</h2>
 * The peer owns its files and may truncate one while we use it. A copy through a mapping then faults (SIGBUS), and
 * JDK 17 turns that into an {@link InternalError} delivered <em>later</em>, at some safepoint poll of the same thread
 * and often outside any {@code try} around the copy (the copy itself returns as if it had worked), so it cannot be
 * handled where it happens ({@code DirectMemoryFaultTest}). A positional read or write ({@code pread}/{@code pwrite})
 * on the peer's file cannot fault: a read past the end comes back short and fails the request, and a WRITE is checked
 * against the file's current size first (a truncation right after that check makes the kernel extend the peer's file
 * again, the peer's own loss). The kernel copies straight between the file and our scatter/gather entries, through a
 * buffer view retargeted at each entry, so the bytes still cross once, with no work on the peer's side; a system call
 * per entry is the price (one in-JVM run, one buffer reused, against the mapped copy: 64 KiB WRITE 9.5 against 9.4
 * GB/s and READ 18 against 14; 1 MiB WRITE 15 against 28 and READ 24 against 30).
 *
 * <h2>Outcomes</h2>
 * <ul>
 *   <li>{@link #DONE}: executed.</li>
 *   <li>{@link #DECLINED}: send it over the wire, where the peer decides. Nothing was copied, except after an
 *       interrupt closed the file under a copy; the wire then repeats the same bytes to the same places.</li>
 *   <li>{@link #FAILED}: the peer's file is shorter than its own table says (truncated under us; a mapped file, by
 *       whoever truncated it). The request fails with a remote access error and the link closes, with one WARN
 *       naming the file: the registration's bytes are gone, and the peer's engine would fault the same way on the TCP
 *       path. As on a NIC, the target range of a failed WRITE and the destination of a failed READ are undefined
 *       afterwards; nothing behind the failed request is executed (RC).</li>
 * </ul>
 * The key table stays a mapping: its in-use counts need atomic updates in memory both processes see. Its size is
 * checked before each request; a peer that truncates it in the microseconds a request uses it can still make this
 * process fault (the remaining risk, see the package documentation).
 *
 * <p>Threading: {@link #execute} runs on the link's single drainer (a large copy is shared with the engine's
 * {@link CopyHelper}, which is done with it before {@link #execute} returns); {@link #close()} may come from any
 * thread and releases everything only once no request is under way. {@link #execute} takes no lock and allocates
 * nothing once a file is open (an inline WRITE's first one wraps the queue pair's array); opening a file the first
 * time allocates.
 */
final class SharedPeer {
    static final int DONE = 0;
    static final int DECLINED = 1;
    static final int FAILED = 2;
    /** How often a missing peer table is looked for again (the peer creates it with its first shared memory). */
    private static final long TABLE_RETRY_NANOS = 100_000_000L;
    /**
     * The peer's files open at once on one link; one more closes the least recently used. The peer names the files
     * (its table's file numbers), so without a bound it could make us hold a descriptor for every file it makes.
     */
    static final int MAX_OPEN_FILES = 256;
    /**
     * How long a peer file that could not be opened is not tried again; its requests take the TCP path meanwhile. The
     * peer names the files, so without it a key naming one we cannot open would cost every request on it an open and
     * the link checks.
     */
    static final long REOPEN_DELAY_NANOS = 1_000_000_000L;
    /**
     * Failed opens per {@link #REOPEN_DELAY_NANOS} on one link; beyond them no new file is opened until that time has
     * passed. A peer can write a new number into its table before each of our requests, which the per-number memory
     * of failures does not catch.
     */
    static final int MAX_FAILED_OPENS = 8;

    private final SharedMemoryFiles files;
    private final Path directory;
    private final long peerPid;
    private final String filePrefix;
    private final ResourceUsage usage;
    private final CopyHelper copyHelper;
    private final AtomicInteger users = new AtomicInteger();
    private final AtomicBoolean released = new AtomicBoolean();
    private volatile boolean closed;
    private SharedKeyTable table;
    private FileChannel tableChannel;
    private long tableRetryAt;
    /** Retargeted at each of our scatter/gather entries in turn ({@link DirectMemory#retarget}); drainer only. */
    private final ByteBuffer view = CopyHelper.newView();
    /** The queue pair's inline bytes, made on the first inline WRITE. */
    private ByteBuffer inline;
    /** The shared-memory directory with every link resolved, once a peer's link needs it; drainer only. */
    private Path realDirectory;
    /** Why the last {@link #FAILED} failed: names the file, the cause and the fix. */
    private String failure;
    // The peer's files open: number, channel, size at open, when last used (a count of lookups), and for a link to a
    // mapped file of the peer the device and inode it led to (0 otherwise); count entries.
    private long[] numbers = new long[4];
    private long[] devices = new long[4];
    private long[] inodes = new long[4];
    private FileChannel[] channels = new FileChannel[4];
    private long[] sizes = new long[4];
    private long[] lastUse = new long[4];
    private long lookups;
    private int count;
    // For a link to a mapped file of the peer, the file it led to when opened, for messages (null otherwise).
    private Path[] targets = new Path[4];
    // Peer files that could not be opened lately, and when each may be tried again; the oldest gives way. Also the
    // failed opens since failuresSince, at most MAX_FAILED_OPENS per REOPEN_DELAY_NANOS.
    private final long[] refused = new long[MAX_FAILED_OPENS];
    private final long[] refusedUntil = new long[MAX_FAILED_OPENS];
    private int nextRefused;
    private long failuresSince;
    private int failures;

    SharedPeer(SharedMemoryFiles files, long peerPid, ResourceUsage usage, CopyHelper copyHelper) {
        this.files = files;
        this.directory = files.directory;
        this.peerPid = peerPid;
        this.usage = usage;
        this.copyHelper = copyHelper;
        filePrefix = SharedMemoryFiles.filePrefix(peerPid);
        failuresSince = System.nanoTime();
    }

    /**
     * Executes send slot {@code i} of {@code q}, an RDMA WRITE or READ of at least one byte whose local entries were
     * checked, against the memory of the peer's queue pair {@code peerQpn}.
     *
     * @return {@link #DONE}, {@link #DECLINED} or {@link #FAILED} (then {@link #failure()} says why)
     */
    int execute(SoftQueuePair q, int i, int peerQpn) {
        users.incrementAndGet();
        try {
            if (closed) {
                return DECLINED;
            }
            SharedKeyTable t = table();
            if (t == null || !tableIntact()) {
                return DECLINED;
            }
            int domain = t.queuePairDomain(peerQpn);
            if (domain < 0) {
                return DECLINED;
            }
            boolean read = q.sOpcode[i] == WrOpcode.RDMA_READ;
            int needed = read ? Access.REMOTE_READ : Access.REMOTE_WRITE;
            int len = q.sLength[i];
            long remote = q.sRemote[i];
            int e = t.acquire(q.sRkey[i]);
            if (e < 0) {
                return DECLINED;
            }
            try {
                // Each value read once into a local, then checked: the table is the peer's to write.
                long address = t.address(e);
                long length = t.length(e);
                long number = t.fileNumber(e);
                long offset = t.fileOffset(e);
                // remote - address < 0 after remote >= address: the difference overflowed (an address near -2^63).
                if (t.domain(e) != domain || (t.access(e) & needed) != needed || length < len || remote < address
                        || remote - address < 0 || remote - address > length - len || offset < 0 || number <= 0) {
                    return DECLINED;
                }
                int f = file(number);
                // A link to a mapped file of the peer is read only, and only while it leads to the file the peer
                // published (not one renamed over it since).
                if (f < 0 || inodes[f] != 0 && (!read || t.fileInode(e) != inodes[f]
                        || t.fileDevice(e) != devices[f])) {
                    return DECLINED;
                }
                long at = offset + (remote - address);
                if (at < 0 || (at > sizes[f] - len && !grewTo(f, at, len))) {
                    return DECLINED;
                }
                return copy(q, i, read, f, at, len);
            } finally {
                t.release(e);
            }
        } finally {
            if (users.decrementAndGet() == 0 && closed) {
                releaseAll();
            }
        }
    }

    /** Why the last request {@link #FAILED}. */
    String failure() {
        return failure;
    }

    private int copy(SoftQueuePair q, int i, boolean read, int f, long at, int len) {
        FileChannel ch = channels[f];
        try {
            if (!read && ch.size() < at + len) {
                return truncated(f, at + len, ch.size());
            }
            if ((q.sFlags[i] & SendWorkRequest.INLINE) != 0) {
                // An inline WRITE: its bytes are in the queue pair's heap array (this link's only queue pair).
                ByteBuffer b = inline;
                if (b == null) {
                    b = ByteBuffer.wrap(q.sInline);
                    inline = b;
                }
                b.limit(i * q.maxInline + len).position(i * q.maxInline);
                while (b.hasRemaining()) {
                    ch.write(b, at + len - b.remaining());
                }
                return DONE;
            }
            // Straight between the peer's file and our memory, entry by entry: one copy, in the kernel; a large one
            // shared with the engine's copy helper.
            int r = copyHelper.tryCopy(ch, view, q.sSges, i, len, at, read);
            if (r < 0) {
                r = CopyHelper.copyRange(ch, view, q.sSges, i, 0, len, at, read);
            }
            if (r == CopyHelper.SHORT) {
                return truncated(f, at + len, ch.size());
            }
            return DONE;
        } catch (ClosedChannelException e) {
            // Closed under us by an interrupt of the posting thread: open it again next time; the wire repeats
            // what was done of this request, which is idempotent (same bytes to the same place).
            forget(f);
            return DECLINED;
        } catch (IOException e) {
            failure = "cannot " + (read ? "read" : "write") + " same-host peer " + peerPid + "'s "
                    + (inodes[f] == 0 ? "memory file " + directory.resolve(filePrefix + numbers[f])
                    : "mapped file " + PeerText.printable(targets[f].toString())) + " (" + e
                    + "): closing the connection";
            SoftEngine.logger.warn("soft0: {}", failure);
            closed = true;
            return FAILED;
        }
    }

    /**
     * Whether the mapped file behind link entry {@code f} now holds {@code [at, at + len)}: such a file may have grown
     * since it was opened (a log appended to, its new chunks mapped and registered). Our memory files keep their size.
     */
    private boolean grewTo(int f, long at, int len) {
        if (inodes[f] == 0) {
            return false;
        }
        long size;
        try {
            size = channels[f].size();
        } catch (IOException e) {
            return false;
        }
        if (size - len < at) {
            return false;
        }
        usage.peerFiles(0, size - sizes[f]);
        sizes[f] = size;
        return true;
    }

    private int truncated(int f, long needed, long size) {
        if (inodes[f] == 0) {
            failure = "same-host peer " + peerPid + " truncated its memory file " + directory.resolve(filePrefix
                    + numbers[f]) + " to " + size + " bytes while the region it backs (" + needed + " bytes needed) "
                    + "is registered; the peer is broken or hostile: closing the connection (fix the peer: free memory "
                    + "only after deregistering it)";
        } else {
            // A mapped file is anyone's to truncate (a log cut back, say), not necessarily the peer's doing.
            failure = "the file " + PeerText.printable(targets[f].toString()) + " that same-host peer " + peerPid
                    + " registered a mapping of (a file region it sends) is now " + size + " bytes, short of the "
                    + needed + " bytes the registered region needs: it was truncated while registered: closing the "
                    + "connection (fix the sender: truncate or overwrite a file only after the file regions sent from "
                    + "it are released, or write a new file and rename it over the old)";
        }
        SoftEngine.logger.warn("soft0: {}", failure);
        closed = true; // a registration's bytes are gone: nothing more one-sided on this link
        return FAILED;
    }

    private SharedKeyTable table() {
        SharedKeyTable t = table;
        if (t == null && System.nanoTime() - tableRetryAt >= 0) {
            tableRetryAt = System.nanoTime() + TABLE_RETRY_NANOS;
            FileChannel ch = open(directory.resolve(filePrefix + "keys"));
            if (ch == null) {
                return null;
            }
            t = SharedKeyTable.open(ch, directory.resolve(filePrefix + "keys"));
            if (t == null) {
                closeQuietly(ch);
                return null;
            }
            table = t;
            tableChannel = ch;
            usage.peerKeyTables(1, SharedKeyTable.SIZE);
        }
        return t;
    }

    /** Whether the peer's table still has its full size: a truncated one would fault on access (see above). */
    private boolean tableIntact() {
        try {
            return tableChannel.size() == SharedKeyTable.SIZE;
        } catch (ClosedChannelException e) {
            releaseTable(); // closed by an interrupt of the posting thread: open it again after the retry delay
            return false;
        } catch (IOException e) {
            return false;
        }
    }

    /** Opens a peer file for reading and writing, not through a link (a peer must not redirect us), or null. */
    private static FileChannel open(Path file) {
        try {
            return FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE,
                    LinkOption.NOFOLLOW_LINKS);
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    /**
     * Where the peer's link {@code path} leads, when it is a link to a regular file outside the shared-memory directory
     * (a mapped file of the peer, {@link MappedFileLinks}), else {@code null}. The target is then opened by its real
     * path, not through a link; opened for writing too, as every peer file is, so that a FIFO put there meanwhile
     * cannot block the open. Never a file of the shared-memory directory: a peer must not make us read our own
     * memory, or another peer's, as its own.
     */
    private Path linkTarget(Path path) {
        try {
            if (!Files.isSymbolicLink(path)) {
                return null;
            }
            Path target = path.toRealPath();
            if (realDirectory == null) {
                realDirectory = directory.toRealPath();
            }
            return Files.isRegularFile(target, LinkOption.NOFOLLOW_LINKS) && !target.startsWith(realDirectory)
                    ? target : null;
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    /**
     * The index of peer file {@code number}, opened now if need be, or -1 when it cannot be (then not tried again for
     * {@link #REOPEN_DELAY_NANOS}) or when this link's {@link #MAX_FAILED_OPENS} are used up.
     */
    private int file(long number) {
        lookups++;
        for (int k = 0; k < count; k++) {
            if (numbers[k] == number) {
                lastUse[k] = lookups;
                return k;
            }
        }
        long now = System.nanoTime();
        if (now - failuresSince >= REOPEN_DELAY_NANOS) {
            failuresSince = now;
            failures = 0;
        } else if (failures >= MAX_FAILED_OPENS) {
            return -1;
        }
        for (int k = 0; k < refused.length; k++) {
            if (refused[k] == number && now - refusedUntil[k] < 0) {
                return -1;
            }
        }
        int f = openFile(number);
        // An interrupt of the posting thread closes the file under us: not the peer's file's fault.
        if (f < 0 && !Thread.currentThread().isInterrupted()) {
            refused[nextRefused] = number;
            refusedUntil[nextRefused] = now + REOPEN_DELAY_NANOS;
            nextRefused = (nextRefused + 1) % refused.length;
            failures++;
            files.refusedPeerFiles.incrementAndGet();
        }
        return f;
    }

    /** Opens peer file {@code number} into a new entry, or -1 when it cannot be. */
    private int openFile(long number) {
        Path path = directory.resolve(filePrefix + number);
        FileChannel ch = open(path);
        long device = 0;
        long inode = 0;
        Path target = null;
        if (ch == null) {
            target = linkTarget(path);
            if (target == null || (ch = open(target)) == null) {
                return -1;
            }
            try {
                device = ((Number) Files.getAttribute(target, "unix:dev", LinkOption.NOFOLLOW_LINKS)).longValue();
                inode = ((Number) Files.getAttribute(target, "unix:ino", LinkOption.NOFOLLOW_LINKS)).longValue();
            } catch (IOException | RuntimeException e) {
                inode = 0;
            }
            if (inode == 0) {
                closeQuietly(ch);
                return -1;
            }
        }
        long size;
        try {
            size = ch.size();
        } catch (IOException e) {
            size = -1;
        }
        // Our memory files are at most 2 GiB; a peer's mapped file (a shuffle file, a log segment) may be larger.
        if (size <= 0 || size > Integer.MAX_VALUE && inode == 0) {
            closeQuietly(ch);
            return -1;
        }
        // Opened: now let go of the files the peer has deleted (their numbers never come back), then, at the bound,
        // of the one unused longest (no copy is under way: the copy helper is done before execute returns).
        for (int k = count - 1; k >= 0; k--) {
            if (!Files.exists(directory.resolve(filePrefix + numbers[k]), LinkOption.NOFOLLOW_LINKS)) {
                forget(k);
            }
        }
        if (count == MAX_OPEN_FILES) {
            int oldest = 0;
            for (int k = 1; k < count; k++) {
                if (lastUse[k] < lastUse[oldest]) {
                    oldest = k;
                }
            }
            forget(oldest);
        }
        if (count == numbers.length) {
            numbers = Arrays.copyOf(numbers, count * 2);
            channels = Arrays.copyOf(channels, count * 2);
            sizes = Arrays.copyOf(sizes, count * 2);
            lastUse = Arrays.copyOf(lastUse, count * 2);
            devices = Arrays.copyOf(devices, count * 2);
            inodes = Arrays.copyOf(inodes, count * 2);
            targets = Arrays.copyOf(targets, count * 2);
        }
        numbers[count] = number;
        targets[count] = target;
        devices[count] = device;
        inodes[count] = inode;
        channels[count] = ch;
        sizes[count] = size;
        lastUse[count] = lookups;
        usage.peerFiles(1, size);
        return count++;
    }

    /** Closes file entry {@code k} and moves the last entry into its place. */
    private void forget(int k) {
        closeQuietly(channels[k]);
        usage.peerFiles(-1, -sizes[k]);
        count--;
        numbers[k] = numbers[count];
        channels[k] = channels[count];
        sizes[k] = sizes[count];
        lastUse[k] = lastUse[count];
        devices[k] = devices[count];
        inodes[k] = inodes[count];
        targets[k] = targets[count];
        targets[count] = null;
        channels[count] = null;
    }

    /**
     * Releases everything once no request is under way; any thread, idempotent. A dead peer's files are deleted
     * (see {@link SharedMemoryFiles#removeFilesOfDeadProcess}).
     */
    void close() {
        closed = true;
        if (users.get() == 0) {
            releaseAll();
        }
        SharedMemoryFiles.removeFilesOfDeadProcess(directory, peerPid);
    }

    private void releaseAll() {
        if (!released.compareAndSet(false, true)) {
            return;
        }
        while (count > 0) {
            forget(count - 1);
        }
        releaseTable();
    }

    private void releaseTable() {
        SharedKeyTable t = table;
        if (t != null) {
            table = null;
            closeQuietly(tableChannel);
            tableChannel = null;
            DirectMemory.free(t.mapping());
            usage.peerKeyTables(-1, -SharedKeyTable.SIZE);
        }
    }

    private static void closeQuietly(FileChannel ch) {
        try {
            ch.close();
        } catch (IOException ignored) {
            // A descriptor is released either way.
        }
    }
}
