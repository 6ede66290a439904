package io.rdmabridge.spark;

import org.apache.spark.network.buffer.ManagedBuffer;

/** Where the block server finds the bytes of a block it was asked for. Implementations are thread-safe. */
@FunctionalInterface
interface BlockSource {
    /**
     * The block called {@code blockId}, owned by the caller (who releases it).
     *
     * @throws Exception whose message names the cause; it is sent to the peer as the block's failure
     */
    ManagedBuffer open(String blockId) throws Exception;
}
