package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.channel.Channel;
import io.netty.channel.ChannelInboundHandlerAdapter;
import java.net.InetSocketAddress;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkConf;
import org.apache.spark.network.buffer.ManagedBuffer;
import org.apache.spark.network.shuffle.BlockFetchingListener;
import org.apache.spark.network.shuffle.BlockStoreClient;
import org.apache.spark.network.shuffle.DownloadFile;
import org.apache.spark.network.shuffle.DownloadFileManager;
import org.apache.spark.network.util.TransportConf;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Which client a fetch of Spark's iterator goes to: the block transport, or Spark's own (which reaches the external
 * shuffle service when there is one).
 */
class RoutingBlockStoreClientTest {
    private static final String[] BLOCKS = {"shuffle_0_1_2", "shuffle_0_3_2"};
    // Nothing listens there: a fetch routed to the block transport fails to connect.
    private static final InetSocketAddress NO_SERVER = new InetSocketAddress("127.0.0.1", 1);

    private final RdmaShuffleMetrics metrics = new RdmaShuffleMetrics();
    private final List<Object[]> sparkFetches = new CopyOnWriteArrayList<>();
    private final List<String> forgotten = new CopyOnWriteArrayList<>();
    private BlockStoreClient sparkClient;
    private final LinkedBlockingQueue<Throwable> failures = new LinkedBlockingQueue<>();
    /** A reducer's limits with Spark's default settings. */
    private static final RdmaShuffleConf DEFAULTS = new RdmaShuffleConf(new SparkConf(false));

    private BlockTransport transport;
    private ShuffleBlockClient blockClient;
    private RoutingBlockStoreClient routing;

    @BeforeEach
    void setUp() throws Exception {
        transport = BlockTransport.open(BlockTransport.SOFT, 1, RdmaShuffleConf.DEFAULT_SEND_QUEUE_DEPTH,
                RdmaShuffleConf.DEFAULT_RECV_QUEUE_DEPTH, "test-routing");
        blockClient = new ShuffleBlockClient(transport, new PeerAuthenticator(null), 5_000, 10_000,
                DEFAULTS::maxFetchedBlockLength, DEFAULTS.maxFetchedBytesPerConnection, metrics);
        sparkClient = new BlockStoreClient() {
            @Override
            public void fetchBlocks(String host, int port, String execId, String[] blockIds,
                                    BlockFetchingListener listener, DownloadFileManager downloadFileManager) {
                sparkFetches.add(new Object[] {execId, blockIds, downloadFileManager, listener});
            }

            @Override
            public void close() {
            }
        };
        routing = routing(false, 0);
    }

    /** Executor "1"'s block server: where nothing listens, unless a test starts one. */
    private volatile InetSocketAddress server1 = NO_SERVER;

    /** Executor "1" has a block server at {@link #server1}; "2" runs none. */
    private RoutingBlockStoreClient routing(boolean externalShuffleService, int maxRetries) {
        RoutingBlockStoreClient.BlockServers servers = new RoutingBlockStoreClient.BlockServers() {
            @Override
            public InetSocketAddress lookup(String executorId) {
                if (executorId.equals("4")) {
                    // A reduce task killed while it asks the driver.
                    throw sneaky(new InterruptedException());
                }
                if (executorId.equals("3")) {
                    // As Spark's ask fails when the driver does not answer in time: a checked exception, undeclared.
                    throw sneaky(new java.util.concurrent.TimeoutException("the driver did not answer within 120s"));
                }
                return executorId.equals("1") ? server1 : null;
            }

            @Override
            public void forget(String executorId) {
                forgotten.add(executorId);
            }
        };
        SparkConf conf = new SparkConf(false).set("spark.shuffle.io.maxRetries", String.valueOf(maxRetries))
                .set("spark.shuffle.io.retryWait", "10ms");
        return new RoutingBlockStoreClient(blockClient, servers, sparkClient,
                RoutingBlockStoreClient.shuffleTransportConf(conf), externalShuffleService, metrics);
    }

    @SuppressWarnings("unchecked")
    private static <T extends Throwable> RuntimeException sneaky(Throwable t) throws T {
        throw (T) t;
    }

    @AfterEach
    void tearDown() throws Exception {
        routing.close();
        blockClient.close();
        transport.close();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!transport.provider().resourceUsage().isZero() && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        assertTrue(transport.provider().resourceUsage().isZero(), "leaked: " + transport.provider().resourceUsage());
    }

    /**
     * Waits up to 10 s for a fetch handed to Spark's client and its blocks counted: the fallback thread may call
     * Spark's client before the event loop has counted the blocks it handed over.
     */
    private void awaitFallback() throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while ((sparkFetches.isEmpty() || metrics.blocksFetchedByFallback.getCount() < BLOCKS.length)
                && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
    }

    private final BlockFetchingListener listener = new BlockFetchingListener() {
        @Override
        public void onBlockFetchSuccess(String blockId, ManagedBuffer data) {
            throw new AssertionError("nothing serves " + blockId);
        }

        @Override
        public void onBlockFetchFailure(String blockId, Throwable exception) {
            failures.add(exception);
        }
    };

    /**
     * Exactly one fetch reached Spark's client: executor {@code execId}'s {@link #BLOCKS}, reported to Spark's own
     * listener (Spark's client retries for itself, and calls methods the retries' listener refuses), counted as
     * fetched by fallback, and no block failed.
     */
    private void assertOneFetchHandedToSpark(String execId) {
        assertEquals(1, sparkFetches.size(), () -> "fetches handed to Spark's client; failed: " + failures);
        assertEquals(execId, sparkFetches.get(0)[0]);
        assertArrayEquals(BLOCKS, (String[]) sparkFetches.get(0)[1]);
        assertSame(listener, sparkFetches.get(0)[3]);
        assertEquals(BLOCKS.length, metrics.blocksFetchedByFallback.getCount());
        assertTrue(failures.isEmpty(), () -> "blocks failed: " + failures);
    }

    /** A task killed while it asks the driver keeps its interrupt, for Spark's client to see. */
    @Test
    void shouldKeepTheInterruptOfATaskKilledWhileItAsksTheDriver() {
        routing.fetchBlocks("host4", 7337, "4", BLOCKS, listener, null);
        assertTrue(Thread.interrupted(), "the interrupt was swallowed");
        assertOneFetchHandedToSpark("4");
    }

    @Test
    void shouldFetchThroughSparksOwnTransportWhenTheDriverCannotSayWhereTheBlockServerIs() {
        // Not thrown into Spark's fetch iterator, where it would fail the task rather than its fetches.
        routing.fetchBlocks("host3", 7337, "3", BLOCKS, listener, null);
        assertOneFetchHandedToSpark("3");
    }

    @Test
    void shouldFetchFromABlockServerOverTheBlockTransport() throws Exception {
        routing.fetchBlocks("127.0.0.1", 7337, "1", BLOCKS, listener, null);
        Throwable failure = failures.poll(10, TimeUnit.SECONDS);
        assertNotNull(failure, "the block transport did not report the fetch");
        assertTrue(failure.getMessage().contains("cannot reach shuffle block server"), failure.getMessage());
        assertTrue(sparkFetches.isEmpty(), "went to Spark's client");
        // Without an external shuffle service the blocks are lost with their executor: Spark recomputes them.
        assertEquals(List.of("1"), forgotten, "the unreachable server is looked up afresh next time");
    }

    /**
     * A fetch whose connection fails is tried again as Spark's own transport tries it, for spark.shuffle.io.maxRetries
     * more attempts, and the blocks fail only after the last; it used to fail at once, and Spark ran map tasks again.
     */
    @Test
    void shouldRetryAFetchThatFailedOnItsConnectionAsSparkDoes() throws Exception {
        routing.close();
        routing = routing(false, 2);
        routing.fetchBlocks("127.0.0.1", 7337, "1", BLOCKS, listener, null);
        for (int i = 0; i < BLOCKS.length; i++) {
            Throwable failure = failures.poll(10, TimeUnit.SECONDS);
            assertNotNull(failure, "block " + i + " was not reported");
            assertTrue(failure.getMessage().contains("cannot reach shuffle block server"), failure.getMessage());
        }
        // Three attempts of both blocks: the first and two retries.
        assertEquals(3L * BLOCKS.length, metrics.fetchFailures.getCount());
        assertTrue(failures.isEmpty(), "more than one report per block: " + failures);
    }

    /**
     * With the external shuffle service, the blocks of an executor that is gone (dynamic allocation removed it) are
     * still served by the service on its host: a block server that cannot be reached sends the fetch there, as Spark
     * would without this plugin. It used to fail every block, and Spark recomputed map outputs it still had.
     */
    @Test
    void shouldFetchFromTheExternalShuffleServiceWhenTheBlockServerCannotBeReached() throws Exception {
        routing.close();
        routing = routing(true, 2);
        routing.fetchBlocks("127.0.0.1", 7337, "1", BLOCKS, listener, null);
        awaitFallback();
        assertOneFetchHandedToSpark("1");
        assertEquals(List.of("1"), forgotten, "the unreachable server is looked up afresh next time");
        assertEquals(0, metrics.fetchFailures.getCount());
    }

    /**
     * A block server whose challenge shows that its spark.authenticate differs from this executor's will never serve
     * it: without the external shuffle service the blocks fail at once, naming the key, and the address is looked up
     * afresh next time (it is most likely another application's server on a port the executor held). Such a server
     * used to count as merely unreachable, and Spark retried the fetch for 15 s before it failed.
     */
    @Test
    void shouldFailAtOnceWhenTheBlockServerRequiresAuthenticationThisExecutorLacks() throws Exception {
        routing.close();
        routing = routing(false, 2);
        RdmaShuffleConf conf = new RdmaShuffleConf(new SparkConf(false));
        try (ShuffleBlockServer server = new ShuffleBlockServer(transport, "1", "127.0.0.1", 0, blockId -> {
            throw new AssertionError("asked for " + blockId);
        }, new PeerAuthenticator("the application's secret"), conf, new RdmaShuffleMetrics())) {
            server1 = server.localAddress();
            routing.fetchBlocks("127.0.0.1", 7337, "1", BLOCKS, listener, null);
            for (int i = 0; i < BLOCKS.length; i++) {
                Throwable failure = failures.poll(10, TimeUnit.SECONDS);
                assertNotNull(failure, "block " + i + " was not reported");
                assertTrue(failure.getMessage().contains("requires authentication but this executor has no secret")
                        && failure.getMessage().contains("spark.authenticate=true"), failure.getMessage());
            }
            assertEquals(BLOCKS.length, metrics.fetchFailures.getCount(), "one attempt, not retried");
            assertTrue(sparkFetches.isEmpty(), "went to Spark's client");
            assertEquals(List.of("1"), forgotten, "the address is looked up afresh next time");
        }
    }

    /**
     * Under dynamic allocation a removed executor's port may be taken by another executor's block server (or another
     * application's), which cannot prove that it serves the executor meant. With the external shuffle service, which
     * still holds that executor's blocks, the fetch goes there and the address is forgotten. Fetches used to go out
     * before the proof, failed with the connection, and were retried against the same server until Spark gave up and
     * ran the map stage again.
     */
    @Test
    void shouldFetchFromTheExternalShuffleServiceWhenAnotherExecutorsServerHoldsThePort() throws Exception {
        routing.close();
        blockClient.close();
        blockClient = new ShuffleBlockClient(transport, new PeerAuthenticator("secret"), 5_000, 10_000,
                DEFAULTS::maxFetchedBlockLength, DEFAULTS.maxFetchedBytesPerConnection, metrics);
        routing = routing(true, 2);
        RdmaShuffleConf conf = new RdmaShuffleConf(new SparkConf(false));
        RdmaShuffleMetrics otherMetrics = new RdmaShuffleMetrics();
        try (ShuffleBlockServer other = new ShuffleBlockServer(transport, "9", "127.0.0.1", 0, blockId -> {
            throw new AssertionError("asked for " + blockId);
        }, new PeerAuthenticator("secret"), conf, otherMetrics)) {
            server1 = other.localAddress();
            routing.fetchBlocks("127.0.0.1", 7337, "1", BLOCKS, listener, null);
            awaitFallback();
            assertEquals(1, sparkFetches.size(), "fetches handed to Spark's client");
            assertArrayEquals(BLOCKS, (String[]) sparkFetches.get(0)[1]);
            assertEquals(List.of("1"), forgotten, "the address is looked up afresh next time");
            assertTrue(failures.isEmpty(), "blocks failed: " + failures);
            assertEquals(0, metrics.fetchFailures.getCount());
            // The other server refused our answer, which names executor 1: it asked for nothing.
            assertEquals(1, otherMetrics.authFailures.getCount());
        }
    }

    /**
     * A block server that holds spark.shuffle.rdma.maxConnections already refuses further connections before its
     * challenge. It is alive, so even without the external shuffle service the executor's own Spark transport serves
     * the blocks, and the address stays known. Such a refusal used to fail the fetch as unreachable: Spark retried it
     * against the same full server and then ran the map stage again.
     */
    @Test
    void shouldFetchThroughSparksOwnTransportWhenTheBlockServerHoldsAllTheConnectionsItTakes() throws Exception {
        RdmaShuffleConf conf = new RdmaShuffleConf(new SparkConf(false).set(RdmaShuffleConf.MAX_CONNECTIONS, "1"));
        RdmaShuffleMetrics serverMetrics = new RdmaShuffleMetrics();
        try (ShuffleBlockServer server = new ShuffleBlockServer(transport, "1", "127.0.0.1", 0, blockId -> {
            throw new AssertionError("asked for " + blockId);
        }, new PeerAuthenticator(null), conf, serverMetrics)) {
            server1 = server.localAddress();
            // Holds the one connection the server takes.
            Channel holder = transport.newBootstrap().handler(new ChannelInboundHandlerAdapter()).connect(server1)
                    .sync().channel();
            try {
                routing.fetchBlocks("127.0.0.1", 7337, "1", BLOCKS, listener, null);
                awaitFallback();
                assertOneFetchHandedToSpark("1");
                assertEquals(List.of(), forgotten, "the busy server stays known");
                assertEquals(1, serverMetrics.connectionsRefused.getCount(), "the server refused one connection");
                // Not dialled again at once (a refused connection costs the full server a queue pair): the next
                // fetch goes straight to Spark's client.
                routing.fetchBlocks("127.0.0.1", 7337, "1", BLOCKS, listener, null);
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
                while (sparkFetches.size() < 2 && System.nanoTime() < deadline) {
                    Thread.sleep(10);
                }
                assertEquals(2, sparkFetches.size(), () -> "fetches handed to Spark's client; failed: " + failures);
                assertEquals(1, serverMetrics.connectionsRefused.getCount(), "connections the full server refused");
            } finally {
                holder.close().sync();
            }
        }
    }

    @Test
    void shouldLeaveExecutorsWithoutABlockServerToSpark() {
        routing.fetchBlocks("127.0.0.1", 7337, "2", BLOCKS, listener, null);
        assertEquals(1, sparkFetches.size());
        assertEquals(BLOCKS.length, metrics.blocksFetchedByFallback.getCount());
    }

    /**
     * Spark passes a download file manager for a request larger than spark.network.maxRemoteBlockSizeFetchToMem so
     * that its blocks are streamed to disk; the block transport would hold them in memory, so Spark's client takes it.
     */
    @Test
    void shouldLeaveRequestsToBeStreamedToDiskToSpark() {
        DownloadFileManager toDisk = new DownloadFileManager() {
            @Override
            public DownloadFile createTempFile(TransportConf conf) {
                throw new UnsupportedOperationException("not called by the routing");
            }

            @Override
            public boolean registerTempFileToClean(DownloadFile file) {
                return false;
            }
        };
        routing.fetchBlocks("127.0.0.1", 7337, "1", BLOCKS, listener, toDisk);
        assertEquals(1, sparkFetches.size(), "fetches handed to Spark's client");
        assertEquals("1", sparkFetches.get(0)[0]);
        assertArrayEquals(BLOCKS, (String[]) sparkFetches.get(0)[1]);
        assertSame(toDisk, sparkFetches.get(0)[2]);
        assertEquals(BLOCKS.length, metrics.blocksFetchedByFallback.getCount());
        assertTrue(failures.isEmpty(), "the block transport was asked too: " + failures);
    }
}
