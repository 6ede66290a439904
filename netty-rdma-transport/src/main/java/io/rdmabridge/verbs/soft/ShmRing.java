package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.DirectMemory;
import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFileAttributes;
import java.nio.file.attribute.PosixFilePermission;
import java.util.Set;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * One direction of a same-host link's frame stream in shared memory: a single-producer, single-consumer byte ring in a
 * file of the writer's ({@code rdmabridge-soft-<pid namespace>-<pid>-<n>}, made and deleted by
 * {@link SharedMemoryFiles} like registered memory). The writer owns the file so that it can switch at once: it
 * creates the ring, names it in a {@link SoftFrame#RING} frame (its last frame on the socket) and writes on into the
 * ring, with no round trip; the reader maps the file when it processes that frame, so it reads the ring only after
 * every frame sent before it.
 *
 * <h2>Layout (native byte order)</h2>
 * A {@value #CONTROL}-byte control page, each field on a cache line of its own: {@code tail} (bytes the writer has
 * published, written by the writer), {@code head} (bytes the reader has consumed, written by the reader),
 * {@code readerParked} (the reader is about to block: publish, then send a {@link SoftFrame#DOORBELL}) and
 * {@code writerWaiting} (the writer found too little room: consume, then send one) and {@code readerWake} (where the
 * parked reader wants its wake-up: {@code 0} for a DOORBELL to its engine, else its network namespace and the UDP
 * port of its event loop's {@link io.rdmabridge.verbs.EventNotifier#loopbackWakePort() wake socket}, see
 * {@link #wakeAddress}; written before the flag). Then {@code capacity} bytes of
 * frames (a power of two). Head and tail are 64-bit counts that only grow; a frame starts at {@code counter &
 * (capacity - 1)}.
 *
 * <h2>Frames never wrap</h2>
 * A frame is a {@link SoftFrame} header and payload, whole and contiguous, so the reader executes it in place. When
 * the room before the end of the data area is too small for the next frame ({@link #MIN_ROOM}), the writer skips to
 * the start: the bytes up to the end are padding, marked by opcode {@link #PAD} in their first byte when they can hold
 * a header, and implied when they cannot (fewer than {@value SoftFrame#HEADER_LENGTH} bytes). Padding counts as
 * published bytes, so the reader accepts it only when the tail has passed the end of the data area.
 *
 * <h2>Ordering</h2>
 * Frame bytes are written before the tail is stored with release semantics, and read after it is loaded with
 * acquire; the same holds for the head and the space it frees. The park handshakes are Dekker-style: each side stores
 * (its counter, or its flag), then a full fence, then loads the other's; so of a writer that publishes and a reader
 * that parks, at least one sees the other, and no wake-up is lost. Flags are taken with an atomic get-and-set, so a
 * doorbell is sent after the flag it answers was cleared.
 *
 * <p>The peer can write anything at any time: the owner of each counter keeps a private copy and never reads its own
 * published value back, and callers validate what they read of the other's. A peer that truncates the file makes
 * accesses fault; JDK 17 turns such a fault into {@link InternalError}, which callers catch and turn into closing the
 * link. From compiled code HotSpot 17 raises it only at the thread's next safepoint or VM transition, which may lie in
 * other code (another link's); so the file stays open, and {@link #truncated()} tells which ring was cut. Not
 * thread-safe: one writer thread (the link's drainer) and one reader thread (the engine or a completion-queue poller,
 * see {@link TcpLink}) at a time.
 */
final class ShmRing {
    /** {@code false} keeps same-host links' frames on the socket (the one-sided path stays); read per connection. */
    static final String PROPERTY = "rdmabridge.soft.rings";
    static final int CONTROL = 4096;
    static final int TAIL = 0;
    static final int HEAD = 128;
    static final int READER_PARKED = 256;
    static final int WRITER_WAITING = 384;
    static final int READER_WAKE = 512;
    /** Data bytes of the rings this side creates: 16 of the largest frames. */
    static final int CAPACITY = 1 << 21;
    /** Overrides {@link #CAPACITY}: a power of two in {@link #MIN_CAPACITY}..{@link #MAX_CAPACITY}; per connection. */
    static final String CAPACITY_PROPERTY = "rdmabridge.soft.ringBytes";
    /** Capacities a peer may announce; the smallest still holds two of the largest frames. */
    static final int MIN_CAPACITY = 1 << 18;
    static final int MAX_CAPACITY = 1 << 26;
    /** Opcode byte of padding; never a frame's ({@link SoftFrame#SEND} is 1). */
    static final int PAD = 0;
    /**
     * Less room than this before the end is skipped: a data frame is cut to the room down to {@link TcpLink#MIN_CHUNK}
     * bytes, so a window of this size always takes the next frame, whatever it is.
     */
    static final int MIN_ROOM = SoftFrame.HEADER_LENGTH + TcpLink.MIN_CHUNK;
    /** The largest frame: with less free space than this the writer may be stuck, and asks for a doorbell. */
    static final int MAX_FRAME = SoftFrame.HEADER_LENGTH + SoftFrame.MAX_PAYLOAD;
    /** The inode of this process's network namespace ({@code /proc/self/ns/net}); {@code 0} when unknown. */
    static final long NET_NAMESPACE = netNamespace();

    private static final VarHandle INT = MethodHandles.byteBufferViewVarHandle(int[].class, ByteOrder.nativeOrder());
    private static final VarHandle LONG = MethodHandles.byteBufferViewVarHandle(long[].class, ByteOrder.nativeOrder());
    private static final AtomicBoolean CAPACITY_IGNORED_LOGGED = new AtomicBoolean();
    private static final Set<PosixFilePermission> OWNER_ONLY =
            Set.of(PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE);

    final MappedByteBuffer map;
    /** The file, open while mapped: its size (fstat) holds even once the name is gone. */
    private final FileChannel file;
    /** The {@code <n>} of the file's name. */
    final long number;
    final int capacity;
    final int mask;
    /** Address of the first data byte. */
    final long data;
    /** The data area as a buffer (position 0 = first data byte), the writer's window for encoding frames. */
    final ByteBuffer window;

    private ShmRing(MappedByteBuffer map, FileChannel file, long number, int capacity) {
        this.map = map;
        this.file = file;
        this.number = number;
        this.capacity = capacity;
        this.mask = capacity - 1;
        this.data = DirectMemory.address(map) + CONTROL;
        this.window = map.slice(CONTROL, capacity);
    }

    /** Whether {@value #PROPERTY} lets same-host links move their frames into rings (the default). */
    static boolean enabled() {
        return !"false".equalsIgnoreCase(System.getProperty(PROPERTY, "true").trim());
    }

    /**
     * A new ring in a file of ours; {@code writerHere} is the link that writes it when its peer is in this process (a
     * link between two queue pairs of this JVM over TCP), else null: only such a ring may be claimed by a RING frame
     * that names our pid, and never by its writer.
     *
     * @throws IOException naming the file and the cause when the shared-memory directory cannot hold it
     */
    static ShmRing create(SharedMemoryFiles files, int capacity, Object writerHere) throws IOException {
        SharedMemoryFiles.SharedFile f = files.create(CONTROL + capacity);
        if (writerHere != null) {
            files.ringCreated(f.number(), writerHere);
        }
        return new ShmRing(f.map(), f.channel(), f.number(), capacity);
    }

    /**
     * Data bytes of the next ring this side creates: {@value #CAPACITY_PROPERTY}, or {@link #CAPACITY} when it is
     * unset or invalid (logged once). Each same-host connection holds one ring per direction in shared memory; smaller
     * rings save memory, larger ones let a writer run further ahead of a busy reader.
     */
    static int configuredCapacity() {
        String value = System.getProperty(CAPACITY_PROPERTY);
        if (value == null) {
            return CAPACITY;
        }
        try {
            int capacity = Integer.parseInt(value.trim());
            if (validCapacity(capacity)) {
                return capacity;
            }
        } catch (NumberFormatException e) {
            // Logged below.
        }
        if (CAPACITY_IGNORED_LOGGED.compareAndSet(false, true)) {
            SoftEngine.logger.warn("soft0: -D{}={} ignored, rings keep {} bytes (expected: a power of two in {}..{})",
                    CAPACITY_PROPERTY, value, CAPACITY, MIN_CAPACITY, MAX_CAPACITY);
        }
        return CAPACITY;
    }

    /** Whether a peer may announce a ring of {@code capacity} data bytes. */
    static boolean validCapacity(int capacity) {
        return capacity >= MIN_CAPACITY && capacity <= MAX_CAPACITY && Integer.bitCount(capacity) == 1;
    }

    /**
     * Maps the peer's ring {@code number}: the file {@code rdmabridge-soft-<pid namespace>-<peerPid>-<number>} in
     * {@code directory} (the name is made here, so it lies under the peer's prefix with a numeric suffix), a regular
     * file, not a link, owner-only, of exactly {@link #CONTROL} + {@code capacity} bytes.
     */
    static ShmRing open(Path directory, long peerPid, long number, int capacity) throws IOException {
        if (number <= 0 || !validCapacity(capacity)) {
            throw new IOException("file number " + number + ", capacity " + capacity + " (expected: a number > 0, a "
                    + "power of two in " + MIN_CAPACITY + ".." + MAX_CAPACITY + ")");
        }
        Path file = directory.resolve(SharedMemoryFiles.filePrefix(peerPid) + number);
        FileChannel ch = FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE,
                LinkOption.NOFOLLOW_LINKS);
        try {
            PosixFileAttributes a = Files.readAttributes(file, PosixFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
            if (!a.isRegularFile() || !OWNER_ONLY.equals(a.permissions())) {
                throw new IOException(file + " is not an owner-only regular file");
            }
            long size = ch.size();
            if (size != (long) CONTROL + capacity) {
                throw new IOException(file + " has " + size + " bytes (expected: " + ((long) CONTROL + capacity) + ")");
            }
            return new ShmRing(ch.map(FileChannel.MapMode.READ_WRITE, 0, size), ch, number, capacity);
        } catch (IOException | RuntimeException e) {
            ch.close();
            throw e;
        }
    }

    /** Whether the file is now shorter than the mapping (someone truncated it: accesses fault); any thread. */
    boolean truncated() {
        try {
            return file.size() < (long) CONTROL + capacity;
        } catch (IOException e) {
            return false; // closed: released, not cut
        }
    }

    /** Closes the file; the caller unmaps or frees the mapping. */
    void closeFile() {
        try {
            file.close();
        } catch (IOException e) {
            // Released either way.
        }
    }

    long tail() {
        return (long) LONG.getAcquire(map, TAIL);
    }

    void publishTail(long tail) {
        LONG.setRelease(map, TAIL, tail);
    }

    long head() {
        return (long) LONG.getAcquire(map, HEAD);
    }

    void publishHead(long head) {
        LONG.setRelease(map, HEAD, head);
    }

    void readerParked(boolean parked) {
        INT.setVolatile(map, READER_PARKED, parked ? 1 : 0);
    }

    boolean isReaderParked() {
        return (int) INT.getVolatile(map, READER_PARKED) != 0;
    }

    /** Where the reader wants its wake-up ({@link #wakeAddress}); stored before {@link #readerParked}. */
    void readerWake(long wake) {
        LONG.setRelease(map, READER_WAKE, wake);
    }

    /** The peer's {@link #readerWake}, to read after taking its parked flag; untrusted ({@link #wakePort}). */
    long readerWake() {
        return (long) LONG.getAcquire(map, READER_WAKE);
    }

    /**
     * A {@code readerWake} value naming a UDP port on this network namespace's loopback address, or {@code 0} (a
     * DOORBELL to the engine) when there is no port or the namespace is unknown.
     */
    static long wakeAddress(int port) {
        return port <= 0 || port > 0xFFFF || NET_NAMESPACE == 0 ? 0 : NET_NAMESPACE << 16 | port;
    }

    /**
     * The port a peer's {@code readerWake} names, or {@code 0} (send a DOORBELL instead) when it names none, or one in
     * another network namespace, where our loopback address would reach someone else.
     */
    static int wakePort(long wake) {
        int port = (int) (wake & 0xFFFF);
        return NET_NAMESPACE != 0 && wake >>> 16 == NET_NAMESPACE ? port : 0;
    }

    private static long netNamespace() {
        try {
            // "net:[4026531840]"
            String link = Files.readSymbolicLink(Paths.get("/proc/self/ns/net")).toString();
            int open = link.indexOf('[');
            long inode = Long.parseLong(link.substring(open + 1, link.length() - 1));
            return inode > 0 && inode < 1L << 47 ? inode : 0;
        } catch (IOException | RuntimeException e) {
            return 0;
        }
    }

    /** Clears the reader's parked flag; whether it was set. */
    boolean takeReaderParked() {
        return (int) INT.getAndSet(map, READER_PARKED, 0) != 0;
    }

    void writerWaiting() {
        INT.setVolatile(map, WRITER_WAITING, 1);
    }

    /** Clears the writer's waiting flag; whether it was set. */
    boolean takeWriterWaiting() {
        return (int) INT.getAndSet(map, WRITER_WAITING, 0) != 0;
    }

    /** Marks the bytes from {@code offset} to the end of the data area as padding (when a header fits there). */
    void pad(int offset) {
        if (capacity - offset >= SoftFrame.HEADER_LENGTH) {
            // Through the whole mapping, not the window: the writer's last window may have ended at this offset
            // (it filled the free space to the byte), and the window's absolute put checks its limit.
            map.put(CONTROL + offset, (byte) PAD);
        }
    }

    /** Between publishing and checking the other side's flag, on both sides of a park handshake. */
    static void fence() {
        VarHandle.fullFence();
    }
}
