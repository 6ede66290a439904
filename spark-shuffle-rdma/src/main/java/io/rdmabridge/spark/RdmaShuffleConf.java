package io.rdmabridge.spark;

import java.util.List;
import java.util.Locale;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.SparkConf;

/**
 * The {@code spark.shuffle.rdma.*} keys, their defaults, and their validation. docs/spark.md documents each key; keep
 * the two in step. Immutable, thread-safe.
 */
final class RdmaShuffleConf {
    static final String PREFIX = "spark.shuffle.rdma.";
    /** {@code auto} (hardware RDMA if usable, otherwise Spark's transport), {@code disni} or {@code soft}. */
    static final String PROVIDER = PREFIX + "provider";
    /** Port of each executor's block server; 0 picks a free one (reducers find it through the driver). */
    static final String PORT = PREFIX + "port";
    /** Spark's own key: how many ports after a taken one a service tries, as each of Spark's services does. */
    static final String PORT_MAX_RETRIES = "spark.port.maxRetries";
    /** I/O threads (event loops) that the block server and the fetch client share. */
    static final String IO_THREADS = PREFIX + "ioThreads";
    /** Cap on block bytes the server has handed to the transport and not yet seen completed. */
    static final String PINNED_MEMORY_CAP = PREFIX + "pinnedMemoryCap";
    static final String CONNECT_TIMEOUT = PREFIX + "connectTimeout";
    /** A connection with fetches outstanding and nothing received for this long is closed; its fetches fail. */
    static final String FETCH_TIMEOUT = PREFIX + "fetchTimeout";
    /** Outstanding send work requests per connection: {@code RdmaChannelOption.SEND_QUEUE_DEPTH}. */
    static final String SEND_QUEUE_DEPTH = PREFIX + "sendQueueDepth";
    /** Receive buffers posted per connection (the peer's credits): {@code RdmaChannelOption.RECEIVE_QUEUE_DEPTH}. */
    static final String RECV_QUEUE_DEPTH = PREFIX + "recvQueueDepth";
    /** With {@code spark.authenticate=true}: a connection not authenticated within this time is closed. */
    static final String AUTH_TIMEOUT = PREFIX + "authTimeout";
    /** A block server connection with no request outstanding and nothing received for this long is closed. */
    static final String IDLE_TIMEOUT = PREFIX + "idleTimeout";
    /** A block server connection whose sent data is not consumed for this long is closed, releasing its share. */
    static final String WRITE_TIMEOUT = PREFIX + "writeTimeout";
    /** Connections a block server keeps open at once; further ones are refused. */
    static final String MAX_CONNECTIONS = PREFIX + "maxConnections";
    /** Requests a block server holds per connection; beyond it, it stops reading that connection until some end. */
    static final String MAX_REQUESTS_PER_CONNECTION = PREFIX + "maxRequestsPerConnection";
    /** The share of {@link #PINNED_MEMORY_CAP} one connection may hold in flight. */
    static final String PINNED_MEMORY_PER_CONNECTION = PREFIX + "pinnedMemoryPerConnection";
    /**
     * Bytes the fetch client holds for one connection (received and not yet decoded, and fetched blocks Spark has not
     * released); beyond it, it stops reading that connection until Spark releases some. Off unless set.
     */
    static final String MAX_FETCHED_BYTES_PER_CONNECTION = PREFIX + "maxFetchedBytesPerConnection";
    /** Shortest interval between two WARN lines of one kind that peers can cause repeatedly. */
    static final String WARN_INTERVAL = PREFIX + "warnInterval";
    /** Spark's key: requests larger than this Spark streams to disk, and so never over the block transport. */
    static final String MAX_REMOTE_BLOCK_SIZE_FETCH_TO_MEM = "spark.network.maxRemoteBlockSizeFetchToMem";
    /** Spark's key: a map output of many partitions reports the blocks below this size as their average. */
    static final String ACCURATE_BLOCK_THRESHOLD = "spark.shuffle.accurateBlockThreshold";
    /** Spark's ShuffleBlockBatchId: reduce partitions START to END (exclusive) of one map output, in one block. */
    private static final Pattern BATCH_BLOCK_ID = Pattern.compile("shuffle_\\d+_\\d+_(\\d{1,10})_(\\d{1,10})");
    /**
     * Spark's keys that ask for encrypted block transfers (AES-based, SASL's, TLS), which the block transport does not
     * provide: with any of them true, shuffle blocks stay on Spark's own transport.
     */
    static final List<String> ENCRYPTION_KEYS = List.of("spark.network.crypto.enabled",
            "spark.authenticate.enableSaslEncryption", "spark.ssl.rpc.enabled");
    /** The channel's own defaults, written out so that docs/spark.md can name them. */
    static final int DEFAULT_SEND_QUEUE_DEPTH = 128;
    static final int DEFAULT_RECV_QUEUE_DEPTH = 32;

    final String provider;
    final int port;
    final int portMaxRetries;
    final int ioThreads;
    final long pinnedMemoryCap;
    final int connectTimeoutMillis;
    final long fetchTimeoutMillis;
    final int sendQueueDepth;
    final int recvQueueDepth;
    final long authTimeoutMillis;
    final long idleTimeoutMillis;
    final long writeTimeoutMillis;
    final int maxConnections;
    final int maxRequestsPerConnection;
    final long pinnedMemoryPerConnection;
    final long warnIntervalMillis;
    final long maxFetchedBytesPerConnection;
    private final long maxRemoteBlockSizeFetchToMem;
    private final long accurateBlockThreshold;

    /**
     * Why this application's blocks must not take the block transport, which sends them in the clear: a message
     * naming the key of {@link #ENCRYPTION_KEYS} that is true, or {@code null}.
     */
    static String encryptionRequested(SparkConf conf) {
        for (String key : ENCRYPTION_KEYS) {
            if (conf.getBoolean(key, false)) {
                return key + "=true asks for encrypted block transfers, which the RDMA block transport does not "
                        + "provide (it sends blocks in the clear); shuffle blocks stay on Spark's own transport (set "
                        + key + "=false to use RDMA, on a network you trust)";
            }
        }
        return null;
    }

    RdmaShuffleConf(SparkConf conf) {
        provider = conf.get(PROVIDER, "auto").trim().toLowerCase(Locale.ROOT);
        port = (int) conf.getLong(PORT, 0);
        if (port < 0 || port > 65535) {
            throw new IllegalArgumentException(PORT + ": " + port + " (expected: 0-65535, 0 picks a free port)");
        }
        portMaxRetries = conf.getInt(PORT_MAX_RETRIES, 16);
        if (portMaxRetries < 0) {
            throw new IllegalArgumentException(PORT_MAX_RETRIES + ": " + portMaxRetries + " (expected: >= 0)");
        }
        ioThreads = conf.getInt(IO_THREADS, 1);
        if (ioThreads < 1) {
            throw new IllegalArgumentException(IO_THREADS + ": " + ioThreads + " (expected: >= 1)");
        }
        pinnedMemoryCap = conf.getSizeAsBytes(PINNED_MEMORY_CAP, "256m");
        if (pinnedMemoryCap < 1) {
            throw new IllegalArgumentException(PINNED_MEMORY_CAP + ": " + pinnedMemoryCap + " (expected: > 0)");
        }
        long connectTimeout = conf.getTimeAsMs(CONNECT_TIMEOUT, "10s");
        if (connectTimeout < 1 || connectTimeout > Integer.MAX_VALUE) {
            throw new IllegalArgumentException(CONNECT_TIMEOUT + ": " + connectTimeout + "ms (expected: 1ms-24d)");
        }
        connectTimeoutMillis = (int) connectTimeout;
        fetchTimeoutMillis = positiveTime(conf, FETCH_TIMEOUT, "120s");
        sendQueueDepth = conf.getInt(SEND_QUEUE_DEPTH, DEFAULT_SEND_QUEUE_DEPTH);
        if (sendQueueDepth < 8 || sendQueueDepth > 1 << 15 || Integer.bitCount(sendQueueDepth) != 1) {
            throw new IllegalArgumentException(SEND_QUEUE_DEPTH + ": " + sendQueueDepth
                    + " (expected: a power of 2, 8-32768)");
        }
        recvQueueDepth = conf.getInt(RECV_QUEUE_DEPTH, DEFAULT_RECV_QUEUE_DEPTH);
        if (recvQueueDepth < 1 || recvQueueDepth > 0xFFFF) {
            throw new IllegalArgumentException(RECV_QUEUE_DEPTH + ": " + recvQueueDepth + " (expected: 1-65535)");
        }
        authTimeoutMillis = positiveTime(conf, AUTH_TIMEOUT, "10s");
        idleTimeoutMillis = positiveTime(conf, IDLE_TIMEOUT, "120s");
        writeTimeoutMillis = positiveTime(conf, WRITE_TIMEOUT, "60s");
        warnIntervalMillis = positiveTime(conf, WARN_INTERVAL, "10s");
        maxConnections = conf.getInt(MAX_CONNECTIONS, 512);
        if (maxConnections < 1) {
            throw new IllegalArgumentException(MAX_CONNECTIONS + ": " + maxConnections + " (expected: >= 1)");
        }
        maxRequestsPerConnection = conf.getInt(MAX_REQUESTS_PER_CONNECTION, 256);
        if (maxRequestsPerConnection < 1) {
            throw new IllegalArgumentException(MAX_REQUESTS_PER_CONNECTION + ": " + maxRequestsPerConnection
                    + " (expected: >= 1)");
        }
        // A quarter by default: a greedy peer leaves three quarters of the cap to the others.
        pinnedMemoryPerConnection = conf.getSizeAsBytes(PINNED_MEMORY_PER_CONNECTION,
                Long.toString(Math.max(1, pinnedMemoryCap / 4)));
        if (pinnedMemoryPerConnection < 1 || pinnedMemoryPerConnection > pinnedMemoryCap) {
            throw new IllegalArgumentException(PINNED_MEMORY_PER_CONNECTION + ": " + pinnedMemoryPerConnection
                    + " (expected: 1-" + pinnedMemoryCap + ", at most " + PINNED_MEMORY_CAP + ")");
        }
        // Defaults as Spark's (3.5 to 4.2).
        maxRemoteBlockSizeFetchToMem = conf.getSizeAsBytes(MAX_REMOTE_BLOCK_SIZE_FETCH_TO_MEM, "200m");
        accurateBlockThreshold = conf.getSizeAsBytes(ACCURATE_BLOCK_THRESHOLD, "100m");
        // Off by default: what a legitimate job holds of one server's blocks has no bound the client knows (tasks per
        // executor, times shuffles read at once, times maxSizeInFlight, and map outputs that under-report skewed
        // blocks), and pausing a legitimate job costs more than the memory: a task that waits for one shuffle's block
        // while it holds another's waits for ever, and the server resets a connection unread for its writeTimeout.
        maxFetchedBytesPerConnection = conf.contains(MAX_FETCHED_BYTES_PER_CONNECTION)
                ? conf.getSizeAsBytes(MAX_FETCHED_BYTES_PER_CONNECTION) : Long.MAX_VALUE;
        if (maxFetchedBytesPerConnection < 1) {
            throw new IllegalArgumentException(MAX_FETCHED_BYTES_PER_CONNECTION + ": " + maxFetchedBytesPerConnection
                    + " (expected: > 0)");
        }
    }

    /**
     * The largest block the fetch client takes as {@code blockId}; a larger BLOCK fails its connection before it is
     * buffered. Spark fetches a request over the block transport only when its blocks' sizes, as their map outputs
     * report them, sum to at most {@link #MAX_REMOTE_BLOCK_SIZE_FETCH_TO_MEM}. A report rounds a size up, except that
     * one of over 2000 partitions gives the blocks below {@link #ACCURATE_BLOCK_THRESHOLD} as their average: such a
     * block can be larger than reported, up to the threshold. A batch of reduce partitions sums their reports, so each
     * partition after the first may add a threshold.
     */
    long maxFetchedBlockLength(String blockId) {
        long partitions = 1;
        Matcher batch = BATCH_BLOCK_ID.matcher(blockId);
        if (batch.matches()) {
            partitions = Math.max(1, Long.parseLong(batch.group(2)) - Long.parseLong(batch.group(1)));
        }
        long max = BlockFrame.MAX_BLOCK_LENGTH;
        long one = Math.min(max, Math.max(maxRemoteBlockSizeFetchToMem, accurateBlockThreshold));
        long threshold = Math.max(0, accurateBlockThreshold);
        // Both terms at most max: the sum cannot overflow.
        long more = threshold == 0 || partitions - 1 <= max / threshold ? (partitions - 1) * threshold : max;
        return Math.min(max, one + more);
    }

    private static long positiveTime(SparkConf conf, String key, String defaultValue) {
        long millis = conf.getTimeAsMs(key, defaultValue);
        if (millis < 1) {
            throw new IllegalArgumentException(key + ": " + millis + "ms (expected: > 0)");
        }
        return millis;
    }
}
