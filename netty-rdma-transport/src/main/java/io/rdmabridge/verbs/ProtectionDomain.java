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
     * Registers the whole capacity of a direct buffer (position and limit are ignored).
     *
     * @throws IllegalArgumentException when the buffer is not direct
     */
    default MemoryRegion register(ByteBuffer directBuffer, int access) throws RdmaException {
        if (!directBuffer.isDirect()) {
            throw new IllegalArgumentException("buffer: heap ByteBuffer (expected: a direct ByteBuffer;"
                    + " RDMA can only register off-heap memory)");
        }
        return register(DirectMemory.address(directBuffer), directBuffer.capacity(), access);
    }

    /**
     * Deallocates the domain ({@code ibv_dealloc_pd}).
     *
     * @throws IllegalStateException when memory regions or queue pairs of this domain are still alive
     */
    @Override
    void close();
}
