package io.rdmabridge.kafka;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.ByteChannel;
import java.security.SecureRandom;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Semaphore;

/**
 * The leader's side of the upgrade, a non-blocking state machine driven by Kafka's network thread: it looks at the
 * first byte of an accepted inter-broker connection and either hands that byte back to Kafka (plain TCP) or runs the
 * {@link Preamble} exchange. It never reads past what the exchange needs, so the bytes that follow belong to Kafka
 * untouched.
 *
 * <p>Hostile input costs bounded resources: fixed-size buffers, exact reads, a cap on handshakes in progress
 * (a semaphore shared by the listener), and a deadline enforced by the owner through {@link #expire(String)}.
 * Not thread-safe except {@link #expire(String)} and {@link #failure()}, which may be called from a timer thread.
 */
final class LeaderHandshake {
    enum State { SNIFF, HELLO, REPLY, DECISION, AWAIT_STREAM, TCP, RDMA, FAILED }

    private static final SecureRandom TOKENS = new SecureRandom();

    private final ByteChannel tcp;
    private final RdmaStreamTransport transport;
    private final int localBrokerId;
    private final Semaphore admission;
    private final Runnable wakeup;

    private final ByteBuffer in = ByteBuffer.allocate(Preamble.HELLO_LENGTH);
    private volatile State state = State.SNIFF;
    private volatile String failure;
    private ByteBuffer out;
    private ByteBuffer replay;
    private CompletableFuture<RdmaStream> pending;
    private RdmaStream stream;
    private boolean admitted;
    private int peerBrokerId = -1;
    private String fallbackReason;

    /**
     * @param admission permits for handshakes in progress, shared by all connections of one listener
     * @param wakeup    run (from any thread) when the state machine can make progress without TCP input
     */
    LeaderHandshake(ByteChannel tcp, RdmaStreamTransport transport, int localBrokerId, Semaphore admission,
                    Runnable wakeup) {
        this.tcp = tcp;
        this.transport = transport;
        this.localBrokerId = localBrokerId;
        this.admission = admission;
        this.wakeup = wakeup;
    }

    State state() {
        return state;
    }

    /** Why the connection was cut off, when {@link #state()} is FAILED. */
    String failure() {
        return failure;
    }

    /** Bytes read while sniffing that belong to Kafka (TCP state), or an empty buffer. */
    ByteBuffer replay() {
        return replay;
    }

    RdmaStream stream() {
        return stream;
    }

    /** The follower's broker id from its HELLO, or -1 before (or without) one. */
    int peerBrokerId() {
        return peerBrokerId;
    }

    /** Why an upgrade attempt ended on TCP, or {@code null} when none was attempted or it succeeded. */
    String fallbackReason() {
        return fallbackReason;
    }

    /** True once the exchange started (a HELLO's first byte arrived): the upgrade was attempted. */
    boolean attempted() {
        return state != State.SNIFF && !(state == State.TCP && fallbackReason == null);
    }

    /** Whether the state machine still owns the connection's bytes. */
    boolean inProgress() {
        State s = state;
        return s != State.TCP && s != State.RDMA && s != State.FAILED;
    }

    /**
     * Makes as much progress as the available bytes allow and returns the state reached. Never blocks.
     *
     * @throws IOException from the TCP channel; protocol violations do not throw but end in FAILED
     */
    State advance() throws IOException {
        while (true) {
            switch (state) {
                case SNIFF: {
                    in.clear().limit(1);
                    int n = tcp.read(in);
                    if (n == 0) {
                        return state;
                    }
                    if (n < 0 || in.get(0) != Preamble.MAGIC_FIRST_BYTE) {
                        // Kafka's own bytes (or an end of stream Kafka should see): hand back what was read.
                        replay = in.flip();
                        state = State.TCP;
                        return state;
                    }
                    admitted = admission.tryAcquire();
                    state = State.HELLO;
                    break;
                }
                case HELLO: {
                    in.limit(Preamble.HELLO_LENGTH);
                    while (in.hasRemaining()) {
                        int n = tcp.read(in);
                        if (n < 0) {
                            return fail("connection closed after " + in.position() + " of " + Preamble.HELLO_LENGTH
                                    + " preamble bytes");
                        }
                        if (n == 0) {
                            return state;
                        }
                    }
                    String invalid = Preamble.validateHello(in);
                    if (invalid != null) {
                        return fail("invalid RDMA preamble: " + invalid);
                    }
                    peerBrokerId = in.getInt(Preamble.HELLO_BROKER_ID_OFFSET);
                    startReply();
                    break;
                }
                case REPLY: {
                    tcp.write(out);
                    if (out.hasRemaining()) {
                        return state;
                    }
                    if (pending != null) {
                        state = State.DECISION;
                    } else {
                        toTcp();
                    }
                    break;
                }
                case DECISION: {
                    in.clear().limit(1);
                    int n = tcp.read(in);
                    if (n < 0) {
                        return fail("connection closed before the follower's RDMA decision");
                    }
                    if (n == 0) {
                        return state;
                    }
                    byte decision = in.get(0);
                    if (decision == Preamble.DECISION_TCP) {
                        pending.cancel(false);
                        fallbackReason = "follower " + peerBrokerId + " could not open its RDMA stream (its log "
                                + "names the cause)";
                        toTcp();
                        return state;
                    }
                    if (decision != Preamble.DECISION_RDMA) {
                        return fail("invalid RDMA decision byte 0x" + Integer.toHexString(decision & 0xff)
                                + " (expected: 'D' or 'T')");
                    }
                    state = State.AWAIT_STREAM;
                    break;
                }
                case AWAIT_STREAM: {
                    if (!pending.isDone()) {
                        return state;
                    }
                    try {
                        stream = pending.join();
                    } catch (RuntimeException e) {
                        Throwable cause = e.getCause() != null ? e.getCause() : e;
                        return fail("follower " + peerBrokerId + " switched to RDMA but its stream failed: " + cause);
                    }
                    release();
                    if (state == State.FAILED) {
                        closeQuietly(stream);
                        return state;
                    }
                    state = State.RDMA;
                    return state;
                }
                default:
                    return state;
            }
        }
    }

    private void startReply() {
        byte version = in.get(Preamble.HELLO_VERSION_OFFSET);
        byte status;
        long token = 0;
        int port = 0;
        if (version != Preamble.VERSION) {
            status = Preamble.STATUS_DECLINE_VERSION;
            fallbackReason = "follower " + peerBrokerId + " speaks preamble version " + version + " (expected: "
                    + Preamble.VERSION + ")";
        } else if (!transport.isAvailable()) {
            status = Preamble.STATUS_DECLINE_UNAVAILABLE;
            fallbackReason = transport.unavailabilityCause();
        } else if (!admitted) {
            status = Preamble.STATUS_DECLINE_BUSY;
            fallbackReason = "too many RDMA handshakes in progress";
        } else {
            status = Preamble.STATUS_ACCEPT;
            token = TOKENS.nextLong();
            port = transport.listenPort();
            pending = transport.expect(token);
            pending.whenComplete((s, e) -> wakeup.run());
        }
        out = Preamble.reply(status, port, localBrokerId, token);
        state = State.REPLY;
    }

    private void toTcp() {
        release();
        replay = ByteBuffer.allocate(0);
        state = State.TCP;
    }

    /** Ends the handshake from outside (deadline, shutdown); a no-op once it has finished. */
    void expire(String reason) {
        synchronized (this) {
            if (!inProgress()) {
                return;
            }
            failure = reason;
            state = State.FAILED;
        }
        cleanUp();
        wakeup.run();
    }

    private State fail(String reason) {
        synchronized (this) {
            if (state != State.FAILED) {
                failure = reason;
                state = State.FAILED;
            }
        }
        cleanUp();
        return State.FAILED;
    }

    private void cleanUp() {
        CompletableFuture<RdmaStream> p = pending;
        if (p != null && !p.cancel(false) && p.isDone() && !p.isCompletedExceptionally()) {
            RdmaStream s = p.join();
            if (s != stream || state == State.FAILED) {
                closeQuietly(s);
            }
        }
        release();
    }

    private synchronized void release() {
        if (admitted) {
            admitted = false;
            admission.release();
        }
    }

    private static void closeQuietly(RdmaStream s) {
        try {
            s.close();
        } catch (IOException | RuntimeException ignored) {
            // The connection is being dropped; the stream's own close logs what it must.
        }
    }
}
