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
    @Disabled("binds the client to a local address; the verbs SPI's connection manager picks the source address itself")
    public void testShutdownNotYetConnected(TestInfo testInfo) throws Throwable {
        super.testShutdownNotYetConnected(testInfo);
    }

    @Override
    @Test
    @Disabled("times out; not yet diagnosed")
    public void readMustBePendingUntilChannelIsActive(TestInfo testInfo) throws Throwable {
        super.readMustBePendingUntilChannelIsActive(testInfo);
    }
}
