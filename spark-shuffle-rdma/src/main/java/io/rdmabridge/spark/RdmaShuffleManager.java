package io.rdmabridge.spark;

import java.net.InetSocketAddress;
import java.util.Map;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerExecutorRemoved;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.ShuffleBlockResolver;
import org.apache.spark.shuffle.ShuffleHandle;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.shuffle.ShuffleReader;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.ShuffleWriter;
import org.apache.spark.shuffle.sort.SortShuffleManager;
import org.apache.spark.storage.BlockId;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Spark shuffle over the RDMA block transport. Enable with
 * {@code spark.shuffle.manager=io.rdmabridge.spark.RdmaShuffleManager} and this jar on the class path; tune with
 * {@code spark.shuffle.rdma.*} (docs/spark.md).
 *
 * <p>Composes Spark's {@link SortShuffleManager}: registration, writers, the block resolver and unregistration stay
 * Spark's; only the reduce side's block transfer changes. Each executor serves its shuffle files from a block server
 * and fetches remote blocks through it; Spark's fetch iterator keeps its flow control and failure handling, and a
 * failed fetch is retried as Spark retries its own ({@code spark.shuffle.io.maxRetries}).
 *
 * <p>When the transport cannot start on an executor (no RDMA device, no libdisni, a provider error), that executor
 * logs one WARN line naming the cause and its shuffle runs over Spark's own transport; peers fetch its blocks the same
 * way. A job never fails because RDMA is unavailable.
 *
 * <p>Thread-safe: Spark calls it from many task threads.
 */
public final class RdmaShuffleManager implements org.apache.spark.shuffle.ShuffleManager {
    private static final Logger LOG = LoggerFactory.getLogger(RdmaShuffleManager.class);

    private final SortShuffleManager sort;
    private final RdmaShuffleMetrics metrics = new RdmaShuffleMetrics();
    private final SparkConf conf;
    private final boolean isDriver;
    /** Set once by {@link #start()}, after one of the two fields below (neither, on an executor that falls back). */
    private volatile boolean started;
    private volatile BlockServerDirectory.Driver driverDirectory;
    private volatile ExecutorTransport executorTransport;
    private volatile boolean watchingExecutors;
    /** An executor's transport, started on a thread of its own at the first call of {@link #start()}. */
    private final BackgroundStart<ExecutorTransport> executorStart;

    /**
     * Called by Spark ({@code ShuffleManager.create}) on the driver and on every executor.
     *
     * @throws IllegalStateException when this jar was built for the other Scala line than the running Spark's; the
     *         message names the jar to use instead
     */
    public RdmaShuffleManager(SparkConf conf, boolean isDriver) {
        // Before anything compiled against Scala runs: the wrong jar's first symptom would come much later.
        ScalaLine.check();
        sort = new SortShuffleManager(conf);
        this.conf = conf;
        this.isDriver = isDriver;
        this.executorStart = new BackgroundStart<>("rdma-shuffle-start", () -> ExecutorTransport.start(conf, metrics));
        if (!SparkCompat.createsShuffleManagerBeforeEnv()) {
            start();
        }
        // Otherwise (Spark 3.5) the first shuffle call starts it: registerShuffle on the driver, before any executor
        // runs a shuffle task; getWriter or getReader on an executor, before its map output exists.
    }

    /** The driver's directory, or this executor's transport (or its fallback): once, on the first call. */
    private void start() {
        if (started) {
            return;
        }
        if (isDriver) {
            synchronized (this) {
                if (!started) {
                    driverDirectory = BlockServerDirectory.Driver.start(SparkEnv.get().rpcEnv());
                    started = true;
                }
            }
            return;
        }
        ExecutorTransport transport;
        try {
            transport = executorStart.await();
        } catch (InterruptedException e) {
            // Spark is killing this task: it goes on without the transport (it is ending), and the start without it.
            Thread.currentThread().interrupt();
            return;
        }
        synchronized (this) {
            if (!started) {
                executorTransport = transport;
                started = true;
            }
        }
    }

    @Override
    public <K, V, C> ShuffleHandle registerShuffle(int shuffleId, ShuffleDependency<K, V, C> dependency) {
        start();
        if (driverDirectory != null && !watchingExecutors) {
            watchExecutors(dependency.rdd().sparkContext());
        }
        return sort.registerShuffle(shuffleId, dependency);
    }

    /**
     * Makes the driver's directory forget each executor Spark removes. Done at the first shuffle, the first call with
     * the context at hand (this manager is built before it is active); executors removed before then served no
     * shuffle.
     */
    private synchronized void watchExecutors(SparkContext sc) {
        if (!watchingExecutors) {
            BlockServerDirectory.Driver directory = driverDirectory;
            sc.addSparkListener(new SparkListener() {
                @Override
                public void onExecutorRemoved(SparkListenerExecutorRemoved removed) {
                    directory.executorRemoved(removed.executorId());
                }
            });
            watchingExecutors = true;
        }
    }

    @Override
    public <K, V> ShuffleWriter<K, V> getWriter(ShuffleHandle handle, long mapId, TaskContext context,
                                                ShuffleWriteMetricsReporter metrics) {
        start();
        return sort.getWriter(handle, mapId, context, metrics);
    }

    @Override
    @SuppressWarnings("unchecked")
    public <K, C> ShuffleReader<K, C> getReader(ShuffleHandle handle, int startMapIndex, int endMapIndex,
                                                int startPartition, int endPartition, TaskContext context,
                                                ShuffleReadMetricsReporter readMetrics) {
        start();
        BaseShuffleHandle<K, ?, C> base = (BaseShuffleHandle<K, ?, C>) handle;
        if (executorTransport == null || base.dependency().isShuffleMergeFinalizedMarked()) {
            // No block transport here, or push-based shuffle (merged blocks live in the external shuffle service).
            return sort.getReader(handle, startMapIndex, endMapIndex, startPartition, endPartition, context,
                    readMetrics);
        }
        context.addTaskCompletionListener((org.apache.spark.util.TaskCompletionListener)
                ctx -> executorTransport.directory.reportMetrics(metrics));
        return new RdmaShuffleReader<>(base,
                (scala.collection.Iterator) SparkEnv.get().mapOutputTracker().getMapSizesByExecutorId(
                        handle.shuffleId(), startMapIndex, endMapIndex, startPartition, endPartition),
                context, readMetrics, executorTransport.routingClient,
                SortShuffleManager.canUseBatchFetch(startPartition, endPartition, context));
    }

    @Override
    public boolean unregisterShuffle(int shuffleId) {
        return sort.unregisterShuffle(shuffleId);
    }

    @Override
    public ShuffleBlockResolver shuffleBlockResolver() {
        return sort.shuffleBlockResolver();
    }

    @Override
    public void stop() {
        // Also a transport whose start is still running (Spark 3.5, a first task killed while it waited) or that no
        // task took after its killed first one: it is closed when its start ends.
        executorStart.close(ExecutorTransport::close);
        sort.stop();
    }

    /**
     * On the driver: executor id → block server address of every executor that runs one. Empty on executors.
     */
    public Map<String, InetSocketAddress> blockServers() {
        return driverDirectory == null ? Map.of() : driverDirectory.servers();
    }

    /** On the driver: executor id → the cause that made it run on Spark's own transport. Empty on executors. */
    public Map<String, String> fallbacks() {
        return driverDirectory == null ? Map.of() : driverDirectory.fallbacks();
    }

    /**
     * On the driver: executor id → that executor's latest counters as {@code name=value} pairs ({@code bytesFetched},
     * {@code blocksFetched}, {@code fetchWaitNanos}, {@code blocksFetchedByFallback}, ...), reported after each of its
     * reduce tasks. Empty on executors; there, the same counters are the metrics source {@code rdmaShuffle}.
     */
    public Map<String, String> executorMetrics() {
        return driverDirectory == null ? Map.of() : driverDirectory.metrics();
    }

    /** An executor's block server, fetch client and directory, or nothing when the transport cannot start. */
    private static final class ExecutorTransport {
        final BlockTransport transport;
        final ShuffleBlockServer server;
        final ShuffleBlockClient client;
        final BlockServerDirectory.Executor directory;
        final RoutingBlockStoreClient routingClient;

        private ExecutorTransport(BlockTransport transport, ShuffleBlockServer server, ShuffleBlockClient client,
                                  BlockServerDirectory.Executor directory, RoutingBlockStoreClient routingClient) {
            this.transport = transport;
            this.server = server;
            this.client = client;
            this.directory = directory;
            this.routingClient = routingClient;
        }

        static ExecutorTransport start(SparkConf conf, RdmaShuffleMetrics metrics) {
            SparkEnv env = SparkEnv.get();
            BlockServerDirectory.Executor directory = new BlockServerDirectory.Executor(conf, env.rpcEnv(),
                    env.executorId());
            env.metricsSystem().registerSource(metrics);
            BlockTransport transport = null;
            try {
                String encrypted = RdmaShuffleConf.encryptionRequested(conf);
                if (encrypted != null) {
                    throw new BlockTransport.UnavailableException(encrypted);
                }
                RdmaShuffleConf rdmaConf = new RdmaShuffleConf(conf);
                transport = BlockTransport.open(rdmaConf.provider, rdmaConf.ioThreads, rdmaConf.sendQueueDepth,
                        rdmaConf.recvQueueDepth, "rdma-shuffle");
                PeerAuthenticator authenticator = new PeerAuthenticator(
                        env.securityManager().isAuthenticationEnabled() ? env.securityManager().getSecretKey() : null);
                String host = env.blockManager().blockManagerId().host();
                ShuffleBlockServer server = new ShuffleBlockServer(transport, env.executorId(), host, rdmaConf.port,
                        ExecutorTransport::openShuffleBlock, authenticator, rdmaConf, metrics);
                ShuffleBlockClient client = new ShuffleBlockClient(transport, authenticator,
                        rdmaConf.connectTimeoutMillis, rdmaConf.fetchTimeoutMillis, rdmaConf::maxFetchedBlockLength,
                        rdmaConf.maxFetchedBytesPerConnection, metrics);
                metrics.watchCopies(transport::copiedOnSendBytes, transport::copiedOnReceiveBytes);
                metrics.watchPath(transport::sameHostConnections);
                InetSocketAddress address = new InetSocketAddress(host, server.localAddress().getPort());
                directory.register(address);
                LOG.info("RDMA shuffle: executor {} serves shuffle blocks at {} over {}", env.executorId(), address,
                        transport.description());
                return new ExecutorTransport(transport, server, client, directory,
                        new RoutingBlockStoreClient(client, directory, env.blockManager().blockStoreClient(),
                                RoutingBlockStoreClient.shuffleTransportConf(conf),
                                conf.getBoolean("spark.shuffle.service.enabled", false), metrics));
            } catch (Exception | LinkageError e) {
                if (transport != null) {
                    transport.close();
                }
                String cause = e instanceof BlockTransport.UnavailableException ? e.getMessage() : e.toString();
                metrics.transportFallbacks.inc();
                LOG.warn("RDMA shuffle unavailable on executor {}, using Spark's own shuffle transport: {}",
                        env.executorId(), cause);
                directory.reportFallback(cause);
                return null;
            }
        }

        /** Serves shuffle blocks only: a peer can never read other blocks (broadcasts, cached RDDs) from here. */
        private static org.apache.spark.network.buffer.ManagedBuffer openShuffleBlock(String blockId) {
            BlockId id = BlockId.apply(blockId);
            if (!id.isShuffle()) {
                throw new IllegalArgumentException("not a shuffle block: " + blockId);
            }
            return SparkEnv.get().shuffleManager().shuffleBlockResolver().getBlockData(id, scala.Option.empty());
        }

        void close() {
            routingClient.close();
            client.close();
            server.close();
            transport.close();
        }
    }
}
