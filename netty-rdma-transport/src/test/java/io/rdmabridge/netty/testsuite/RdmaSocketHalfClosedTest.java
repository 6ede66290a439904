package io.rdmabridge.netty.testsuite;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.testsuite.transport.TestsuitePermutation.BootstrapComboFactory;
import io.netty.testsuite.transport.socket.SocketHalfClosedTest;
import org.junit.jupiter.api.Tag;

import java.net.SocketAddress;
import java.util.List;

@Tag(RdmaSocketTestPermutation.DEVICE)
public class RdmaSocketHalfClosedTest extends SocketHalfClosedTest {
    @Override
    protected List<BootstrapComboFactory<ServerBootstrap, Bootstrap>> newFactories() {
        return RdmaSocketTestPermutation.INSTANCE.socket();
    }

    @Override
    protected SocketAddress newSocketAddress() {
        return RdmaSocketTestPermutation.deviceAddress();
    }
}
