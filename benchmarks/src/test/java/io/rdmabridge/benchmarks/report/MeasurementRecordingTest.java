package io.rdmabridge.benchmarks.report;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordedFrame;
import jdk.jfr.consumer.RecordingFile;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.openjdk.jmh.infra.IterationParams;
import org.openjdk.jmh.runner.IterationType;
import org.openjdk.jmh.runner.options.TimeValue;

/** {@link MeasurementRecording} driven as JMH drives it: a warm-up iteration, then two measurement iterations. */
class MeasurementRecordingTest {
    private static volatile long sink;

    @Test
    void shouldRecordTheMeasurementIterationsAndNotTheWarmUp(@TempDir Path dir) throws Exception {
        Path jfr = dir.resolve("profile.jfr");
        MeasurementRecording profiler = new MeasurementRecording(jfr.toString());
        IterationParams warmup = new IterationParams(IterationType.WARMUP, 1, TimeValue.milliseconds(400), 1);
        IterationParams measurement = new IterationParams(IterationType.MEASUREMENT, 2, TimeValue.milliseconds(400),
                1);

        profiler.beforeIteration(null, warmup);
        warmUpSpin();
        assertEquals(List.of(), profiler.afterIteration(null, warmup, null));
        for (int i = 0; i < 2; i++) {
            profiler.beforeIteration(null, measurement);
            measuredSpin();
            profiler.afterIteration(null, measurement, null);
            assertEquals(i == 1, Files.exists(jfr), "written after the last measurement iteration only");
        }

        Set<String> sampled = new HashSet<>();
        for (RecordedEvent e : RecordingFile.readAllEvents(jfr)) {
            if (e.getEventType().getName().equals("jdk.ExecutionSample") && e.getStackTrace() != null) {
                for (RecordedFrame f : e.getStackTrace().getFrames()) {
                    sampled.add(f.getMethod().getName());
                }
            }
        }
        assertTrue(sampled.contains("measuredSpin"), "methods sampled: " + sampled);
        assertFalse(sampled.contains("warmUpSpin"), "the warm-up was recorded: " + sampled);
    }

    private static void warmUpSpin() {
        spin();
    }

    private static void measuredSpin() {
        spin();
    }

    /** Java code for 400 ms: the clock is read seldom, since a sample taken inside its call is dropped. */
    private static void spin() {
        long end = System.nanoTime() + 400_000_000L;
        long x = 0;
        while (System.nanoTime() < end) {
            for (int i = 0; i < 100_000; i++) {
                x += x * 31 + i;
            }
        }
        sink = x;
    }
}
