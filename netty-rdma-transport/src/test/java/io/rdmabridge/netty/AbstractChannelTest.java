package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.rdmabridge.verbs.RdmaProvider;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;

import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Channel tests on one provider: each test gets an event loop group of two loops; afterwards the channels it made are
 * closed (clients before listeners), the group is shut down, and every verbs resource, registered bytes included, must
 * be back to zero. Servers listen on the address under test ({@link DeviceUnderTest}: 127.0.0.1 but on a device).
 */
abstract class AbstractChannelTest {
    private final RdmaProvider rdma;
    EventLoopGroup group;
    /** Closed in this order after the test. */
    final List<Channel> channels = new ArrayList<>();

    AbstractChannelTest(RdmaProvider provider) {
        this.rdma = provider;
    }

    @BeforeEach
    void startGroup() {
        group = new MultiThreadIoEventLoopGroup(2, RdmaIoHandler.newFactory(rdma));
    }

    @AfterEach
    void closeAndCheckNothingLeaked() throws Exception {
        for (Channel ch : channels) {
            ch.close().sync();
        }
        group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        // A DiSNI completion queue is destroyed by its event thread shortly after its channel closed it.
        assertTrue(rdma.resourceUsage().awaitZero(Duration.ofSeconds(5)), "leaked: " + rdma.resourceUsage());
    }

    /** Binds {@code bootstrap} (handlers and options set, no group, no channel) on the address under test, any port. */
    Channel listen(ServerBootstrap bootstrap) throws InterruptedException {
        return listen(bootstrap, group);
    }

    /** As {@link #listen(ServerBootstrap)}, with the accepted channels on {@code childGroup}. */
    Channel listen(ServerBootstrap bootstrap, EventLoopGroup childGroup) throws InterruptedException {
        Channel ch = bootstrap.group(group, childGroup).channel(RdmaServerSocketChannel.class)
                .bind(new InetSocketAddress(DeviceUnderTest.address(), 0)).sync().channel();
        channels.add(ch);
        return ch;
    }

    /** Connects {@code bootstrap} (handler and options set, no group, no channel) to {@code server}. */
    RdmaSocketChannel connect(Bootstrap bootstrap, Channel server) throws InterruptedException {
        RdmaSocketChannel ch = (RdmaSocketChannel) bootstrap.group(group).channel(RdmaSocketChannel.class)
                .connect(server.localAddress()).sync().channel();
        channels.add(0, ch);
        return ch;
    }

    /**
     * Starts connecting {@code bootstrap} (handler and options set, no group, no channel) to {@code remote}, without
     * waiting: the channel is closed after the test however its connect ends.
     */
    ChannelFuture startConnect(Bootstrap bootstrap, SocketAddress remote) {
        ChannelFuture connecting = bootstrap.group(group).channel(RdmaSocketChannel.class).connect(remote);
        channels.add(0, connecting.channel());
        return connecting;
    }
}
