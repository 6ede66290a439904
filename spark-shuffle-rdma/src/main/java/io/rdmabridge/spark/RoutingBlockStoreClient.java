package io.rdmabridge.spark;

import java.net.InetSocketAddress;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import org.apache.spark.SparkConf;
import org.apache.spark.network.shuffle.BlockFetchingListener;
import org.apache.spark.network.shuffle.BlockStoreClient;
import org.apache.spark.network.shuffle.DownloadFileManager;
import org.apache.spark.network.shuffle.RetryingBlockTransferor;
import org.apache.spark.network.shuffle.checksum.Cause;
import org.apache.spark.network.util.MapConfigProvider;
import org.apache.spark.network.util.TransportConf;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The {@link BlockStoreClient} handed to Spark's fetch iterator: blocks of executors that run a block server are
 * fetched over the block transport, all others (and everything that is not a block fetch) through Spark's own client.
 * So are requests Spark wants streamed to disk (it passes a {@link DownloadFileManager} for requests larger than
 * {@code spark.network.maxRemoteBlockSizeFetchToMem}): the block transport receives into memory, and a large
 * skewed block held there would escape the memory bound Spark keeps with that setting.
 *
 * <p>A fetch over the block transport that fails with an {@link java.io.IOException} (the connection could not be made,
 * broke, or timed out) is retried as Spark retries its own transport's fetches: by Spark's
 * {@link RetryingBlockTransferor}, for the blocks not yet received, up to {@code spark.shuffle.io.maxRetries} times
 * {@code spark.shuffle.io.retryWait} apart. A block the server reports it cannot serve is not retried.
 *
 * <p>With the external shuffle service ({@code spark.shuffle.service.enabled}), map outputs outlive their executor:
 * Spark keeps them and fetches them from the service on the executor's host. So when an executor's block server cannot
 * be reached (the executor is gone, as dynamic allocation removes idle ones), its blocks are fetched from the service
 * through Spark's client, as without this plugin, and the server is looked up afresh next time. Without the service,
 * such blocks are lost with their executor: the fetch fails and Spark recomputes them. A block server that is alive but
 * refuses the connection (it holds {@code spark.shuffle.rdma.maxConnections}, or this host's share of them) has its
 * blocks fetched through Spark's client too, with or without the service: from the service, or from the executor's
 * own Spark transport, which every executor runs. Thread-safe.
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
    private final TransportConf retryConf;
    private final boolean externalShuffleService;
    private final RdmaShuffleMetrics metrics;
    /** Where fetches of unreachable servers go on to Spark's client; threads end when idle for a minute. */
    private final ExecutorService fallbackThreads = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "rdma-shuffle-fallback");
        t.setDaemon(true);
        return t;
    });

    /**
     * @param retryConf Spark's shuffle transport settings ({@code spark.shuffle.io.maxRetries},
     *        {@code spark.shuffle.io.retryWait}), for the retries of failed fetches
     * @param externalShuffleService whether Spark's client reaches an external shuffle service, which serves the
     *        blocks of executors that are gone
     */
    RoutingBlockStoreClient(ShuffleBlockClient blockClient, BlockServers blockServers, BlockStoreClient sparkClient,
                            TransportConf retryConf, boolean externalShuffleService, RdmaShuffleMetrics metrics) {
        this.blockClient = blockClient;
        this.blockServers = blockServers;
        this.sparkClient = sparkClient;
        this.retryConf = retryConf;
        this.externalShuffleService = externalShuffleService;
        this.metrics = metrics;
    }

    /** Spark's settings of the {@code shuffle} transport module, read from {@code conf} as Spark reads them. */
    static TransportConf shuffleTransportConf(SparkConf conf) {
        Map<String, String> settings = new HashMap<>();
        for (scala.Tuple2<String, String> entry : conf.getAll()) {
            settings.put(entry._1(), entry._2());
        }
        return new TransportConf("shuffle", new MapConfigProvider(settings));
    }

    @Override
    public void fetchBlocks(String host, int port, String execId, String[] blockIds, BlockFetchingListener listener,
                            DownloadFileManager downloadFileManager) {
        InetSocketAddress server = downloadFileManager == null ? lookup(execId) : null;
        if (server == null) {
            metrics.blocksFetchedByFallback.inc(blockIds.length);
            sparkClient.fetchBlocks(host, port, execId, blockIds, listener, downloadFileManager);
            return;
        }
        // Blocks arrive in the transport's receive buffers, never streamed to temporary files.
        RetryingBlockTransferor.BlockTransferStarter starter = (ids, attemptListener) ->
                fetch(host, port, execId, server, ids, (BlockFetchingListener) attemptListener, listener);
        if (retryConf.maxIORetries() > 0) {
            new RetryingBlockTransferor(retryConf, starter, blockIds, listener).start();
        } else {
            fetch(host, port, execId, server, blockIds, listener, listener);
        }
    }

    /**
     * Executor {@code execId}'s block server, or {@code null} when it runs none or the driver cannot say (its lookup
     * timed out or failed): the executor's blocks are then fetched through Spark's own transport, which every executor
     * runs, rather than the failure thrown into Spark's fetch iterator, where it would fail the task itself instead of
     * its fetches (Spark's own {@code fetchBlocks} reports every failure to the listener). The next fetch asks again.
     */
    private InetSocketAddress lookup(String execId) {
        try {
            return blockServers.lookup(execId);
        } catch (Exception e) {
            // Checked ones too: Spark's ask throws its RpcTimeoutException and SparkException undeclared, and the
            // InterruptedException of a task being killed, whose interrupt Spark's client must still see.
            if (e instanceof InterruptedException) {
                Thread.currentThread().interrupt();
            }
            LOG.warn("Cannot look up the RDMA block server of executor {} ({}); fetching its blocks through Spark's "
                    + "own transport", execId, e.toString());
            return null;
        }
    }

    /**
     * One attempt at {@code blockIds}, reported to {@code attemptListener} (the retries' own); blocks handed to Spark's
     * client are reported to Spark's {@code listener} directly, since that client retries for itself and calls
     * listener methods that the retries' own listener refuses (the retries, left waiting for those blocks, hold
     * nothing and are dropped).
     */
    private void fetch(String host, int port, String execId, InetSocketAddress server, String[] blockIds,
                       BlockFetchingListener attemptListener, BlockFetchingListener listener) {
        blockClient.fetch(execId, server, blockIds, attemptListener, unreachable -> {
            // A busy server is alive and stays known: the executor's own Spark transport serves these blocks. Any
            // other is gone (or is not the one meant), and only an external shuffle service still has its blocks.
            boolean busy = unreachable instanceof ShuffleBlockClient.ServerBusy;
            if (!busy) {
                blockServers.forget(execId);
                if (!externalShuffleService) {
                    return false;
                }
            }
            try {
                // Not on the transport's event loop, which called this: Spark's client connects blocking.
                fallbackThreads.execute(() -> sparkClient.fetchBlocks(host, port, execId, blockIds, listener, null));
            } catch (RejectedExecutionException closed) {
                return false; // the executor is stopping: the blocks fail here instead
            }
            LOG.info("{}; fetching {} blocks of executor {} from {} at {}:{} instead", unreachable.getMessage(),
                    blockIds.length, execId, externalShuffleService ? "the external shuffle service"
                            : "its Spark transport", host, port);
            metrics.blocksFetchedByFallback.inc(blockIds.length);
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
