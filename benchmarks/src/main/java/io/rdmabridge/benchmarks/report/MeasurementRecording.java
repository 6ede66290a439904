package io.rdmabridge.benchmarks.report;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.text.ParseException;
import java.util.Collection;
import java.util.List;
import jdk.jfr.Configuration;
import jdk.jfr.Recording;
import org.openjdk.jmh.infra.BenchmarkParams;
import org.openjdk.jmh.infra.IterationParams;
import org.openjdk.jmh.profile.InternalProfiler;
import org.openjdk.jmh.results.IterationResult;
import org.openjdk.jmh.results.Result;
import org.openjdk.jmh.runner.IterationType;

/**
 * A JMH profiler that records the benchmark JVM with JFR's {@code profile} settings during the measurement iterations
 * only, after the warm-up, into the file its init line names. JMH's own {@code jfr} profiler does the same but writes
 * into a directory named after every parameter of the benchmark, a name longer than a file name may be for the
 * cross-process benchmark, and then writes nothing.
 *
 * <p>Usage: {@code addProfiler(MeasurementRecording.class, "/path/to/profile.jfr")}.
 */
public final class MeasurementRecording implements InternalProfiler {
    private final Path file;
    private Recording recording;
    private int measured;

    /** Records into {@code initLine}, a file path. */
    public MeasurementRecording(String initLine) {
        if (initLine == null || initLine.isBlank()) {
            throw new IllegalArgumentException("MeasurementRecording needs the recording's file as its init line");
        }
        file = Paths.get(initLine.trim());
    }

    @Override
    public void beforeIteration(BenchmarkParams benchmarkParams, IterationParams iterationParams) {
        if (iterationParams.getType() == IterationType.MEASUREMENT && recording == null) {
            try {
                recording = new Recording(Configuration.getConfiguration("profile"));
            } catch (IOException | ParseException e) {
                throw new IllegalStateException("JFR's \"profile\" settings cannot be read: " + e, e);
            }
            recording.start();
        }
    }

    @Override
    public Collection<? extends Result> afterIteration(BenchmarkParams benchmarkParams,
                                                       IterationParams iterationParams, IterationResult result) {
        if (iterationParams.getType() == IterationType.MEASUREMENT && ++measured == iterationParams.getCount()) {
            try {
                recording.stop();
                recording.dump(file);
            } catch (IOException e) {
                throw new UncheckedIOException("writing the JFR recording to " + file, e);
            } finally {
                recording.close();
            }
        }
        return List.of();
    }

    @Override
    public String getDescription() {
        return "JFR recording of the measurement iterations, into the file the init line names";
    }
}
