package io.rdmabridge.it.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * The Scala 2.13 drop-in jar on a Spark built for Scala 2.12: the shuffle manager must refuse to start, naming the
 * {@code _2.12} jar, instead of failing reduce tasks later with {@code NoClassDefFoundError}. Runs in a child JVM whose
 * class path is this module's (Spark 3.5 for Scala 2.12) with the 2.13 jar in place of the 2.12 one.
 */
class RdmaShuffleScalaLineTest {
    @Test
    void jarBuiltForScala213RefusesToStartOnScala212NamingTheJarToUse() throws Exception {
        Path jar213 = Path.of(System.getProperty("it.scala213.jar"));
        assertTrue(Files.isRegularFile(jar213), jar213 + " is missing: build spark-shuffle-rdma first (mvn verify "
                + "from the root builds it before this module)");
        List<String> classPath = Stream.of(System.getProperty("java.class.path").split(File.pathSeparator))
                .filter(e -> !e.contains("spark-shuffle-rdma-3.5_2.12"))
                .collect(Collectors.toCollection(ArrayList::new));
        classPath.add(jar213.toString());
        String output = run(classPath);
        assertTrue(output.startsWith("FAILED java.lang.IllegalStateException: rdma-bridge: spark-shuffle-rdma-"),
                output);
        assertTrue(output.contains("is built for Scala 2.13, but this Spark runs on Scala 2.12."), output);
        assertTrue(output.contains("Put spark-shuffle-rdma-3.5_2.12-"), output);
    }

    @Test
    void jarBuiltForScala212StartsOnScala212() throws Exception {
        List<String> classPath = List.of(System.getProperty("java.class.path").split(File.pathSeparator));
        String output = run(classPath);
        // Executor side, no SparkEnv: on Spark 3.5 the manager starts its transport at its first shuffle call, so
        // construction gets past the line check and completes.
        assertEquals("STARTED io.rdmabridge.spark.RdmaShuffleManager", output);
    }

    private static String run(List<String> classPath) throws Exception {
        List<String> command = new ArrayList<>();
        command.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        command.add("-cp");
        command.add(String.join(File.pathSeparator, classPath));
        command.add(ScalaLineProbe.class.getName());
        Process p = new ProcessBuilder(command).redirectErrorStream(true).start();
        byte[] out = p.getInputStream().readAllBytes();
        assertTrue(p.waitFor(60, TimeUnit.SECONDS), "probe did not exit");
        String text = new String(out, StandardCharsets.UTF_8);
        return text.lines().filter(l -> l.startsWith("STARTED") || l.startsWith("FAILED")).findFirst()
                .orElse("no result; output:\n" + text);
    }
}
