package io.rdmabridge.benchmarks;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A server in a child JVM started from this JVM's class path, for benchmarks across processes on loopback: a
 * {@link PerfServer}, or any main class taking the same arguments ({@code TRANSPORT HOST}) and printing
 * {@link PerfServer#LISTENING} once bound. The child serves until {@link #close()} (which closes its standard input,
 * then kills it if it lingers). Not thread-safe.
 */
public final class ChildServer implements AutoCloseable {
    private final Process process;
    private final InetSocketAddress address;

    private ChildServer(Process process, InetSocketAddress address) {
        this.process = process;
        this.address = address;
    }

    /**
     * Starts a server of {@code transport} on 127.0.0.1 and waits until it listens.
     *
     * @param provider the RDMA provider the child uses for {@link Transport#RDMA}
     */
    public static ChildServer start(Transport transport, String provider) throws IOException {
        return start(PerfServer.class, transport, provider);
    }

    /**
     * Starts {@code main} (arguments {@code TRANSPORT 127.0.0.1}) and waits until it prints
     * {@link PerfServer#LISTENING}.
     *
     * @param provider the RDMA provider the child uses for {@link Transport#RDMA}
     */
    public static ChildServer start(Class<?> main, Transport transport, String provider) throws IOException {
        return start(main, transport, provider, List.of());
    }

    /**
     * As {@link #start(Class, Transport, String)}, with {@code jvmOptions} added to the child's command line.
     */
    public static ChildServer start(Class<?> main, Transport transport, String provider, List<String> jvmOptions)
            throws IOException {
        if (!transport.isNetwork()) {
            throw new IllegalArgumentException("transport: " + transport.id() + " (expected: a network transport;"
                    + " local channels cannot cross processes)");
        }
        List<String> command = new ArrayList<>();
        command.add(System.getProperty("java.home") + File.separator + "bin" + File.separator + "java");
        command.add("-Xmx512m");
        command.add("-XX:MaxDirectMemorySize=1g");
        command.add("-XX:+UseSerialGC");
        command.add("-Drdmabridge.provider=" + provider);
        command.add("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn");
        command.addAll(RdmaTuning.jvmOptions());
        command.addAll(jvmOptions);
        command.add("--add-exports");
        command.add("java.base/sun.nio.ch=ALL-UNNAMED");
        command.add("-cp");
        command.add(System.getProperty("java.class.path"));
        command.add(main.getName());
        command.add(transport.id());
        command.add("127.0.0.1");
        Process p = new ProcessBuilder(command).redirectError(ProcessBuilder.Redirect.INHERIT).start();
        try {
            BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
            String line;
            while ((line = out.readLine()) != null) {
                if (line.startsWith(PerfServer.LISTENING)) {
                    String hostPort = line.substring(PerfServer.LISTENING.length()).trim();
                    int colon = hostPort.lastIndexOf(':');
                    InetSocketAddress address = new InetSocketAddress(hostPort.substring(0, colon),
                            Integer.parseInt(hostPort.substring(colon + 1)));
                    return new ChildServer(p, address);
                }
            }
            throw new IOException("child " + transport.id() + " server exited before listening (exit status "
                    + p.waitFor() + "); its standard error above names the cause");
        } catch (IOException | InterruptedException | RuntimeException e) {
            p.destroyForcibly();
            if (e instanceof InterruptedException) {
                Thread.currentThread().interrupt();
            }
            throw e instanceof IOException ? (IOException) e : new IOException(e);
        }
    }

    public InetSocketAddress address() {
        return address;
    }

    /** The child's process id, for reports. */
    public long pid() {
        return process.pid();
    }

    /** CPU nanoseconds (user + system) the child has used so far, from the OS; -1 where it cannot tell. */
    public long cpuNanos() {
        return process.info().totalCpuDuration().map(Duration::toNanos).orElse(-1L);
    }

    @Override
    public void close() {
        try {
            process.getOutputStream().close();
            if (!process.waitFor(5, TimeUnit.SECONDS)) {
                process.destroyForcibly().waitFor(5, TimeUnit.SECONDS);
            }
        } catch (IOException e) {
            process.destroyForcibly();
        } catch (InterruptedException e) {
            process.destroyForcibly();
            Thread.currentThread().interrupt();
        }
    }
}
