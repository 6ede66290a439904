package io.rdmabridge.tools;

import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.Sysfs;
import java.net.Inet4Address;
import java.net.InetAddress;
import java.net.NetworkInterface;
import java.net.SocketException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import java.util.function.Function;

/**
 * The local IPv4 address a tool should use when the user gave none: the address of an {@code ACTIVE} RDMA port, found
 * through the network interface the kernel ties to that port, or loopback for a software provider.
 *
 * <p>rdma_cm binds and connects by IP address, and an address reaches a device only if the device serves the
 * interface that carries it; 127.0.0.1 is served by no RDMA device. The kernel publishes the tie under
 * {@code /sys/class/infiniband}: for RoCE (and soft-RoCE) each GID entry names its interface in
 * {@code ports/<n>/gid_attrs/ndevs/<i>}; for InfiniBand (IPoIB) and iWARP the interfaces sit under
 * {@code <device>/device/net/}. Devices are taken by name, ports by number, and the first {@code ACTIVE} port whose
 * interface has an IPv4 address wins. When there is none, {@link #description()} is one sentence that names the cause
 * and the fix.
 *
 * <p>Immutable and thread-safe; {@link #find()} reads sysfs on every call.
 */
public final class LocalRdmaAddress {
    private static final Path CLASS_INFINIBAND = Path.of("/sys/class/infiniband");
    private static final String PASS_ADDRESS = "pass --address IP";

    private final InetAddress address;
    private final String device;
    private final int port;
    private final String interfaceName;
    private final String description;

    private LocalRdmaAddress(InetAddress address, String device, int port, String interfaceName,
                             String description) {
        this.address = address;
        this.device = device;
        this.port = port;
        this.interfaceName = interfaceName;
        this.description = description;
    }

    /**
     * The address to use with {@code provider}: loopback for a software provider (it serves every local address),
     * otherwise what {@link #find()} finds.
     */
    public static LocalRdmaAddress of(RdmaProvider provider) {
        if (!provider.isHardware()) {
            return new LocalRdmaAddress(InetAddress.getLoopbackAddress(), null, 0, null,
                    InetAddress.getLoopbackAddress().getHostAddress() + " (loopback: the " + provider.name()
                            + " provider is software and serves every local address)");
        }
        return find();
    }

    /** The IPv4 address of the first {@code ACTIVE} RDMA port this host's kernel lists, or why there is none. */
    public static LocalRdmaAddress find() {
        return find(CLASS_INFINIBAND, LocalRdmaAddress::ipv4Addresses);
    }

    /**
     * As {@link #find()}, reading the devices under {@code classInfiniband} and the IPv4 addresses of an interface
     * through {@code ipv4Of} (tests give a fake sysfs tree and fake interfaces).
     */
    static LocalRdmaAddress find(Path classInfiniband, Function<String, List<InetAddress>> ipv4Of) {
        List<Path> devices = Sysfs.list(classInfiniband);
        if (devices.isEmpty()) {
            return notFound("no RDMA device: " + classInfiniband + " lists none (no RDMA driver is loaded); "
                    + PASS_ADDRESS + ", load the device's driver (e.g. mlx5_ib) or create a soft-RoCE device"
                    + " (rdma link add rxe0 type rxe netdev IFACE), or use --provider soft, which runs on loopback");
        }
        List<String> down = new ArrayList<>();
        List<String> withoutInterface = new ArrayList<>();
        List<String> withoutIpv4 = new ArrayList<>();
        List<LocalRdmaAddress> found = new ArrayList<>();
        for (Path device : devices) {
            String deviceName = device.getFileName().toString();
            List<Path> ports = Sysfs.list(device.resolve("ports"));
            ports.sort((a, b) -> Integer.compare(index(a), index(b)));
            for (Path portDir : ports) {
                int port = index(portDir);
                if (port == Integer.MAX_VALUE) {
                    continue;
                }
                String where = deviceName + " port " + port;
                String state = portState(portDir);
                if (!"ACTIVE".equals(state)) {
                    down.add(where + " is " + state);
                    continue;
                }
                Set<String> interfaces = interfacesOf(device, portDir, port);
                if (interfaces.isEmpty()) {
                    String linkLayer = Sysfs.read(portDir.resolve("link_layer"));
                    withoutInterface.add(where + (linkLayer == null ? "" : " (" + linkLayer + ")"));
                    continue;
                }
                for (String ifName : interfaces) {
                    List<InetAddress> addresses = ipv4Of.apply(ifName);
                    if (addresses.isEmpty()) {
                        withoutIpv4.add("interface " + ifName + " of " + where);
                    }
                    for (InetAddress a : addresses) {
                        found.add(new LocalRdmaAddress(a, deviceName, port, ifName, null));
                    }
                }
            }
        }
        if (!found.isEmpty()) {
            return chosen(found);
        }
        if (!withoutIpv4.isEmpty()) {
            return notFound(String.join(", ", withoutIpv4) + (withoutIpv4.size() == 1 ? " has" : " have")
                    + " no IPv4 address, and rdma_cm needs one: assign one (ip addr add A.B.C.D/NN dev IFACE) or "
                    + PASS_ADDRESS);
        }
        if (!withoutInterface.isEmpty()) {
            return notFound("no network interface serves the ACTIVE RDMA port" + (withoutInterface.size() == 1
                    ? " " : "s ") + String.join(", ", withoutInterface) + ", and rdma_cm needs an IP address: configure"
                    + " one (IPoIB, e.g. ib0, for InfiniBand) with an IPv4 address or " + PASS_ADDRESS);
        }
        if (!down.isEmpty()) {
            return notFound("no RDMA port is ACTIVE (" + String.join(", ", down) + "): bring the link up (cable,"
                    + " ip link set IFACE up; InfiniBand also needs a subnet manager) or " + PASS_ADDRESS);
        }
        return notFound("no RDMA port: the devices under " + classInfiniband + " list no ports; check the device's"
                + " driver (dmesg) or " + PASS_ADDRESS);
    }

    private static LocalRdmaAddress chosen(List<LocalRdmaAddress> found) {
        LocalRdmaAddress first = found.get(0);
        StringBuilder why = new StringBuilder(first.address.getHostAddress()).append(" (").append(first.device)
                .append(" port ").append(first.port).append(", interface ").append(first.interfaceName).append(": ");
        if (found.size() == 1) {
            why.append("the only ACTIVE RDMA port with an IPv4 address)");
        } else {
            why.append("the first of ").append(found.size()).append(" IPv4 addresses of ACTIVE RDMA ports, devices by")
                    .append(" name, then ports by number; the others: ");
            for (LocalRdmaAddress other : found.subList(1, found.size())) {
                why.append(other == found.get(1) ? "" : ", ").append(other.address.getHostAddress()).append(" on ")
                        .append(other.device).append(" port ").append(other.port).append(" (")
                        .append(other.interfaceName).append(')');
            }
            why.append(')');
        }
        return new LocalRdmaAddress(first.address, first.device, first.port, first.interfaceName, why.toString());
    }

    private static LocalRdmaAddress notFound(String cause) {
        return new LocalRdmaAddress(null, null, 0, null, cause);
    }

    /** {@code ports/<n>/state} reads e.g. {@code 4: ACTIVE}. */
    private static String portState(Path portDir) {
        String state = Sysfs.read(portDir.resolve("state"));
        if (state == null) {
            return "in an unknown state (no readable " + portDir.resolve("state") + ")";
        }
        int colon = state.indexOf(':');
        return colon >= 0 ? state.substring(colon + 1).trim() : state;
    }

    /**
     * The interfaces of one port: the GID table's (RoCE; the table may name one interface many times, and entries
     * without one do not read), else the device's own (IPoIB, iWARP), matched to the port by {@code dev_port} when
     * the kernel gives one.
     */
    private static Set<String> interfacesOf(Path device, Path portDir, int port) {
        Set<String> names = new LinkedHashSet<>();
        List<Path> ndevs = Sysfs.list(portDir.resolve("gid_attrs").resolve("ndevs"));
        ndevs.sort((a, b) -> Integer.compare(index(a), index(b)));
        for (Path ndev : ndevs) {
            String name = Sysfs.read(ndev);
            if (name != null && !name.isEmpty()) {
                names.add(name);
            }
        }
        if (!names.isEmpty()) {
            return names;
        }
        for (Path net : Sysfs.list(device.resolve("device").resolve("net"))) {
            String devPort = Sysfs.read(net.resolve("dev_port"));
            if (devPort == null || devPort.equals(Integer.toString(port - 1))) {
                names.add(net.getFileName().toString());
            }
        }
        return names;
    }

    /** A numbered sysfs entry's number (a port, a GID index); {@code Integer.MAX_VALUE} for any other name. */
    private static int index(Path entry) {
        try {
            return Integer.parseInt(entry.getFileName().toString());
        } catch (NumberFormatException e) {
            return Integer.MAX_VALUE;
        }
    }

    /** The IPv4 addresses of interface {@code name} in this network namespace; none when it is not here. */
    static List<InetAddress> ipv4Addresses(String name) {
        try {
            NetworkInterface nif = NetworkInterface.getByName(name);
            if (nif == null) {
                return List.of();
            }
            return nif.inetAddresses().filter(a -> a instanceof Inet4Address).toList();
        } catch (SocketException e) {
            return List.of();
        }
    }



    /** Whether an address was found. */
    public boolean isFound() {
        return address != null;
    }

    /** The address, or {@code null} when none was found ({@link #description()} says why). */
    public InetAddress address() {
        return address;
    }

    /** The RDMA device whose port serves the address, e.g. {@code mlx5_0}; {@code null} for loopback or none. */
    public String device() {
        return device;
    }

    /** The 1-based port of {@link #device()}; 0 for loopback or none. */
    public int port() {
        return port;
    }

    /** The network interface that carries the address, e.g. {@code eth1}; {@code null} for loopback or none. */
    public String interfaceName() {
        return interfaceName;
    }

    /**
     * One line: the address with its device, port, interface and why this one was chosen; or, when none was found,
     * one sentence naming the cause and the fix.
     */
    public String description() {
        return description;
    }

    @Override
    public String toString() {
        return description;
    }
}
