package io.rdmabridge.grpc;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A server in a child JVM on this JVM's class path, so that every byte between client and server crosses processes
 * (as in netty-rdma-transport's cross-process echo test): started with the options of
 * {@code rdmabridge.test.childJvmOptions}, it prints {@code PORT n} once listening; its later output is copied to
 * this JVM's standard error; closing it closes the child's standard input and then kills it.
 */
final class ChildJvm implements AutoCloseable {
    private final Process process;
    final int port;

    ChildJvm(Class<?> main, String... args) throws IOException {
        String java = System.getProperty("java.home") + File.separator + "bin" + File.separator + "java";
        List<String> command = new ArrayList<>(List.of(java, "-Xmx256m", "-XX:MaxDirectMemorySize=512m",
                "-Dio.netty.leakDetection.level=paranoid",
                "-Drdmabridge.provider=" + System.getProperty("rdmabridge.provider", "soft"),
                "-Drdmabridge.test.address=" + GrpcSetup.address()));
        String options = System.getProperty("rdmabridge.test.childJvmOptions", "").trim();
        if (!options.isEmpty()) {
            command.addAll(Arrays.asList(options.split("\\s+")));
        }
        command.addAll(List.of("-cp", System.getProperty("java.class.path"), main.getName()));
        command.addAll(Arrays.asList(args));
        process = new ProcessBuilder(command).redirectErrorStream(true).start();
        BufferedReader out = new BufferedReader(new InputStreamReader(process.getInputStream(),
                StandardCharsets.UTF_8));
        String line;
        int found = 0;
        while ((line = out.readLine()) != null) {
            if (line.startsWith("PORT ")) {
                found = Integer.parseInt(line.substring(5).trim());
                break;
            }
            System.err.println("[" + main.getSimpleName() + "] " + line);
        }
        if (found == 0) {
            process.destroyForcibly();
            throw new IOException(main.getSimpleName() + " printed no port and exited (last line: " + line
                    + "); its output is above");
        }
        port = found;
        String prefix = "[" + main.getSimpleName() + " " + String.join(" ", args) + "] ";
        Thread drain = new Thread(() -> {
            try {
                String l;
                while ((l = out.readLine()) != null) {
                    System.err.println(prefix + l);
                }
            } catch (IOException ignored) {
                // The child is gone.
            }
        }, "child-output");
        drain.setDaemon(true);
        drain.start();
    }

    /** Asks the child to stop (its standard input ends), then kills it if it has not within 10 s. */
    @Override
    public void close() {
        try {
            try {
                process.getOutputStream().close();
            } catch (IOException e) {
                // The pipe is gone with the child, or it cannot be told: kill it below.
            }
            if (!process.waitFor(10, TimeUnit.SECONDS)) {
                process.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
            }
        } catch (InterruptedException e) {
            process.destroyForcibly();
            Thread.currentThread().interrupt();
        }
    }
}
