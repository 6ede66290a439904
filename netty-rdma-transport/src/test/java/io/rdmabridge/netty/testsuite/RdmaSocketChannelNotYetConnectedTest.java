package io.rdmabridge.netty.testsuite;

import io.netty.bootstrap.Bootstrap;
import io.netty.testsuite.transport.TestsuitePermutation.BootstrapFactory;
import io.netty.testsuite.transport.socket.SocketChannelNotYetConnectedTest;

import org.junit.jupiter.api.Disabled;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;

import java.util.List;

public class RdmaSocketChannelNotYetConnectedTest extends SocketChannelNotYetConnectedTest {
    @Override
    protected List<BootstrapFactory<Bootstrap>> newFactories() {
        return RdmaSocketTestPermutation.INSTANCE.clientSocket();
    }

    @Override
    @Test
    @Disabled("its server is a NIO ServerSocketChannel: a TCP endpoint cannot talk to an RDMA queue pair (see RdmaSocketTestPermutation)")
    public void readMustBePendingUntilChannelIsActive(TestInfo testInfo) throws Throwable {
        super.readMustBePendingUntilChannelIsActive(testInfo);
    }
}
