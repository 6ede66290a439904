package io.rdmabridge.spark;

import java.net.InetSocketAddress;
import org.apache.spark.network.shuffle.BlockFetchingListener;
import org.apache.spark.network.shuffle.BlockStoreClient;
import org.apache.spark.network.shuffle.DownloadFileManager;
import org.apache.spark.network.shuffle.checksum.Cause;

/**
 * The {@link BlockStoreClient} handed to Spark's fetch iterator: blocks of executors that run a block server are
 * fetched over the block transport, all others (and everything that is not a block fetch) through Spark's own client.
 * Thread-safe.
 */
final class RoutingBlockStoreClient extends BlockStoreClient {
    private final ShuffleBlockClient blockClient;
    private final BlockServerDirectory.Executor directory;
    private final BlockStoreClient sparkClient;
    private final RdmaShuffleMetrics metrics;

    RoutingBlockStoreClient(ShuffleBlockClient blockClient, BlockServerDirectory.Executor directory,
                            BlockStoreClient sparkClient, RdmaShuffleMetrics metrics) {
        this.blockClient = blockClient;
        this.directory = directory;
        this.sparkClient = sparkClient;
        this.metrics = metrics;
    }

    @Override
    public void fetchBlocks(String host, int port, String execId, String[] blockIds, BlockFetchingListener listener,
                            DownloadFileManager downloadFileManager) {
        InetSocketAddress server = directory.lookup(execId);
        if (server != null) {
            // Blocks arrive in the transport's receive buffers, never streamed to temporary files.
            blockClient.fetch(server, blockIds, listener);
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
