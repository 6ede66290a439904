package io.rdmabridge.benchmarks.report;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.List;

/**
 * The Spark framework benchmark of the results page: a TeraSort-style job on {@code local-cluster[2,1,1024]} with
 * {@code RdmaShuffleManager} and with Spark's {@code SortShuffleManager}, as ratios of job times and fetch wait
 * times. It runs {@code bin/rdma-bridge-demo --terasort} in its own JVM, because Spark must see the shaded drop-in jar
 * only, never this module's unshaded transport and Netty.
 */
final class SparkSection {
    static final String TITLE = "## Spark shuffle: RdmaShuffleManager vs SortShuffleManager";
    /** Data size of the TeraSort-style job; {@code -Dbenchmarks.spark.mb=N} changes it. */
    static final int MEGABYTES = Integer.getInteger("benchmarks.spark.mb", 200);

    private SparkSection() {
    }

    /** Runs the job and returns the section's markdown; {@code commands} gets the command line. */
    static String measure(List<String> commands) throws IOException, InterruptedException {
        Path table = Files.createTempFile("spark-terasort", ".md");
        try {
            String command = "bin/rdma-bridge-demo --terasort --mb " + MEGABYTES;
            commands.add(command);
            Instant start = Instant.now();
            // The demo's own output (progress, its table) goes to ours; the markdown comes back through the file.
            Process p = new ProcessBuilder("bin/rdma-bridge-demo", "--terasort", "--mb", String.valueOf(MEGABYTES),
                    "--markdown", table.toString()).redirectOutput(ProcessBuilder.Redirect.INHERIT)
                    .redirectError(ProcessBuilder.Redirect.INHERIT).start();
            int status = p.waitFor();
            StringBuilder md = new StringBuilder(TITLE).append("\n\n");
            md.append("Measured by `").append(command).append("` on ").append(start.truncatedTo(ChronoUnit.SECONDS))
                    .append(". The job time covers the sort and a validation pass over its output (order, record"
                            + " count, checksum); each manager first runs an untimed tenth-size warm-up. Fetch wait is"
                            + " Spark's own task metric (time reduce tasks sat blocked on shuffle blocks). The RDMA"
                            + " figures come from the adapter's counters (docs/spark.md, Metrics); zero-copy share ="
                            + " bytes fetched over RDMA that no CPU copied / bytes fetched over RDMA.\n\n");
            if (Files.size(table) > 0) {
                md.append(Files.readString(table));
            }
            if (status != 0) {
                md.append("\n**`").append(command).append("` exited with status ").append(status)
                        .append(": see its output above this run's log.**\n");
            }
            return md.append("\n").toString();
        } finally {
            Files.deleteIfExists(table);
        }
    }

    /**
     * RDMA / Spark's shuffle of the job time and of the fetch wait, from the last cells of the section's table (as
     * {@code bin/rdma-bridge-demo --markdown} writes it); NaN for a figure the section does not have.
     */
    static double[] ratios(String section) {
        return new double[] {lastCell(section, "| job time |"), lastCell(section, "| shuffle fetch wait")};
    }

    private static double lastCell(String section, String rowStart) {
        for (String line : section.split("\n")) {
            if (line.startsWith(rowStart)) {
                String[] cells = line.split("\\|");
                try {
                    return Double.parseDouble(cells[cells.length - 1].trim());
                } catch (NumberFormatException e) {
                    // "-": no ratio (Spark's own figure was zero).
                    return Double.NaN;
                }
            }
        }
        return Double.NaN;
    }

    /** Puts {@code section} into {@code results} in place of an older Spark section, or before its command list. */
    static void splice(Path results, String section) throws IOException {
        PageSections.splice(results, TITLE, section);
    }
}
