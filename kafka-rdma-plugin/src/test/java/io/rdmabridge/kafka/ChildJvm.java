package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;

/** Runs a test's main class in a JVM of its own, for what must not touch the test JVM (its descriptors, its classes). */
final class ChildJvm {
    private ChildJvm() {
    }

    /** The {@code java} of the running JDK. */
    static String java() {
        return Path.of(System.getProperty("java.home"), "bin", "java").toString();
    }

    /** The class path entry {@code c} was loaded from. */
    static String location(Class<?> c) throws Exception {
        return Path.of(c.getProtectionDomain().getCodeSource().getLocation().toURI()).toString();
    }

    /** Runs {@code command}, asserts it ends with status 0 within a minute, and returns what it printed. */
    static String run(List<String> command) throws Exception {
        Process child = new ProcessBuilder(command).redirectErrorStream(true).start();
        String out;
        try {
            out = new String(child.getInputStream().readAllBytes(), StandardCharsets.UTF_8).strip();
            assertTrue(child.waitFor(60, TimeUnit.SECONDS), "the child JVM did not end: " + out);
        } finally {
            child.destroyForcibly();
        }
        assertEquals(0, child.exitValue(), out);
        return out;
    }
}
