package io.rdmabridge.grpc;

import io.grpc.Server;
import io.grpc.ServerInterceptors;
import io.grpc.testing.integration.TestServiceImpl;
import io.netty.channel.EventLoopGroup;

import java.net.InetSocketAddress;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * The server process of the cross-process interop runs: gRPC's interop {@link TestServiceImpl} (with its
 * interceptors, as the suite's own server has them) on the transport named by the first argument ({@code RDMA} or
 * {@code NIO}), TLS when the second is {@code tls}; bound to an ephemeral port of {@code rdmabridge.test.address},
 * printed as {@code PORT n}. Runs until its standard input closes or it is killed.
 */
public final class InteropServerMain {
    private InteropServerMain() {
    }

    public static void main(String[] args) throws Exception {
        Transport transport = Transport.valueOf(args[0]);
        boolean tls = args.length > 1 && args[1].equals("tls");
        EventLoopGroup group = transport.newGroup(2);
        ScheduledExecutorService executor = Executors.newScheduledThreadPool(2);
        Server server = new GrpcSetup(transport, tls, group).serverBuilder(GrpcSetup.address())
                .addService(ServerInterceptors.intercept(new TestServiceImpl(executor), TestServiceImpl.interceptors()))
                .build().start();
        System.out.println("PORT " + ((InetSocketAddress) server.getListenSockets().get(0)).getPort());
        System.out.flush();
        while (System.in.read() >= 0) {
            // Nothing is expected on standard input: its end is the signal to stop.
        }
        server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
        executor.shutdownNow();
        group.shutdownGracefully(0, 1, TimeUnit.SECONDS).sync();
    }
}
