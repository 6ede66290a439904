package io.rdmabridge.grpc;

import io.grpc.CallOptions;
import io.grpc.ManagedChannel;
import io.grpc.MethodDescriptor;
import io.grpc.Server;
import io.grpc.ServerServiceDefinition;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.ServerCalls;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.rdmabridge.netty.RdmaChannelOption;
import io.rdmabridge.netty.RdmaIoHandler;
import io.rdmabridge.netty.RdmaServerSocketChannel;
import io.rdmabridge.netty.RdmaSocketChannel;
import io.rdmabridge.verbs.RdmaProviders;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The gRPC example of the README, as written there but bound to an ephemeral loopback port (tests never leave this
 * host); the provider comes from {@code rdmabridge.provider}, set to soft for the tests.
 */
class GrpcReadmeExampleTest {

    @Test
    @Timeout(60)
    void theReadmeGrpcExampleAnswers() throws Exception {
        String answer;
        // From the README, unchanged but for the address and port.
        // A gRPC method without generated code: requests and responses are UTF-8 strings.
        MethodDescriptor.Marshaller<String> utf8 = new MethodDescriptor.Marshaller<>() {
            @Override
            public InputStream stream(String value) {
                return new ByteArrayInputStream(value.getBytes(StandardCharsets.UTF_8));
            }

            @Override
            public String parse(InputStream stream) {
                try {
                    return new String(stream.readAllBytes(), StandardCharsets.UTF_8);
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
            }
        };
        MethodDescriptor<String, String> say = MethodDescriptor.<String, String>newBuilder()
                .setType(MethodDescriptor.MethodType.UNARY).setFullMethodName("demo.Echo/Say")
                .setRequestMarshaller(utf8).setResponseMarshaller(utf8).build();

        EventLoopGroup group = new MultiThreadIoEventLoopGroup(RdmaIoHandler.newFactory());
        Server server = NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0))
                .channelType(RdmaServerSocketChannel.class).bossEventLoopGroup(group).workerEventLoopGroup(group)
                .withChildOption(RdmaChannelOption.REGISTERED_ALLOCATOR, true) // gRPC writes from registered memory
                .addService(ServerServiceDefinition.builder("demo.Echo")
                        .addMethod(say, ServerCalls.asyncUnaryCall((request, reply) -> {
                            reply.onNext("echo: " + request);
                            reply.onCompleted();
                        }))
                        .build())
                .build().start();
        int port = ((InetSocketAddress) server.getListenSockets().get(0)).getPort();
        ManagedChannel channel = NettyChannelBuilder.forAddress("127.0.0.1", port)
                .channelType(RdmaSocketChannel.class).eventLoopGroup(group).usePlaintext()
                .withOption(RdmaChannelOption.REGISTERED_ALLOCATOR, true)
                .build();
        try {
            answer = ClientCalls.blockingUnaryCall(channel, say, CallOptions.DEFAULT, "hello over RDMA");
            System.out.println(answer);
        } finally {
            channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
            server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
            group.shutdownGracefully().sync();
        }

        assertEquals("echo: hello over RDMA", answer);
        assertTrue(RdmaProviders.byName("soft").resourceUsage().isZero(),
                "leaked: " + RdmaProviders.byName("soft").resourceUsage());
    }
}
