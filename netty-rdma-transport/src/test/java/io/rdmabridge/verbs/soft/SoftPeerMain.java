package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.CmEvent;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.QpCapabilities;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RecvWorkRequest;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;

/**
 * A peer process for {@link SoftCrossProcessTest}: listens on an ephemeral port (printed as {@code PORT n}), accepts
 * one connection advertising a 1 MiB remote-accessible region in the accept's private data, posts 4 receives and
 * waits to be killed. With the argument {@code shared} the region is allocated through the domain (a shared file when
 * the same-host path is on).
 */
public final class SoftPeerMain {
    private SoftPeerMain() {
    }

    public static void main(String[] args) throws Exception {
        SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
        RdmaDevice device = provider.devices().get(0);
        EventNotifier notifier = new EventNotifier();
        RdmaEventChannel channel = provider.createEventChannel(notifier);
        RdmaCmId listen = channel.createId();
        InetSocketAddress bound = listen.listen(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 4);
        System.out.println("PORT " + bound.getPort());
        System.out.flush();
        CmEvent event = new CmEvent();
        while (!channel.poll(event)) {
            notifier.await(100_000_000L);
        }
        if (event.type() != CmEventType.CONNECT_REQUEST) {
            throw new IllegalStateException("unexpected " + event);
        }
        ProtectionDomain pd = device.allocProtectionDomain();
        CompletionQueue cq = device.createCompletionQueue(64, notifier);
        ByteBuffer memory = args.length > 0 && args[0].equals("shared") ? pd.allocateMemory(1 << 20)
                : ByteBuffer.allocateDirect(1 << 20);
        MemoryRegion mr = pd.register(memory, Access.ALL);
        RdmaCmId id = event.id();
        QueuePair qp = id.createQueuePair(pd, cq, cq, new QpCapabilities(16, 16, 1, 1, 0));
        RecvWorkRequest rwr = new RecvWorkRequest(1);
        for (int i = 0; i < 4; i++) {
            qp.postRecv(rwr.reset().wrId(i).addSge(mr.address() + i * 1024, 1024, mr.lkey()));
        }
        ByteBuffer data = ByteBuffer.allocate(12).putLong(mr.address()).putInt(mr.rkey());
        id.accept(ConnectionParameters.DEFAULT.withPrivateData(data.array()));
        Thread.sleep(60_000);
    }
}
