package io.rdmabridge.it.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;

/** The stderr logs of a running local-cluster application's executors (workers keep them in temporary dirs). */
final class ExecutorLogs {
    private ExecutorLogs() {
    }

    /** Every line of every executor's stderr of application {@code appId} that contains {@code text}. */
    static List<String> linesContaining(String appId, String text) {
        List<String> lines = new ArrayList<>();
        Path tmp = Path.of(System.getProperty("java.io.tmpdir"));
        try (Stream<Path> workers = Files.list(tmp)) {
            for (Path worker : workers.filter(p -> p.getFileName().toString().startsWith("worker")).toList()) {
                Path app = worker.resolve(appId);
                if (!Files.isDirectory(app)) {
                    continue;
                }
                try (Stream<Path> executors = Files.list(app)) {
                    for (Path stderr : executors.map(e -> e.resolve("stderr")).filter(Files::exists).toList()) {
                        for (String line : Files.readAllLines(stderr)) {
                            if (line.contains(text)) {
                                lines.add(line);
                            }
                        }
                    }
                }
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return lines;
    }
}
