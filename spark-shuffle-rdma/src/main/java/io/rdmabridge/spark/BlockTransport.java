package io.rdmabridge.spark;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.Channel;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.rdmabridge.connection.Handshake;
import io.rdmabridge.netty.RdmaChannelMetrics;
import io.rdmabridge.netty.RdmaChannelOption;
import io.rdmabridge.netty.RdmaIoHandler;
import io.rdmabridge.netty.RdmaServerSocketChannel;
import io.rdmabridge.netty.RdmaSocketChannel;
import io.rdmabridge.verbs.ProviderSelection;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RdmaProviders;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The one seam that picks the Netty channel classes and I/O handler under the shuffle block pipeline; everything
 * above it ({@link ShuffleBlockServer}, {@link ShuffleBlockClient}) is channel-agnostic. It runs the pipeline on
 * {@link RdmaSocketChannel}/{@link RdmaServerSocketChannel} over the provider that {@code spark.shuffle.rdma.provider}
 * selects, or reports why none can be used. Thread-safe after construction.
 */
final class BlockTransport {
    /** Provider value that selects the software RDMA provider. */
    static final String SOFT = "soft";

    /**
     * The largest message a block server takes from a client in one piece. Clients send requests and authentication
     * frames of at most a few hundred bytes; a larger write arrives in parts of this size, each read only once the
     * server has decoded what came before, so a peer cannot make the server hold megabytes of registered memory by
     * sending them in one message (the channel's default allows 16 MiB).
     */
    static final int SERVER_MAX_MESSAGE_SIZE = Handshake.MIN_MAX_MESSAGE_SIZE;

    private final EventLoopGroup group;
    private final RdmaProvider provider;
    private final int sendQueueDepth;
    private final int recvQueueDepth;
    /** The counters of every event loop that has carried a connection; each covers all channels of its loop. */
    private final Set<RdmaChannelMetrics> eventLoopMetrics = ConcurrentHashMap.newKeySet();

    private BlockTransport(EventLoopGroup group, RdmaProvider provider, int sendQueueDepth, int recvQueueDepth) {
        this.group = group;
        this.provider = provider;
        this.sendQueueDepth = sendQueueDepth;
        this.recvQueueDepth = recvQueueDepth;
    }

    /**
     * The RDMA transport for {@code provider} ({@code auto}, {@code disni} or {@code soft}), or an exception whose
     * message names why RDMA cannot be used here and what to do about it. Every connection, client or server side, gets
     * {@code sendQueueDepth} send work requests and {@code recvQueueDepth} posted receives.
     */
    static BlockTransport open(String provider, int ioThreads, int sendQueueDepth, int recvQueueDepth,
                               String threadPrefix) throws UnavailableException {
        ProviderSelection selection = RdmaProviders.select(provider, RdmaShuffleConf.PROVIDER);
        if (!selection.isAvailable()) {
            throw new UnavailableException(selection.reason());
        }
        RdmaProvider chosen = selection.provider();
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(ioThreads, daemonThreads(threadPrefix),
                RdmaIoHandler.newFactory(chosen));
        return new BlockTransport(group, chosen, sendQueueDepth, recvQueueDepth);
    }

    EventLoopGroup group() {
        return group;
    }

    /** A client bootstrap on this transport's group, channel class and connection options. */
    Bootstrap newBootstrap() {
        return new Bootstrap().group(group).channel(RdmaSocketChannel.class)
                .option(RdmaChannelOption.SEND_QUEUE_DEPTH, sendQueueDepth)
                .option(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, recvQueueDepth);
    }

    /** A server bootstrap on this transport's group and channel class; accepted connections get its options. */
    ServerBootstrap newServerBootstrap() {
        return new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
                .childOption(RdmaChannelOption.SEND_QUEUE_DEPTH, sendQueueDepth)
                .childOption(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, recvQueueDepth)
                .childOption(RdmaChannelOption.MAX_MESSAGE_SIZE, SERVER_MAX_MESSAGE_SIZE);
    }

    /** Called from each connection's initializer (so registered): its event loop's copy counters join the sums. */
    void track(Channel ch) {
        RdmaChannelMetrics m = ((RdmaSocketChannel) ch).eventLoopMetrics();
        if (m != null) {
            eventLoopMetrics.add(m);
        }
    }

    /** Bytes written on this transport's connections that the CPU copied into registered memory first. */
    long copiedOnSendBytes() {
        long sum = 0;
        for (RdmaChannelMetrics m : eventLoopMetrics) {
            sum += m.copiedBytes();
        }
        return sum;
    }

    /** Bytes received on this transport's connections that the CPU copied out of a receive buffer. */
    long copiedOnReceiveBytes() {
        long sum = 0;
        for (RdmaChannelMetrics m : eventLoopMetrics) {
            sum += m.receivedCopiedBytes();
        }
        return sum;
    }

    RdmaProvider provider() {
        return provider;
    }

    /** What moves the bytes, in words, for logs. */
    /** Connections of this JVM's provider that took the soft provider's same-host path, since it started. */
    long sameHostConnections() {
        return provider.resourceUsage().sameHostConnections();
    }

    String description() {
        return "RdmaSocketChannel on the " + provider.name() + " RDMA provider";
    }

    void close() {
        group.shutdownGracefully(0, 2, TimeUnit.SECONDS).syncUninterruptibly();
    }

    private static ThreadFactory daemonThreads(String prefix) {
        AtomicInteger n = new AtomicInteger();
        return r -> {
            Thread t = new Thread(r, prefix + "-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        };
    }

    /** RDMA cannot be used in this process; the message names the cause and the fix. */
    static final class UnavailableException extends Exception {
        UnavailableException(String message) {
            super(message);
        }
    }
}
