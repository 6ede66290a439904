package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.InputStream;
import java.util.Properties;
import org.junit.jupiter.api.Test;

class ScalaLineTest {
    @Test
    void builtJarRecordsTheScalaLineItWasCompiledAgainst() throws Exception {
        Properties p = new Properties();
        try (InputStream in = ScalaLine.class.getResourceAsStream(ScalaLine.RESOURCE)) {
            p.load(in);
        }
        // Filtered by Maven: an unfiltered ${...} here would make every check fail at start-up.
        assertEquals(ScalaLine.binaryVersion(scala.util.Properties.versionNumberString()),
                p.getProperty("scala.binary.version"));
        assertEquals("spark-shuffle-rdma", p.getProperty("artifactId"));
        assertTrue(p.getProperty("version").matches("\\d+\\.\\d+\\.\\d+.*"), p.getProperty("version"));
    }

    @Test
    void sameLinePasses() {
        ScalaLine.check();
        assertNull(ScalaLine.mismatch("2.13", "spark-shuffle-rdma", "1.0", "2.13.16"));
        assertNull(ScalaLine.mismatch("2.12", "spark-shuffle-rdma-3.5_2.12", "1.0", "2.12.18"));
    }

    @Test
    void jarFor213OnSpark212NamesThe212Jar() {
        String m = ScalaLine.mismatch("2.13", "spark-shuffle-rdma", "1.0", "2.12.18");
        assertEquals("rdma-bridge: spark-shuffle-rdma-1.0.jar is built for Scala 2.13, but this Spark runs on Scala "
                + "2.12.18 (Scala lines are not binary compatible). Put spark-shuffle-rdma-3.5_2.12-1.0.jar on the "
                + "class path instead of it.", m);
    }

    @Test
    void jarFor212OnSpark213NamesThe213Jar() {
        String m = ScalaLine.mismatch("2.12", "spark-shuffle-rdma-3.5_2.12", "1.0", "2.13.16");
        assertTrue(m.contains("spark-shuffle-rdma-3.5_2.12-1.0.jar is built for Scala 2.12"), m);
        assertTrue(m.contains("Put spark-shuffle-rdma-1.0.jar on the class path"), m);
    }

    @Test
    void unknownLineSaysNoJarExists() {
        String m = ScalaLine.mismatch("2.13", "spark-shuffle-rdma", "1.0", "3.3.4");
        assertTrue(m.contains("runs on Scala 3.3.4") && m.contains("No rdma-bridge jar is built for Scala 3.3"), m);
    }

    @Test
    void binaryVersionKeepsMajorAndMinor() {
        assertEquals("2.13", ScalaLine.binaryVersion("2.13.16"));
        assertEquals("2.12", ScalaLine.binaryVersion("2.12.18"));
        assertEquals("weird", ScalaLine.binaryVersion("weird"));
    }
}
