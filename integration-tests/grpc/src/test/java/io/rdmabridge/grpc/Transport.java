package io.rdmabridge.grpc;

import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.ServerChannel;
import io.netty.channel.nio.NioIoHandler;
import io.netty.channel.socket.nio.NioServerSocketChannel;
import io.netty.channel.socket.nio.NioSocketChannel;
import io.rdmabridge.netty.RdmaIoHandler;
import io.rdmabridge.netty.RdmaServerSocketChannel;
import io.rdmabridge.netty.RdmaSocketChannel;

/**
 * The Netty transports gRPC runs on in these tests: the RDMA channel (provider from {@code rdmabridge.provider}, the
 * soft provider in the tests) and NIO, the control.
 */
enum Transport {
    RDMA(RdmaServerSocketChannel.class, RdmaSocketChannel.class),
    NIO(NioServerSocketChannel.class, NioSocketChannel.class);

    final Class<? extends ServerChannel> serverChannel;
    final Class<? extends io.netty.channel.Channel> clientChannel;

    Transport(Class<? extends ServerChannel> serverChannel, Class<? extends io.netty.channel.Channel> clientChannel) {
        this.serverChannel = serverChannel;
        this.clientChannel = clientChannel;
    }

    /** An event loop group of {@code threads} loops for this transport, for gRPC's boss, workers and clients. */
    EventLoopGroup newGroup(int threads) {
        return new MultiThreadIoEventLoopGroup(threads,
                this == RDMA ? RdmaIoHandler.newFactory() : NioIoHandler.newFactory());
    }
}
