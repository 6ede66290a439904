package io.rdmabridge.benchmarks.perf;

import io.rdmabridge.verbs.RdmaProviders;
import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * rdma-perf in loopback mode as a user runs it: no {@code --address}, the provider this build's tests run on
 * ({@code rdmabridge.provider}: soft here, DiSNI in the rxe guest), three sizes on one connection (the pattern that
 * once hung on rxe), and the Netty channel's send_lat over the same provider.
 */
class RdmaPerfProviderTest {

    private static String run(String... args) {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        int status = RdmaPerf.run(args, new PrintStream(bytes, true, StandardCharsets.UTF_8));
        String text = bytes.toString(StandardCharsets.UTF_8);
        System.out.println(text);
        assertEquals(0, status, text);
        return text;
    }

    private static String provider() {
        return System.getProperty(RdmaProviders.PROVIDER_PROPERTY, "soft");
    }

    @Test
    void shouldRunWriteBandwidthWithThreeSizesOnOneConnection() {
        String text = run("write_bw", "--provider", provider(), "--sizes", "64,4096,65536", "--iterations", "200");
        assertTrue(text.startsWith("rdma-perf: address "), text);
        for (String size : new String[] {"64", "4096", "65536"}) {
            assertTrue(text.lines().anyMatch(l -> l.trim().startsWith(size + " ")), "no row for " + size + ": " + text);
        }
    }

    @Test
    void shouldRunTheNettyChannelOverTheProvider() {
        String text = run("send_lat", "--provider", provider(), "--api", "netty", "--sizes", "64,4096",
                "--iterations", "200");
        assertTrue(text.lines().anyMatch(l -> l.trim().startsWith("64 ")), text);
    }
}
