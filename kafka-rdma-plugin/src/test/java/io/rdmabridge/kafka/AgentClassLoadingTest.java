package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.slf4j.LoggerFactory;

/**
 * What the agent touches at the JVM's start ({@code premain}: the replication state, told the agent is installed)
 * loads no Kafka class: a JVM given the agent before Kafka's jars are usable, or a tool without them, must not fail
 * to start because of it.
 */
class AgentClassLoadingTest {

    @Test
    void shouldMarkTheAgentInstalledWithoutKafkasClasses() throws Exception {
        String classpath = location(RdmaReplication.class) + File.pathSeparator + location(WithoutKafka.class)
                + File.pathSeparator + location(LoggerFactory.class);
        Process child = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-Xmx64m", "-XX:TieredStopAtLevel=1", "-cp", classpath, WithoutKafka.class.getName())
                .redirectErrorStream(true).start();
        String out;
        try {
            out = new String(child.getInputStream().readAllBytes(), StandardCharsets.UTF_8).strip();
            assertTrue(child.waitFor(60, TimeUnit.SECONDS), "the child JVM did not end: " + out);
        } finally {
            child.destroyForcibly();
        }
        assertEquals(0, child.exitValue(), out);
        assertTrue(out.endsWith("agent installed; Kafka absent"), out);
    }

    private static String location(Class<?> c) throws Exception {
        return Path.of(c.getProtectionDomain().getCodeSource().getLocation().toURI()).toString();
    }

    /** Runs on a class path of this module's classes and SLF4J only; says whether Kafka was there. */
    static final class WithoutKafka {
        public static void main(String[] args) {
            RdmaReplication.get().agentInstalled();
            String kafka;
            try {
                Class.forName("org.apache.kafka.common.metrics.Metrics");
                kafka = "Kafka present";
            } catch (ClassNotFoundException e) {
                kafka = "Kafka absent";
            }
            System.out.println("agent installed; " + kafka);
        }
    }
}
