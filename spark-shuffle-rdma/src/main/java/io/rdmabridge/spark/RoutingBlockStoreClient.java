package io.rdmabridge.spark;

import java.net.InetSocketAddress;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.apache.spark.network.shuffle.BlockFetchingListener;
import org.apache.spark.network.shuffle.BlockStoreClient;
import org.apache.spark.network.shuffle.DownloadFileManager;
import org.apache.spark.network.shuffle.checksum.Cause;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The {@link BlockStoreClient} handed to Spark's fetch iterator: blocks of executors that run a block server are
 * fetched over the block transport, all others (and everything that is not a block fetch) through Spark's own client.
 * So are requests Spark wants streamed to disk (it passes a {@link DownloadFileManager} for requests larger than
 * {@code spark.network.maxRemoteBlockSizeFetchToMem}): the block transport receives into memory, and a large
 * skewed block held there would escape the memory bound Spark keeps with that setting.
 *
 * <p>With the external shuffle service ({@code spark.shuffle.service.enabled}), map outputs outlive their executor:
 * Spark keeps them and fetches them from the service on the executor's host. So when an executor's block server cannot
 * be reached (the executor is gone, as dynamic allocation removes idle ones), its blocks are fetched from the service
 * through Spark's client, as without this plugin, and the server is looked up afresh next time. Without the service,
 * such blocks are lost with their executor: the fetch fails and Spark recomputes them. Thread-safe.
 */
final class RoutingBlockStoreClient extends BlockStoreClient {
    private static final Logger LOG = LoggerFactory.getLogger(RoutingBlockStoreClient.class);

    /** Where each executor's block server is. */
    interface BlockServers {
        /** The block server of executor {@code executorId}, or {@code null} when it runs none. */
        InetSocketAddress lookup(String executorId);

        /** Executor {@code executorId}'s block server could not be reached: ask again next time. */
        void forget(String executorId);
    }

    private final ShuffleBlockClient blockClient;
    private final BlockServers blockServers;
    private final BlockStoreClient sparkClient;
    private final boolean externalShuffleService;
    private final RdmaShuffleMetrics metrics;
    /** Where fetches of unreachable servers go on to Spark's client; threads end when idle for a minute. */
    private final ExecutorService fallbackThreads = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "rdma-shuffle-fallback");
        t.setDaemon(true);
        return t;
    });

    /**
     * @param externalShuffleService whether Spark's client reaches an external shuffle service, which serves the
     *        blocks of executors that are gone
     */
    RoutingBlockStoreClient(ShuffleBlockClient blockClient, BlockServers blockServers, BlockStoreClient sparkClient,
                            boolean externalShuffleService, RdmaShuffleMetrics metrics) {
        this.blockClient = blockClient;
        this.blockServers = blockServers;
        this.sparkClient = sparkClient;
        this.externalShuffleService = externalShuffleService;
        this.metrics = metrics;
    }

    @Override
    public void fetchBlocks(String host, int port, String execId, String[] blockIds, BlockFetchingListener listener,
                            DownloadFileManager downloadFileManager) {
        InetSocketAddress server = downloadFileManager == null ? blockServers.lookup(execId) : null;
        if (server == null) {
            metrics.blocksFetchedByFallback.inc(blockIds.length);
            sparkClient.fetchBlocks(host, port, execId, blockIds, listener, downloadFileManager);
            return;
        }
        // Blocks arrive in the transport's receive buffers, never streamed to temporary files.
        blockClient.fetch(execId, server, blockIds, listener, unreachable -> {
            blockServers.forget(execId);
            if (!externalShuffleService) {
                return false;
            }
            LOG.info("{}; fetching {} blocks of executor {} from the external shuffle service at {}:{} instead",
                    unreachable.getMessage(), blockIds.length, execId, host, port);
            metrics.blocksFetchedByFallback.inc(blockIds.length);
            // Not on the transport's event loop, which called this: Spark's client connects blocking.
            fallbackThreads.execute(() -> sparkClient.fetchBlocks(host, port, execId, blockIds, listener, null));
            return true;
        });
    }

    @Override
    public Cause diagnoseCorruption(String host, int port, String execId, int shuffleId, long mapId, int reduceId,
                                    long checksum, String algorithm) {
        return sparkClient.diagnoseCorruption(host, port, execId, shuffleId, mapId, reduceId, checksum, algorithm);
    }

    /** Stops the fallback threads; both clients belong to others (the executor's transport, Spark's block manager). */
    @Override
    public void close() {
        fallbackThreads.shutdown();
    }
}
