package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.WrOpcode;
import java.io.IOException;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The requester's side of the one-sided same-host path for one TCP link: it maps the peer's {@link SharedKeyTable}
 * and, on first use, each of the peer's shared memory files, and executes an RDMA WRITE or READ by checking the
 * peer's published key, bounds, access rights and queue pair, then copying once, straight between our registered
 * memory and the peer's. Whatever it cannot do that way (memory the peer could not share, a key or queue pair not
 * published, any value from the peer's table that does not add up) it declines, and the work request takes the TCP
 * path, where the peer's engine decides as before.
 *
 * <p>Threading: {@link #execute} runs on the link's single drainer; {@link #close()} may come from any thread and
 * unmaps only once no copy is under way. {@link #execute} takes no lock and allocates nothing once a file is mapped;
 * mapping a file the first time opens it.
 */
final class SharedPeer {
    /** How often a missing peer table is looked for again (the peer creates it with its first shared memory). */
    private static final long TABLE_RETRY_NANOS = 100_000_000L;

    private final Path directory;
    private final long peerPid;
    private final String filePrefix;
    private final AtomicInteger users = new AtomicInteger();
    private final AtomicBoolean unmapped = new AtomicBoolean();
    private volatile boolean closed;
    private SharedKeyTable table;
    private long tableRetryAt;
    // The peer's files mapped so far: number, mapping, its address and size; count entries used.
    private long[] numbers = new long[4];
    private MappedByteBuffer[] maps = new MappedByteBuffer[4];
    private long[] addresses = new long[4];
    private long[] sizes = new long[4];
    private int count;

    SharedPeer(Path directory, long peerPid) {
        this.directory = directory;
        this.peerPid = peerPid;
        filePrefix = SharedMemoryFiles.PREFIX + peerPid + '-';
    }

    /**
     * Executes send slot {@code i} of {@code q}, an RDMA WRITE or READ of at least one byte whose local entries were
     * checked, against the memory of the peer's queue pair {@code peerQpn}.
     *
     * @return whether it was done; {@code false}: nothing was touched, send it over the wire
     */
    boolean execute(SoftQueuePair q, int i, int peerQpn) {
        users.incrementAndGet();
        try {
            if (closed) {
                return false;
            }
            SharedKeyTable t = table();
            if (t == null) {
                return false;
            }
            int domain = t.queuePairDomain(peerQpn);
            if (domain < 0) {
                return false;
            }
            boolean read = q.sOpcode[i] == WrOpcode.RDMA_READ;
            int needed = read ? Access.REMOTE_READ : Access.REMOTE_WRITE;
            int len = q.sLength[i];
            long remote = q.sRemote[i];
            int e = t.acquire(q.sRkey[i]);
            if (e < 0) {
                return false;
            }
            try {
                // Each value read once into a local, then checked: the table is the peer's to write.
                long address = t.address(e);
                long length = t.length(e);
                long number = t.fileNumber(e);
                long offset = t.fileOffset(e);
                if (t.domain(e) != domain || (t.access(e) & needed) != needed || length < len || remote < address
                        || remote - address > length - len || offset < 0 || number <= 0) {
                    return false;
                }
                int f = file(number);
                if (f < 0) {
                    return false;
                }
                long at = offset + (remote - address);
                if (at < 0 || at > sizes[f] - len) {
                    return false;
                }
                long peerMemory = addresses[f] + at;
                if (read) {
                    q.scatterRead(i, 0, peerMemory, len);
                } else {
                    q.gather(i, 0, peerMemory, len);
                }
                return true;
            } finally {
                t.release(e);
            }
        } finally {
            if (users.decrementAndGet() == 0 && closed) {
                unmapAll();
            }
        }
    }

    private SharedKeyTable table() {
        SharedKeyTable t = table;
        if (t == null && System.nanoTime() - tableRetryAt >= 0) {
            t = SharedKeyTable.open(directory.resolve(filePrefix + "keys"));
            table = t;
            tableRetryAt = System.nanoTime() + TABLE_RETRY_NANOS;
        }
        return t;
    }

    /** The index of peer file {@code number}, mapped now if need be, or -1 when it cannot be mapped. */
    private int file(long number) {
        for (int k = 0; k < count; k++) {
            if (numbers[k] == number) {
                return k;
            }
        }
        // A new file: first let go of those the peer has deleted (their numbers never come back).
        int kept = 0;
        for (int k = 0; k < count; k++) {
            if (Files.exists(directory.resolve(filePrefix + numbers[k]))) {
                numbers[kept] = numbers[k];
                maps[kept] = maps[k];
                addresses[kept] = addresses[k];
                sizes[kept] = sizes[k];
                kept++;
            } else {
                DirectMemory.free(maps[k]);
            }
        }
        Arrays.fill(maps, kept, count, null);
        count = kept;
        MappedByteBuffer map;
        try (FileChannel ch = FileChannel.open(directory.resolve(filePrefix + number), StandardOpenOption.READ,
                StandardOpenOption.WRITE)) {
            long size = ch.size();
            if (size <= 0 || size > Integer.MAX_VALUE) {
                return -1;
            }
            map = ch.map(FileChannel.MapMode.READ_WRITE, 0, size);
        } catch (IOException | RuntimeException e) {
            return -1;
        }
        if (count == numbers.length) {
            numbers = Arrays.copyOf(numbers, count * 2);
            maps = Arrays.copyOf(maps, count * 2);
            addresses = Arrays.copyOf(addresses, count * 2);
            sizes = Arrays.copyOf(sizes, count * 2);
        }
        numbers[count] = number;
        maps[count] = map;
        addresses[count] = DirectMemory.address(map);
        sizes[count] = map.capacity();
        return count++;
    }

    /**
     * Unmaps everything once no copy is under way; any thread, idempotent. When the peer died (killed, so without
     * its shutdown hook), its files are deleted now rather than by the next process that starts this path.
     */
    void close() {
        closed = true;
        if (users.get() == 0) {
            unmapAll();
        }
        if (ProcessHandle.of(peerPid).map(p -> !p.isAlive()).orElse(true)) {
            SharedMemoryFiles.removeFilesOfDeadProcesses(directory, -1);
        }
    }

    private void unmapAll() {
        if (!unmapped.compareAndSet(false, true)) {
            return;
        }
        for (int k = 0; k < count; k++) {
            DirectMemory.free(maps[k]);
            maps[k] = null;
        }
        count = 0;
        SharedKeyTable t = table;
        if (t != null) {
            table = null;
            DirectMemory.free(t.mapping());
        }
    }
}
