package io.rdmabridge.benchmarks.report;

import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordedFrame;
import jdk.jfr.consumer.RecordedStackTrace;
import jdk.jfr.consumer.RecordingFile;

import java.io.IOException;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;

/**
 * Summarizes a JFR recording's execution samples: the methods most often on top of the stack (self time) and, of
 * the project's and Netty's own methods, those most often anywhere on it (inclusive). Uses only the JDK's
 * {@code jdk.jfr.consumer} API, so no profiler needs installing.
 */
final class HotMethods {
    private HotMethods() {
    }

    /** Markdown lines: two top-{@code n} tables with the share of samples. */
    static String summarize(Path jfr, int n) throws IOException {
        Map<String, Integer> self = new HashMap<>();
        Map<String, Integer> inclusive = new HashMap<>();
        int samples = 0;
        for (RecordedEvent e : RecordingFile.readAllEvents(jfr)) {
            if (!"jdk.ExecutionSample".equals(e.getEventType().getName())) {
                continue;
            }
            RecordedStackTrace st = e.getStackTrace();
            if (st == null || st.getFrames().isEmpty()) {
                continue;
            }
            samples++;
            List<RecordedFrame> frames = st.getFrames();
            self.merge(name(frames.get(0)), 1, Integer::sum);
            frames.stream().map(HotMethods::name)
                    .filter(HotMethods::isTransportFrame)
                    .distinct().forEach(m -> inclusive.merge(m, 1, Integer::sum));
        }
        if (samples == 0) {
            return "(no execution samples recorded)\n";
        }
        return "Execution samples: " + samples + "\n\n" + table("self (top of stack)", self, samples, n) + "\n"
                + table("inclusive, transport frames (io.rdmabridge, io.netty.channel/buffer)", inclusive, samples, n);
    }

    // The transport's own frames: the project's (not the benchmark harness) and Netty's channel and buffer code, not
    // the event-loop frames that sit under every sample.
    private static boolean isTransportFrame(String method) {
        return method.startsWith("io.rdmabridge.") && !method.startsWith("io.rdmabridge.benchmarks.")
                || (method.startsWith("io.netty.channel.") || method.startsWith("io.netty.buffer."))
                && !method.startsWith("io.netty.channel.SingleThreadIoEventLoop");
    }

    private static String name(RecordedFrame f) {
        return f.getMethod().getType().getName() + "." + f.getMethod().getName();
    }

    private static String table(String title, Map<String, Integer> counts, int samples, int n) {
        StringBuilder sb = new StringBuilder("| " + title + " | share |\n|---|---:|\n");
        counts.entrySet().stream().sorted(Map.Entry.<String, Integer>comparingByValue().reversed()).limit(n)
                .collect(Collectors.toList())
                .forEach(e -> sb.append("| `").append(e.getKey()).append("` | ")
                        .append(String.format(java.util.Locale.ROOT, "%.1f%%", 100.0 * e.getValue() / samples))
                        .append(" |\n"));
        return sb.toString();
    }
}
