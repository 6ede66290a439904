package io.rdmabridge.netty;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * A received buffer that the application drops without releasing it is reported by Netty's leak detector, as a
 * pooled buffer would be: otherwise its receive slot stays out of the queue, unnoticed, with one of the peer's
 * credits. Runs in a child JVM ({@link ReceivedBufferLeakMain}), since the leaked slot stays registered there.
 */
class RdmaReceivedBufferLeakTest {
    @Test
    @Timeout(120)
    void shouldReportAReceivedBufferTheApplicationNeverReleased() throws Exception {
        String java = System.getProperty("java.home") + File.separator + "bin" + File.separator + "java";
        Process child = new ProcessBuilder(List.of(java, "-Xmx128m", "-XX:MaxDirectMemorySize=256m",
                "-Dio.netty.leakDetection.level=paranoid", "-Drdmabridge.provider=soft",
                "-cp", System.getProperty("java.class.path"), ReceivedBufferLeakMain.class.getName()))
                .redirectErrorStream(true).start();
        String out;
        try {
            byte[] output = child.getInputStream().readAllBytes();
            assertTrue(child.waitFor(60, TimeUnit.SECONDS), "the child JVM did not exit");
            out = new String(output, StandardCharsets.UTF_8);
        } finally {
            child.destroyForcibly();
        }
        assertTrue(out.contains("REPORTED RdmaReceivedByteBuf") && !out.contains("NOT REPORTED"), out);
        assertTrue(out.contains("LEAK: RdmaReceivedByteBuf.release() was not called"), out);
    }
}
