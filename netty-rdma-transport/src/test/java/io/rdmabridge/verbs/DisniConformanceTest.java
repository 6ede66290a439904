package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.rdmabridge.internal.LinuxEpoll;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The conformance suite on the DiSNI provider, with the peer on a thread of this JVM. It runs wherever a real RDMA
 * device and libdisni are usable and is skipped elsewhere, with the provider's reason. On a machine with a device:
 * <pre>
 * mvn -o -Pdisni -pl netty-rdma-transport test -Dtest=DisniConformanceTest \
 *     -Drdmabridge.test.address=&lt;IP of an RDMA interface, e.g. 192.168.1.10&gt; \
 *     -Ddisni.library.path=&lt;directory of libdisni.so, default /usr/local/lib&gt;
 * </pre>
 * (The {@code disni} profile's argLine opens {@code sun.nio.ch}, which DiSNI and the provider's completion event thread
 * need, and points {@code java.library.path} at libdisni.) On Soft-RoCE the address is that of the rxe device's
 * interface. The private-data cases are skipped, with the reason, because DiSNI 2.1 delivers none; {@code
 * shouldDeliverNoPrivateDataWhereNoneIsDeclared} runs instead.
 */
// The rxe stage selects the device tag (rxe/steps).
@Tag("device")
class DisniConformanceTest extends AbstractProviderConformanceTest {

    @Override
    protected RdmaProvider newProvider() {
        RdmaProvider provider = RdmaProviders.byName("disni");
        // Skipped, not failed, where there is no DiSNI provider, device or libdisni: the reason is printed.
        assumeTrue(provider != null, "DiSNI unavailable: no provider named 'disni' on the class path");
        assumeTrue(provider.isAvailable(), () -> "DiSNI unavailable: " + provider.unavailabilityCause());
        return provider;
    }

    @Override
    protected ConformancePeer newPeer() {
        return new InJvmConformancePeer(provider);
    }

    /**
     * The peer shares this JVM, so it dies the way the kernel buries a dead process's connection: its queue pair and
     * id are destroyed without a disconnect (the release of the uverbs and rdma_cm files does exactly that), and
     * rdma_cm tells this end with a DREQ.
     */
    @Override
    protected void killPeerAbruptly(LocalEnd.Connection c) throws Exception {
        peer.destroy(c.peerIndex);
    }

    /**
     * Every completion queue of the provider waits for its events on one thread, however many there are (a peer
     * decides how many connections, and so queues, a server has): the suite's other cases show that each queue's
     * events still wake its own notifier, on this JVM's thread and on the peer's queues, which share it.
     */
    @Test
    void shouldWaitForTheEventsOfEveryCompletionQueueOnOneThread() throws Exception {
        assumeTrue(LinuxEpoll.unavailabilityCause() == null, "sun.nio.ch is not opened to this JVM's class path (the"
                + " disni profile opens it): each queue has a thread of its own here");
        RdmaDevice device = local.defaultDevice();
        long before = provider.resourceUsage().completionQueues();
        List<CompletionQueue> queues = new ArrayList<>();
        for (int i = 0; i < 32; i++) {
            queues.add(local.newCq(device, 16));
        }
        // One; for a moment two where the thread of an earlier case, idle for its linger, is still ending.
        long settle = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
        while (eventThreads() != 1 && System.nanoTime() - settle < 0) {
            Thread.sleep(5);
        }
        assertEquals(1, eventThreads(), "threads waiting for the events of 32 completion queues");
        for (CompletionQueue cq : queues) {
            cq.close();
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        while (provider.resourceUsage().completionQueues() != before && System.nanoTime() - deadline < 0) {
            Thread.sleep(5);
        }
        assertEquals(before, provider.resourceUsage().completionQueues(),
                () -> "closed completion queues still counted: " + provider.resourceUsage());
    }

    private static long eventThreads() {
        return Thread.getAllStackTraces().keySet().stream()
                .filter(t -> t.isAlive() && t.getName().startsWith("disni-cq-events")).count();
    }
}
