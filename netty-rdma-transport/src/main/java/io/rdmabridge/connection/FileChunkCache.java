package io.rdmabridge.connection;

import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.MemoryRegion;

import java.io.IOException;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.util.ArrayList;
import java.util.List;

/**
 * Registered, memory-mapped chunks of files, so file bytes go to the device without passing through the heap (or
 * any copy). Chunks are {@link #CHUNK_SIZE} bytes of a file at aligned offsets, mapped privately and registered
 * without write access (the device reads them; on Linux before 6.2 registering copies each page once); at most
 * {@code maxChunks} are mapped at once. A chunk in use by posted work is never unmapped; when all are in use,
 * {@link #acquire} answers {@code null} and the caller waits for completions.
 *
 * <p>Owned by one thread (a channel's event loop). Acquiring an already-mapped chunk allocates nothing.
 */
public final class FileChunkCache implements AutoCloseable {
    public static final int CHUNK_SIZE = 4 * 1024 * 1024;

    private final RegisteredMemory memory;
    private final int maxChunks;
    private final List<Chunk> chunks = new ArrayList<>();
    private boolean closed;

    public FileChunkCache(RegisteredMemory memory, int maxChunks) {
        if (maxChunks < 1) {
            throw new IllegalArgumentException("maxChunks: " + maxChunks + " (expected: > 0)");
        }
        this.memory = memory;
        this.maxChunks = maxChunks;
    }

    /**
     * The registered chunk holding {@code file[offset]}, with one more user; give it back with
     * {@link Chunk#release()}.
     *
     * @return {@code null} when every chunk slot is in use
     */
    public Chunk acquire(FileChannel file, long offset) throws IOException {
        long index = offset / CHUNK_SIZE;
        for (int i = 0; i < chunks.size(); i++) {
            Chunk c = chunks.get(i);
            if (c.file == file && c.index == index) {
                c.users++;
                return c;
            }
        }
        if (chunks.size() >= maxChunks && !evictOne()) {
            return null;
        }
        long start = index * CHUNK_SIZE;
        long size = file.size();
        if (offset >= size) {
            throw new IOException("file offset " + offset + " is beyond the end of the file (" + size
                    + " bytes); was it truncated while being sent?");
        }
        int length = (int) Math.min(CHUNK_SIZE, size - start);
        // A private mapping, not a read-only shared one: Linux before 6.2 pins every region it registers for
        // writing, and refuses a read-only shared mapping with EFAULT (seen on rxe, Linux 6.1: "Bad address"). There
        // the pin copies each page once (copy on write), so a registered chunk costs its size in memory; later
        // kernels pin the page cache itself. Nothing writes the mapping either way.
        MappedByteBuffer map = file.map(FileChannel.MapMode.PRIVATE, start, length);
        MemoryRegion mr = memory.registerReadOnly(DirectMemory.address(map), length);
        Chunk c = new Chunk(file, index, start, length, map, mr);
        c.users = 1;
        chunks.add(c);
        return c;
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
        private int users;
        private boolean unmapped;

        Chunk(FileChannel file, long index, long fileOffset, int length, MappedByteBuffer map, MemoryRegion mr) {
            this.file = file;
            this.index = index;
            this.fileOffset = fileOffset;
            this.length = length;
            this.map = map;
            this.mr = mr;
        }

        /** File offset of the chunk's first byte. */
        public long fileOffset() {
            return fileOffset;
        }

        public int length() {
            return length;
        }

        public long address() {
            return mr.address();
        }

        public MemoryRegion memoryRegion() {
            return mr;
        }

        /** One user is done (its work request completed or was dropped). */
        public void release() {
            if (--users == 0 && closed) {
                chunks.remove(this);
                unmap();
            }
        }

        void unmap() {
            if (!unmapped) {
                unmapped = true;
                memory.deregister(mr);
                DirectBuffers.free(map);
            }
        }
    }
}
