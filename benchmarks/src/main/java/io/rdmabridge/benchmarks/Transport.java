package io.rdmabridge.benchmarks;

import io.netty.channel.Channel;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.IoHandlerFactory;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.ServerChannel;
import io.netty.channel.epoll.Epoll;
import io.netty.channel.epoll.EpollIoHandler;
import io.netty.channel.epoll.EpollServerSocketChannel;
import io.netty.channel.epoll.EpollSocketChannel;
import io.netty.channel.local.LocalAddress;
import io.netty.channel.local.LocalChannel;
import io.netty.channel.local.LocalIoHandler;
import io.netty.channel.local.LocalServerChannel;
import io.netty.channel.nio.NioIoHandler;
import io.netty.channel.socket.nio.NioServerSocketChannel;
import io.netty.channel.socket.nio.NioSocketChannel;
import io.rdmabridge.netty.RdmaIoHandler;
import io.rdmabridge.netty.RdmaServerSocketChannel;
import io.rdmabridge.netty.RdmaSocketChannel;
import io.rdmabridge.verbs.ProviderSelection;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RdmaProviders;

import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.util.Locale;
import java.util.UUID;

/**
 * The Netty transports the benchmarks compare: the RDMA channel and Netty's own LocalChannel, epoll and NIO. Each
 * knows its event loop, its channel classes and the address a server of it binds. Thread-safe (immutable).
 */
public enum Transport {
    /** {@link RdmaSocketChannel} on an RDMA provider (the soft provider in these benchmarks unless told otherwise). */
    RDMA(RdmaSocketChannel.class, RdmaServerSocketChannel.class),
    /** Netty's in-JVM {@link LocalChannel}: the in-process baseline. */
    LOCAL(LocalChannel.class, LocalServerChannel.class),
    /** Netty's native epoll transport over TCP: the cross-process baseline. */
    EPOLL(EpollSocketChannel.class, EpollServerSocketChannel.class),
    /** Netty's NIO transport over TCP. */
    NIO(NioSocketChannel.class, NioServerSocketChannel.class);

    private final Class<? extends Channel> channelClass;
    private final Class<? extends ServerChannel> serverChannelClass;

    Transport(Class<? extends Channel> channelClass, Class<? extends ServerChannel> serverChannelClass) {
        this.channelClass = channelClass;
        this.serverChannelClass = serverChannelClass;
    }

    /** Parses {@code rdma}, {@code local}, {@code epoll} or {@code nio} (any case). */
    public static Transport of(String name) {
        try {
            return valueOf(name.trim().toUpperCase(Locale.ROOT));
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException("transport: " + name + " (expected: rdma, local, epoll or nio)");
        }
    }

    /** The lower-case name used in parameters and reports. */
    public String id() {
        return name().toLowerCase(Locale.ROOT);
    }

    public Class<? extends Channel> channelClass() {
        return channelClass;
    }

    public Class<? extends ServerChannel> serverChannelClass() {
        return serverChannelClass;
    }

    /** Whether this transport is over a network address (as opposed to {@link #LOCAL}'s in-JVM names). */
    public boolean isNetwork() {
        return this != LOCAL;
    }

    /**
     * A group of {@code threads} event loops for this transport.
     *
     * @param provider the RDMA provider for {@link #RDMA}; ignored otherwise
     * @throws IllegalStateException when epoll is unavailable here, with Netty's cause
     */
    public EventLoopGroup newGroup(int threads, RdmaProvider provider) {
        return new MultiThreadIoEventLoopGroup(threads, ioHandlerFactory(provider));
    }

    private IoHandlerFactory ioHandlerFactory(RdmaProvider provider) {
        switch (this) {
            case RDMA:
                return RdmaIoHandler.newFactory(provider);
            case LOCAL:
                return LocalIoHandler.newFactory();
            case EPOLL:
                if (!Epoll.isAvailable()) {
                    throw new IllegalStateException("epoll transport unavailable: " + Epoll.unavailabilityCause()
                            + " (expected: Linux x86_64 with netty-transport-native-epoll:linux-x86_64 on the class"
                            + " path; use nio instead)", Epoll.unavailabilityCause());
                }
                return EpollIoHandler.newFactory();
            case NIO:
                return NioIoHandler.newFactory();
            default:
                throw new AssertionError(this);
        }
    }

    /** Where a server of this transport binds: a fresh local name, or {@code host} with a port (0 picks one). */
    public SocketAddress bindAddress(String host, int port) {
        if (this == LOCAL) {
            return new LocalAddress("rdma-perf-" + UUID.randomUUID());
        }
        return new InetSocketAddress(host, port);
    }

    /**
     * The provider chosen by {@code name} ({@code auto}, {@code soft}, {@code disni}).
     *
     * @throws IllegalStateException naming why no provider is usable
     */
    public static RdmaProvider provider(String name) {
        ProviderSelection selection = RdmaProviders.select(name);
        if (selection.provider() == null) {
            throw new IllegalStateException(selection.reason());
        }
        return selection.provider();
    }
}
