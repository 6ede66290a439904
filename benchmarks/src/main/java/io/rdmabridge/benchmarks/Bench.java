package io.rdmabridge.benchmarks;

import io.netty.channel.EventLoopGroup;
import io.rdmabridge.benchmarks.perf.CpuClock;
import io.rdmabridge.verbs.RdmaProvider;

import java.net.SocketAddress;
import java.util.concurrent.TimeUnit;

/**
 * One benchmark setup: a server (in this JVM or a child process), a client event loop and one client connection in
 * echo or sink mode. Built in a benchmark's trial setup, closed in its teardown. Not thread-safe.
 */
public final class Bench implements AutoCloseable {
    /** The system property naming the RDMA provider the benchmarks use; they default to {@code soft}. */
    public static final String PROVIDER_PROPERTY = "rdmabridge.provider";

    private final AutoCloseable server;
    private final EventLoopGroup clientGroup;
    private final PerfClient client;

    private Bench(AutoCloseable server, EventLoopGroup clientGroup, PerfClient client) {
        this.server = server;
        this.clientGroup = clientGroup;
        this.client = client;
    }

    /** The provider name benchmarks use: {@value #PROVIDER_PROPERTY}, or {@code soft}. */
    public static String providerName() {
        return System.getProperty(PROVIDER_PROPERTY, "soft");
    }

    /** Messages per acknowledged batch: {@code batchBytes} worth, at least 4 so that large messages pipeline. */
    public static int messagesPerBatch(int size, int batchBytes) {
        return Math.max(4, batchBytes / size);
    }

    /** Server and client in this JVM, each on its own event loop. */
    public static Bench inJvm(Transport transport, boolean echo, int size, int batchBytes, Payload payload)
            throws Exception {
        RdmaProvider provider = transport == Transport.RDMA ? Transport.provider(providerName()) : null;
        PerfServer server = PerfServer.start(transport, provider, transport.bindAddress("127.0.0.1", 0));
        return connect(server, server.localAddress(), transport, provider, echo, size, batchBytes, payload);
    }

    /** Server in a child JVM on loopback, client here, writing {@code payload}. */
    public static Bench crossProcess(Transport transport, boolean echo, int size, int batchBytes, Payload payload)
            throws Exception {
        RdmaProvider provider = transport == Transport.RDMA ? Transport.provider(providerName()) : null;
        ChildServer server = ChildServer.start(transport, providerName());
        return connect(server, server.address(), transport, provider, echo, size, batchBytes, payload);
    }

    private static Bench connect(AutoCloseable server, SocketAddress address, Transport transport,
                                 RdmaProvider provider, boolean echo, int size, int batchBytes, Payload payload)
            throws Exception {
        EventLoopGroup group = null;
        try {
            group = transport.newGroup(1, provider);
            PerfClient client = echo ? PerfClient.echo(transport, group, address, size)
                    : PerfClient.sink(transport, group, address, size, messagesPerBatch(size, batchBytes), payload);
            return new Bench(server, group, client);
        } catch (Exception | Error e) {
            if (group != null) {
                group.shutdownGracefully(0, 0, TimeUnit.SECONDS);
            }
            server.close();
            throw e;
        }
    }

    /**
     * CPU nanoseconds (user + system, all threads) this process and, for {@link #crossProcess}, the child server have
     * used so far; -1 where either cannot be read.
     */
    public long cpuNanos() {
        long here = CpuClock.processNanos();
        long child = server instanceof ChildServer c ? c.cpuNanos() : 0;
        return here < 0 || child < 0 ? -1 : here + child;
    }

    public PerfClient client() {
        return client;
    }

    @Override
    public void close() throws Exception {
        try {
            client.close();
        } finally {
            clientGroup.shutdownGracefully(0, 5, TimeUnit.SECONDS).syncUninterruptibly();
            server.close();
        }
    }
}
