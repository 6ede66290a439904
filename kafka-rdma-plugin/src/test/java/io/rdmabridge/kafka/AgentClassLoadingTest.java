package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.SourceShares;
import java.io.File;
import java.util.List;
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
        // The plugin's jar carries the transport's classes (shaded), not Kafka's.
        String classpath = ChildJvm.location(RdmaReplication.class) + File.pathSeparator
                + ChildJvm.location(WithoutKafka.class) + File.pathSeparator + ChildJvm.location(SourceShares.class)
                + File.pathSeparator + ChildJvm.location(LoggerFactory.class);
        String out = ChildJvm.run(List.of(ChildJvm.java(), "-Xmx64m", "-XX:TieredStopAtLevel=1", "-cp", classpath,
                WithoutKafka.class.getName()));
        assertTrue(out.endsWith("agent installed; Kafka absent"), out);
    }

    /** Runs on a class path of this module's and the transport's classes and SLF4J; says whether Kafka was there. */
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
