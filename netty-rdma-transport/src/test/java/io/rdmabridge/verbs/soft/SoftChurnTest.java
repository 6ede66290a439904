package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaEventChannel;
import org.junit.jupiter.api.Test;
import org.junitpioneer.jupiter.SetSystemProperty;

import java.lang.ref.WeakReference;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Connection churn and floods on the soft provider's TCP wire: a closed connection leaves nothing reachable (its
 * links, each with two direct buffers of ~256 KiB, were pinned by the handshake and connect timers until they fired:
 * about 2,000 sequential handshakes exhausted 512 MB), and silent sockets aimed at one listener neither block the
 * others nor flood the log. The handshake timeout is far longer than the tests, so whatever its timers pin stays pinned
 * while they run.
 */
@SetSystemProperty(key = "rdmabridge.soft.handshakeTimeoutMillis", value = "60000")
class SoftChurnTest {
    @Test
    void shouldLeaveNoClosedLinkReachable() throws Exception {
        List<WeakReference<SoftLink>> links = new ArrayList<>();
        for (int i = 0; i < 200; i++) {
            try (SoftPair pair = SoftPair.tcp()) {
                for (SoftLink link : SoftEngine.get().links) {
                    links.add(new WeakReference<>(link));
                }
            }
        }
        assertTrue(links.size() >= 200, "links seen: " + links.size());
        long deadline = System.nanoTime() + 10_000_000_000L;
        int alive;
        do {
            System.gc();
            Thread.sleep(50);
            alive = 0;
            for (WeakReference<SoftLink> ref : links) {
                if (ref.get() != null) {
                    alive++;
                }
            }
        } while (alive > 0 && System.nanoTime() < deadline);
        assertEquals(0, alive, alive + " of " + links.size() + " closed links are still reachable (and their buffers)");
    }

    @Test
    @SetSystemProperty(key = "rdmabridge.soft.loopback", value = "tcp")
    void shouldKeepServingOtherListenersWhileOneIsFloodedWithSilentSockets() throws Exception {
        SoftProvider provider = new SoftProvider();
        EventNotifier notifier = new EventNotifier();
        RdmaEventChannel channel = provider.createEventChannel(notifier);
        List<Socket> silent = new ArrayList<>();
        long emittedBefore = TcpLink.REFUSALS.emitted();
        long start = System.nanoTime();
        try {
            RdmaCmId flooded = channel.createId();
            InetSocketAddress floodedAddress = flooded.listen(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0),
                    16);
            // More than the JVM-wide cap of pending handshakes, all on one listener, none saying a word.
            for (int i = 0; i < TcpLink.MAX_PENDING_HANDSHAKES + 100; i++) {
                silent.add(new Socket(floodedAddress.getAddress(), floodedAddress.getPort()));
            }
            Thread.sleep(500);
            // Another listener of the same JVM still completes a connection over the wire.
            try (SoftPair pair = SoftPair.tcp()) {
                // SoftPair waits for ESTABLISHED on both sides and fails otherwise.
                assertTrue(pair.client.qp != null && pair.server.qp != null);
            }
            long lines = TcpLink.REFUSALS.emitted() - emittedBefore;
            // One line per 10 s at most (the flood's length depends on the machine), never one per socket.
            long allowed = 1 + (System.nanoTime() - start) / 10_000_000_000L;
            assertTrue(lines <= allowed, "refusal WARN lines: " + lines + " (expected: <= " + allowed
                    + ", one per 10 s)");
            assertTrue(TcpLink.REFUSALS.suppressed() > 0 || lines > 0, "no refusal was counted");
            flooded.close();
        } finally {
            for (Socket s : silent) {
                s.close();
            }
            channel.close();
        }
    }

}
