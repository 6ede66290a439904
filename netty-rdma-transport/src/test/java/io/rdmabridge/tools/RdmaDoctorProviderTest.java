package io.rdmabridge.tools;

import io.rdmabridge.verbs.RdmaProviders;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * rdma-doctor as a user runs it on a new node: no {@code --address}, the provider this build's tests run on
 * ({@code rdmabridge.provider}: the soft provider here, DiSNI in the rxe guest, where the address must come from the
 * active RDMA port's interface, never 127.0.0.1).
 */
// Runs on a real device too: the rxe stage selects the device tag (rxe/steps).
@Tag("device")
class RdmaDoctorProviderTest {

    @Test
    void shouldFindTheAddressItselfAndPassThePingPong() throws InterruptedException {
        String provider = System.getProperty(RdmaProviders.PROVIDER_PROPERTY, "soft");
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        int status = RdmaDoctor.run(new String[] {"--provider", provider, "--iterations", "200"},
                new PrintStream(bytes, true, StandardCharsets.UTF_8));

        String text = bytes.toString(StandardCharsets.UTF_8);
        System.out.println(text);
        assertEquals(0, status, text);
        assertTrue(text.contains("-- address: "), text);
        if (RdmaProviders.byName(provider).isHardware()) {
            assertTrue(!text.contains("-- address: 127.0.0.1"), "a device's address must not be loopback: " + text);
        }
        assertTrue(text.endsWith("RESULT: OK: " + provider + " passed the ping-pong\n"), text);
        assertTrue(RdmaProviders.byName(provider).resourceUsage().awaitZero(Duration.ofSeconds(5)),
                () -> "leaked: " + RdmaProviders.byName(provider).resourceUsage());
    }
}
