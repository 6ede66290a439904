package io.rdmabridge.verbs.soft;

import static io.rdmabridge.verbs.soft.SoftPair.assertCompletion;
import static io.rdmabridge.verbs.soft.SoftPair.awaitEvent;
import static io.rdmabridge.verbs.soft.SoftPair.pollOne;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.CmEvent;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.QpCapabilities;
import io.rdmabridge.verbs.QpState;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RecvWorkRequest;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WcOpcode;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WrOpcode;
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;

/** Queue pairs in two processes: one-sided WRITE/READ into the other JVM's memory, then that JVM is killed. */
class SoftCrossProcessTest {
    private final SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);

    @Test
    void shouldMoveBytesAcrossProcessesAndFlushWhenThePeerDies() throws Exception {
        String java = System.getProperty("java.home") + File.separator + "bin" + File.separator + "java";
        Process child = new ProcessBuilder(java, "-Xmx64m", "-cp", System.getProperty("java.class.path"),
                SoftPeerMain.class.getName()).redirectErrorStream(true).start();
        try {
            BufferedReader out = new BufferedReader(new InputStreamReader(child.getInputStream(),
                    StandardCharsets.UTF_8));
            String line;
            int port = -1;
            while ((line = out.readLine()) != null) {
                if (line.startsWith("PORT ")) {
                    port = Integer.parseInt(line.substring(5).trim());
                    break;
                }
            }
            assertTrue(port > 0, "the peer process printed no port");
            connectWriteReadAndKill(provider, port, child);
        } finally {
            child.destroyForcibly();
            child.waitFor();
        }
        SoftPair.assertResourcesReleased(provider);
    }

    /**
     * Connects to the peer process on {@code port}, WRITEs 1 MiB into its region and READs it back, SENDs, then kills
     * it and checks the flush.
     */
    static void connectWriteReadAndKill(SoftProvider provider, int port, Process child) throws Exception {
        RdmaDevice device = provider.devices().get(0);
        EventNotifier notifier = new EventNotifier();
        try (RdmaEventChannel channel = provider.createEventChannel(notifier)) {
            RdmaCmId id = channel.createId();
            id.resolve(new InetSocketAddress(InetAddress.getLoopbackAddress(), port), 5000);
            awaitEvent(channel, CmEventType.ADDR_RESOLVED);
            ProtectionDomain pd = device.allocProtectionDomain();
            CompletionQueue cq = device.createCompletionQueue(64, notifier);
            QueuePair qp = id.createQueuePair(pd, cq, cq, new QpCapabilities(16, 16, 1, 1, 0));
            ByteBuffer local = ByteBuffer.allocateDirect(1 << 20);
            MemoryRegion mr = pd.register(local, Access.ALL);
            RecvWorkRequest rwr = new RecvWorkRequest(1);
            for (int i = 0; i < 3; i++) {
                qp.postRecv(rwr.reset().wrId(100 + i).addSge(mr.address(), 1024, mr.lkey()));
            }
            id.connect(ConnectionParameters.DEFAULT);
            CmEvent established = awaitEvent(channel, CmEventType.ESTABLISHED);
            ByteBuffer advert = ByteBuffer.wrap(established.privateData());
            long remoteAddress = advert.getLong();
            int rkey = advert.getInt();
            for (int i = 0; i < local.capacity(); i++) {
                local.put(i, (byte) (i * 7 + 1));
            }
            SendWorkRequest swr = new SendWorkRequest(1);
            qp.postSend(swr.reset().wrId(1).opcode(WrOpcode.RDMA_WRITE).flags(SendWorkRequest.SIGNALED)
                    .remote(remoteAddress, rkey).addSge(mr.address(), 1 << 20, mr.lkey()));
            assertCompletion(pollOne(cq, null), 1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE);
            for (int i = 0; i < local.capacity(); i++) {
                local.put(i, (byte) 0);
            }
            qp.postSend(swr.reset().wrId(2).opcode(WrOpcode.RDMA_READ).flags(SendWorkRequest.SIGNALED)
                    .remote(remoteAddress, rkey).addSge(mr.address(), 1 << 20, mr.lkey()));
            assertCompletion(pollOne(cq, null), 2, WcStatus.SUCCESS, WcOpcode.RDMA_READ);
            for (int i = 0; i < local.capacity(); i++) {
                assertEquals((byte) (i * 7 + 1), local.get(i), "byte " + i + " read back from the other process");
            }
            qp.postSend(swr.reset().wrId(3).flags(SendWorkRequest.SIGNALED).addSge(mr.address(), 100, mr.lkey()));
            assertCompletion(pollOne(cq, null), 3, WcStatus.SUCCESS, WcOpcode.SEND);

            long start = System.nanoTime();
            child.destroyForcibly();
            awaitEvent(channel, CmEventType.DISCONNECTED);
            for (int i = 0; i < 3; i++) {
                assertCompletion(pollOne(cq, null), 100 + i, WcStatus.WR_FLUSH_ERR, 0);
            }
            long millis = (System.nanoTime() - start) / 1_000_000;
            assertTrue(millis < 1000, "peer death noticed and flushed after " + millis + " ms");
            assertEquals(QpState.ERROR, qp.state());
            qp.close();
            mr.close();
            id.close();
            cq.close();
            pd.close();
        }
    }
}
