package io.rdmabridge.verbs;

import java.nio.ByteBuffer;

/**
 * A protection domain ({@code ibv_pd}): memory regions and queue pairs of one domain may be used together only.
 * Thread-safe.
 */
public interface ProtectionDomain extends AutoCloseable {

    RdmaDevice device();

    /**
     * Registers {@code [address, address + length)} ({@code ibv_reg_mr}). The memory must stay allocated until the
     * region is closed; the caller owns that lifetime, as with hardware.
     *
     * @param access a combination of {@link Access} flags
     * @throws IllegalArgumentException when {@code length} is not in {@code 1..maxMrSize} or the flags are invalid
     * @throws RdmaException            when the device refuses (its message names the limit hit, e.g. memlock)
     */
    MemoryRegion register(long address, long length, int access) throws RdmaException;

    /**
     * Registers {@code [address, address + length)} as {@link #register(long, long, int)} does, and may hand back the
     * object of {@code closed} for it: a region of this domain that its owner closed and no longer uses anywhere.
     * For a registration per transfer (exposing exactly the bytes a peer may READ, for as long as it may): the soft
     * provider reuses the object, so that registering allocates nothing; the default, which the DiSNI provider
     * uses, registers a new region. The old keys stay dead either way.
     *
     * @param closed a closed region of this domain, or {@code null}
     * @throws IllegalArgumentException as {@link #register(long, long, int)}, or when {@code closed} is still open
     */
    default MemoryRegion registerReusing(MemoryRegion closed, long address, long length, int access)
            throws RdmaException {
        return register(address, length, access);
    }

    /**
     * Registers a read-only shared mapping of a file ({@link java.nio.channels.FileChannel#map} in
     * {@code READ_ONLY} mode), {@code [address, address + length)} mapping the file from {@code fileOffset}, for
     * local access, as {@code register(address, length, 0)} does. A device reaches the page cache pages the
     * registration pins; a provider that moves bytes in software may instead note which file the range maps, so that
     * a peer on the same host can read the file itself when a part of the range is later registered for remote read
     * (the soft provider's same-host path). The default, which the DiSNI provider uses, is
     * {@code register(address, length, 0)}. The mapping must stay in place until the region is closed.
     *
     * @throws IllegalArgumentException as {@link #register(long, long, int)}
     */
    default MemoryRegion registerFileMapping(long address, long length, long fileOffset) throws RdmaException {
        return register(address, length, 0);
    }

    /**
     * Registers the whole capacity of a direct buffer (position and limit are ignored).
     *
     * @throws IllegalArgumentException when the buffer is not direct, or is read-only and {@code access} asks for
     *         {@link Access#LOCAL_WRITE} or {@link Access#REMOTE_WRITE}
     */
    default MemoryRegion register(ByteBuffer directBuffer, int access) throws RdmaException {
        if (!directBuffer.isDirect()) {
            throw new IllegalArgumentException("buffer: heap ByteBuffer (expected: a direct ByteBuffer;"
                    + " RDMA can only register off-heap memory)");
        }
        if (directBuffer.isReadOnly() && (access & (Access.LOCAL_WRITE | Access.REMOTE_WRITE)) != 0) {
            // ibv_reg_mr refuses write access to a read-only mapping (EFAULT); a software provider would instead
            // fault when a receive or a peer's RDMA WRITE lands there, and take the process down.
            throw new IllegalArgumentException("buffer: read-only, but access " + Access.toString(access)
                    + " lets a receive or a peer write into it (expected: access without LOCAL_WRITE and REMOTE_WRITE"
                    + ", or a writable buffer)");
        }
        return register(DirectMemory.address(directBuffer), directBuffer.capacity(), access);
    }

    /**
     * Allocates {@code capacity} bytes of direct memory meant to be registered in this domain. A provider may place it
     * where a peer on the same host can reach it (the soft provider's shared-memory path); the default, which the
     * DiSNI provider uses, allocates plain direct memory. Free it with {@link #freeMemory(ByteBuffer)}, after its
     * regions are closed.
     *
     * @throws IllegalArgumentException when {@code capacity} is negative
     */
    default ByteBuffer allocateMemory(int capacity) {
        return ByteBuffer.allocateDirect(capacity);
    }

    /**
     * Gives back memory from {@link #allocateMemory(int)} (the buffer itself, not a slice or duplicate) at once,
     * rather than whenever the garbage collector gets to it; the buffer must not be used afterwards.
     */
    default void freeMemory(ByteBuffer memory) {
        DirectMemory.free(memory);
    }

    /**
     * Deallocates the domain ({@code ibv_dealloc_pd}).
     *
     * @throws IllegalStateException when memory regions or queue pairs of this domain are still alive
     */
    @Override
    void close();
}
