package io.rdmabridge.verbs;

/**
 * A registered memory region ({@code ibv_mr}). Its keys are valid until {@link #close()}; a peer that uses the
 * rkey afterwards gets {@link WcStatus#REM_ACCESS_ERR}. Thread-safe.
 */
public interface MemoryRegion extends AutoCloseable {

    ProtectionDomain protectionDomain();

    long address();

    long length();

    /** Key for local scatter/gather entries. */
    int lkey();

    /**
     * Key a peer names in RDMA READ and WRITE. Meaningful only for a region registered with
     * {@link Access#REMOTE_READ} or {@link Access#REMOTE_WRITE}: without them devices differ (rxe and the soft
     * provider answer 0, mlx5 the lkey's value), and no device lets a peer use it. Not a secret (devices build it
     * from a table index and a few varying bits), and valid for every queue pair of the protection domain over the
     * whole region until {@link #close()}: limit what is registered with remote access, and for how long.
     */
    int rkey();

    /** The {@link Access} flags it was registered with. */
    int access();

    /** Whether {@code [address, address + length)} lies inside this region. */
    default boolean contains(long address, long length) {
        return length >= 0 && address >= address() && address - address() <= length() - length;
    }

    /**
     * Deregisters ({@code ibv_dereg_mr}); idempotent. Once it returns, no peer's RDMA READ or WRITE touches the
     * memory. Deregister memory that local work requests still use (a posted receive, a SEND not yet complete) only
     * after destroying their queue pair: a device then fails those work requests, while the soft provider may still
     * complete a copy into or out of the memory that had begun.
     */
    @Override
    void close();
}
