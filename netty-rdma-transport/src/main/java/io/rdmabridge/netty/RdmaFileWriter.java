package io.rdmabridge.netty;

import io.netty.channel.DefaultFileRegion;
import io.rdmabridge.connection.FileChunkCache;
import io.rdmabridge.connection.RegisteredMemory;
import io.rdmabridge.verbs.RdmaException;

import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.channels.FileChannel;

/**
 * Sends {@link DefaultFileRegion}s from registered, memory-mapped chunks of the file ({@link FileChunkCache}): the
 * bytes go from the page cache to the device without a heap copy, by eager SEND below the rendezvous threshold and
 * by rendezvous above it. The chunks are registered for local access only: a rendezvous exposes just the bytes it
 * advertises ({@link io.rdmabridge.connection.RdmaConnection#sendRendezvous}), never the rest of the chunk, which
 * may hold other blocks of the file. Owned by the channel's event loop.
 */
final class RdmaFileWriter {
    /** Mapped chunks per channel: bounds the registered (pinned) file memory to 8 x 4 MiB. */
    static final int MAX_CHUNKS = 8;
    private static final VarHandle FILE;

    static {
        VarHandle file = null;
        try {
            // DefaultFileRegion keeps its FileChannel private; Netty's own native transports read it too.
            file = MethodHandles.privateLookupIn(DefaultFileRegion.class, MethodHandles.lookup())
                    .findVarHandle(DefaultFileRegion.class, "file", FileChannel.class);
        } catch (ReflectiveOperationException | RuntimeException e) {
            // Unusable: write() reports it per region.
        }
        FILE = file;
    }

    private final FileChunkCache cache;

    RdmaFileWriter(RegisteredMemory memory) {
        cache = new FileChunkCache(memory, MAX_CHUNKS);
    }

    /**
     * Posts the part of {@code region} from {@code offset} (relative to the region) on, by rendezvous where at least
     * {@code rendezvousThreshold} bytes of a chunk are left. @return whether all of it
     */
    boolean write(DefaultFileRegion region, long offset, Sink sink, int rendezvousThreshold) throws IOException {
        if (FILE == null) {
            throw new IOException("cannot read the FileChannel of DefaultFileRegion on this JDK/Netty version");
        }
        region.open();
        if (offset == 0) {
            cache.retireChunks();
        }
        FileChannel file = (FileChannel) FILE.get(region);
        long position = region.position() + offset;
        long end = region.position() + region.count();
        while (position < end) {
            if (!sink.canSend()) {
                return false;
            }
            FileChunkCache.Chunk chunk = cache.acquire(file, position, end);
            if (chunk == null) {
                sink.unspend();
                return false;
            }
            long inChunk = chunk.fileOffset() + chunk.length() - position;
            long left = Math.min(inChunk, end - position);
            boolean rendezvous = left >= rendezvousThreshold;
            int length = (int) Math.min(left, rendezvous ? sink.maxRendezvousLength() : sink.maxFramePayload());
            long address = chunk.address() + (position - chunk.fileOffset());
            sink.send(address, length, chunk, rendezvous);
            position += length;
        }
        cache.retireChunks();
        return true;
    }

    /** Chunks of files mapped (or copied) now. */
    int mappedChunks() {
        return cache.size();
    }

    void close() {
        cache.close();
    }

    /** Where file chunks are posted. */
    interface Sink {
        boolean canSend();

        void unspend();

        int maxFramePayload();

        int maxRendezvousLength();

        /** Posts {@code [address, address + length)} of {@code chunk}, which it now holds (released on failure). */
        void send(long address, int length, FileChunkCache.Chunk chunk, boolean rendezvous) throws RdmaException;
    }
}
