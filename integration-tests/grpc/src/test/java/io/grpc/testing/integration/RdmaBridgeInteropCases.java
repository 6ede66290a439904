package io.grpc.testing.integration;

import io.grpc.ManagedChannelBuilder;
import io.grpc.ServerBuilder;
import io.rdmabridge.grpc.GrpcSetup;

import java.net.InetSocketAddress;

/**
 * gRPC's interop suite ({@link AbstractInteropTest}, JUnit 4) on the transport of {@link #target}: with a server in
 * this JVM, or against the server of another process when {@link Target#remotePort} is set. Run case by case by
 * {@code io.rdmabridge.grpc.InteropSuite}, never by Surefire itself (the name matches none of its patterns). In
 * gRPC's package because the suite tells its server's port only there ({@code getListenAddress()}).
 */
public class RdmaBridgeInteropCases extends AbstractInteropTest {
    /** What the next run of this class tests. */
    public static volatile Target target;

    /**
     * @param setup      the transport and security of both ends
     * @param remotePort the port of a server in another process, or 0 for a server in this JVM
     */
    public record Target(GrpcSetup setup, int remotePort) {
    }

    @Override
    protected ServerBuilder<?> getServerBuilder() {
        Target t = target;
        return t.remotePort() != 0 ? null : t.setup().serverBuilder(GrpcSetup.address());
    }

    @Override
    protected ManagedChannelBuilder<?> createChannelBuilder() {
        Target t = target;
        int port = t.remotePort() != 0 ? t.remotePort() : ((InetSocketAddress) getListenAddress()).getPort();
        return t.setup().channelBuilder(GrpcSetup.address(), port);
    }

    @Override
    protected boolean metricsExpected() {
        // No census module is installed on these channels, so the suite's metric checks are off (its tracer checks
        // stay on).
        return false;
    }
}
