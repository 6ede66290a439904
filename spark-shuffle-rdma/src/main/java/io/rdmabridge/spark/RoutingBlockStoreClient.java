package io.rdmabridge.spark;

import java.net.InetSocketAddress;
import java.util.function.Function;
import org.apache.spark.network.shuffle.BlockFetchingListener;
import org.apache.spark.network.shuffle.BlockStoreClient;
import org.apache.spark.network.shuffle.DownloadFileManager;
import org.apache.spark.network.shuffle.checksum.Cause;

/**
 * The {@link BlockStoreClient} handed to Spark's fetch iterator: blocks of executors that run a block server are
 * fetched over the block transport, all others (and everything that is not a block fetch) through Spark's own client.
 * So are requests Spark wants streamed to disk (it passes a {@link DownloadFileManager} for requests larger than
 * {@code spark.network.maxRemoteBlockSizeFetchToMem}): the block transport receives into memory, and a large
 * skewed block held there would escape the memory bound Spark keeps with that setting. Thread-safe.
 */
final class RoutingBlockStoreClient extends BlockStoreClient {
    private final ShuffleBlockClient blockClient;
    private final Function<String, InetSocketAddress> blockServerOf;
    private final BlockStoreClient sparkClient;
    private final RdmaShuffleMetrics metrics;

    /** {@code blockServerOf} maps an executor id to its block server's address, or {@code null} when it runs none. */
    RoutingBlockStoreClient(ShuffleBlockClient blockClient, Function<String, InetSocketAddress> blockServerOf,
                            BlockStoreClient sparkClient, RdmaShuffleMetrics metrics) {
        this.blockClient = blockClient;
        this.blockServerOf = blockServerOf;
        this.sparkClient = sparkClient;
        this.metrics = metrics;
    }

    @Override
    public void fetchBlocks(String host, int port, String execId, String[] blockIds, BlockFetchingListener listener,
                            DownloadFileManager downloadFileManager) {
        InetSocketAddress server = downloadFileManager == null ? blockServerOf.apply(execId) : null;
        if (server != null) {
            // Blocks arrive in the transport's receive buffers, never streamed to temporary files.
            blockClient.fetch(execId, server, blockIds, listener);
        } else {
            metrics.blocksFetchedByFallback.inc(blockIds.length);
            sparkClient.fetchBlocks(host, port, execId, blockIds, listener, downloadFileManager);
        }
    }

    @Override
    public Cause diagnoseCorruption(String host, int port, String execId, int shuffleId, long mapId, int reduceId,
                                    long checksum, String algorithm) {
        return sparkClient.diagnoseCorruption(host, port, execId, shuffleId, mapId, reduceId, checksum, algorithm);
    }

    @Override
    public void close() {
        // Both clients belong to others: the executor's transport and Spark's block manager.
    }
}
