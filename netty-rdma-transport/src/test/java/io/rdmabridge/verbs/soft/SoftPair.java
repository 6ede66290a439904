package io.rdmabridge.verbs.soft;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.CmEvent;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.QpCapabilities;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.WorkCompletions;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;

/** Two connected queue pairs on the soft device (in-JVM direct or TCP), with helpers; closes everything. */
final class SoftPair implements AutoCloseable {
    static final long TIMEOUT_NANOS = 10_000_000_000L;

    final SoftProvider provider = new SoftProvider(SoftProvider.PrivateDataMode.DELIVER);
    final RdmaDevice device;
    final Side client;
    final Side server;
    final RdmaCmId listenId;
    private final RdmaEventChannel listenChannel;
    private final List<MemoryRegion> regions = new ArrayList<>();

    /** One end: its event channel, id, domain, queues. */
    static final class Side {
        final EventNotifier notifier = new EventNotifier();
        RdmaEventChannel channel;
        RdmaCmId id;
        ProtectionDomain pd;
        CompletionQueue sendCq;
        CompletionQueue recvCq;
        QueuePair qp;
        final WorkCompletions wc = new WorkCompletions(64);
    }

    static SoftPair direct() throws Exception {
        return new SoftPair(false, ConnectionParameters.DEFAULT, ConnectionParameters.DEFAULT);
    }

    static SoftPair tcp() throws Exception {
        return new SoftPair(true, ConnectionParameters.DEFAULT, ConnectionParameters.DEFAULT);
    }

    static SoftPair of(boolean tcp) throws Exception {
        return tcp ? tcp() : direct();
    }

    SoftPair(boolean tcp, ConnectionParameters clientParams, ConnectionParameters serverParams) throws Exception {
        String old = System.getProperty("rdmabridge.soft.loopback");
        System.setProperty("rdmabridge.soft.loopback", tcp ? "tcp" : "direct");
        try {
            device = provider.devices().get(0);
            client = new Side();
            server = new Side();
            listenChannel = provider.createEventChannel(server.notifier);
            listenId = listenChannel.createId();
            InetSocketAddress bound = listenId.listen(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 16);
            client.channel = provider.createEventChannel(client.notifier);
            client.id = client.channel.createId();
            client.id.resolve(bound, 5000);
            awaitEvent(client.channel, CmEventType.ADDR_RESOLVED);
            setUpQueues(client);
            client.id.connect(clientParams);
            CmEvent request = awaitEvent(listenChannel, CmEventType.CONNECT_REQUEST);
            server.channel = listenChannel;
            server.id = request.id();
            setUpQueues(server);
            server.id.accept(serverParams);
            awaitEvent(listenChannel, CmEventType.ESTABLISHED);
            awaitEvent(client.channel, CmEventType.ESTABLISHED);
        } finally {
            if (old == null) {
                System.clearProperty("rdmabridge.soft.loopback");
            } else {
                System.setProperty("rdmabridge.soft.loopback", old);
            }
        }
    }

    private void setUpQueues(Side side) throws Exception {
        side.pd = device.allocProtectionDomain();
        side.sendCq = device.createCompletionQueue(256, side.notifier);
        side.recvCq = device.createCompletionQueue(256, side.notifier);
        side.qp = side.id.createQueuePair(side.pd, side.sendCq, side.recvCq, new QpCapabilities(64, 64, 4, 4, 256));
    }

    static CmEvent awaitEvent(RdmaEventChannel channel, CmEventType type) {
        CmEvent e = new CmEvent();
        long deadline = System.nanoTime() + TIMEOUT_NANOS;
        while (System.nanoTime() < deadline) {
            if (channel.poll(e)) {
                if (e.type() == type) {
                    return e;
                }
                fail("expected " + type + " but got " + e);
            }
            Thread.onSpinWait();
            sleepMicros(100);
        }
        return fail("no " + type + " within 10 s");
    }

    static void sleepMicros(long micros) {
        java.util.concurrent.locks.LockSupport.parkNanos(micros * 1000);
    }

    /** Polls {@code cq} until one completion arrives; returns its index 0 in {@code wc}. */
    static WorkCompletions pollOne(CompletionQueue cq, WorkCompletions wc) {
        WorkCompletions one = new WorkCompletions(1);
        long deadline = System.nanoTime() + TIMEOUT_NANOS;
        while (System.nanoTime() < deadline) {
            if (cq.poll(one) == 1) {
                return one;
            }
            sleepMicros(50);
        }
        return fail("no completion within 10 s");
    }

    /** Asserts that nothing more arrives on {@code cq} for {@code millis}. */
    static void assertQuiet(CompletionQueue cq, long millis) {
        WorkCompletions wc = new WorkCompletions(8);
        long deadline = System.nanoTime() + millis * 1_000_000L;
        while (System.nanoTime() < deadline) {
            int n = cq.poll(wc);
            if (n > 0) {
                fail("unexpected completion " + wc.toString(0));
            }
            sleepMicros(500);
        }
    }

    static void assertCompletion(WorkCompletions wc, long wrId, int status, int opcode) {
        assertEquals(wrId, wc.wrId(0), wc.toString(0));
        assertEquals(io.rdmabridge.verbs.WcStatus.name(status), io.rdmabridge.verbs.WcStatus.name(wc.status(0)),
                wc.toString(0));
        if (status == io.rdmabridge.verbs.WcStatus.SUCCESS) {
            assertEquals(opcode, wc.opcode(0), wc.toString(0));
        }
    }

    /** A direct buffer with a registered region; closed with the pair. */
    Buffer buffer(Side side, int size, int access) throws Exception {
        ByteBuffer b = ByteBuffer.allocateDirect(size);
        MemoryRegion mr = side.pd.register(b, access);
        regions.add(mr);
        return new Buffer(b, mr);
    }

    Buffer buffer(Side side, int size) throws Exception {
        return buffer(side, size, Access.ALL);
    }

    record Buffer(ByteBuffer buf, MemoryRegion mr) {
        long address() {
            return mr.address();
        }

        void fill(int seed) {
            for (int i = 0; i < buf.capacity(); i++) {
                buf.put(i, (byte) (seed + i * 31));
            }
        }

        byte get(int i) {
            return DirectMemory.getByte(address() + i);
        }

        void assertFilled(int offset, int length, int seed, int seedOffset) {
            for (int i = 0; i < length; i++) {
                byte expected = (byte) (seed + (seedOffset + i) * 31);
                if (buf.get(offset + i) != expected) {
                    fail("byte " + (offset + i) + ": " + buf.get(offset + i) + " (expected: " + expected + ")");
                }
            }
        }
    }

    /** Closes {@code b}'s region with the pair. */
    Buffer track(Buffer b) {
        regions.add(b.mr());
        return b;
    }

    void deregister(MemoryRegion mr) {
        mr.close();
        regions.remove(mr);
    }

    @Override
    public void close() {
        for (Side s : new Side[] {client, server}) {
            if (s.id != null) {
                s.id.disconnect();
            }
        }
        for (Side s : new Side[] {client, server}) {
            if (s.qp != null) {
                s.qp.close();
            }
        }
        for (MemoryRegion mr : regions) {
            mr.close();
        }
        for (Side s : new Side[] {client, server}) {
            if (s.id != null) {
                s.id.close();
            }
            if (s.sendCq != null) {
                s.sendCq.close();
                s.recvCq.close();
            }
            if (s.pd != null) {
                s.pd.close();
            }
        }
        listenId.close();
        client.channel.close();
        listenChannel.close();
        client.notifier.close();
        server.notifier.close();
    }

    /** Waits (bounded) for the provider's counters to return to zero; links close asynchronously. */
    static void assertResourcesReleased(SoftProvider provider) {
        long deadline = System.nanoTime() + TIMEOUT_NANOS;
        while (!provider.resourceUsage().isZero() && System.nanoTime() < deadline) {
            sleepMicros(1000);
        }
        assertTrue(provider.resourceUsage().isZero(), provider.resourceUsage().toString());
    }
}
