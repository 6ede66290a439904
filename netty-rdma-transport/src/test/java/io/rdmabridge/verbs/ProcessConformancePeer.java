package io.rdmabridge.verbs;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.Writer;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * A {@link ConformancePeer} in a child JVM ({@link ConformancePeerMain}) started from this JVM's class path, so every
 * byte between the two ends crosses a process boundary. Its stderr goes to a file whose tail is quoted when the child
 * stops answering. {@link #kill()} is SIGKILL ({@link Process#destroyForcibly()}). Thread-safe: one command at a time.
 */
final class ProcessConformancePeer implements ConformancePeer {
    private static final long COMMAND_TIMEOUT_MILLIS = 60_000;
    private static final String EOF = "\u0000eof";

    private final Process process;
    private final Writer stdin;
    private final BlockingQueue<String> stdout = new LinkedBlockingQueue<>();
    private final Path stderr;

    /**
     * Starts {@code java -cp <java.class.path> [jvmOptions] ConformancePeerMain provider} with a small heap and waits
     * until it is ready.
     *
     * @param jvmOptions system properties and other options of the child JVM, e.g. the provider's mode
     */
    ProcessConformancePeer(String provider, List<String> jvmOptions) throws IOException, TimeoutException {
        stderr = Files.createTempFile("conformance-peer-", ".log");
        String java = System.getProperty("java.home") + File.separator + "bin" + File.separator + "java";
        List<String> command = new ArrayList<>(List.of(java, "-cp", System.getProperty("java.class.path"),
                "-Xmx256m", "-XX:MaxDirectMemorySize=512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-D" + RdmaProviders.PROVIDER_PROPERTY + "=" + provider));
        command.addAll(jvmOptions);
        command.addAll(List.of(ConformancePeerMain.class.getName(), provider));
        process = new ProcessBuilder(command).redirectError(stderr.toFile()).start();
        stdin = new java.io.OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8);
        Thread reader = new Thread(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(process.getInputStream(),
                    StandardCharsets.UTF_8))) {
                String line;
                while ((line = r.readLine()) != null) {
                    stdout.add(line);
                }
            } catch (IOException ignored) {
                // The child died; EOF below tells the waiting command.
            }
            stdout.add(EOF);
        }, "conformance-peer-stdout");
        reader.setDaemon(true);
        reader.start();
        String ready = readLine(30_000);
        if (!ready.startsWith("ok ready")) {
            close();
            throw new IllegalStateException("conformance peer process did not start: " + ready + stderrTail());
        }
    }

    /** Process id of the child, for diagnostics. */
    long pid() {
        return process.pid();
    }

    private String readLine(long timeoutMillis) throws TimeoutException {
        String line;
        try {
            line = stdout.poll(timeoutMillis, TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted waiting for the conformance peer", e);
        }
        if (line == null) {
            throw new TimeoutException("conformance peer (pid " + process.pid() + ") did not answer within "
                    + timeoutMillis + " ms" + stderrTail());
        }
        if (EOF.equals(line)) {
            stdout.add(EOF);
            throw new IllegalStateException("conformance peer (pid " + process.pid() + ") exited"
                    + stderrTail());
        }
        return line;
    }

    private synchronized String[] command(long timeoutMillis, String... words) throws Exception {
        String line = String.join(" ", words);
        try {
            stdin.write(line);
            stdin.write('\n');
            stdin.flush();
        } catch (IOException e) {
            throw new IllegalStateException("conformance peer (pid " + process.pid() + ") is gone: " + e
                    + stderrTail(), e);
        }
        String response = readLine(timeoutMillis);
        if (response.startsWith("err ")) {
            throw new RdmaException("conformance peer: " + line + " -> " + response.substring(4));
        }
        return response.split(" ");
    }

    private String[] command(String... words) throws Exception {
        return command(COMMAND_TIMEOUT_MILLIS, words);
    }

    private String stderrTail() {
        try {
            String text = Files.readString(stderr);
            return "; its stderr ends with:\n" + text.substring(Math.max(0, text.length() - 4000));
        } catch (IOException e) {
            return "";
        }
    }

    @Override
    public int listen(String host, Config config) throws Exception {
        return Integer.parseInt(command("listen", host, config.encode())[1]);
    }

    @Override
    public void configure(Config config) throws Exception {
        command("configure", config.encode());
    }

    @Override
    public synchronized List<byte[]> connectRequests() throws Exception {
        int n = Integer.parseInt(command("requests")[1]);
        List<byte[]> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            out.add(ConformancePeer.unhex(readLine(COMMAND_TIMEOUT_MILLIS)));
        }
        return out;
    }

    @Override
    public Region register(long length, int access, int guard) throws Exception {
        return Region.decode(command("register", Long.toString(length), Integer.toString(access),
                Integer.toString(guard)), 1);
    }

    @Override
    public void fill(int region, long seed) throws Exception {
        command("fill", Integer.toString(region), Long.toString(seed));
    }

    @Override
    public long checksum(int region, long offset, long length) throws Exception {
        return Long.parseLong(command("checksum", Integer.toString(region), Long.toString(offset),
                Long.toString(length))[1]);
    }

    @Override
    public void deregister(int region) throws Exception {
        command("deregister", Integer.toString(region));
    }

    @Override
    public void postRecvs(int conn, int count) throws Exception {
        command("postRecvs", Integer.toString(conn), Integer.toString(count));
    }

    @Override
    public void send(int conn, int count, int size, long seed, int opcode, int imm) throws Exception {
        command("send", Integer.toString(conn), Integer.toString(count), Integer.toString(size), Long.toString(seed),
                Integer.toString(opcode), Integer.toString(imm));
    }

    @Override
    public synchronized List<Completion> takeCompletions(int conn, int min, long timeoutMillis) throws Exception {
        int n = Integer.parseInt(command(timeoutMillis + COMMAND_TIMEOUT_MILLIS, "take", Integer.toString(conn),
                Integer.toString(min), Long.toString(timeoutMillis))[1]);
        List<Completion> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            out.add(Completion.decode(readLine(COMMAND_TIMEOUT_MILLIS).split(" "), 0));
        }
        return out;
    }

    @Override
    public boolean awaitDisconnected(int conn, long timeoutMillis) throws Exception {
        return Boolean.parseBoolean(command(timeoutMillis + COMMAND_TIMEOUT_MILLIS, "awaitDisconnected",
                Integer.toString(conn), Long.toString(timeoutMillis))[1]);
    }

    @Override
    public InetSocketAddress remoteAddress(int conn) throws Exception {
        String[] f = command("remoteAddress", Integer.toString(conn));
        return new InetSocketAddress(InetAddress.getByName(f[1]), Integer.parseInt(f[2]));
    }

    @Override
    public QpState qpState(int conn) throws Exception {
        return QpState.valueOf(command("qpState", Integer.toString(conn))[1]);
    }

    @Override
    public void disconnect(int conn) throws Exception {
        command("disconnect", Integer.toString(conn));
    }

    @Override
    public void destroy(int conn) throws Exception {
        command("destroy", Integer.toString(conn));
    }

    @Override
    public Usage reset() throws Exception {
        String[] f = command("reset");
        return new Usage(Boolean.parseBoolean(f[1]), f[2].replace('_', ' '));
    }

    @Override
    public boolean canDie() {
        return true;
    }

    @Override
    public void kill() throws InterruptedException {
        process.destroyForcibly();
        process.waitFor(10, TimeUnit.SECONDS);
    }

    @Override
    public boolean isAlive() {
        return process.isAlive();
    }

    @Override
    public void close() {
        if (process.isAlive()) {
            try {
                command(10_000, "quit");
                process.waitFor(5, TimeUnit.SECONDS);
            } catch (Exception ignored) {
                // Killed below.
            }
        }
        process.destroyForcibly();
        try {
            process.waitFor(10, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        try {
            Files.deleteIfExists(stderr);
        } catch (IOException ignored) {
            // A temp file left behind is harmless.
        }
    }
}
