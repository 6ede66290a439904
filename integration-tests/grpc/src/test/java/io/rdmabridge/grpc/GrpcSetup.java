package io.rdmabridge.grpc;

import io.grpc.ManagedChannelBuilder;
import io.grpc.netty.GrpcSslContexts;
import io.grpc.netty.NegotiationType;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.NettyServerBuilder;
import io.grpc.testing.TlsTesting;
import io.netty.channel.EventLoopGroup;
import io.netty.handler.ssl.SslContext;
import io.netty.handler.ssl.SslContextBuilder;
import io.netty.handler.ssl.SslProvider;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;

/**
 * How the interop suite's server and client are built for one transport, with or without TLS, as gRPC's own
 * Netty interop tests build them (flow-control window and message limit of {@code AbstractInteropTest}).
 */
public final class GrpcSetup {
    /** Host name in the test certificate (server1.pem of grpc-testing). */
    static final String TEST_AUTHORITY = "foo.test.google.fr";
    /** {@code AbstractInteropTest.TEST_FLOW_CONTROL_WINDOW} and {@code MAX_MESSAGE_SIZE}. */
    static final int FLOW_CONTROL_WINDOW = 65 * 1024;
    static final int MAX_MESSAGE_SIZE = 16 * 1024 * 1024;

    final Transport transport;
    final boolean tls;
    final EventLoopGroup group;

    GrpcSetup(Transport transport, boolean tls, EventLoopGroup group) {
        this.transport = transport;
        this.tls = tls;
        this.group = group;
    }

    /** A server bound to an ephemeral port of {@code host} on this transport. */
    public NettyServerBuilder serverBuilder(String host) {
        NettyServerBuilder b = NettyServerBuilder.forAddress(new InetSocketAddress(host, 0))
                .channelType(transport.serverChannel).bossEventLoopGroup(group).workerEventLoopGroup(group)
                .flowControlWindow(FLOW_CONTROL_WINDOW).maxInboundMessageSize(MAX_MESSAGE_SIZE);
        if (tls) {
            try (InputStream cert = TlsTesting.loadCert("server1.pem");
                 InputStream key = TlsTesting.loadCert("server1.key")) {
                b.sslContext(GrpcSslContexts.configure(SslContextBuilder.forServer(cert, key), SslProvider.JDK)
                        .build());
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
        return b;
    }

    /** A client of {@code host:port} on this transport. */
    public ManagedChannelBuilder<?> channelBuilder(String host, int port) {
        NettyChannelBuilder b = NettyChannelBuilder.forAddress(host, port)
                .channelType(transport.clientChannel).eventLoopGroup(group)
                .flowControlWindow(FLOW_CONTROL_WINDOW).maxInboundMessageSize(MAX_MESSAGE_SIZE);
        if (!tls) {
            return b.negotiationType(NegotiationType.PLAINTEXT);
        }
        try (InputStream ca = TlsTesting.loadCert("ca.pem")) {
            SslContext ssl = GrpcSslContexts.configure(SslContextBuilder.forClient().trustManager(ca), SslProvider.JDK)
                    .build();
            return b.sslContext(ssl).overrideAuthority(TEST_AUTHORITY);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Where the tests listen and connect: loopback for the soft provider ({@code rdmabridge.test.address}). */
    public static String address() {
        return System.getProperty("rdmabridge.test.address", "127.0.0.1");
    }

    @Override
    public String toString() {
        return transport + (tls ? " with TLS" : "");
    }
}
