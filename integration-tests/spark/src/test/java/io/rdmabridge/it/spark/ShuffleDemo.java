package io.rdmabridge.it.spark;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;

/**
 * The project's main job ({@code bin/rdma-bridge-demo}): the same Spark shuffle job on {@code local-cluster[2,1,1024]}
 * (two executor JVMs, so every remote block crosses processes) once with {@code RdmaShuffleManager} on the soft RDMA
 * provider and once with Spark's own {@code SortShuffleManager}, then a side-by-side table of job time, fetch wait,
 * remote shuffle bytes, bytes fetched over RDMA, the zero-copy share and the output digests.
 *
 * <p>Jobs: {@code groupByKey} (default; every record crosses the shuffle, no map-side combine) or, with
 * {@code --terasort}, a TeraSort-style generate / sort / validate ({@link TeraSort}). The RDMA run goes first, so
 * any warm-up of the driver JVM favours Spark's own shuffle. Host-local disk reads are off in both runs
 * ({@code spark.shuffle.readHostLocalDisk=false}): on one host Spark would otherwise read the other executor's files
 * from disk and no transport would be involved.
 *
 * <p>Usage: {@code ShuffleDemo [--mb N] [--terasort] [--markdown FILE] [--quiet]}. Exit status 0 when both outputs
 * are valid and identical and the RDMA run fetched every remote shuffle byte over RDMA; 1 otherwise, naming why.
 */
public final class ShuffleDemo {
    static final String RDMA = "RdmaShuffleManager";
    static final String SORT = "SortShuffleManager";
    static final int DEFAULT_MB = 150;

    private ShuffleDemo() {
    }

    /** What to run: data size, which job, where to write a markdown table (may be null), whether to show progress. */
    record Options(int megabytes, boolean terasort, Path markdown, boolean progress) {
        String jobName() {
            return terasort ? "TeraSort-style sort" : "groupByKey";
        }
    }

    /** One run's figures; RDMA-only fields are -1 on the SortShuffleManager run. {@code invalid}: null when valid. */
    record Run(String manager, long jobNanos, long fetchWaitMillis, long remoteBytes, long rdmaBytes,
               long rdmaBlocks, long copiedBytes, long fallbackBlocks, int fallbackExecutors,
               long sameHostConnections, String digest, String invalid) {
        /** Which path the executors' RDMA connections took, as the demo prints it. */
        String path() {
            return sameHostConnections > 0
                    ? "same-host shared memory (" + sameHostConnections + " connections)"
                    : "TCP between processes";
        }

        /** Share of the bytes fetched over RDMA that no CPU copied on the way. */
        double zeroCopyShare() {
            return rdmaBytes <= 0 ? Double.NaN : Math.max(0, rdmaBytes - copiedBytes) / (double) rdmaBytes;
        }
    }

    /** Both runs and what is wrong with them together (empty when the demo succeeded). */
    record Outcome(Options options, Run rdma, Run sort) {
        List<String> problems() {
            List<String> p = new ArrayList<>();
            if (rdma.invalid != null) {
                p.add("the RDMA run's output is wrong: " + rdma.invalid);
            }
            if (sort.invalid != null) {
                p.add("the SortShuffleManager run's output is wrong: " + sort.invalid);
            }
            if (!rdma.digest.equals(sort.digest)) {
                p.add("outputs differ: digest " + rdma.digest + " over RDMA, " + sort.digest + " on Spark's shuffle");
            }
            if (rdma.remoteBytes <= 0) {
                p.add("no shuffle block crossed executors (remote shuffle bytes: " + rdma.remoteBytes + ")");
            } else if (rdma.rdmaBytes != rdma.remoteBytes) {
                p.add("bytes fetched over RDMA: " + rdma.rdmaBytes + " (expected: the " + rdma.remoteBytes
                        + " remote shuffle bytes Spark read; " + rdma.fallbackBlocks + " blocks by fallback, "
                        + rdma.fallbackExecutors + " executors without RDMA: see their logs under "
                        + "integration-tests/spark/target/spark-home/work)");
            }
            return p;
        }
    }

    public static void main(String[] args) throws Exception {
        int megabytes = DEFAULT_MB;
        boolean terasort = false;
        Path markdown = null;
        boolean progress = true;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--mb" -> megabytes = Integer.parseInt(args[++i]);
                case "--terasort" -> terasort = true;
                case "--markdown" -> markdown = Paths.get(args[++i]);
                case "--quiet" -> progress = false;
                default -> {
                    System.err.println("usage: ShuffleDemo [--mb N] [--terasort] [--markdown FILE] [--quiet]");
                    System.exit(2);
                }
            }
        }
        if (megabytes < 1) {
            System.err.println("--mb: " + megabytes + " (expected: at least 1)");
            System.exit(2);
        }
        Outcome outcome = run(new Options(megabytes, terasort, markdown, progress));
        if (progress) {
            System.err.println("[4/4] comparing");
        }
        System.out.println();
        System.out.print(table(outcome));
        if (markdown != null) {
            Files.writeString(markdown, markdown(outcome));
        }
        List<String> problems = outcome.problems();
        if (problems.isEmpty()) {
            System.out.println("OK: identical outputs; every remote shuffle byte crossed over RDMA.");
            System.exit(0);
        }
        problems.forEach(p -> System.out.println("FAILED: " + p));
        System.exit(1);
    }

    /** Runs the job under both shuffle managers, RDMA first. */
    static Outcome run(Options o) {
        // What the local-cluster master needs to start workers from this JVM's class path (see LocalCluster).
        if (System.getProperty("spark.testing") == null) {
            System.setProperty("spark.testing", "1");
        }
        if (System.getProperty("spark.test.home") == null) {
            System.setProperty("spark.test.home", Paths.get("target", "spark-home").toAbsolutePath().toString());
        }
        Run rdma = runOnce(RDMA, o, "[2/4] " + o.jobName() + " of " + o.megabytes + " MB over RDMA");
        Run sort = runOnce(SORT, o, "[3/4] same job on Spark's own shuffle");
        return new Outcome(o, rdma, sort);
    }

    private static Run runOnce(String manager, Options o, String label) {
        Map<String, String> settings = new HashMap<>();
        settings.put("spark.shuffle.readHostLocalDisk", "false");
        if (o.terasort) {
            settings.put("spark.serializer", "org.apache.spark.serializer.KryoSerializer");
        }
        if (manager.equals(RDMA)) {
            settings.put("spark.shuffle.manager", "io.rdmabridge.spark.RdmaShuffleManager");
            settings.put("spark.shuffle.rdma.provider", "soft");
        }
        JobProgress progress = o.progress ? new JobProgress(label + ": starting 2 executor JVMs", System.err) : null;
        SparkSession spark = LocalCluster.start("rdma-bridge-demo-" + manager, settings);
        try {
            JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
            TeraSort.Summary input = null;
            if (o.terasort) {
                if (progress != null) {
                    progress.label(label + ": input checksum");
                }
                input = TeraSort.input(sc, o.megabytes);
            }
            if (progress != null) {
                spark.sparkContext().addSparkListener(progress);
                progress.label(label + ": warm-up");
            }
            // A small untimed run of the same job first, so that neither manager is timed with cold executor JVMs.
            ShuffleCounters counters = ShuffleCounters.install(spark);
            runJob(sc, o.terasort, Math.max(1, o.megabytes / 10), null);
            boolean rdma = manager.equals(RDMA);
            if (rdma) {
                awaitReports(sc, counters.remoteBytesRead.get());
            }
            long remoteBefore = counters.remoteBytesRead.get();
            long fetchWaitBefore = counters.fetchWaitMillis.get();
            Map<String, Long> rdmaBefore = rdma ? rdmaCounters() : Map.of();
            if (progress != null) {
                progress.label(label);
            }
            long start = System.nanoTime();
            String[] result = runJob(sc, o.terasort, o.megabytes, input);
            long jobNanos = System.nanoTime() - start;
            String digest = result[0];
            String invalid = result[1];
            ShuffleCounters.drain(spark);
            long remote = counters.remoteBytesRead.get() - remoteBefore;
            long fetchWait = counters.fetchWaitMillis.get() - fetchWaitBefore;
            if (!rdma) {
                return new Run(manager, jobNanos, fetchWait, remote, -1, -1, -1, -1, -1, -1, digest, invalid);
            }
            if (progress != null) {
                progress.label(label + ": collecting executors' counters");
            }
            awaitReports(sc, rdmaBefore.get("bytesFetched") + remote);
            Map<String, Long> after = rdmaCounters();
            Map<String, Long> d = new HashMap<>();
            after.forEach((k, v) -> d.put(k, v - rdmaBefore.get(k)));
            return new Run(manager, jobNanos, fetchWait, remote, d.get("bytesFetched"), d.get("blocksFetched"),
                    d.get("bytesCopiedOnSend") + d.get("bytesCopiedOnReceive"), d.get("blocksFetchedByFallback"),
                    ShuffleCounters.manager().fallbacks().size(), after.get("sameHostConnections"), digest,
                    invalid);
        } finally {
            if (progress != null) {
                progress.close();
            }
            spark.stop();
        }
    }

    /**
     * Runs the job on {@code megabytes} of data; returns its output digest and, for TeraSort with {@code input}
     * known, what is wrong with the output (null when it is {@code input} sorted).
     */
    private static String[] runJob(JavaSparkContext sc, boolean terasort, int megabytes, TeraSort.Summary input) {
        if (!terasort) {
            return new String[] {sha256(ShuffleJobs.groupByKey(sc, megabytes)), null};
        }
        List<TeraSort.Summary> output = TeraSort.sort(sc, megabytes);
        return new String[] {sha256(TeraSort.outputDigest(output)),
            input == null ? null : TeraSort.validate(input, output)};
    }

    /** The RDMA shuffle counters summed over executors, as last reported to the driver. */
    private static Map<String, Long> rdmaCounters() {
        Map<String, Long> m = new HashMap<>();
        for (String name : List.of("bytesFetched", "blocksFetched", "bytesCopiedOnSend", "bytesCopiedOnReceive",
                "blocksFetchedByFallback", "sameHostConnections")) {
            m.put(name, ShuffleCounters.rdmaCounter(name));
        }
        return m;
    }

    /**
     * Executors report their counters after each of their reduce tasks, asynchronously; a block server may still be
     * serving a peer after its own last task. So: wait until the fetched bytes add up, then run a shuffle of no
     * records, whose reduce tasks (several per executor) make every executor report once more, after all it served.
     */
    private static void awaitReports(JavaSparkContext sc, long remote) {
        long deadline = System.nanoTime() + 20_000_000_000L;
        while (ShuffleCounters.rdmaCounter("bytesFetched") < remote && System.nanoTime() < deadline) {
            sleep(100);
        }
        sc.parallelize(List.<Integer>of(), LocalCluster.EXECUTORS).repartition(4 * LocalCluster.EXECUTORS).count();
        sleep(500);
    }

    private static void sleep(long millis) {
        try {
            Thread.sleep(millis);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
    }

    /** The side-by-side table the demo prints. */
    static String table(Outcome outcome) {
        Run r = outcome.rdma;
        Run s = outcome.sort;
        StringBuilder sb = new StringBuilder();
        sb.append(String.format(Locale.ROOT, "Spark %s of %d MB on local-cluster[2,1,1024] (two executor JVMs), "
                + "RDMA on the soft provider, path: %s%n%n", outcome.options.jobName(), outcome.options.megabytes,
                r.path()));
        String row = "%-30s %20s %20s%n";
        sb.append(String.format(Locale.ROOT, row, "", RDMA, SORT));
        sb.append(String.format(Locale.ROOT, row, "job time", seconds(r.jobNanos / 1e9), seconds(s.jobNanos / 1e9)));
        sb.append(String.format(Locale.ROOT, row, "shuffle fetch wait (tasks)", seconds(r.fetchWaitMillis / 1e3),
                seconds(s.fetchWaitMillis / 1e3)));
        sb.append(String.format(Locale.ROOT, row, "remote shuffle bytes", bytes(r.remoteBytes), bytes(s.remoteBytes)));
        sb.append(String.format(Locale.ROOT, row, "bytes fetched over RDMA", bytes(r.rdmaBytes), "-"));
        sb.append(String.format(Locale.ROOT, row, "blocks fetched over RDMA", r.rdmaBlocks, "-"));
        sb.append(String.format(Locale.ROOT, row, "zero-copy share",
                String.format(Locale.ROOT, "%.1f %%", 100 * r.zeroCopyShare()), "-"));
        sb.append(String.format(Locale.ROOT, row, "blocks fetched by fallback", r.fallbackBlocks, "-"));
        sb.append(String.format(Locale.ROOT, row, "output digest", r.digest, s.digest));
        sb.append(String.format(Locale.ROOT, row, "outputs", r.digest.equals(s.digest) && r.invalid == null
                && s.invalid == null ? "identical" : "DIFFERENT", outcome.options.terasort ? "(validated)" : ""));
        sb.append(String.format(Locale.ROOT, "%nratios RDMA / Spark's shuffle: job time %.2f, fetch wait %s%n",
                r.jobNanos / (double) s.jobNanos, ratio(r.fetchWaitMillis, s.fetchWaitMillis)));
        return sb.toString();
    }

    /** A markdown section with the same figures, for docs/results/RESULTS.md. */
    static String markdown(Outcome outcome) {
        Run r = outcome.rdma;
        Run s = outcome.sort;
        StringBuilder sb = new StringBuilder();
        sb.append(String.format(Locale.ROOT, "%s of %d MB (%s), `local-cluster[2,1,1024]`: two executor JVMs with one"
                + " core each; RDMA on the soft provider, path: %s; host-local disk reads off so that every block"
                + " between executors crosses the transport.%n%n", outcome.options.jobName(), outcome.options.megabytes,
                outcome.options.terasort ? "100-byte records, 10-byte keys, Kryo" : "Java serialization", r.path()));
        sb.append("| | RdmaShuffleManager | SortShuffleManager | ratio RDMA / Spark |\n|---|---:|---:|---:|\n");
        sb.append(String.format(Locale.ROOT, "| job time | %s | %s | %.2f |%n", seconds(r.jobNanos / 1e9),
                seconds(s.jobNanos / 1e9), r.jobNanos / (double) s.jobNanos));
        sb.append(String.format(Locale.ROOT, "| shuffle fetch wait (sum over tasks) | %s | %s | %s |%n",
                seconds(r.fetchWaitMillis / 1e3), seconds(s.fetchWaitMillis / 1e3),
                ratio(r.fetchWaitMillis, s.fetchWaitMillis)));
        sb.append(String.format(Locale.ROOT, "| remote shuffle bytes | %s | %s | |%n", bytes(r.remoteBytes),
                bytes(s.remoteBytes)));
        sb.append(String.format(Locale.ROOT, "| bytes fetched over RDMA | %s (%d blocks) | - | |%n",
                bytes(r.rdmaBytes), r.rdmaBlocks));
        sb.append(String.format(Locale.ROOT, "| zero-copy share | %.1f %% | - | |%n", 100 * r.zeroCopyShare()));
        sb.append(String.format(Locale.ROOT, "| blocks fetched by fallback | %d | - | |%n", r.fallbackBlocks));
        sb.append(String.format(Locale.ROOT, "| output | %s | %s | %s |%n", r.invalid == null ? "valid" : "INVALID",
                s.invalid == null ? "valid" : "INVALID", r.digest.equals(s.digest) ? "identical" : "**different**"));
        return sb.toString();
    }

    private static String ratio(long a, long b) {
        return b == 0 ? "-" : String.format(Locale.ROOT, "%.2f", a / (double) b);
    }

    private static String seconds(double s) {
        return String.format(Locale.ROOT, "%.2f s", s);
    }

    private static String bytes(long n) {
        return n < 0 ? "-" : String.format(Locale.ROOT, "%.1f MB", n / 1e6);
    }

    private static String sha256(String s) {
        try {
            byte[] d = MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8));
            return HexFormat.of().formatHex(d, 0, 8);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }
}
