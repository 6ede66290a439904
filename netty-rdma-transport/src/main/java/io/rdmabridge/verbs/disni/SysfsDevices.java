package io.rdmabridge.verbs.disni;

import io.rdmabridge.verbs.PortAttributes;
import io.rdmabridge.verbs.Sysfs;
import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;

/**
 * What the kernel publishes about RDMA devices under {@code /sys/class/infiniband}. DiSNI 2.1 cannot name a device,
 * query its ports or its transport, so the provider reads them here, best effort: every method returns what it
 * found and never throws. Thread-safe (stateless).
 */
final class SysfsDevices {
    static final Path CLASS_INFINIBAND = Paths.get("/sys/class/infiniband");
    private static final Path CLASS_NET = Paths.get("/sys/class/net");

    private SysfsDevices() {
    }

    /** The RDMA device names the kernel knows, e.g. {@code [mlx5_0, rxe0]}; empty when none or no sysfs. */
    static List<String> deviceNames() {
        List<String> names = new ArrayList<>();
        try (DirectoryStream<Path> dirs = Files.newDirectoryStream(CLASS_INFINIBAND)) {
            for (Path dir : dirs) {
                names.add(dir.getFileName().toString());
            }
        } catch (IOException | RuntimeException e) {
            // No sysfs entry: no device, or not Linux.
        }
        names.sort(null);
        return names;
    }

    /**
     * The RDMA device that serves the network interface {@code ifName}: the device whose GID table names it
     * (RoCE, soft-RoCE) or the device under the interface's parent (IPoIB, iWARP). {@code null} when unknown.
     */
    static String deviceOfInterface(String ifName) {
        if (ifName == null) {
            return null;
        }
        for (String device : deviceNames()) {
            for (Path port : Sysfs.list(CLASS_INFINIBAND.resolve(device).resolve("ports"))) {
                for (Path ndev : Sysfs.list(port.resolve("gid_attrs").resolve("ndevs"))) {
                    if (ifName.equals(Sysfs.read(ndev))) {
                        return device;
                    }
                }
            }
        }
        List<Path> parents = Sysfs.list(CLASS_NET.resolve(ifName).resolve("device").resolve("infiniband"));
        return parents.size() == 1 ? parents.get(0).getFileName().toString() : null;
    }

    /** {@code InfiniBand}, {@code RoCE} or {@code iWARP}, from the device's node type and first port's link layer. */
    static String transport(String device) {
        if (device == null) {
            return "unknown (DiSNI 2.1 cannot query the device)";
        }
        String nodeType = Sysfs.read(CLASS_INFINIBAND.resolve(device).resolve("node_type"));
        if (nodeType != null && nodeType.contains("RNIC")) {
            return "iWARP";
        }
        List<PortAttributes> ports = ports(device);
        if (!ports.isEmpty() && "Ethernet".equals(ports.get(0).linkLayer())) {
            return "RoCE";
        }
        return ports.isEmpty() ? "unknown (no port listed in sysfs)" : ports.get(0).linkLayer();
    }

    /** The device's ports with state and link layer; the MTU is 0 because sysfs does not publish the active MTU. */
    static List<PortAttributes> ports(String device) {
        List<PortAttributes> ports = new ArrayList<>();
        if (device == null) {
            return ports;
        }
        for (Path port : Sysfs.list(CLASS_INFINIBAND.resolve(device).resolve("ports"))) {
            int number;
            try {
                number = Integer.parseInt(port.getFileName().toString());
            } catch (NumberFormatException e) {
                continue;
            }
            // "state" reads e.g. "4: ACTIVE".
            String state = Sysfs.read(port.resolve("state"));
            if (state != null && state.indexOf(':') >= 0) {
                state = state.substring(state.indexOf(':') + 1).trim();
            }
            String linkLayer = Sysfs.read(port.resolve("link_layer"));
            ports.add(new PortAttributes(number, state == null ? "unknown" : state,
                    linkLayer == null ? "unknown" : linkLayer, 0, null));
        }
        ports.sort((a, b) -> Integer.compare(a.portNumber(), b.portNumber()));
        return ports;
    }


}
