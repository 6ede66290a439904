package io.rdmabridge.benchmarks.perf;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Which address loopback mode runs on, and that it says so. */
@Timeout(60)
class RdmaPerfAddressTest {
    private final ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    private final PrintStream out = new PrintStream(bytes, true, StandardCharsets.UTF_8);

    private String output() {
        return bytes.toString(StandardCharsets.UTF_8);
    }

    @Test
    void shouldRunTheSoftProviderOnLoopbackAndSaySo() {
        int status = RdmaPerf.run(new String[] {"send_lat", "--provider", "soft", "--size", "64", "--iterations", "50"},
                out);

        String text = output();
        assertEquals(0, status, text);
        assertTrue(text.startsWith("rdma-perf: address 127.0.0.1 (loopback: the soft provider is software and serves"
                + " every local address)\n"), text);
        assertTrue(text.contains("mode=loopback (both ends in this process) on 127.0.0.1"), text);
    }

    @Test
    void shouldRunOnAnExplicitAddress() {
        int status = RdmaPerf.run(new String[] {"write_bw", "--provider", "soft", "--address", "127.0.0.2",
            "--size", "64", "--iterations", "50"}, out);

        String text = output();
        assertEquals(0, status, text);
        assertTrue(text.startsWith("rdma-perf: address 127.0.0.2 (--address)\n"), text);
        assertTrue(text.contains("mode=loopback (both ends in this process) on 127.0.0.2"), text);
    }

    @Test
    void shouldRefuseAnAddressOutsideLoopbackMode() {
        int status = RdmaPerf.run(new String[] {"--connect", "127.0.0.1:18515", "--address", "127.0.0.2"}, out);

        assertEquals(2, status, output());
        assertTrue(output().startsWith("rdma-perf: --address is loopback mode's address (expected: --bind IP with"
                + " --server, HOST in --connect HOST:PORT)\nusage:"), output());
    }
}
