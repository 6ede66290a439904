package io.rdmabridge.grpc;

import io.grpc.CallOptions;
import io.grpc.ClientCall;
import io.grpc.ManagedChannel;
import io.grpc.MethodDescriptor;
import io.grpc.Server;
import io.grpc.ServerServiceDefinition;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.ServerCalls;
import io.grpc.stub.StreamObserver;
import io.netty.channel.EventLoopGroup;
import io.rdmabridge.netty.RdmaChannelOption;
import io.rdmabridge.netty.RdmaServerSocketChannel;
import io.rdmabridge.netty.RdmaSocketChannel;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Copied bytes per byte of a gRPC client stream over the RDMA channel (the client's {@code RdmaChannelMetrics}): at
 * least one copy per byte with gRPC's own allocator, as gRPC installs it on every channel; a few percent with
 * {@link RdmaChannelOption#REGISTERED_ALLOCATOR}, whose buffers are registered memory (what is left is DATA that
 * HTTP/2's flow controller merged into composite buffers, which the write path copies). docs/grpc.md quotes the
 * figures this prints.
 */
class GrpcZeroCopyTest {
    private static final int MESSAGE = 1 << 20;
    private static final int MESSAGES = 32;

    /** Client streaming of byte arrays: the server answers with the number of bytes it received. */
    static final MethodDescriptor<byte[], byte[]> UPLOAD = MethodDescriptor.<byte[], byte[]>newBuilder()
            .setType(MethodDescriptor.MethodType.CLIENT_STREAMING).setFullMethodName("bench.Upload/Send")
            .setRequestMarshaller(new Bytes()).setResponseMarshaller(new Bytes()).build();

    @Test
    @Timeout(120)
    void grpcWritesComeFromRegisteredMemoryWithTheOption() throws Exception {
        double copiedPerByte = upload(false);
        double registeredCopiedPerByte = upload(true);
        System.out.printf("gRPC client streaming over RDMA, %d x %d B: copied bytes per byte %.4f with gRPC's"
                + " allocator, %.4f with REGISTERED_ALLOCATOR%n", MESSAGES, MESSAGE, copiedPerByte,
                registeredCopiedPerByte);
        assertTrue(copiedPerByte >= 1.0, "copied bytes per byte with gRPC's allocator: " + copiedPerByte);
        assertTrue(registeredCopiedPerByte < 0.1, "copied bytes per byte with REGISTERED_ALLOCATOR: "
                + registeredCopiedPerByte);
    }

    /** Streams {@link #MESSAGES} messages to a server in this JVM; returns the client's copied bytes per byte. */
    private static double upload(boolean registered) throws Exception {
        EventLoopGroup group = Transport.RDMA.newGroup(2);
        List<RdmaSocketChannel> clients = new CopyOnWriteArrayList<>();
        Server server = NettyServerBuilder.forAddress(new InetSocketAddress(GrpcSetup.address(), 0))
                .channelType(RdmaServerSocketChannel.class).bossEventLoopGroup(group).workerEventLoopGroup(group)
                .withChildOption(RdmaChannelOption.REGISTERED_ALLOCATOR, registered)
                .addService(ServerServiceDefinition.builder("bench.Upload")
                        .addMethod(UPLOAD, ServerCalls.asyncClientStreamingCall(GrpcZeroCopyTest::counter)).build())
                .build().start();
        ManagedChannel channel = NettyChannelBuilder.forAddress(GrpcSetup.address(),
                        ((InetSocketAddress) server.getListenSockets().get(0)).getPort())
                .channelFactory(() -> {
                    RdmaSocketChannel ch = new RdmaSocketChannel();
                    clients.add(ch);
                    return ch;
                }, InetSocketAddress.class)
                .eventLoopGroup(group).usePlaintext()
                .withOption(RdmaChannelOption.REGISTERED_ALLOCATOR, registered).build();
        try {
            byte[] payload = new byte[MESSAGE];
            ClientCall<byte[], byte[]> call = channel.newCall(UPLOAD, CallOptions.DEFAULT);
            CompletableFuture<byte[]> reply = new CompletableFuture<>();
            StreamObserver<byte[]> requests = ClientCalls.asyncClientStreamingCall(call, observer(reply));
            for (int i = 0; i < MESSAGES; i++) {
                requests.onNext(payload);
            }
            requests.onCompleted();
            assertEquals((long) MESSAGE * MESSAGES, Long.parseLong(new String(reply.get(60, TimeUnit.SECONDS), StandardCharsets.US_ASCII)));
            long copied = clients.stream().mapToLong(c -> c.metrics().copiedBytes()).sum();
            return (double) copied / ((long) MESSAGE * MESSAGES);
        } finally {
            channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
            server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
            group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
        }
    }

    static StreamObserver<byte[]> counter(StreamObserver<byte[]> reply) {
        return new StreamObserver<>() {
            private long bytes;

            @Override
            public void onNext(byte[] value) {
                bytes += value.length;
            }

            @Override
            public void onError(Throwable t) {
                reply.onError(t);
            }

            @Override
            public void onCompleted() {
                reply.onNext(Long.toString(bytes).getBytes(StandardCharsets.US_ASCII));
                reply.onCompleted();
            }
        };
    }

    private static <T> StreamObserver<T> observer(CompletableFuture<T> result) {
        return new StreamObserver<>() {
            @Override
            public void onNext(T value) {
                result.complete(value);
            }

            @Override
            public void onError(Throwable t) {
                result.completeExceptionally(t);
            }

            @Override
            public void onCompleted() {
                result.completeExceptionally(new IllegalStateException("completed without a reply"));
            }
        };
    }

    /** Byte arrays as they are. */
    static final class Bytes implements MethodDescriptor.Marshaller<byte[]> {
        @Override
        public InputStream stream(byte[] value) {
            return new ByteArrayInputStream(value);
        }

        @Override
        public byte[] parse(InputStream stream) {
            try {
                return stream.readAllBytes();
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    }
}
