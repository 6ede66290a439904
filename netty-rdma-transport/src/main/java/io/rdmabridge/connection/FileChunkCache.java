package io.rdmabridge.connection;

import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.RdmaException;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Registered, memory-mapped chunks of files, so file bytes go to the device without passing through the heap (or
 * any copy). Chunks lie within {@link #CHUNK_SIZE}-byte pieces of a file at aligned offsets and hold only the pages
 * the region being sent needs there (registering pins every page, and reads it from disk if it is not cached, so a
 * small region pins a page or two, not the whole piece). They are mapped read-only and registered without write
 * access; where the kernel refuses that (Linux before 6.2), each chunk is read into registered memory instead (one
 * copy per byte, {@link Chunk#isCopy()}); at most {@code maxChunks} are mapped at once. A chunk in use by posted
 * work is never unmapped; when all are in use, {@link #acquire} answers {@code null} and the caller waits for
 * completions. A file that grew since its last chunk was mapped (a log being appended to) gets that chunk mapped again
 * for the bytes past its old end.
 *
 * <p>Chunks are shared by the parts of one file region, not across regions ({@link #retireChunks()}): the file may
 * have changed in between. A copy keeps the bytes it read, and a device's registration pins the pages it found, which
 * a truncation detaches from the file; a socket would send what the file holds when the region is written.
 *
 * <p>Owned by one thread (a channel's event loop). Acquiring an already-mapped chunk allocates nothing.
 */
public final class FileChunkCache implements AutoCloseable {
    private static final Logger logger = LoggerFactory.getLogger(FileChunkCache.class);
    private static final AtomicBoolean REFUSAL_LOGGED = new AtomicBoolean();
    public static final int CHUNK_SIZE = 4 * 1024 * 1024;
    private static final int PAGE_SIZE = 4096;

    private final RegisteredMemory memory;
    private final int maxChunks;
    private final List<Chunk> chunks = new ArrayList<>();
    private boolean closed;
    private boolean mappingRefused;

    public FileChunkCache(RegisteredMemory memory, int maxChunks) {
        if (maxChunks < 1) {
            throw new IllegalArgumentException("maxChunks: " + maxChunks + " (expected: > 0)");
        }
        this.memory = memory;
        this.maxChunks = maxChunks;
    }

    /**
     * The registered chunk holding {@code file[offset]}, with one more user; give it back with
     * {@link Chunk#release()}. A new chunk holds the pages of {@code [offset, end)} within the piece of the file
     * {@code offset} lies in.
     *
     * @param end the end of the region being sent (exclusive), past {@code offset}
     * @return {@code null} when every chunk slot is in use
     */
    public Chunk acquire(FileChannel file, long offset, long end) throws IOException {
        long index = offset / CHUNK_SIZE;
        for (int i = 0; i < chunks.size(); i++) {
            Chunk c = chunks.get(i);
            if (c.file == file && c.index == index && !c.retired && offset >= c.fileOffset) {
                if (offset < c.fileOffset + c.length) {
                    c.users++;
                    return c;
                }
                // The file grew past the chunk since it was mapped (a log appended to): it is mapped again below.
                if (c.users == 0) {
                    chunks.remove(i--);
                    c.unmap();
                }
            }
        }
        if (chunks.size() >= maxChunks && !evictOne()) {
            return null;
        }
        long pieceStart = index * CHUNK_SIZE;
        long size = file.size();
        if (offset >= size) {
            throw new IOException("file offset " + offset + " is beyond the end of the file (" + size
                    + " bytes); was it truncated while being sent?");
        }
        long pieceEnd = Math.min(pieceStart + CHUNK_SIZE, size);
        long start = Math.max(pieceStart, offset - offset % PAGE_SIZE);
        long regionEnd = Math.max(end, offset + 1);
        int length = (int) (Math.min(pieceEnd, regionEnd + (PAGE_SIZE - regionEnd % PAGE_SIZE) % PAGE_SIZE) - start);
        Chunk c = mappingRefused ? copy(file, index, start, length) : map(file, index, start, length);
        c.users = 1;
        chunks.add(c);
        return c;
    }

    private Chunk map(FileChannel file, long index, long start, int length) throws IOException {
        MappedByteBuffer map = file.map(FileChannel.MapMode.READ_ONLY, start, length);
        MemoryRegion mr;
        try {
            mr = memory.registerFileMapping(DirectMemory.address(map), length, start);
        } catch (RdmaException e) {
            // Linux before 6.2 pins every page it registers for writing and so refuses a read-only shared mapping
            // (EFAULT; rxe on Linux 6.1 says "Bad address"). A private mapping needs a writable FileChannel, which
            // a file region does not have: read the chunk into registered memory instead, from now on.
            DirectMemory.free(map);
            mappingRefused = true;
            if (REFUSAL_LOGGED.compareAndSet(false, true)) {
                logger.info("Registering a read-only mapping of a file failed ({}): file regions are read into"
                        + " registered memory instead, one copy per byte; Linux 6.2 or later registers the page"
                        + " cache itself", e.getMessage());
            }
            return copy(file, index, start, length);
        } catch (RuntimeException e) {
            DirectMemory.free(map);
            throw e;
        }
        return new Chunk(file, index, start, length, map, mr, null);
    }

    private Chunk copy(FileChannel file, long index, long start, int length) throws IOException {
        RegisteredMemory.Block block = memory.allocate(length);
        try {
            ByteBuffer into = block.buffer().duplicate().clear().limit(length);
            while (into.hasRemaining()) {
                if (file.read(into, start + into.position()) < 0) {
                    throw new IOException("file ended at offset " + (start + into.position()) + " while reading "
                            + length + " bytes from " + start + "; was it truncated while being sent?");
                }
            }
        } catch (IOException | RuntimeException e) {
            block.free();
            throw e;
        }
        return new Chunk(file, index, start, length, null, block.memoryRegion(), block);
    }

    /** Whether chunks are read into registered memory (the kernel refused to register a file mapping). */
    public boolean isCopying() {
        return mappingRefused;
    }

    private boolean evictOne() {
        for (int i = 0; i < chunks.size(); i++) {
            Chunk c = chunks.get(i);
            if (c.users == 0) {
                chunks.remove(i);
                c.unmap();
                return true;
            }
        }
        return false;
    }

    /**
     * No later file region uses the chunks mapped or copied so far (the file may change in between): idle ones are
     * unmapped now, busy ones once their last user releases them. For a region that starts, and one posted whole,
     * so that a connection left idle after a transfer keeps no file pages pinned.
     */
    public void retireChunks() {
        for (int i = chunks.size() - 1; i >= 0; i--) {
            Chunk c = chunks.get(i);
            if (c.users == 0) {
                chunks.remove(i);
                c.unmap();
            } else {
                c.retired = true;
            }
        }
    }

    /** Chunks currently mapped. */
    public int size() {
        return chunks.size();
    }

    /** Unmaps every idle chunk now and each busy one when it is released. Idempotent. */
    @Override
    public void close() {
        closed = true;
        for (int i = chunks.size() - 1; i >= 0; i--) {
            Chunk c = chunks.get(i);
            if (c.users == 0) {
                chunks.remove(i);
                c.unmap();
            }
        }
    }

    /** One registered, mapped piece of a file. */
    public final class Chunk {
        final FileChannel file;
        final long index;
        private final long fileOffset;
        private final int length;
        private final MappedByteBuffer map;
        private final MemoryRegion mr;
        private final RegisteredMemory.Block copy;
        private int users;
        private boolean retired;
        private boolean unmapped;

        Chunk(FileChannel file, long index, long fileOffset, int length, MappedByteBuffer map, MemoryRegion mr,
              RegisteredMemory.Block copy) {
            this.file = file;
            this.index = index;
            this.fileOffset = fileOffset;
            this.length = length;
            this.map = map;
            this.mr = mr;
            this.copy = copy;
        }

        /** File offset of the chunk's first byte. */
        public long fileOffset() {
            return fileOffset;
        }

        public int length() {
            return length;
        }

        public long address() {
            return copy != null ? copy.address() : mr.address();
        }

        /** Whether the chunk's bytes were read into registered memory (one copy) rather than mapped. */
        public boolean isCopy() {
            return copy != null;
        }

        public MemoryRegion memoryRegion() {
            return mr;
        }

        /** One user is done (its work request completed or was dropped). */
        public void release() {
            if (--users == 0 && (closed || retired)) {
                chunks.remove(this);
                unmap();
            }
        }

        void unmap() {
            if (!unmapped) {
                unmapped = true;
                if (copy != null) {
                    copy.free();
                } else {
                    memory.deregister(mr);
                    DirectMemory.free(map);
                }
            }
        }
    }
}
