package io.rdmabridge.netty.testsuite;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.testsuite.transport.TestsuitePermutation.BootstrapComboFactory;
import io.netty.testsuite.transport.socket.SocketFileRegionTest;

import org.junit.jupiter.api.Disabled;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;

import java.util.List;

public class RdmaSocketFileRegionTest extends SocketFileRegionTest {
    @Override
    protected List<BootstrapComboFactory<ServerBootstrap, Bootstrap>> newFactories() {
        return RdmaSocketTestPermutation.INSTANCE.socket();
    }

    @Override
    @Test
    @Disabled("a custom FileRegion that writes one byte per transferTo() call hangs; not yet diagnosed")
    public void testFileRegionDrainStopsAtCompletion(TestInfo testInfo) throws Throwable {
        super.testFileRegionDrainStopsAtCompletion(testInfo);
    }
}
