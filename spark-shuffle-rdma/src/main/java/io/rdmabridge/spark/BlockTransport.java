package io.rdmabridge.spark;

import io.netty.channel.Channel;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.ServerChannel;
import io.netty.channel.nio.NioIoHandler;
import io.netty.channel.socket.nio.NioServerSocketChannel;
import io.netty.channel.socket.nio.NioSocketChannel;
import io.rdmabridge.verbs.ProviderSelection;
import io.rdmabridge.verbs.RdmaProviders;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The one seam that picks the Netty channel classes and I/O handler under the shuffle block pipeline; everything
 * above it ({@link ShuffleBlockServer}, {@link ShuffleBlockClient}) is channel-agnostic.
 *
 * <p><b>PLACEHOLDER.</b> The RDMA Netty channel ({@code io.rdmabridge.netty.RdmaSocketChannel}) is not on this branch
 * yet, so {@link #open} runs the pipeline over Netty NIO sockets whenever a provider is usable. That moves bytes over
 * TCP, not RDMA; {@link #description()} and the log line say so. Switching to {@code RdmaIoHandler.newFactory()},
 * {@code RdmaServerSocketChannel} and {@code RdmaSocketChannel} is a change to this class only.
 *
 * <p>Thread-safe after construction.
 */
final class BlockTransport {
    /** Provider value that selects the software RDMA provider. */
    static final String SOFT = "soft";

    private final EventLoopGroup group;
    private final String description;

    private BlockTransport(EventLoopGroup group, String description) {
        this.group = group;
        this.description = description;
    }

    /**
     * The transport for {@code provider}, or an exception whose message names why RDMA cannot be used here and what
     * to do about it. Never returns a transport that silently differs from the one asked for.
     */
    static BlockTransport open(String provider, int ioThreads, String threadPrefix) throws UnavailableException {
        String how;
        if (SOFT.equals(provider)) {
            // PLACEHOLDER: the soft provider and the RDMA channel are not on this branch; NIO stands in for both.
            how = "PLACEHOLDER Netty NIO (TCP) standing in for RdmaSocketChannel on the soft provider";
        } else {
            ProviderSelection selection = RdmaProviders.select(provider);
            if (!selection.isAvailable()) {
                throw new UnavailableException(selection.reason());
            }
            how = "PLACEHOLDER Netty NIO (TCP) standing in for RdmaSocketChannel on " + selection.provider().name();
        }
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(ioThreads, daemonThreads(threadPrefix),
                NioIoHandler.newFactory());
        return new BlockTransport(group, how);
    }

    EventLoopGroup group() {
        return group;
    }

    Class<? extends ServerChannel> serverChannelClass() {
        return NioServerSocketChannel.class;
    }

    Class<? extends Channel> channelClass() {
        return NioSocketChannel.class;
    }

    /** What moves the bytes, in words, for logs and the fallback report. */
    String description() {
        return description;
    }

    void close() {
        group.shutdownGracefully(0, 2, java.util.concurrent.TimeUnit.SECONDS).syncUninterruptibly();
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
