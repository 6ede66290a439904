package io.rdmabridge.spark;

import java.io.IOException;
import java.io.InputStream;
import java.util.Properties;

/**
 * The Scala line this jar was compiled against, checked against the one Spark runs on before anything else starts.
 * Scala 2.12 and 2.13 are not binary compatible: the wrong jar loads, then fails reduce tasks much later with
 * {@code NoClassDefFoundError: scala/collection/IterableOnce} (or the 2.12 equivalent), which names neither the cause
 * nor the fix. Maven writes the line into {@code scala-line.properties} for each drop-in jar.
 */
final class ScalaLine {
    static final String RESOURCE = "scala-line.properties";
    /** The jar for each Scala line these sources are built for (README, "Spark versions"). */
    private static final String JAR_2_13 = "spark-shuffle-rdma";
    private static final String JAR_2_12 = "spark-shuffle-rdma-3.5_2.12";

    private ScalaLine() {
    }

    /**
     * Throws when the running Scala line differs from this jar's.
     *
     * @throws IllegalStateException naming both lines and the jar to use instead
     */
    static void check() {
        Properties jar = new Properties();
        try (InputStream in = ScalaLine.class.getResourceAsStream(RESOURCE)) {
            if (in == null) {
                throw new IllegalStateException("rdma-bridge: " + RESOURCE + " is missing from the spark-shuffle-rdma "
                        + "jar on the class path; the jar is damaged or repackaged: use the released jar");
            }
            jar.load(in);
        } catch (IOException e) {
            throw new IllegalStateException("rdma-bridge: cannot read " + RESOURCE + " from the spark-shuffle-rdma "
                    + "jar (" + e + "); the jar is damaged: use the released jar", e);
        }
        String problem = mismatch(jar.getProperty("scala.binary.version"), jar.getProperty("artifactId"),
                jar.getProperty("version"), scala.util.Properties.versionNumberString());
        if (problem != null) {
            throw new IllegalStateException(problem);
        }
    }

    /**
     * Why a jar compiled for {@code jarLine} cannot run on Scala {@code runningVersion}, or {@code null} when it can.
     */
    static String mismatch(String jarLine, String jarArtifact, String jarVersion, String runningVersion) {
        String running = binaryVersion(runningVersion);
        if (running.equals(jarLine)) {
            return null;
        }
        String use = "2.12".equals(running) ? JAR_2_12 : "2.13".equals(running) ? JAR_2_13 : null;
        return "rdma-bridge: " + jarArtifact + "-" + jarVersion + ".jar is built for Scala " + jarLine
                + ", but this Spark runs on Scala " + runningVersion + " (Scala lines are not binary compatible). "
                + (use != null
                        ? "Put " + use + "-" + jarVersion + ".jar on the class path instead of it."
                        : "No rdma-bridge jar is built for Scala " + running + "; use a Spark built for Scala 2.13 "
                                + "(or 2.12 for Spark 3.5).");
    }

    /** {@code 2.13.16} gives {@code 2.13}; anything else is returned as it is. */
    static String binaryVersion(String version) {
        int first = version.indexOf('.');
        int second = first < 0 ? -1 : version.indexOf('.', first + 1);
        return second < 0 ? version : version.substring(0, second);
    }
}
