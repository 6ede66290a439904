package io.rdmabridge.grpc;

import io.grpc.testing.integration.RdmaBridgeInteropCases;
import io.netty.buffer.ByteBufAllocator;
import io.netty.channel.EventLoopGroup;
import io.rdmabridge.verbs.RdmaProviders;
import io.rdmabridge.verbs.ResourceUsage;
import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

import static io.rdmabridge.grpc.InteropSuite.assertNoRegression;
import static io.rdmabridge.grpc.InteropSuite.report;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * gRPC's interop suite across processes on the provider and address under test: {@code rdmabridge.provider} (the soft
 * provider by default) at {@code rdmabridge.test.address}. The rxe stage runs it with {@code -Pdisni,rxe}: DiSNI on
 * the guest's Soft-RoCE device, client here and server in a child JVM, both on 10.77.0.1, so gRPC runs on the kernel's
 * verbs. Sized for a machine ten times slower than the host ({@link GrpcInteropTest} is the thorough version on the
 * soft provider): the whole suite once per transport, NIO the control, then {@code unimplementedService}, once
 * intermittent across processes, {@value #REPEATS} times more. A case that passes on NIO and fails on RDMA fails the
 * test; Netty's leak detector (paranoid) must stay quiet and the provider's resources must return to zero.
 */
class GrpcDeviceInteropTest {
    static final int REPEATS = 20;

    @Test
    void theInteropSuitePassesOnRdmaWhereverItPassesOnNioOnTheProviderUnderTest() {
        long slowdown = Long.getLong("rdmabridge.test.slowdown", 1);
        String provider = System.getProperty("rdmabridge.provider", "soft");
        assertTimeoutPreemptively(Duration.ofSeconds(240 * slowdown), () -> {
            Map<Transport, List<InteropSuite.Run>> runs = new TreeMap<>();
            for (Transport transport : new Transport[] {Transport.NIO, Transport.RDMA}) {
                EventLoopGroup group = transport.newGroup(2);
                try (ChildJvm server = new ChildJvm(InteropServerMain.class, transport.name())) {
                    RdmaBridgeInteropCases.Target target =
                            new RdmaBridgeInteropCases.Target(new GrpcSetup(transport, false, group), server.port);
                    String name = transport + " on " + provider + " at " + GrpcSetup.address();
                    List<InteropSuite.Run> list = new ArrayList<>();
                    list.add(report(InteropSuite.runAll(name, target)));
                    list.add(report(InteropSuite.repeatCases(name + ", unimplementedService", target,
                            List.of("unimplementedService"), REPEATS)));
                    runs.put(transport, list);
                } finally {
                    group.shutdownGracefully(0, 5, TimeUnit.SECONDS).sync();
                }
            }
            assertNoRegression(runs.get(Transport.NIO), runs.get(Transport.RDMA));
        }, "the suite on both transports (" + 240 * slowdown + " s at most, rdmabridge.test.slowdown " + slowdown
                + ")");
        assertNothingLeftOn(provider, Duration.ofSeconds(10 * slowdown));
    }

    /**
     * Waits for the provider's resources to return to zero (queue pairs close after the groups' shutdown), collecting
     * garbage and tracking a buffer meanwhile (leaks reach the detector only then), and asserts both.
     */
    private static void assertNothingLeftOn(String provider, Duration patience) {
        long deadline = System.nanoTime() + patience.toNanos();
        ResourceUsage usage = RdmaProviders.byName(provider).resourceUsage();
        while (!usage.isZero() && System.nanoTime() - deadline < 0) {
            System.gc();
            ByteBufAllocator.DEFAULT.directBuffer(1).release();
            try {
                Thread.sleep(50);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                break;
            }
            usage = RdmaProviders.byName(provider).resourceUsage();
        }
        assertTrue(usage.isZero(), "still held on " + provider + " " + patience.toSeconds() + " s after the groups "
                + "shut down: " + usage);
        assertEquals(0, CountingLeakDetector.LEAKS.get(), "leaks Netty's detector reported (see the test output)");
    }
}
