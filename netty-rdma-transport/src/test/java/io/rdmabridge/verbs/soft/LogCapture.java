package io.rdmabridge.verbs.soft;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;

/**
 * What the provider logs while open: slf4j-simple writes to whatever {@code System.err} is at each message, so this
 * copies it (and still passes it through). Close it to restore {@code System.err}.
 */
final class LogCapture implements AutoCloseable {
    private final PrintStream original = System.err;
    private final ByteArrayOutputStream captured = new ByteArrayOutputStream();

    LogCapture() {
        OutputStream tee = new OutputStream() {
            @Override
            public void write(int b) {
                synchronized (captured) {
                    captured.write(b);
                }
                original.write(b);
            }

            @Override
            public void write(byte[] b, int off, int len) {
                synchronized (captured) {
                    captured.write(b, off, len);
                }
                original.write(b, off, len);
            }
        };
        System.setErr(new PrintStream(tee, true, StandardCharsets.UTF_8));
    }

    String text() {
        synchronized (captured) {
            return captured.toString(StandardCharsets.UTF_8);
        }
    }

    /** Waits (bounded) for a WARN line that contains every one of {@code parts}. */
    void assertWarned(String... parts) {
        long deadline = System.nanoTime() + SoftPair.TIMEOUT_NANOS;
        while (true) {
            for (String line : text().split("\n")) {
                boolean all = line.contains("WARN");
                for (String p : parts) {
                    all &= line.contains(p);
                }
                if (all) {
                    return;
                }
            }
            assertTrue(System.nanoTime() < deadline, "no WARN with " + String.join(", ", parts) + " in:\n" + text());
            SoftPair.sleepMicros(10_000);
        }
    }

    @Override
    public void close() {
        System.setErr(original);
    }
}
