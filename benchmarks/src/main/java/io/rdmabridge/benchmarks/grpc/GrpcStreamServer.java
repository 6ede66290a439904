package io.rdmabridge.benchmarks.grpc;

import io.grpc.Server;
import io.grpc.ServerServiceDefinition;
import io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.ServerCalls;
import io.grpc.stub.StreamObserver;
import io.netty.channel.EventLoopGroup;
import io.rdmabridge.benchmarks.Bench;
import io.rdmabridge.benchmarks.PerfServer;
import io.rdmabridge.benchmarks.RdmaTuning;
import io.rdmabridge.benchmarks.Transport;
import io.rdmabridge.benchmarks.perf.CpuClock;
import io.rdmabridge.netty.RdmaChannelOption;

import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.util.concurrent.TimeUnit;

/**
 * The server end of the gRPC streaming benchmark, run as a child JVM ({@code GrpcStreamServer TRANSPORT HOST}, through
 * {@link io.rdmabridge.benchmarks.ChildServer}): one event loop for both accepting and serving, gRPC callbacks on that
 * loop (direct executor), and on RDMA {@link RdmaChannelOption#REGISTERED_ALLOCATOR} unless
 * {@value #COPIED_PROPERTY} is {@code true} (gRPC's own buffers, which the channel copies). Prints
 * {@link PerfServer#LISTENING} once bound and serves until its standard input closes.
 */
public final class GrpcStreamServer {
    /** System property: {@code true} leaves gRPC's allocator in place on RDMA. */
    static final String COPIED_PROPERTY = "benchmarks.grpc.copied";

    private GrpcStreamServer() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: GrpcStreamServer rdma|nio host");
            System.exit(2);
        }
        Transport transport = Transport.of(args[0]);
        EventLoopGroup group = transport.newGroup(1,
                transport == Transport.RDMA ? Transport.provider(Bench.providerName()) : null);
        NettyServerBuilder b = NettyServerBuilder.forAddress(new InetSocketAddress(args[1], 0))
                .channelType(transport.serverChannelClass()).bossEventLoopGroup(group).workerEventLoopGroup(group)
                .directExecutor()
                .addService(ServerServiceDefinition.builder(UploadMethod.SERVICE).addMethod(UploadMethod.SERVER,
                        ServerCalls.asyncClientStreamingCall(GrpcStreamServer::counter)).build());
        if (transport == Transport.RDMA) {
            b.withChildOption(RdmaChannelOption.REGISTERED_ALLOCATOR, !Boolean.getBoolean(COPIED_PROPERTY));
            RdmaTuning.forEach(b::withChildOption);
        }
        Server server = b.build().start();
        try {
            InetSocketAddress bound = (InetSocketAddress) server.getListenSockets().get(0);
            System.out.println(PerfServer.LISTENING + bound.getAddress().getHostAddress() + ":" + bound.getPort());
            System.out.flush();
            InputStream in = System.in;
            try {
                while (in.read() >= 0) {
                    // The parent keeps the pipe open while it wants us.
                }
            } catch (IOException e) {
                // Pipe broken: the parent is gone.
            }
        } finally {
            server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
            group.shutdownGracefully(0, 5, TimeUnit.SECONDS).syncUninterruptibly();
        }
    }

    private static StreamObserver<Integer> counter(StreamObserver<UploadMethod.Reply> reply) {
        return new StreamObserver<>() {
            private long bytes;

            @Override
            public void onNext(Integer length) {
                bytes += length;
            }

            @Override
            public void onError(Throwable t) {
                // The client went away; nothing to answer.
            }

            @Override
            public void onCompleted() {
                reply.onNext(new UploadMethod.Reply(bytes, CpuClock.processNanos(),
                        CpuClock.threadNanos(CpuClock.SOFT_ENGINE_THREAD)));
                reply.onCompleted();
            }
        };
    }
}
