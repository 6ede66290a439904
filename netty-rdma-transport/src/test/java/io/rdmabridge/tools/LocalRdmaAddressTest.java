package io.rdmabridge.tools;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.RdmaProviders;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The address discovery against fake {@code /sys/class/infiniband} trees. */
class LocalRdmaAddressTest {
    @TempDir
    Path sys;

    private final Map<String, List<InetAddress>> interfaces = new HashMap<>();

    private Path infiniband() {
        return sys.resolve("class/infiniband");
    }

    private LocalRdmaAddress find() {
        return LocalRdmaAddress.find(infiniband(), name -> interfaces.getOrDefault(name, List.of()));
    }

    private void write(String relative, String content) {
        try {
            Path file = infiniband().resolve(relative);
            Files.createDirectories(file.getParent());
            Files.writeString(file, content + "\n");
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private void port(String device, int port, String state, String linkLayer) {
        write(device + "/ports/" + port + "/state", state);
        write(device + "/ports/" + port + "/link_layer", linkLayer);
    }

    private void iface(String name, String... addresses) {
        interfaces.put(name, Arrays.stream(addresses).map(LocalRdmaAddressTest::ip).toList());
    }

    private static InetAddress ip(String text) {
        try {
            return InetAddress.getByName(text);
        } catch (UnknownHostException e) {
            throw new IllegalArgumentException(text, e);
        }
    }

    @Test
    void shouldTakeTheInterfaceOfARoceGidTable() throws IOException {
        port("rxe0", 1, "4: ACTIVE", "Ethernet");
        write("rxe0/ports/1/gid_attrs/ndevs/0", "veth0");
        write("rxe0/ports/1/gid_attrs/ndevs/1", "veth0");
        // An unused GID entry does not read (the kernel answers EINVAL); a directory fails the read the same way.
        Files.createDirectories(infiniband().resolve("rxe0/ports/1/gid_attrs/ndevs/2"));
        iface("veth0", "10.77.0.1");

        LocalRdmaAddress found = find();

        assertTrue(found.isFound(), found.description());
        assertEquals(ip("10.77.0.1"), found.address());
        assertEquals("rxe0", found.device());
        assertEquals(1, found.port());
        assertEquals("veth0", found.interfaceName());
        assertEquals("10.77.0.1 (rxe0 port 1, interface veth0: the only ACTIVE RDMA port with an IPv4 address)",
                found.description());
    }

    @Test
    void shouldSkipADownPortForAnActiveOne() {
        port("mlx5_0", 1, "1: DOWN", "Ethernet");
        write("mlx5_0/ports/1/gid_attrs/ndevs/0", "eth2");
        port("mlx5_0", 2, "4: ACTIVE", "Ethernet");
        write("mlx5_0/ports/2/gid_attrs/ndevs/0", "eth3");
        iface("eth2", "192.168.2.1");
        iface("eth3", "192.168.3.1");

        LocalRdmaAddress found = find();

        assertEquals(ip("192.168.3.1"), found.address(), found.description());
        assertEquals(2, found.port());
        assertEquals("eth3", found.interfaceName());
    }

    @Test
    void shouldNameTheDownPortWhenNoneIsActive() {
        port("mlx5_0", 1, "1: DOWN", "Ethernet");
        write("mlx5_0/ports/1/gid_attrs/ndevs/0", "eth2");
        iface("eth2", "192.168.2.1");

        LocalRdmaAddress found = find();

        assertFalse(found.isFound());
        assertNull(found.address());
        assertEquals("no RDMA port is ACTIVE (mlx5_0 port 1 is DOWN): bring the link up (cable, ip link set IFACE up;"
                + " InfiniBand also needs a subnet manager) or pass --address IP", found.description());
    }

    @Test
    void shouldSayThereIsNoDeviceWhenTheClassIsEmptyOrMissing() throws IOException {
        LocalRdmaAddress missing = find();
        Files.createDirectories(infiniband());
        LocalRdmaAddress empty = find();

        for (LocalRdmaAddress none : List.of(missing, empty)) {
            assertFalse(none.isFound());
            assertEquals("no RDMA device: " + infiniband() + " lists none (no RDMA driver is loaded); pass --address"
                    + " IP, load the device's driver (e.g. mlx5_ib) or create a soft-RoCE device (rdma link add rxe0"
                    + " type rxe netdev IFACE), or use --provider soft, which runs on loopback", none.description());
        }
    }

    @Test
    void shouldSayAnInfinibandPortWithoutIpoibHasNoAddress() {
        port("mlx5_0", 1, "4: ACTIVE", "InfiniBand");

        LocalRdmaAddress found = find();

        assertFalse(found.isFound());
        assertEquals("no network interface serves the ACTIVE RDMA port mlx5_0 port 1 (InfiniBand), and rdma_cm needs"
                + " an IP address: configure one (IPoIB, e.g. ib0, for InfiniBand) with an IPv4 address or pass"
                + " --address IP", found.description());
    }

    @Test
    void shouldMatchIpoibInterfacesToPortsByDevPort() {
        port("mlx4_0", 1, "4: ACTIVE", "InfiniBand");
        port("mlx4_0", 2, "4: ACTIVE", "InfiniBand");
        write("mlx4_0/device/net/ib0/dev_port", "0");
        write("mlx4_0/device/net/ib1/dev_port", "1");
        iface("ib1", "10.0.1.5");

        LocalRdmaAddress found = find();

        // ib0 (port 1) has no address; port 2's ib1 has one.
        assertEquals(ip("10.0.1.5"), found.address(), found.description());
        assertEquals(2, found.port());
        assertEquals("ib1", found.interfaceName());
    }

    @Test
    void shouldNameTheInterfaceThatLacksAnIpv4Address() {
        port("rxe0", 1, "4: ACTIVE", "Ethernet");
        write("rxe0/ports/1/gid_attrs/ndevs/0", "veth0");

        LocalRdmaAddress found = find();

        assertFalse(found.isFound());
        assertEquals("interface veth0 of rxe0 port 1 has no IPv4 address, and rdma_cm needs one: assign one"
                + " (ip addr add A.B.C.D/NN dev IFACE) or pass --address IP", found.description());
    }

    @Test
    void shouldTakeDevicesByNameAndPortsByNumberAndListTheOthers() {
        port("mlx5_1", 1, "4: ACTIVE", "Ethernet");
        write("mlx5_1/ports/1/gid_attrs/ndevs/0", "eth9");
        port("mlx5_0", 10, "4: ACTIVE", "Ethernet");
        write("mlx5_0/ports/10/gid_attrs/ndevs/0", "eth10");
        port("mlx5_0", 2, "4: ACTIVE", "Ethernet");
        write("mlx5_0/ports/2/gid_attrs/ndevs/0", "eth2");
        iface("eth9", "10.0.0.9");
        iface("eth10", "10.0.0.10");
        iface("eth2", "10.0.0.2");

        LocalRdmaAddress found = find();

        assertEquals("10.0.0.2 (mlx5_0 port 2, interface eth2: the first of 3 IPv4 addresses of ACTIVE RDMA ports,"
                + " devices by name, then ports by number; the others: 10.0.0.10 on mlx5_0 port 10 (eth10), 10.0.0.9"
                + " on mlx5_1 port 1 (eth9))", found.description());
    }

    @Test
    void shouldReadTheAddressOfARealInterface() {
        // Soft-RoCE can serve loopback (rdma link add rxe_lo type rxe netdev lo); lo exists on every Linux host.
        port("rxe_lo", 1, "4: ACTIVE", "Ethernet");
        write("rxe_lo/ports/1/gid_attrs/ndevs/0", "lo");

        LocalRdmaAddress found = LocalRdmaAddress.find(infiniband(), LocalRdmaAddress::ipv4Addresses);

        assertEquals(ip("127.0.0.1"), found.address(), found.description());
        assertEquals("lo", found.interfaceName());
    }

    @Test
    void shouldUseLoopbackForTheSoftProvider() {
        LocalRdmaAddress soft = LocalRdmaAddress.of(RdmaProviders.byName("soft"));

        assertEquals(InetAddress.getLoopbackAddress(), soft.address());
        assertNull(soft.device());
        assertEquals("127.0.0.1 (loopback: the soft provider is software and serves every local address)",
                soft.description());
    }
}
