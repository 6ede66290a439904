package io.rdmabridge.tools;

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
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RecvWorkRequest;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WorkCompletions;
import io.rdmabridge.verbs.WrOpcode;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.concurrent.TimeUnit;

/**
 * A SEND/RECV ping-pong between two queue pairs of one process, over the verbs SPI alone: the server side runs on
 * its own thread, the client measures round trips. It exercises the whole stack a user depends on (CM handshake,
 * registration, receives, sends, completions, teardown), so a node that passes it is ready for the transports above.
 * Single-use; not thread-safe.
 */
final class PingPong implements AutoCloseable {
    private static final long TIMEOUT_NANOS = TimeUnit.SECONDS.toNanos(10);
    private static final long SEND_WR_ID = 1;
    private static final long RECV_WR_ID = 2;

    private final RdmaProvider provider;
    private final InetSocketAddress bindAddress;
    private final int messageSize;

    PingPong(RdmaProvider provider, InetSocketAddress bindAddress, int messageSize) {
        if (messageSize <= 0) {
            throw new IllegalArgumentException("messageSize: " + messageSize + " (expected: > 0)");
        }
        this.provider = provider;
        this.bindAddress = bindAddress;
        this.messageSize = messageSize;
    }

    /**
     * Runs {@code warmup + iterations} round trips and returns the round-trip times of the measured ones, in
     * nanoseconds, sorted.
     */
    long[] run(int warmup, int iterations) throws Exception {
        EventNotifier serverNotifier = new EventNotifier();
        Endpoint server = new Endpoint(serverNotifier);
        RdmaCmId listener = server.channel.createId();
        InetSocketAddress bound = listener.listen(bindAddress, 16);
        int total = warmup + iterations;
        Throwable[] serverFailure = new Throwable[1];
        Thread serverThread = new Thread(() -> {
            try {
                RdmaCmId id = server.await(CmEventType.CONNECT_REQUEST).id();
                server.setUp(id);
                id.accept(ConnectionParameters.DEFAULT);
                server.await(CmEventType.ESTABLISHED);
                for (int i = 1; i <= total; i++) {
                    server.awaitTotals(i - 1, i);
                    server.send();
                }
                server.awaitTotals(total, total);
            } catch (Throwable t) {
                serverFailure[0] = t;
            }
        }, "rdma-doctor-pong");
        serverThread.setDaemon(true);
        serverThread.start();

        Endpoint client = new Endpoint(new EventNotifier());
        long[] rtt = new long[iterations];
        try {
            RdmaCmId id = client.channel.createId();
            id.resolve(bound, 5000);
            client.await(CmEventType.ADDR_RESOLVED);
            client.setUp(id);
            id.connect(ConnectionParameters.DEFAULT);
            client.await(CmEventType.ESTABLISHED);
            for (int i = 0; i < total; i++) {
                long start = System.nanoTime();
                client.send();
                client.awaitTotals(i + 1, i + 1);
                if (i >= warmup) {
                    rtt[i - warmup] = System.nanoTime() - start;
                }
            }
            serverThread.join(TimeUnit.NANOSECONDS.toMillis(TIMEOUT_NANOS));
            if (serverFailure[0] != null) {
                throw new RdmaException("ping-pong server side failed: " + serverFailure[0], serverFailure[0]);
            }
        } finally {
            client.close();
            client.channel.close();
            client.notifier.close();
            serverThread.join(TimeUnit.NANOSECONDS.toMillis(TIMEOUT_NANOS));
            server.close();
            listener.close();
            server.channel.close();
            serverNotifier.close();
        }
        Arrays.sort(rtt);
        return rtt;
    }

    @Override
    public void close() {
    }

    /** One side: an event channel, a protection domain, one CQ, one QP, one send and one receive buffer. */
    private final class Endpoint implements AutoCloseable {
        final EventNotifier notifier;
        final RdmaEventChannel channel;
        final CmEvent event = new CmEvent();
        final WorkCompletions wc = new WorkCompletions(4);
        final SendWorkRequest sendWr = new SendWorkRequest(1);
        final RecvWorkRequest recvWr = new RecvWorkRequest(1);
        long sendsCompleted;
        long receivesCompleted;
        ByteBuffer memory;
        ProtectionDomain pd;
        MemoryRegion mr;
        CompletionQueue cq;
        QueuePair qp;
        RdmaCmId id;

        Endpoint(EventNotifier notifier) throws RdmaException {
            this.notifier = notifier;
            this.channel = provider.createEventChannel(notifier);
        }

        CmEvent await(CmEventType type) throws RdmaException {
            long deadline = System.nanoTime() + TIMEOUT_NANOS;
            while (!channel.poll(event)) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    throw new RdmaException("timed out after 10 s waiting for the connection manager event " + type
                            + ": check that the address " + bindAddress.getAddress().getHostAddress()
                            + " belongs to an RDMA interface");
                }
                notifier.await(left);
            }
            if (event.type() != type) {
                throw new RdmaException("expected the connection manager event " + type + " but got " + event);
            }
            return event;
        }

        void setUp(RdmaCmId id) throws RdmaException {
            this.id = id;
            memory = ByteBuffer.allocateDirect(2 * messageSize);
            pd = id.device().allocProtectionDomain();
            mr = pd.register(memory, Access.LOCAL_WRITE);
            cq = id.device().createCompletionQueue(16, notifier);
            qp = id.createQueuePair(pd, cq, cq, new QpCapabilities(4, 4, 1, 1, 0));
            postReceive();
        }

        private void postReceive() throws RdmaException {
            recvWr.reset().wrId(RECV_WR_ID).addSge(mr.address() + messageSize, messageSize, mr.lkey());
            qp.postRecv(recvWr);
        }

        /** Posts one SEND of {@code messageSize} bytes. */
        void send() throws RdmaException {
            sendWr.reset().wrId(SEND_WR_ID).opcode(WrOpcode.SEND).flags(SendWorkRequest.SIGNALED)
                    .addSge(mr.address(), messageSize, mr.lkey());
            qp.postSend(sendWr);
        }

        /**
         * Polls until at least {@code sends} SENDs and {@code receives} receives have completed in total. A send's
         * completion and the reply's receive may be polled in either order, so both are counted, not awaited in
         * turn. The receive is reposted as soon as it completes, before this side sends again, so the peer (which
         * only sends in answer) always finds it posted.
         */
        void awaitTotals(long sends, long receives) throws RdmaException {
            long deadline = System.nanoTime() + TIMEOUT_NANOS;
            while (sendsCompleted < sends || receivesCompleted < receives) {
                int n = cq.poll(wc);
                if (n == 0) {
                    cq.requestNotify();
                    n = cq.poll(wc);
                }
                for (int i = 0; i < n; i++) {
                    if (wc.status(i) != WcStatus.SUCCESS) {
                        throw new RdmaException("work completion failed: " + wc.toString(i));
                    }
                    if (wc.wrId(i) == SEND_WR_ID) {
                        sendsCompleted++;
                    } else {
                        receivesCompleted++;
                        postReceive();
                    }
                }
                if (n == 0) {
                    long left = deadline - System.nanoTime();
                    if (left <= 0) {
                        throw new RdmaException("timed out after 10 s waiting for " + sends + " send and " + receives
                                + " receive completions (have " + sendsCompleted + " and " + receivesCompleted + ")");
                    }
                    notifier.await(left);
                }
            }
        }

        @Override
        public void close() {
            if (id != null) {
                id.disconnect();
            }
            if (qp != null) {
                qp.close();
            }
            if (cq != null) {
                cq.close();
            }
            if (mr != null) {
                mr.close();
            }
            if (pd != null) {
                pd.close();
            }
            if (id != null) {
                id.close();
            }
        }
    }
}
