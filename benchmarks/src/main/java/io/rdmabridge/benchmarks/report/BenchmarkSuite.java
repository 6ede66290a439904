package io.rdmabridge.benchmarks.report;

import io.rdmabridge.benchmarks.jmh.CopiedBytesBenchmark;
import io.rdmabridge.benchmarks.jmh.CrossProcessChannelBenchmark;
import io.rdmabridge.benchmarks.jmh.InJvmChannelBenchmark;
import org.openjdk.jmh.results.RunResult;
import org.openjdk.jmh.runner.Runner;
import org.openjdk.jmh.runner.RunnerException;
import org.openjdk.jmh.runner.options.ChainedOptionsBuilder;
import org.openjdk.jmh.runner.options.OptionsBuilder;
import org.openjdk.jmh.runner.options.TimeValue;
import org.openjdk.jmh.runner.options.VerboseMode;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.regex.Pattern;

/**
 * The JMH part of the results: which benchmarks run, with which parameters, in full or smoke mode. Shared by
 * {@link RunBenchmarks} and the smoke test, so that what CI runs is what the report runs, only smaller.
 */
public final class BenchmarkSuite {
    /** Smoke mode: one message size, small batches, no warm-up, one short iteration. */
    public static final String SMOKE_SIZE = "1024";

    private BenchmarkSuite() {
    }

    /** Every benchmark of the suite. */
    public static List<String> includes() {
        return List.of(regex(InJvmChannelBenchmark.class), regex(CrossProcessChannelBenchmark.class),
                regex(CopiedBytesBenchmark.class));
    }

    static String regex(Class<?> benchmark) {
        return "^" + Pattern.quote(benchmark.getName()) + "\\.";
    }

    /**
     * Options for the suite.
     *
     * @param smoke in smoke mode
     * @param forks JMH forks (0 runs in this JVM: the smoke test does that to stay fast)
     */
    public static ChainedOptionsBuilder options(boolean smoke, int forks) {
        ChainedOptionsBuilder b = new OptionsBuilder().forks(forks).shouldFailOnError(true);
        for (String include : includes()) {
            b.include(include);
        }
        if (smoke) {
            smokeRun(b.param("size", SMOKE_SIZE));
        }
        return b;
    }

    /**
     * Options for the cross-process benchmark's RDMA rows on the soft provider's TCP path ({@code sameHost=tcp}, the
     * path between hosts), measured beside the suite's own rows (same-host path, epoll, NIO) with the same settings.
     */
    public static ChainedOptionsBuilder tcpPathOptions(boolean smoke, int forks) {
        ChainedOptionsBuilder b = new OptionsBuilder().forks(forks).shouldFailOnError(true)
                .include(regex(CrossProcessChannelBenchmark.class)).param("transport", "rdma").param("sameHost", "tcp");
        if (smoke) {
            smokeRun(b.param("size", SMOKE_SIZE));
        }
        return b;
    }

    /** The busy-poll budget of {@link #busyPollOptions}, in nanoseconds: 100 us at both ends. */
    public static final String BUSY_POLL_NANOS = "100000";

    /**
     * Options for the cross-process ping-pong with RDMA's event loops busy-polling ({@code busyPollNanos} at both
     * ends, the same-host path), for issue 13's busy-polling latency target; 64 B (the smoke size in smoke mode).
     * Measured beside the suite's epoll rows, which it is compared with (epoll has no such knob), with the benchmark's
     * own warm-up: two spinning event loops on a 2-core host leave the JIT compiler threads little time, and after
     * 2 x 1 s a run once measured p50 280 us where longer ones measure 40-70 us.
     */
    public static ChainedOptionsBuilder busyPollOptions(boolean smoke, int forks) {
        ChainedOptionsBuilder b = new OptionsBuilder().forks(forks).shouldFailOnError(true)
                .include(regex(CrossProcessChannelBenchmark.class) + "latency$").param("transport", "rdma")
                .param("sameHost", "shm").param("busyPollNanos", BUSY_POLL_NANOS)
                .param("size", smoke ? SMOKE_SIZE : "64");
        if (smoke) {
            smokeRun(b);
        }
        return b;
    }

    /**
     * Options for the cross-process throughput of file regions ({@code payload=file}: a {@code DefaultFileRegion} per
     * message, as Spark's block server sends shuffle blocks), RDMA on the same-host path, where the peer reads a
     * rendezvous from the file itself, beside epoll, which sends them with {@code sendfile}; 1 MiB and 4 MiB (the
     * smoke size in smoke mode).
     */
    public static ChainedOptionsBuilder fileRegionOptions(boolean smoke, int forks) {
        ChainedOptionsBuilder b = new OptionsBuilder().forks(forks).shouldFailOnError(true)
                .include(regex(CrossProcessChannelBenchmark.class) + "throughput$").param("transport", "rdma", "epoll")
                .param("sameHost", "shm").param("payload", "file");
        if (smoke) {
            smokeRun(b.param("size", SMOKE_SIZE));
        } else {
            b.param("size", "1048576", "4194304");
        }
        return b;
    }

    /** Smoke mode's small batches and single short iteration, without warm-up; each caller sets the size. */
    private static void smokeRun(ChainedOptionsBuilder b) {
        b.param("batchBytes", "65536").warmupIterations(0).measurementIterations(1)
                .measurementTime(TimeValue.milliseconds(300)).verbosity(VerboseMode.SILENT);
    }

    /**
     * The whole suite: {@link #options}, {@link #tcpPathOptions}, {@link #busyPollOptions} and
     * {@link #fileRegionOptions}, in run order.
     */
    public static List<RunResult> runAll(boolean smoke, int forks) throws RunnerException {
        List<RunResult> results = run(options(smoke, forks));
        results.addAll(run(tcpPathOptions(smoke, forks)));
        results.addAll(run(busyPollOptions(smoke, forks)));
        results.addAll(run(fileRegionOptions(smoke, forks)));
        return results;
    }

    /** Runs the given options and returns the results in run order. */
    public static List<RunResult> run(ChainedOptionsBuilder options) throws RunnerException {
        Collection<RunResult> results = new Runner(options.build()).run();
        return new ArrayList<>(results);
    }
}
