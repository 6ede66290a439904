package io.rdmabridge.netty.testsuite;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.ChannelFuture;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.testsuite.transport.TestsuitePermutation.BootstrapFactory;
import io.netty.testsuite.transport.socket.AbstractSocketShutdownOutputByPeerTest;
import io.netty.util.concurrent.DefaultThreadFactory;
import io.rdmabridge.netty.RdmaIoHandler;
import io.rdmabridge.netty.RdmaSocketChannel;
import org.junit.jupiter.api.AfterAll;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.net.SocketAddress;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * Netty's "output shut down by the peer" cases, RDMA x RDMA: the RDMA server's child must see the peer's end of stream
 * as {@code ChannelInputShutdownEvent} with {@code ALLOW_HALF_CLOSURE} (and stay open), or close without it.
 *
 * <p>Netty's own subclass drives a blocking {@code java.net.Socket}, which cannot talk to a queue pair; here the peer
 * is an {@link RdmaSocketChannel} on a loop group of its own (as a separate process would be), each operation
 * waited for as the blocking socket's call would be.
 */
public class RdmaSocketShutdownOutputByPeerTest extends AbstractSocketShutdownOutputByPeerTest<RdmaSocketChannel> {
    private static final EventLoopGroup PEER_GROUP = new MultiThreadIoEventLoopGroup(1,
            new DefaultThreadFactory("testsuite-rdma-peer", true), RdmaIoHandler.newFactory());

    @AfterAll
    static void shutDownPeerGroup() {
        PEER_GROUP.shutdownGracefully(0, 5, TimeUnit.SECONDS).syncUninterruptibly();
    }

    @Override
    protected List<BootstrapFactory<ServerBootstrap>> newFactories() {
        return RdmaSocketTestPermutation.INSTANCE.serverSocket();
    }

    /** An unregistered channel: it holds no resource until {@link #connect} registers it. */
    @Override
    protected RdmaSocketChannel newSocket() {
        return new RdmaSocketChannel();
    }

    @Override
    protected void connect(RdmaSocketChannel peer, SocketAddress address) throws IOException {
        await(PEER_GROUP.register(peer));
        await(peer.connect(address));
    }

    @Override
    protected void write(RdmaSocketChannel peer, int i) throws IOException {
        await(peer.writeAndFlush(peer.alloc().buffer(1).writeByte(i)));
    }

    @Override
    protected void shutdownOutput(RdmaSocketChannel peer) throws IOException {
        await(peer.shutdownOutput());
    }

    @Override
    protected void close(RdmaSocketChannel peer) throws IOException {
        // Never registered when the test failed before connecting: nothing to release then.
        if (peer.isRegistered()) {
            await(peer.close());
        }
    }

    /** Waits as the blocking socket's call would; the operation's failure is thrown as it is. */
    private static void await(ChannelFuture future) throws IOException {
        try {
            future.sync();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted while waiting for " + future.channel());
        }
    }
}
