package io.rdmabridge.tools;

import io.rdmabridge.verbs.DeviceAttributes;
import io.rdmabridge.verbs.PortAttributes;
import io.rdmabridge.verbs.ProviderSelection;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RdmaProviders;
import java.io.IOException;
import java.io.PrintStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Locale;
import java.util.stream.Stream;

/**
 * {@code rdma-doctor}: the first thing to run on a new node. Prints every RDMA provider with its availability and
 * cause, the devices and ports the kernel and the providers see, the memlock limit, and runs a short SEND/RECV
 * ping-pong on the chosen provider with its round-trip times. Without {@code --address} the ping-pong runs on the
 * address {@link LocalRdmaAddress} finds: an {@code ACTIVE} RDMA port's IPv4 address, or loopback for the soft
 * provider.
 *
 * <pre>
 * rdma-doctor [--provider auto|disni|soft] [--address IP] [--size BYTES] [--iterations N]
 * </pre>
 * Exit status: 0 when the chosen provider passed the ping-pong, 1 when no provider is usable or the ping-pong failed,
 * 2 on a usage error.
 */
public final class RdmaDoctor {
    /** How long resources may take to be released after the ping-pong's teardown before they count as leaked. */
    private static final Duration RELEASE_PATIENCE = Duration.ofSeconds(5);

    private RdmaDoctor() {
    }

    public static void main(String[] args) {
        System.exit(run(args, System.out));
    }

    /** Runs the diagnosis, printing to {@code out}; returns the exit status. */
    public static int run(String[] args, PrintStream out) {
        String requested = System.getProperty(RdmaProviders.PROVIDER_PROPERTY, RdmaProviders.AUTO);
        String address = null;
        int size = 64;
        int iterations = 1000;
        try {
            for (int i = 0; i < args.length; i++) {
                switch (args[i]) {
                    case "--provider" -> requested = value(args, ++i);
                    case "--address" -> address = value(args, ++i);
                    case "--size" -> size = Integer.parseInt(value(args, ++i));
                    case "--iterations" -> iterations = Integer.parseInt(value(args, ++i));
                    case "-h", "--help" -> {
                        out.println(usage());
                        return 0;
                    }
                    default -> throw new IllegalArgumentException("unknown option '" + args[i] + "'");
                }
            }
            if (size <= 0 || iterations <= 0) {
                throw new IllegalArgumentException("--size and --iterations must be positive");
            }
        } catch (IllegalArgumentException e) {
            out.println("rdma-doctor: " + e.getMessage());
            out.println(usage());
            return 2;
        }

        out.println("== rdma-doctor ==");
        out.println("java " + System.getProperty("java.version") + " (" + System.getProperty("java.vm.name") + "), "
                + System.getProperty("os.name") + " " + System.getProperty("os.arch"));
        out.println();
        out.println("-- kernel RDMA devices (/sys/class/infiniband)");
        printKernelDevices(out);
        out.println("-- memlock limit (registered memory is pinned): " + memlockLimit());
        out.println();
        out.println("-- providers");
        for (RdmaProvider p : RdmaProviders.all()) {
            out.printf(Locale.ROOT, "%-6s %-8s %s%n", p.name(), p.isHardware() ? "hardware" : "software",
                    p.isAvailable() ? "available" : "UNAVAILABLE: " + p.unavailabilityCause().getMessage());
        }
        out.println();
        ProviderSelection selection = RdmaProviders.select(requested);
        out.println("-- selection (" + RdmaProviders.PROVIDER_PROPERTY + "=" + selection.requested() + "): "
                + selection.reason());
        if (!selection.isAvailable()) {
            out.println();
            out.println("RESULT: no usable RDMA provider (causes and fixes: see the selection line above)");
            return 1;
        }
        RdmaProvider provider = selection.provider();
        try {
            for (RdmaDevice device : provider.devices()) {
                DeviceAttributes a = device.attributes();
                out.printf(Locale.ROOT, "device %s: transport=%s maxQp=%d maxQpWr=%d maxSge=%d maxCqe=%d"
                                + " maxInline=%d maxMrSize=%d maxMr=%d maxQpRdAtom=%d%n", a.name(), a.transport(),
                        a.maxQp(), a.maxQpWr(), a.maxSge(), a.maxCqe(), a.maxInlineData(), a.maxMrSize(), a.maxMr(),
                        a.maxQpRdAtom());
                for (PortAttributes port : device.ports()) {
                    out.printf(Locale.ROOT, "  port %d: state=%s linkLayer=%s mtu=%d address=%s%n", port.portNumber(),
                            port.state(), port.linkLayer(), port.activeMtu(), port.address());
                }
            }
            out.println();
            InetAddress host;
            if (address != null) {
                host = InetAddress.getByName(address);
                out.println("-- address: " + address + " (--address)");
            } else {
                LocalRdmaAddress local = LocalRdmaAddress.of(provider);
                if (!local.isFound()) {
                    out.println("-- address: none");
                    out.println();
                    out.println("RESULT: no address for the ping-pong: " + local.description());
                    return 1;
                }
                host = local.address();
                out.println("-- address: " + local.description());
            }
            out.printf(Locale.ROOT, "-- ping-pong on %s at %s: %d x %d-byte SEND/RECV round trips%n", provider.name(),
                    host.getHostAddress(), iterations, size);
            InetSocketAddress bind = new InetSocketAddress(host, 0);
            long[] rtt;
            try (PingPong pingPong = new PingPong(provider, bind, size)) {
                rtt = pingPong.run(Math.min(iterations, 100), iterations);
            }
            out.printf(Locale.ROOT, "round trip: min %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us%n",
                    micros(rtt[0]), micros(percentile(rtt, 0.50)), micros(percentile(rtt, 0.99)),
                    micros(rtt[rtt.length - 1]));
            // A DiSNI completion queue is destroyed by its event thread once the thread's wait returns.
            boolean released = provider.resourceUsage().awaitZero(RELEASE_PATIENCE);
            out.println("resources after teardown: " + provider.resourceUsage());
            if (!released) {
                out.println("RESULT: FAILED: the provider leaked resources after the ping-pong");
                return 1;
            }
            out.println("RESULT: OK: " + provider.name() + " passed the ping-pong");
            return 0;
        } catch (Exception e) {
            out.println("RESULT: FAILED: " + e);
            return 1;
        }
    }

    private static String value(String[] args, int i) {
        if (i >= args.length) {
            throw new IllegalArgumentException("option '" + args[i - 1] + "' needs a value");
        }
        return args[i];
    }

    private static String usage() {
        return "usage: rdma-doctor [--provider auto|disni|soft] [--address IP] [--size BYTES] [--iterations N]";
    }

    static long percentile(long[] sorted, double p) {
        int index = (int) Math.ceil(p * sorted.length) - 1;
        return sorted[Math.max(0, Math.min(sorted.length - 1, index))];
    }

    private static double micros(long nanos) {
        return nanos / 1000.0;
    }

    private static void printKernelDevices(PrintStream out) {
        Path root = Path.of("/sys/class/infiniband");
        if (!Files.isDirectory(root)) {
            out.println("none: " + root + " does not exist (no RDMA driver loaded; load one, e.g. mlx5_ib, or"
                    + " soft-RoCE with 'rdma link add rxe0 type rxe netdev eth0')");
            return;
        }
        try (Stream<Path> devices = Files.list(root)) {
            List<Path> list = devices.sorted().toList();
            if (list.isEmpty()) {
                out.println("none: " + root + " is empty");
            }
            for (Path device : list) {
                out.println(device.getFileName());
                Path ports = device.resolve("ports");
                if (Files.isDirectory(ports)) {
                    try (Stream<Path> ps = Files.list(ports)) {
                        for (Path port : ps.sorted().toList()) {
                            out.println("  port " + port.getFileName() + ": " + read(port.resolve("state")) + ", "
                                    + read(port.resolve("link_layer")));
                        }
                    }
                }
            }
        } catch (IOException e) {
            out.println("cannot list " + root + ": " + e);
        }
    }

    private static String read(Path file) {
        try {
            return Files.readString(file).trim();
        } catch (IOException e) {
            return "?";
        }
    }

    /** The "Max locked memory" soft limit of this process, as the kernel reports it. */
    static String memlockLimit() {
        try {
            for (String line : Files.readAllLines(Path.of("/proc/self/limits"))) {
                if (line.startsWith("Max locked memory")) {
                    String[] f = line.substring("Max locked memory".length()).trim().split("\\s+");
                    String soft = f[0];
                    if ("unlimited".equals(soft)) {
                        return "unlimited";
                    }
                    long bytes = Long.parseLong(soft);
                    String text = bytes / 1024 + " KiB";
                    return bytes < 64L * 1024 * 1024
                            ? text + " (low for RDMA: raise it with 'ulimit -l unlimited' or limits.conf memlock)"
                            : text;
                }
            }
            return "unknown (no 'Max locked memory' line in /proc/self/limits)";
        } catch (IOException | RuntimeException e) {
            return "unknown (" + e + ")";
        }
    }
}
