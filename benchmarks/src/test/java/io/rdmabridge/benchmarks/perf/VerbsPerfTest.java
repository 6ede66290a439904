package io.rdmabridge.benchmarks.perf;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RdmaProviders;
import java.net.InetSocketAddress;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The control protocol of the verbs patterns around the server's stall timeout, on the soft provider. */
@Timeout(60)
class VerbsPerfTest {
    private static final RdmaProvider SOFT = RdmaProviders.byName("soft");
    /**
     * The server gives up on a client after this long without a completion it is owed: short, so that the phases
     * below outlast it, yet long enough for a loaded machine to schedule the client between two control messages.
     */
    private static final long STALL_NANOS = TimeUnit.SECONDS.toNanos(1);

    private final AtomicReference<Throwable> serverFailure = new AtomicReference<>();
    private Thread serverThread;

    @AfterEach
    void resourcesReturnToZero() throws InterruptedException {
        if (serverThread != null) {
            serverThread.join(10_000);
        }
        assertTrue(SOFT.resourceUsage().isZero(), SOFT.resourceUsage()::toString);
    }

    /** Serves {@code clients} connections on a thread; returns the address it listens on. */
    private InetSocketAddress startServer(int clients) throws Exception {
        CompletableFuture<InetSocketAddress> bound = new CompletableFuture<>();
        VerbsPerf.Settings settings = new VerbsPerf.Settings(4096, 16, 16, 4, STALL_NANOS);
        serverThread = new Thread(() -> {
            try {
                VerbsPerf.serve(SOFT, new InetSocketAddress("127.0.0.1", 0), settings, clients, bound::complete);
            } catch (Throwable t) {
                serverFailure.set(t);
                bound.completeExceptionally(t);
            }
        }, "verbs-perf-test-server");
        serverThread.setDaemon(true);
        serverThread.start();
        return bound.get(10, TimeUnit.SECONDS);
    }

    private static VerbsPerf.Endpoint connect(InetSocketAddress server) throws Exception {
        return VerbsPerf.Endpoint.connect(SOFT, server, new VerbsPerf.Settings(4096, 16, 16, 4));
    }

    @Test
    void shouldKeepAClientWhoseOneSidedPhaseOutlastsTheStallTimeout() throws Exception {
        InetSocketAddress server = startServer(1);
        long peerCpu;
        try (VerbsPerf.Endpoint client = connect(server)) {
            client.begin(PerfTest.WRITE_BW, 64, 1);
            // RDMA WRITEs complete only at the writer: on a slow device the server sees no completion for this long.
            Thread.sleep(3 * TimeUnit.NANOSECONDS.toMillis(STALL_NANOS));
            peerCpu = client.end();
            client.sendControl(VerbsPerf.QUIT, 0, 0, 0);
        }
        serverThread.join(10_000);

        assertNull(serverFailure.get(), () -> "server failed: " + serverFailure.get());
        assertFalse(serverThread.isAlive());
        assertTrue(peerCpu >= 0, "server CPU nanoseconds: " + peerCpu);
    }

    @Test
    void shouldDropAClientThatDisconnectsDuringAOneSidedPhase() throws Exception {
        InetSocketAddress server = startServer(1);
        try (VerbsPerf.Endpoint client = connect(server)) {
            client.begin(PerfTest.READ_BW, 64, 1);
        }
        serverThread.join(10_000);

        assertFalse(serverThread.isAlive(), "the server still waits for a client that disconnected");
        assertNotNull(serverFailure.get());
    }

    @Test
    void shouldServeAClientThatConnectedDuringAnotherOnesOneSidedPhase() throws Exception {
        InetSocketAddress server = startServer(2);
        CompletableFuture<PerfResult> second = new CompletableFuture<>();
        try (VerbsPerf.Endpoint first = connect(server)) {
            first.begin(PerfTest.WRITE_BW, 64, 1);
            Thread secondClient = new Thread(() -> {
                // Connected once the first client is done; then at once a measurement, as rdma-perf does.
                try (VerbsPerf.Endpoint client = connect(server)) {
                    second.complete(client.measure(PerfTest.SEND_LAT, 64, 10, "verbs/soft"));
                    client.sendControl(VerbsPerf.QUIT, 0, 0, 0);
                } catch (Throwable t) {
                    second.completeExceptionally(t);
                }
            }, "verbs-perf-test-second-client");
            secondClient.setDaemon(true);
            secondClient.start();
            // The second request arrives while the server waits out the first client's phase; it must not wait
            // longer than its connect timeout (5 s).
            Thread.sleep(3 * TimeUnit.NANOSECONDS.toMillis(STALL_NANOS) / 2);
            first.end();
            first.sendControl(VerbsPerf.QUIT, 0, 0, 0);
        }
        PerfResult row = second.get(20, TimeUnit.SECONDS);
        serverThread.join(10_000);

        assertEquals(10, row.iterations());
        assertNull(serverFailure.get(), () -> "server failed: " + serverFailure.get());
        assertFalse(serverThread.isAlive());
    }
}
