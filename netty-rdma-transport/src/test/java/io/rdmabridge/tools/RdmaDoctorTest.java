package io.rdmabridge.tools;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

import io.rdmabridge.verbs.RdmaProviders;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

class RdmaDoctorTest {
    private final ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    private final PrintStream out = new PrintStream(bytes, true, StandardCharsets.UTF_8);

    private String output() {
        return bytes.toString(StandardCharsets.UTF_8);
    }

    @AfterEach
    void resourcesReturnToZero() {
        var usage = RdmaProviders.byName("soft").resourceUsage();
        assertTrue(usage.isZero(), usage::toString);
    }

    @Test
    void shouldPassPingPongOnSoftProvider() {
        int status = RdmaDoctor.run(new String[] {"--provider", "soft", "--iterations", "200", "--size", "256"}, out);

        String text = output();
        assertEquals(0, status, text);
        assertTrue(text.contains("soft   software available"), text);
        assertTrue(text.contains("-- selection (rdmabridge.provider=soft): soft was requested and is available"), text);
        assertTrue(text.contains("device soft0: transport=software"), text);
        assertTrue(text.contains("-- address: 127.0.0.1 (loopback: the soft provider is software and serves every"
                + " local address)\n-- ping-pong on soft at 127.0.0.1: 200 x 256-byte SEND/RECV round trips"), text);
        Matcher rtt = Pattern.compile("round trip: min ([0-9.]+) us, p50 ([0-9.]+) us").matcher(text);
        assertTrue(rtt.find(), text);
        assertTrue(Double.parseDouble(rtt.group(1)) > 0, text);
        assertTrue(Double.parseDouble(rtt.group(1)) <= Double.parseDouble(rtt.group(2)), text);
        assertTrue(text.contains("-- memlock limit"), text);
        assertTrue(text.endsWith("RESULT: OK: soft passed the ping-pong\n"), text);
    }

    @Test
    void shouldUseAnExplicitAddress() {
        String local = "127.0.0.2"; // loopback too, but not the default
        int status = RdmaDoctor.run(new String[] {"--provider", "soft", "--iterations", "10", "--address", local}, out);

        String text = output();
        assertEquals(0, status, text);
        assertTrue(text.contains("-- address: " + local + " (--address)\n-- ping-pong on soft at " + local + ":"),
                text);
    }

    @Test
    void shouldExplainWhyDisniIsUnusableHere() {
        assumeFalse(RdmaProviders.byName("disni").isAvailable(),
                "DiSNI is usable on this machine; this case proves the explanation given without it");
        int status = RdmaDoctor.run(new String[] {"--provider", "disni"}, out);

        String text = output();
        assertEquals(1, status, text);
        assertTrue(text.contains("disni  hardware UNAVAILABLE: libdisni not found on java.library.path="), text);
        assertTrue(text.contains("RESULT: no usable RDMA provider"), text);
    }

    @Test
    void shouldRejectUnknownOptionsWithUsage() {
        int status = RdmaDoctor.run(new String[] {"--iterations"}, out);

        assertEquals(2, status);
        assertTrue(output().startsWith("rdma-doctor: option '--iterations' needs a value\nusage: rdma-doctor"),
                output());
    }
}
