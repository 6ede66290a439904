package io.rdmabridge.netty.testsuite;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.testsuite.transport.TestsuitePermutation.BootstrapFactory;
import io.netty.testsuite.transport.socket.ServerSocketSuspendTest;

import java.util.List;

public class RdmaServerSocketSuspendTest extends ServerSocketSuspendTest {
    @Override
    protected List<BootstrapFactory<ServerBootstrap>> newFactories() {
        return RdmaSocketTestPermutation.INSTANCE.serverSocket();
    }
}
