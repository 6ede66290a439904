package io.rdmabridge.benchmarks.perf;

import io.netty.channel.epoll.Epoll;
import io.rdmabridge.benchmarks.PerfServer;
import io.rdmabridge.benchmarks.Transport;
import io.rdmabridge.tools.LocalRdmaAddress;
import io.rdmabridge.verbs.RdmaProvider;

import java.io.PrintStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.atomic.AtomicReference;

/**
 * {@code rdma-perf}: perftest's {@code send_lat}, {@code send_bw}, {@code write_bw} and {@code read_bw}, over the verbs
 * SPI directly ({@code --api verbs}) or over the Netty RDMA channel ({@code --api netty}), on a chosen provider, with
 * {@code --baseline tcp} running the same pattern over Netty epoll.
 *
 * <pre>
 * rdma-perf [send_lat|send_bw|write_bw|read_bw] [--api verbs|netty] [--provider auto|soft|disni]
 *           [--baseline tcp] [--server [--bind IP] [--port P] | --connect HOST:PORT | --address IP]
 *           [--size N | --sizes N,N,... | -a] [--iterations N] [--tx-depth N] [--rx-depth N]
 * </pre>
 * Without {@code --server} or {@code --connect} both ends run in this process (loopback mode) on {@code --address},
 * by default the IPv4 address of an {@code ACTIVE} RDMA port ({@link LocalRdmaAddress}; 127.0.0.1 for the soft
 * provider and the TCP baseline), and the line {@code rdma-perf: address ...} says which and why. Prints
 * one table per test: bandwidth, message rate, one-way latency percentiles (latency tests) and process CPU seconds
 * per GB. Exit status 0 on success, 1 on a failed run, 2 on a usage error.
 */
public final class RdmaPerf {
    /** Sizes when none are given: the message sizes the project's targets are stated at. */
    static final int[] DEFAULT_SIZES = {64, 1024, 65536, 1 << 20, 4 << 20};

    private RdmaPerf() {
    }

    public static void main(String[] args) {
        System.exit(run(args, System.out));
    }

    /** Runs the command; returns the exit status. */
    public static int run(String[] args, PrintStream out) {
        Command command;
        try {
            command = Command.parse(args);
        } catch (IllegalArgumentException e) {
            out.println("rdma-perf: " + e.getMessage());
            out.println(usage());
            return 2;
        }
        if (command == null) {
            out.println(usage());
            return 0;
        }
        try {
            command.execute(out);
            return 0;
        } catch (Exception e) {
            out.println("rdma-perf: " + e.getMessage());
            for (Throwable s : e.getSuppressed()) {
                out.println("rdma-perf: and " + s.getMessage());
            }
            return 1;
        }
    }

    /** Runs the command in loopback or client mode and returns its rows (for the results report and tests). */
    public static List<PerfResult> measure(String... args) throws Exception {
        Command command = Command.parse(args);
        if (command == null || command.server) {
            throw new IllegalArgumentException("measure() needs a loopback or --connect command");
        }
        return command.execute(new PrintStream(PrintStream.nullOutputStream()));
    }

    static String usage() {
        return String.join("\n",
                "usage: rdma-perf [send_lat|send_bw|write_bw|read_bw] [options]",
                "  --api verbs|netty      verbs SPI directly (default) or the Netty RDMA channel",
                "  --provider NAME        auto, soft or disni (default: rdmabridge.provider, else auto)",
                "  --baseline tcp         the same pattern over Netty epoll (NIO where epoll is unavailable)",
                "  --server               serve clients on --bind (default 0.0.0.0) and --port (default 18515)",
                "  --connect HOST:PORT    run against a server elsewhere; without --server/--connect: loopback",
                "  --address IP           loopback mode's address (default: an ACTIVE RDMA port's IPv4 address;",
                "                         127.0.0.1 for the soft provider and --baseline tcp)",
                "  --size N | --sizes N,N | -a   message sizes (default 64,1024,65536,1048576,4194304;",
                "                                -a: 2 B..8 MiB, powers of two); a server takes the largest",
                "  --iterations N         messages per size (default: 1000 round trips; about 256 MiB for bw)",
                "  --tx-depth N, --rx-depth N    verbs queue depths (default 128, 256)");
    }

    /** A parsed command line. */
    private static final class Command {
        PerfTest test = PerfTest.SEND_BW;
        String api = "verbs";
        String provider = System.getProperty("rdmabridge.provider", "auto");
        boolean tcpBaseline;
        boolean server;
        String bind = "0.0.0.0";
        int port = 18515;
        String connect;
        String address;
        int[] sizes = DEFAULT_SIZES;
        long iterations;
        int txDepth = 128;
        int rxDepth = 256;

        static Command parse(String[] args) {
            Command c = new Command();
            for (int i = 0; i < args.length; i++) {
                String a = args[i];
                switch (a) {
                    case "-h", "--help" -> {
                        return null;
                    }
                    case "--api" -> c.api = value(args, ++i, a).toLowerCase(Locale.ROOT);
                    case "--provider" -> c.provider = value(args, ++i, a);
                    case "--baseline" -> {
                        String b = value(args, ++i, a);
                        if (!"tcp".equalsIgnoreCase(b)) {
                            throw new IllegalArgumentException("--baseline: " + b + " (expected: tcp)");
                        }
                        c.tcpBaseline = true;
                    }
                    case "--server" -> c.server = true;
                    case "--bind" -> c.bind = value(args, ++i, a);
                    case "--port" -> c.port = positive(value(args, ++i, a), a);
                    case "--connect" -> c.connect = value(args, ++i, a);
                    case "--address" -> c.address = value(args, ++i, a);
                    case "--size" -> c.sizes = new int[] {positive(value(args, ++i, a), a)};
                    case "--sizes" -> c.sizes = Arrays.stream(value(args, ++i, a).split(","))
                            .mapToInt(s -> positive(s.trim(), a)).toArray();
                    case "-a" -> c.sizes = allSizes();
                    case "--iterations" -> c.iterations = positive(value(args, ++i, a), a);
                    case "--tx-depth" -> c.txDepth = positive(value(args, ++i, a), a);
                    case "--rx-depth" -> c.rxDepth = positive(value(args, ++i, a), a);
                    default -> {
                        if (a.startsWith("-")) {
                            throw new IllegalArgumentException("unknown option '" + a + "'");
                        }
                        c.test = PerfTest.of(a);
                    }
                }
            }
            if (!"verbs".equals(c.api) && !"netty".equals(c.api)) {
                throw new IllegalArgumentException("--api: " + c.api + " (expected: verbs or netty)");
            }
            if (c.tcpBaseline) {
                c.api = "netty";
            }
            if (c.server && c.connect != null) {
                throw new IllegalArgumentException("--server and --connect exclude each other");
            }
            if (c.address != null && (c.server || c.connect != null)) {
                throw new IllegalArgumentException("--address is loopback mode's address (expected: --bind IP with"
                        + " --server, HOST in --connect HOST:PORT)");
            }
            if ("netty".equals(c.api) && c.test.isOneSided() && !c.server) {
                throw new IllegalArgumentException(c.test.id() + " is a one-sided verbs pattern; a Netty channel has"
                        + " no RDMA WRITE/READ of its own (expected: --api verbs, or send_lat / send_bw)");
            }
            return c;
        }

        private static int[] allSizes() {
            List<Integer> sizes = new ArrayList<>();
            for (int s = 2; s <= 8 << 20; s <<= 1) {
                sizes.add(s);
            }
            return sizes.stream().mapToInt(Integer::intValue).toArray();
        }

        private static String value(String[] args, int i, String option) {
            if (i >= args.length) {
                throw new IllegalArgumentException(option + " needs a value");
            }
            return args[i];
        }

        private static int positive(String s, String option) {
            int v;
            try {
                v = Integer.parseInt(s);
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException(option + ": " + s + " (expected: a positive integer)");
            }
            if (v <= 0) {
                throw new IllegalArgumentException(option + ": " + v + " (expected: > 0)");
            }
            return v;
        }

        private Transport transport() {
            if (!tcpBaseline) {
                return Transport.RDMA;
            }
            return Epoll.isAvailable() ? Transport.EPOLL : Transport.NIO;
        }

        private String path(RdmaProvider p, boolean remote) {
            String base = !"netty".equals(api) ? "verbs/" + p.name()
                    : tcpBaseline ? "netty-" + transport().id() : "netty-rdma/" + p.name();
            return base + (remote ? "/remote" : "");
        }

        private VerbsPerf.Settings settings() {
            return new VerbsPerf.Settings(Arrays.stream(sizes).max().orElse(16), txDepth, rxDepth, 16);
        }

        List<PerfResult> execute(PrintStream out) throws Exception {
            RdmaProvider p = tcpBaseline ? null : Transport.provider(provider);
            if (server) {
                serve(p, out);
                return List.of();
            }
            boolean remote = connect != null;
            String path = path(p, remote);
            List<PerfResult> rows;
            String host = null;
            if (remote) {
                rows = client(p, parseHostPort(connect), path, false);
            } else {
                host = loopbackAddress(p, out);
                if ("verbs".equals(api)) {
                    rows = verbsLoopback(p, path, host);
                } else {
                    try (PerfServer s = PerfServer.start(transport(), p, transport().bindAddress(host, 0))) {
                        rows = client(p, s.localAddress(), path, true);
                    }
                }
            }
            String title = String.format(Locale.ROOT, "rdma-perf %s  path=%s  mode=%s%s", test.id(), path,
                    remote ? "client of " + connect : "loopback (both ends in this process) on " + host,
                    p == null ? "" : "  device=" + p.devices().get(0).name() + " ("
                            + p.devices().get(0).attributes().transport() + ")");
            PerfResult.print(out, title + (test.isLatency() ? "\n  latency: one-way = round trip / 2" : ""), rows);
            return rows;
        }

        private List<PerfResult> client(RdmaProvider p, SocketAddress address, String path, boolean loopback)
                throws Exception {
            if ("verbs".equals(api)) {
                return VerbsPerf.runClient(p, (InetSocketAddress) address, test, sizes, iterations, settings(),
                        loopback);
            }
            return ChannelPerf.runClient(transport(), p, address, test, sizes, iterations, path);
        }

        /**
         * Loopback mode's address: {@code --address}, loopback for the TCP baseline, else what
         * {@link LocalRdmaAddress} finds for the provider; printed with the reason.
         */
        private String loopbackAddress(RdmaProvider p, PrintStream out) {
            if (address != null) {
                out.println("rdma-perf: address " + address + " (--address)");
                return address;
            }
            if (p == null) {
                return InetAddress.getLoopbackAddress().getHostAddress();
            }
            LocalRdmaAddress local = LocalRdmaAddress.of(p);
            if (!local.isFound()) {
                throw new IllegalStateException("no address for loopback mode on " + p.name() + ": "
                        + local.description());
            }
            out.println("rdma-perf: address " + local.description());
            return local.address().getHostAddress();
        }

        private List<PerfResult> verbsLoopback(RdmaProvider p, String path, String host) throws Exception {
            AtomicReference<InetSocketAddress> bound = new AtomicReference<>();
            AtomicReference<Throwable> serverFailure = new AtomicReference<>();
            Object lock = new Object();
            Thread serverThread = new Thread(() -> {
                try {
                    VerbsPerf.serve(p, new InetSocketAddress(host, 0), settings(), 1, a -> {
                        synchronized (lock) {
                            bound.set(a);
                            lock.notifyAll();
                        }
                    });
                } catch (Throwable t) {
                    serverFailure.set(t);
                    synchronized (lock) {
                        lock.notifyAll();
                    }
                }
            }, "rdma-perf-server");
            serverThread.setDaemon(true);
            serverThread.start();
            synchronized (lock) {
                while (bound.get() == null && serverFailure.get() == null) {
                    lock.wait(1000);
                }
            }
            if (serverFailure.get() != null) {
                throw new IllegalStateException("server side failed: " + serverFailure.get().getMessage(),
                        serverFailure.get());
            }
            List<PerfResult> rows;
            try {
                rows = client(p, bound.get(), path, true);
            } catch (Exception e) {
                serverThread.join(10_000);
                if (serverFailure.get() != null) {
                    e.addSuppressed(serverFailure.get());
                }
                throw e;
            }
            serverThread.join(10_000);
            if (serverFailure.get() != null) {
                throw new IllegalStateException("server side failed: " + serverFailure.get().getMessage(),
                        serverFailure.get());
            }
            return rows;
        }

        private void serve(RdmaProvider p, PrintStream out) throws Exception {
            InetSocketAddress address = new InetSocketAddress(bind, port);
            if ("verbs".equals(api)) {
                VerbsPerf.serve(p, address, settings(), -1, a -> out.println("rdma-perf: verbs server on "
                        + p.name() + " listening on " + a.getAddress().getHostAddress() + ":" + a.getPort()
                        + " (largest message " + settings().maxSize() + " bytes)"));
                return;
            }
            try (PerfServer s = PerfServer.start(transport(), p, address)) {
                out.println("rdma-perf: netty " + transport().id() + " server listening on " + s.localAddress());
                Thread.currentThread().join();
            }
        }

        private static InetSocketAddress parseHostPort(String hostPort) {
            int colon = hostPort.lastIndexOf(':');
            if (colon <= 0) {
                throw new IllegalArgumentException("--connect: " + hostPort + " (expected: HOST:PORT)");
            }
            return new InetSocketAddress(hostPort.substring(0, colon),
                    positive(hostPort.substring(colon + 1), "--connect"));
        }
    }
}
