package io.rdmabridge.netty.testsuite;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.testsuite.transport.TestsuitePermutation.BootstrapComboFactory;
import io.netty.testsuite.transport.socket.SocketDataReadInitialStateTest;

import org.junit.jupiter.api.Disabled;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;

import java.util.List;

public class RdmaSocketDataReadInitialStateTest extends SocketDataReadInitialStateTest {
    @Override
    protected List<BootstrapComboFactory<ServerBootstrap, Bootstrap>> newFactories() {
        return RdmaSocketTestPermutation.INSTANCE.socket();
    }

    @Override
    @Test
    @Disabled("does not apply to rdma_cm: a connection is established by the server's rdma_accept, issued when the server channel reads the request, so with the server's autoRead off the client's connect() completes after serverChannel.read(), not before as with a TCP backlog (see RdmaSocketTestPermutation)")

    public void testAutoReadOffNoDataReadUntilReadCalled(TestInfo testInfo) throws Throwable {
        super.testAutoReadOffNoDataReadUntilReadCalled(testInfo);
    }
}
