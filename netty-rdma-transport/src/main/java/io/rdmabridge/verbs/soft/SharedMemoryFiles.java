package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.DirectMemory;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Arrays;
import java.util.Set;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Registered memory that a peer process on the same host can reach: each allocation is a file of its own in the
 * shared-memory directory ({@code /dev/shm}, or {@value #DIRECTORY_PROPERTY}), owner-only (0600), named
 * {@code rdmabridge-soft-<pid namespace>-<pid>-<n>} and mapped read-write (the namespace is the inode number of
 * {@code /proc/self/ns/pid}: containers that share a {@code /dev/shm} may each have a pid 1, and each sees the others'
 * pids as dead). A file is deleted when its memory is freed, the files still live at JVM exit by a shutdown hook, and
 * files of processes that died without one (SIGKILL) by a surviving peer when its link closes
 * ({@link #removeFilesOfDeadProcess}) or by the next process of the same pid namespace that allocates here. Peers read
 * and write the files with positional I/O, never through a mapping of their own (see {@link SharedPeer}). Memory the
 * directory cannot hold (no such directory, full, not permitted) falls back to plain direct memory with one WARN, and
 * is counted ({@link #fallbacks()}): it keeps working, through a copy.
 *
 * <p>Also the same-host test of the handshake: {@link #hostToken()} names this host's boot, shared-memory directory,
 * user and pid namespace, so two processes exchanging it learn whether they could share mappings.
 *
 * <p>Thread-safe. Allocating and freeing are rare (slabs, receive rings) and may allocate and take the map's locks;
 * nothing here is on a work request's path.
 */
final class SharedMemoryFiles {
    /**
     * {@code shm} (default) or {@code tcp}: whether registered memory is allocated in shared files and same-host peers
     * are recognised in the handshake; {@code tcp} keeps every link on the TCP path, as between hosts. Read at every
     * allocation and handshake.
     */
    static final String SAME_HOST_PROPERTY = "rdmabridge.soft.sameHost";
    /** The directory of the shared files, read when the device starts; default {@code /dev/shm}. */
    static final String DIRECTORY_PROPERTY = "rdmabridge.soft.shmDirectory";
    static final String PREFIX = "rdmabridge-soft-";
    /** The inode number of this process's pid namespace, or {@code 0} when {@code /proc} cannot tell it. */
    static final long PID_NAMESPACE = pidNamespace();
    /**
     * Our effective user, the owner of the files we create (/proc/self belongs to it), or -1 when it cannot be read.
     */
    static final long EFFECTIVE_UID = effectiveUid();
    /** What the names of every file of a process in our pid namespace start with. */
    private static final String NAMESPACE_PREFIX = PREFIX + PID_NAMESPACE + '-';
    static final int TOKEN_LENGTH = 16;
    /** The token of a side that offers no shared memory; never written. */
    static final byte[] NO_TOKEN = new byte[TOKEN_LENGTH];

    private final long pid = ProcessHandle.current().pid();
    /** Where our files are, and where a same-host peer's are (equal tokens mean equal directories). */
    final Path directory = Paths.get(System.getProperty(DIRECTORY_PROPERTY, "/dev/shm"));
    private final AtomicLong nextFile = new AtomicLong();
    /** Registered read-only file mappings, offered to peers through links to their files. */
    final MappedFileLinks fileLinks = new MappedFileLinks(this);
    /** Live files, sorted by the address of their mapping; replaced whole under {@code this} (rare). */
    private volatile Mappings mappings = new Mappings(new Mapping[0]);
    private final AtomicLong liveBytes = new AtomicLong();
    private final AtomicLong fallbacks = new AtomicLong();
    private final AtomicBoolean started = new AtomicBoolean();
    private final AtomicBoolean fallbackLogged = new AtomicBoolean();
    private static final AtomicBoolean BAD_PROPERTY_LOGGED = new AtomicBoolean();
    /** Read-only zeros that {@link #commit} writes from (duplicated per use: its position is not shared). */
    private static final ByteBuffer ZEROS = ByteBuffer.allocateDirect(64 * 1024).asReadOnlyBuffer();
    private volatile byte[] token;
    /** This process's published keys and queue pairs; created with the first shared file or same-host link. */
    private volatile SharedKeyTable keyTable;
    private boolean keyTableFailed;
    /** RDMA WRITEs and READs of same-host links done one-sided, and those that went over TCP instead. */
    final AtomicLong oneSided = new AtomicLong();
    final AtomicLong overTcp = new AtomicLong();
    /** Peer files a same-host link could not open (each then not tried again for a while: {@link SharedPeer}). */
    final AtomicLong refusedPeerFiles = new AtomicLong();
    /** Frames received through same-host links' shared-memory rings ({@link ShmRing}). */
    final AtomicLong ringFrames = new AtomicLong();
    /** Same-host wake-ups sent: DOORBELLs to a peer's engine, datagrams to a peer's sleeping event loop. */
    final AtomicLong doorbells = new AtomicLong();
    final AtomicLong directWakes = new AtomicLong();
    /**
     * The numbers of our live ring files made for a peer in this process, each with the link that writes it until
     * another link of ours reads it ({@link #CLAIMED}): a peer that claims our own pid (a queue pair of this process,
     * or a liar) may name only such a ring that nobody reads yet and that the naming link does not write itself, never
     * registered memory, another link's ring, or our ring that another process reads.
     */
    private final java.util.concurrent.ConcurrentHashMap<Long, Object> ownRings =
            new java.util.concurrent.ConcurrentHashMap<>();
    private static final Object CLAIMED = new Object();

    /** Whether {@value #SAME_HOST_PROPERTY} asks for the shared-memory path now. */
    static boolean enabled() {
        String value = System.getProperty(SAME_HOST_PROPERTY, "shm").trim();
        if ("tcp".equalsIgnoreCase(value)) {
            return false;
        }
        if (!"shm".equalsIgnoreCase(value) && BAD_PROPERTY_LOGGED.compareAndSet(false, true)) {
            SoftEngine.logger.warn("soft0: {}={} (expected: shm or tcp); using the default, shm", SAME_HOST_PROPERTY,
                    value);
        }
        return true;
    }

    /**
     * {@code capacity} bytes in a new shared file when {@link #enabled()}, else (or when the directory refuses) plain
     * direct memory.
     */
    ByteBuffer allocate(int capacity) {
        if (capacity < 0) {
            throw new IllegalArgumentException("capacity: " + capacity + " (expected: >= 0)");
        }
        if (capacity == 0 || !enabled()) {
            return ByteBuffer.allocateDirect(capacity);
        }
        try {
            SharedFile f = create(capacity);
            closeQuietly(f.channel()); // the mapping stays valid without it
            return f.map();
        } catch (IOException e) {
            fallbacks.incrementAndGet();
            if (fallbackLogged.compareAndSet(false, true)) {
                SoftEngine.logger.warn("soft0: cannot allocate registered memory in {} ({}): using private memory, "
                        + "which a same-host peer reaches only through a copy (fix the directory's space or "
                        + "permissions, choose another with -D{}, or set -D{}=tcp)", directory, e.getMessage(),
                        DIRECTORY_PROPERTY, SAME_HOST_PROPERTY);
            }
            return ByteBuffer.allocateDirect(capacity);
        }
    }

    /** A new shared file: its mapping, its channel (open, read and write; the caller closes it) and its number. */
    record SharedFile(MappedByteBuffer map, FileChannel channel, long number) {
    }

    /**
     * A new shared file of {@code capacity} bytes, committed and mapped, whatever {@link #enabled()} says; freed with
     * {@link #free}. For rings, which keep the channel to watch the file's size.
     *
     * @throws IOException naming the file and the cause when the directory refuses it (nothing is left behind)
     */
    SharedFile create(int capacity) throws IOException {
        Path dir = directory;
        start(dir);
        long number = nextFile.incrementAndGet();
        Path file = dir.resolve(filePrefix(pid) + number);
        FileChannel ch = null;
        MappedByteBuffer map;
        try {
            ch = createOwnerOnly(file);
            commit(ch, 0, capacity);
            map = ch.map(FileChannel.MapMode.READ_WRITE, 0, capacity);
        } catch (IOException | RuntimeException e) {
            if (ch != null) {
                closeQuietly(ch);
            }
            deleteQuietly(file);
            throw new IOException("cannot create " + file + ": " + e, e);
        }
        synchronized (this) {
            mappings = mappings.with(new Mapping(DirectMemory.address(map), capacity, number, file));
        }
        liveBytes.addAndGet(capacity);
        return new SharedFile(map, ch, number);
    }

    private static void closeQuietly(FileChannel ch) {
        try {
            ch.close();
        } catch (IOException e) {
            // Closed either way.
        }
    }

    /**
     * Creates {@code file}, owner-only, and opens it in one step ({@code O_CREAT|O_EXCL}): nothing can put a link in
     * its place between a create and an open, and a link already there fails the create.
     */
    static FileChannel createOwnerOnly(Path file) throws IOException {
        return FileChannel.open(file, Set.of(StandardOpenOption.CREATE_NEW, StandardOpenOption.READ,
                StandardOpenOption.WRITE), PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString(
                "rw-------")));
    }

    /**
     * Writes zeros to bytes {@code from} to {@code to} of {@code ch}'s file, so that tmpfs allocates every page now. Otherwise it does
     * so on first touch through the mapping, and a full directory (a container's small {@code /dev/shm}) would then
     * raise SIGBUS inside a copy, which JDK 17 reports late, at an unrelated point of the thread, as an
     * {@link InternalError}; here it is an {@link IOException} ("No space left on device") and the caller falls back.
     */
    static void commit(FileChannel ch, long from, long to) throws IOException {
        ByteBuffer zeros = ZEROS.duplicate();
        long at = from;
        while (at < to) {
            zeros.clear().limit((int) Math.min(zeros.capacity(), to - at));
            while (zeros.hasRemaining()) {
                at += ch.write(zeros, at);
            }
        }
    }

    /** The number of a new file or link of ours in {@link #directory}; it will be deleted at exit. */
    long nextFileNumber() {
        start(directory);
        return nextFile.incrementAndGet();
    }

    /** Before our first file: stale files go, and ours will go at exit. */
    private void start(Path dir) {
        if (started.compareAndSet(false, true)) {
            removeFilesOfDeadProcesses(dir, pid);
            Runtime.getRuntime().addShutdownHook(new Thread(this::deleteAll, "soft0-shm-cleanup"));
        }
    }

    /** Unmaps and deletes {@code memory}'s file when it is one of ours, else frees it as plain direct memory. */
    void free(ByteBuffer memory) {
        Path file = null;
        if (memory.isDirect()) {
            synchronized (this) {
                Mapping m = mappings.find(DirectMemory.address(memory), 0);
                if (m != null && m.base() == DirectMemory.address(memory)) {
                    file = m.path();
                    mappings = mappings.without(m);
                }
            }
        }
        int capacity = memory.capacity();
        DirectMemory.free(memory);
        if (file != null) {
            deleteQuietly(file);
            liveBytes.addAndGet(-capacity);
        }
    }

    /** The {@code <n>} of the file that {@code memory} (as {@link #allocate} returned it) maps, or -1. */
    long fileNumber(ByteBuffer memory) {
        if (!memory.isDirect()) {
            return -1;
        }
        long address = DirectMemory.address(memory);
        Mapping m = mappings.find(address, 0);
        return m != null && m.base() == address ? m.number() : -1;
    }

    void ringCreated(long number, Object writer) {
        ownRings.put(number, writer);
    }

    void ringReleased(long number) {
        ownRings.remove(number);
    }

    /**
     * Whether our ring {@code number} exists, had no reader and is not written by {@code reader}; {@code reader} reads
     * it now. Never its writer: reading its own frames, a link would take its own requests for the peer's and run them
     * against this process's keys.
     */
    boolean claimOwnRing(long number, Object reader) {
        Object writer = ownRings.get(number);
        return writer != null && writer != CLAIMED && writer != reader && ownRings.replace(number, writer, CLAIMED);
    }

    /** Shared files of this process that are not freed yet. */
    int liveFiles() {
        return mappings.entries.length;
    }

    /** This process's id, which names its files. */
    long pid() {
        return pid;
    }

    /**
     * What the names of process {@code pid}'s files start with, {@code rdmabridge-soft-<pid namespace>-<pid>-}: its
     * memory and ring files {@code <n>} follow, and its key table {@code keys}. A same-host peer shares our pid
     * namespace (its token says so), so this names a peer's files too.
     */
    static String filePrefix(long pid) {
        return NAMESPACE_PREFIX + pid + '-';
    }

    private static long effectiveUid() {
        try {
            return ((Number) Files.getAttribute(Paths.get("/proc/self"), "unix:uid")).longValue();
        } catch (IOException | RuntimeException e) {
            return -1;
        }
    }

    private static long pidNamespace() {
        try {
            // "pid:[4026531836]"
            String link = Files.readSymbolicLink(Paths.get("/proc/self/ns/pid")).toString();
            return Long.parseLong(link.substring(link.indexOf('[') + 1, link.lastIndexOf(']')));
        } catch (IOException | RuntimeException e) {
            return 0;
        }
    }

    long liveBytes() {
        return liveBytes.get();
    }

    /** Allocations that wanted a shared file and got private memory instead. */
    long fallbacks() {
        return fallbacks.get();
    }

    /**
     * 16 bytes naming this host's current boot, its shared-memory directory (the file system and inode, so a container
     * with a /dev/shm of its own differs), our effective user (a peer of another user cannot open our owner-only files)
     * and our pid namespace (our files' names and the liveness of their owners are read in it), or zeros when
     * {@link #enabled()} is false or any of them cannot be told: a peer whose token equals ours, non-zero, can map our
     * files.
     */
    byte[] hostToken() {
        if (!enabled()) {
            return NO_TOKEN;
        }
        byte[] t = token;
        if (t == null) {
            t = computeToken(directory);
            token = t;
        }
        return t;
    }

    /** Whether a peer's token says it shares our host and directory; both tokens as sent, zeros when disabled. */
    static boolean sameHost(byte[] ours, byte[] theirs) {
        return !Arrays.equals(ours, NO_TOKEN) && Arrays.equals(ours, theirs);
    }

    private static byte[] computeToken(Path dir) {
        try {
            String bootId = Files.readString(Paths.get("/proc/sys/kernel/random/boot_id")).trim();
            Object device = Files.getAttribute(dir, "unix:dev");
            Object inode = Files.getAttribute(dir, "unix:ino");
            if (EFFECTIVE_UID < 0) {
                throw new IOException("/proc/self's owner is not readable");
            }
            if (PID_NAMESPACE == 0) {
                throw new IOException("/proc/self/ns/pid is not readable");
            }
            MessageDigest sha = MessageDigest.getInstance("SHA-256");
            byte[] digest = sha.digest((bootId + ' ' + dir.toRealPath() + ' ' + device + ' ' + inode + ' '
                    + EFFECTIVE_UID + ' ' + PID_NAMESPACE).getBytes(StandardCharsets.UTF_8));
            return Arrays.copyOf(digest, TOKEN_LENGTH);
        } catch (IOException | UnsupportedOperationException | IllegalArgumentException
                 | NoSuchAlgorithmException e) {
            SoftEngine.logger.warn("soft0: cannot tell this host's boot, shared-memory directory {}, user and pid "
                    + "namespace apart ({}): same-host peers will use TCP (run on Linux with {} and /proc present, or "
                    + "set -D{}=tcp)", dir, e.toString(), dir, SAME_HOST_PROPERTY);
            return NO_TOKEN;
        }
    }

    /**
     * Deletes the files of processes of our pid namespace that died without their shutdown hook (SIGKILL, a crash),
     * and those of {@code alsoPid} (an earlier process with our pid, before our first file; -1 for none). Files of
     * other pid namespaces are left to their own processes: their pids mean nothing here.
     */
    static void removeFilesOfDeadProcesses(Path dir, long alsoPid) {
        try (DirectoryStream<Path> stream = Files.newDirectoryStream(dir, NAMESPACE_PREFIX + "*")) {
            for (Path file : stream) {
                String name = file.getFileName().toString();
                int dash = name.indexOf('-', NAMESPACE_PREFIX.length());
                if (dash < 0) {
                    continue;
                }
                long owner;
                try {
                    owner = Long.parseLong(name.substring(NAMESPACE_PREFIX.length(), dash));
                } catch (NumberFormatException e) {
                    continue;
                }
                if (owner == alsoPid || isDead(owner)) {
                    deleteQuietly(file);
                }
            }
        } catch (IOException | RuntimeException e) {
            // Nothing to clean, or not ours to list: allocation reports a directory that does not work.
        }
    }

    /** First re-check of a peer that was still alive when its link closed; doubled each time. */
    static final long DEAD_PEER_FIRST_CHECK_NANOS = 50_000_000L;
    /** Re-checks before giving the files over to the next process that starts this path (about 13 s in all). */
    static final int DEAD_PEER_CHECKS = 8;

    /**
     * Deletes the files of peer {@code pid} once it is dead, not waiting for the next process to start this path: at
     * once when it is gone or a zombie (a killed child its parent has not reaped yet, whose pid still answers), else
     * again on the timer with backoff, as a link often closes before its killed peer has finished dying. A peer that
     * is still alive after the last check keeps its files (it deletes them at exit). Any thread.
     */
    static void removeFilesOfDeadProcess(Path dir, long pid) {
        removeFilesOfDeadProcess(dir, pid, DEAD_PEER_FIRST_CHECK_NANOS, DEAD_PEER_CHECKS);
    }

    private static void removeFilesOfDeadProcess(Path dir, long pid, long delay, int checksLeft) {
        if (isDead(pid)) {
            try (DirectoryStream<Path> stream = Files.newDirectoryStream(dir, filePrefix(pid) + "*")) {
                for (Path file : stream) {
                    deleteQuietly(file);
                }
            } catch (IOException | RuntimeException e) {
                // Nothing to clean, or not ours to list: the next process's sweep tries again.
            }
        } else if (checksLeft > 0) {
            SoftEngine.get().schedule(() -> removeFilesOfDeadProcess(dir, pid, delay * 2, checksLeft - 1), delay);
        }
    }

    /** Whether {@code pid} has exited: gone, or a zombie (state Z or X in /proc; it runs no code any more). */
    static boolean isDead(long pid) {
        if (ProcessHandle.of(pid).map(p -> !p.isAlive()).orElse(true)) {
            return true;
        }
        try {
            String stat = Files.readString(Paths.get("/proc/" + pid + "/stat"));
            int close = stat.lastIndexOf(')');
            char state = close >= 0 && close + 2 < stat.length() ? stat.charAt(close + 2) : '?';
            return state == 'Z' || state == 'X';
        } catch (IOException | RuntimeException e) {
            // Gone since the check above (the next check sees it), or no /proc: alive as far as we can tell.
            return false;
        }
    }

    private void deleteAll() {
        for (Mapping m : mappings.entries) {
            deleteQuietly(m.path());
        }
        fileLinks.deleteAll();
        SharedKeyTable t = keyTable;
        if (t != null) {
            deleteQuietly(t.file);
        }
    }

    /**
     * This process's key table, created on first use in the shared-memory directory, or {@code null} when it cannot
     * be (one WARN): peers then take the TCP path for everything.
     */
    SharedKeyTable keyTable() {
        SharedKeyTable t = keyTable;
        if (t != null) {
            return t;
        }
        synchronized (this) {
            if (keyTable == null && !keyTableFailed) {
                Path dir = directory;
                start(dir);
                try {
                    keyTable = SharedKeyTable.create(dir.resolve(filePrefix(pid) + "keys"));
                } catch (IOException | RuntimeException e) {
                    keyTableFailed = true;
                    SoftEngine.logger.warn("soft0: cannot create the shared key table in {} ({}): same-host peers "
                            + "will use TCP (fix the directory's space or permissions, or set -D{}=tcp)", dir,
                            e.toString(), SAME_HOST_PROPERTY);
                }
            }
            return keyTable;
        }
    }

    /**
     * Publishes a registration under {@code key} when its range lies in one of our shared files, or, for remote read
     * only, in a registered read-only file mapping ({@link MappedFileLinks}): peers can then reach it one-sided.
     * Anything else stays private and is served through the TCP path. Caller holds the engine's key lock. Allocates
     * nothing once the table exists (and a file mapping's link is made).
     */
    void publish(int key, int domain, int access, long address, long length) {
        if ((access & (Access.REMOTE_READ | Access.REMOTE_WRITE)) == 0) {
            return;
        }
        Mapping m = mappings.find(address, length);
        long number;
        long offset;
        long device = 0;
        long inode = 0;
        if (m != null) {
            number = m.number();
            offset = address - m.base();
        } else if ((access & Access.REMOTE_WRITE) == 0 && enabled()) {
            MappedFileLinks.Entry f = fileLinks.find(address, length);
            if (f == null) {
                return;
            }
            number = f.link.number;
            offset = f.fileOffset + (address - f.base);
            device = f.link.device;
            inode = f.link.inode;
        } else {
            return;
        }
        SharedKeyTable t = keyTable();
        if (t != null && !t.publish(key, domain, access, address, length, number, offset, device, inode)
                && fallbackLogged.compareAndSet(false, true)) {
            SoftEngine.logger.warn("soft0: the shared key table in {} cannot grow (no space left): regions registered "
                    + "from now on are reached by same-host peers through the TCP path (give the directory more space, "
                    + "choose another with -D{}, or set -D{}=tcp)", directory, DIRECTORY_PROPERTY, SAME_HOST_PROPERTY);
        }
    }

    /**
     * Withdraws {@code key} if it was published, waiting out peers' copies. Caller holds the engine's key lock.
     *
     * @return {@code false} when a peer held it too long: its slot must be retired ({@link SharedKeyTable#withdraw})
     */
    boolean withdraw(int key) {
        SharedKeyTable t = keyTable;
        return t == null || t.withdraw(key);
    }

    static void deleteQuietly(Path file) {
        try {
            Files.deleteIfExists(file);
        } catch (IOException e) {
            SoftEngine.logger.warn("soft0: cannot delete shared-memory file {} ({}); delete it by hand", file,
                    e.toString());
        }
    }

    /** One live file: its mapping's address and size, its number (the {@code <n>} of its name) and path. */
    record Mapping(long base, long size, long number, Path path) {
    }

    /** The live files at one moment, sorted by mapping address. Immutable. */
    static final class Mappings {
        final Mapping[] entries;

        Mappings(Mapping[] entries) {
            this.entries = entries;
        }

        /** The mapping that holds {@code [address, address + length)} whole, or {@code null}; allocates nothing. */
        Mapping find(long address, long length) {
            int lo = 0;
            int hi = entries.length - 1;
            while (lo <= hi) {
                int mid = (lo + hi) >>> 1;
                if (entries[mid].base <= address) {
                    lo = mid + 1;
                } else {
                    hi = mid - 1;
                }
            }
            // hi: the last mapping that starts at or before address.
            if (hi < 0) {
                return null;
            }
            Mapping m = entries[hi];
            return address - m.base <= m.size - length ? m : null;
        }

        Mappings with(Mapping added) {
            int at = 0;
            while (at < entries.length && entries[at].base < added.base) {
                at++;
            }
            Mapping[] r = new Mapping[entries.length + 1];
            System.arraycopy(entries, 0, r, 0, at);
            r[at] = added;
            System.arraycopy(entries, at, r, at + 1, entries.length - at);
            return new Mappings(r);
        }

        Mappings without(Mapping removed) {
            Mapping[] r = new Mapping[entries.length - 1];
            for (int k = 0, j = 0; k < entries.length; k++) {
                if (entries[k] != removed) {
                    r[j++] = entries[k];
                }
            }
            return new Mappings(r);
        }
    }
}
