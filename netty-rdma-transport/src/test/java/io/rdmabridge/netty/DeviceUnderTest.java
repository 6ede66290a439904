package io.rdmabridge.netty;

import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RdmaProviders;

import java.net.InetAddress;
import java.net.UnknownHostException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * What the channel tests that can run on a real RDMA stack run on, from system properties the POM sets: the provider
 * ({@code rdmabridge.provider}, default {@code soft}), the address to listen and connect on
 * ({@code rdmabridge.test.address}, default 127.0.0.1: a real device serves only its own interface's address, e.g.
 * 10.77.0.1 in the rxe guest), the options of the JVMs a test starts ({@code rdmabridge.test.childJvmOptions}: the
 * disni profile's library path and module export) and a factor for time limits ({@code rdmabridge.test.slowdown},
 * 10 in the rxe guest).
 */
public final class DeviceUnderTest {
    private DeviceUnderTest() {
    }

    public static String providerName() {
        return System.getProperty("rdmabridge.provider", "soft");
    }

    public static RdmaProvider provider() {
        return RdmaProviders.byName(providerName());
    }

    public static InetAddress address() {
        String address = System.getProperty("rdmabridge.test.address", "127.0.0.1");
        try {
            return InetAddress.getByName(address);
        } catch (UnknownHostException e) {
            throw new IllegalArgumentException("rdmabridge.test.address: " + address
                    + " (expected: the IP address of an RDMA interface, or 127.0.0.1 for the soft provider)", e);
        }
    }

    /** The options every JVM a test starts needs to reach the same device as this one. */
    public static List<String> childJvmOptions() {
        List<String> options = new ArrayList<>();
        for (String option : System.getProperty("rdmabridge.test.childJvmOptions", "").trim().split("\\s+")) {
            if (!option.isEmpty()) {
                options.add(option);
            }
        }
        options.add("-Drdmabridge.provider=" + providerName());
        options.add("-Drdmabridge.test.address=" + address().getHostAddress());
        return options;
    }

    /** {@code onTheHost} times the slowdown factor: a time limit sized for the host, stretched for a slow machine. */
    public static Duration scaled(Duration onTheHost) {
        String factor = System.getProperty("rdmabridge.test.slowdown", "1");
        try {
            int slowdown = Integer.parseInt(factor.trim());
            if (slowdown < 1) {
                throw new NumberFormatException();
            }
            return onTheHost.multipliedBy(slowdown);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("rdmabridge.test.slowdown: " + factor + " (expected: an integer >= 1)");
        }
    }
}
