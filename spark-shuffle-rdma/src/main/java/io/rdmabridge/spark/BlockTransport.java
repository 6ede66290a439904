package io.rdmabridge.spark;

import io.netty.channel.Channel;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.ServerChannel;
import io.rdmabridge.netty.RdmaIoHandler;
import io.rdmabridge.netty.RdmaServerSocketChannel;
import io.rdmabridge.netty.RdmaSocketChannel;
import io.rdmabridge.verbs.ProviderSelection;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RdmaProviders;
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

    private final EventLoopGroup group;
    private final RdmaProvider provider;

    private BlockTransport(EventLoopGroup group, RdmaProvider provider) {
        this.group = group;
        this.provider = provider;
    }

    /**
     * The RDMA transport for {@code provider} ({@code auto}, {@code disni} or {@code soft}), or an exception whose
     * message names why RDMA cannot be used here and what to do about it.
     */
    static BlockTransport open(String provider, int ioThreads, String threadPrefix) throws UnavailableException {
        ProviderSelection selection = RdmaProviders.select(provider);
        if (!selection.isAvailable()) {
            throw new UnavailableException(selection.reason());
        }
        RdmaProvider chosen = selection.provider();
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(ioThreads, daemonThreads(threadPrefix),
                RdmaIoHandler.newFactory(chosen));
        return new BlockTransport(group, chosen);
    }

    EventLoopGroup group() {
        return group;
    }

    Class<? extends ServerChannel> serverChannelClass() {
        return RdmaServerSocketChannel.class;
    }

    Class<? extends Channel> channelClass() {
        return RdmaSocketChannel.class;
    }

    RdmaProvider provider() {
        return provider;
    }

    /** What moves the bytes, in words, for logs. */
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
