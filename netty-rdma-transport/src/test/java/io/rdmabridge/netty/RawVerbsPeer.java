package io.rdmabridge.netty;

import io.netty.channel.Channel;
import io.rdmabridge.connection.FrameHeader;
import io.rdmabridge.connection.Handshake;
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
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RecvWorkRequest;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WorkCompletions;
import io.rdmabridge.verbs.WrOpcode;

import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/**
 * A peer that speaks raw verbs instead of the rdma-bridge protocol, to drive a channel with frames a well-behaved
 * endpoint never sends. It connects (as a client) or accepts (as a listener), posts receives as the protocol asks,
 * and then sends exactly the frames a test writes, and RDMA READs whatever a test names (as a peer that hunts for
 * other connections' memory would). Single-threaded; closes everything it made.
 */
final class RawVerbsPeer implements AutoCloseable {
    /** 10 s on the host, stretched on a slow machine ({@link DeviceUnderTest#scaled}). */
    private static final long TIMEOUT_NANOS = DeviceUnderTest.scaled(Duration.ofSeconds(10)).toNanos();
    private static final String WITHIN = " within " + TimeUnit.NANOSECONDS.toSeconds(TIMEOUT_NANOS) + " s";
    private static final int SLOT = 4096;
    private static final int RECEIVES = 8;

    private final EventNotifier notifier = new EventNotifier();
    private final RdmaEventChannel events;
    private final CmEvent event = new CmEvent();
    private RdmaCmId listenId;
    private RdmaCmId id;
    private ProtectionDomain pd;
    private CompletionQueue cq;
    private QueuePair qp;
    private ByteBuffer memory;
    private MemoryRegion mr;
    private int connectRequestPrivateData = -1;
    private final java.util.List<MemoryRegion> exposed = new java.util.ArrayList<>();
    // Keeps exposed memory reachable (alive) while its region is registered.
    private final java.util.List<ByteBuffer> regionBuffers = new java.util.ArrayList<>();
    // Receives completed while waiting for a send completion: slot, or -1 - status for a failed receive.
    private final java.util.ArrayDeque<Long> landed = new java.util.ArrayDeque<>();

    private RawVerbsPeer(RdmaProvider provider) throws Exception {
        events = provider.createEventChannel(notifier);
    }

    /** Connects to {@code target}: the connection is established when this returns. */
    static RawVerbsPeer connect(RdmaProvider provider, InetSocketAddress target) throws Exception {
        return open(provider, peer -> peer.establish(target));
    }

    /** Connects to the channel listener {@code server}: the connection is established when this returns. */
    static RawVerbsPeer connect(RdmaProvider provider, Channel server) throws Exception {
        return connect(provider, (InetSocketAddress) server.localAddress());
    }

    /**
     * Connects to the channel listener {@code server} and sends a HELLO that announces {@code handshake}, whose SEND
     * must succeed: the server's child becomes active once it has read it.
     */
    static RawVerbsPeer connectWithHello(RdmaProvider provider, Channel server, Handshake handshake)
            throws Exception {
        return open(provider, peer -> {
            peer.establish((InetSocketAddress) server.localAddress());
            assertEquals(WcStatus.SUCCESS, peer.sendFrame(FrameHeader.HELLO, handshake.encode()));
        });
    }

    /** Connects to {@code target} and waits until the connection is established. */
    private void establish(InetSocketAddress target) throws Exception {
        prepareConnect(target);
        id.connect(ConnectionParameters.DEFAULT);
        await(CmEventType.ESTABLISHED);
    }

    /** A new peer that {@code setUp} prepares; closed again if that fails. */
    private static RawVerbsPeer open(RdmaProvider provider, SetUp setUp) throws Exception {
        RawVerbsPeer peer = new RawVerbsPeer(provider);
        try {
            setUp.run(peer);
            return peer;
        } catch (Exception | Error e) {
            peer.close();
            throw e;
        }
    }

    private interface SetUp {
        void run(RawVerbsPeer peer) throws Exception;
    }

    /** Resolves {@code target} and sets up the queue pair and its receives, ready to connect. */
    private void prepareConnect(InetSocketAddress target) throws Exception {
        id = events.createId();
        id.resolve(target, 5000);
        await(CmEventType.ADDR_RESOLVED);
        setUpQueuePair(id);
    }

    /**
     * Connects to {@code target}, running {@code beforeConnect} once this side's queue pair and receives are set up;
     * the outcome (ESTABLISHED, REJECTED, ...) is {@link #outcome()}. Close the peer either way.
     */
    static RawVerbsPeer attempt(RdmaProvider provider, InetSocketAddress target, Runnable beforeConnect)
            throws Exception {
        return open(provider, peer -> {
            peer.prepareConnect(target);
            beforeConnect.run();
            peer.id.connect(ConnectionParameters.DEFAULT);
            long deadline = System.nanoTime() + TIMEOUT_NANOS;
            while (!peer.events.poll(peer.event)) {
                if (System.nanoTime() > deadline) {
                    fail("no connection-manager event" + WITHIN);
                }
                LockSupport.parkNanos(100_000);
            }
        });
    }

    /** The last connection-manager event, e.g. how {@link #attempt} ended. */
    CmEventType outcome() {
        return event.type();
    }

    /** Listens on {@code address} (port 0: any); {@link #acceptOne()} takes the first connect request. */
    static RawVerbsPeer listen(RdmaProvider provider, InetSocketAddress address) throws Exception {
        return open(provider, peer -> {
            peer.listenId = peer.events.createId();
            peer.listenId.listen(address, 4);
        });
    }

    InetSocketAddress listenAddress() {
        return listenId.localAddress();
    }

    /** Accepts the first connect request; returns once the connection is established. */
    void acceptOne() throws Exception {
        CmEvent request = await(CmEventType.CONNECT_REQUEST);
        connectRequestPrivateData = request.privateData().length;
        id = request.id();
        setUpQueuePair(id);
        id.accept(ConnectionParameters.DEFAULT);
        await(CmEventType.ESTABLISHED);
    }

    private void setUpQueuePair(RdmaCmId cmId) throws Exception {
        pd = cmId.device().allocProtectionDomain();
        cq = cmId.device().createCompletionQueue(64, notifier);
        qp = cmId.createQueuePair(pd, cq, cq, new QpCapabilities(16, RECEIVES, 1, 1, 0));
        // Slot 0 sends, slots 1..RECEIVES receive, the last one is the target of READs.
        memory = ByteBuffer.allocateDirect(SLOT * (RECEIVES + 2)).order(ByteOrder.LITTLE_ENDIAN);
        mr = pd.register(memory, Access.LOCAL_WRITE);
        postReceives();
    }

    /**
     * Sends one frame: a protocol header of {@code type} with no credit returns, then {@code body}.
     *
     * @return the completion status of the SEND
     */
    int sendFrame(byte type, byte[] body) {
        memory.clear();
        new FrameHeader().wrap(memory, 0).set(type, 0, 0, 0, body.length);
        return post(body);
    }

    /** Sends one frame whose header returns {@code data} and {@code control} credits and acknowledges {@code acks}. */
    int sendFrame(byte type, int data, int control, int acks, byte[] body) {
        memory.clear();
        new FrameHeader().wrap(memory, 0).set(type, control, data, acks, body.length);
        return post(body);
    }

    /** Sends a RENDEZVOUS frame advertising {@code length} bytes at {@code address} under {@code rkey}. */
    int sendRendezvous(long address, int length, int rkey) {
        memory.clear();
        new FrameHeader().wrap(memory, 0).set(FrameHeader.RENDEZVOUS, 0, 0, 0, FrameHeader.RENDEZVOUS_BODY_LENGTH)
                .rendezvous(address, length, rkey);
        byte[] body = new byte[FrameHeader.RENDEZVOUS_BODY_LENGTH];
        memory.get(FrameHeader.HEADER_LENGTH, body);
        return post(body);
    }

    /** Sends a CREDIT frame returning {@code data} and {@code control} credits and acknowledging {@code acks}. */
    int sendCredits(int data, int control, int acks) {
        memory.clear();
        new FrameHeader().wrap(memory, 0).set(FrameHeader.CREDIT, control, data, acks, 0);
        return post(new byte[0]);
    }

    /**
     * Posts an RDMA WRITE of no bytes with immediate {@code immediate}: it needs no rkey and takes one of the peer's
     * receives.
     *
     * @return the completion status
     */
    int writeWithImmediate(int immediate) {
        return complete(new SendWorkRequest(1).reset().opcode(WrOpcode.RDMA_WRITE_WITH_IMM)
                .flags(SendWorkRequest.SIGNALED).wrId(0).immData(immediate));
    }

    /**
     * RDMA READs {@code length} bytes (at most 4096) at {@code address} of the peer under {@code rkey}.
     *
     * @return the completion status; the bytes are {@link #readBytes(int)}
     */
    int read(long address, int length, int rkey) {
        int target = SLOT * (RECEIVES + 1);
        for (int i = 0; i < SLOT; i++) {
            memory.put(target + i, (byte) 0);
        }
        return complete(new SendWorkRequest(1).reset().opcode(WrOpcode.RDMA_READ).flags(SendWorkRequest.SIGNALED)
                .wrId(0).addSge(mr.address() + target, length, mr.lkey()).remote(address, rkey));
    }

    /** The first {@code length} bytes of the last {@link #read} target (zeros where nothing landed). */
    byte[] readBytes(int length) {
        byte[] b = new byte[length];
        memory.get(SLOT * (RECEIVES + 1), b);
        return b;
    }

    private int post(byte[] body) {
        memory.put(FrameHeader.HEADER_LENGTH, body);
        return complete(new SendWorkRequest(1).reset().opcode(WrOpcode.SEND).flags(SendWorkRequest.SIGNALED)
                .wrId(0).addSge(mr.address(), FrameHeader.HEADER_LENGTH + body.length, mr.lkey()));
    }

    private int complete(SendWorkRequest wr) {
        try {
            qp.postSend(wr);
        } catch (Exception e) {
            return fail("posting the raw work request failed", e);
        }
        WorkCompletions wc = new WorkCompletions(8);
        long deadline = System.nanoTime() + TIMEOUT_NANOS;
        while (System.nanoTime() < deadline) {
            int n = cq.poll(wc);
            int status = -1;
            for (int i = 0; i < n; i++) {
                if (wc.wrId(i) == 0) {
                    status = wc.status(i);
                } else {
                    // Receives polled in the same batch, before or after this completion, are kept in order for
                    // receivedFrame(): dropping those after it lost the peer's first frame whenever they shared a poll.
                    landed.add(wc.status(i) == WcStatus.SUCCESS ? wc.wrId(i) : -1L - wc.status(i));
                }
            }
            if (status >= 0) {
                return status;
            }
            LockSupport.parkNanos(100_000);
        }
        return fail("no completion for the raw work request" + WITHIN);
    }

    /** Registers {@code contents} (copied into direct memory) for remote READ; its region goes with {@link #close()}. */
    MemoryRegion exposeForRead(byte[] contents) throws Exception {
        ByteBuffer buffer = ByteBuffer.allocateDirect(contents.length);
        buffer.put(contents).flip();
        MemoryRegion region = pd.register(buffer, Access.REMOTE_READ);
        exposed.add(region);
        regionBuffers.add(buffer);
        return region;
    }

    /** Bytes of private data the accepted connect request carried. */
    int lastEventPrivateDataLength() {
        return connectRequestPrivateData;
    }

    /**
     * Posts a receive on every receive slot. After set-up, call it only once a frame has landed in each of them
     * (read with {@link #receivedFrame()}); the peer's SENDs that find no receive meanwhile wait for their RNR timer.
     */
    void postReceives() throws Exception {
        RecvWorkRequest recv = new RecvWorkRequest(1);
        for (int i = 1; i <= RECEIVES; i++) {
            qp.postRecv(recv.reset().wrId(i).addSge(mr.address() + (long) i * SLOT, SLOT, mr.lkey()));
        }
    }

    /** Waits for the next received frame and returns its type. */
    byte receivedFrameType() {
        return receivedFrame().type();
    }

    /** Waits for the next received frame and returns its header (and body), valid until the next frame is read. */
    FrameHeader receivedFrame() {
        WorkCompletions wc = new WorkCompletions(1);
        long deadline = System.nanoTime() + TIMEOUT_NANOS;
        while (System.nanoTime() < deadline) {
            Long early = landed.poll();
            if (early != null || cq.poll(wc) == 1) {
                long slot = early != null ? early : wc.status(0) == WcStatus.SUCCESS ? wc.wrId(0) : -1L - wc.status(0);
                assertTrue(slot > 0, () -> "receive failed: " + WcStatus.name((int) (-1L - slot)));
                return new FrameHeader().wrap(memory, (int) slot * SLOT);
            }
            LockSupport.parkNanos(100_000);
        }
        return fail("no frame received" + WITHIN);
    }

    /** Waits for the next connection-manager event, which must be {@code type}. */
    CmEvent await(CmEventType type) {
        long deadline = System.nanoTime() + TIMEOUT_NANOS;
        while (System.nanoTime() < deadline) {
            if (events.poll(event)) {
                assertEquals(type, event.type(), "connection-manager event: " + event);
                return event;
            }
            LockSupport.parkNanos(100_000);
        }
        return fail("no " + type + WITHIN);
    }

    @Override
    public void close() {
        if (id != null) {
            id.disconnect();
        }
        if (qp != null) {
            qp.close();
        }
        if (mr != null) {
            mr.close();
        }
        exposed.forEach(MemoryRegion::close);
        if (cq != null) {
            cq.close();
        }
        if (pd != null) {
            pd.close();
        }
        if (id != null) {
            id.close();
        }
        if (listenId != null) {
            listenId.close();
        }
        events.close();
    }
}
