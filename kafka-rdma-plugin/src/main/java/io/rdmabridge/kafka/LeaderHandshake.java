package io.rdmabridge.kafka;

import java.io.IOException;
import java.net.InetAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ByteChannel;
import java.security.SecureRandom;
import java.util.concurrent.CompletableFuture;

/**
 * The leader's side of the upgrade, a non-blocking state machine driven by Kafka's network thread: it looks at the
 * first byte of an accepted inter-broker connection and either hands Kafka's bytes back (plain TCP) or runs the
 * {@link Preamble} exchange. It never reads past what the exchange needs, so the bytes that follow belong to Kafka
 * untouched.
 *
 * <p>A follower without the plugin (stock Kafka) sends no preamble; it is named by the client id in the header of its
 * first request, which Kafka's replica fetcher sets to {@code broker-<broker id>-fetcher-<fetcher id>}. To read it the
 * handshake reads at most that header, never past the end of the first request, and hands every byte read back to
 * Kafka. On a TLS listener the header is encrypted: such a follower stays unnamed.
 *
 * <p>Hostile input costs bounded resources: fixed-size buffers, exact reads, a cap on handshakes in progress and one
 * on the RDMA connections they open ({@link SourceAdmission}s shared by the listener, of which one source address may
 * hold half; an accepted upgrade holds its connection's place until {@link #connectionClosed()}: the upgrade comes
 * before Kafka's own authentication, so anyone who reaches the listener can ask for one), and a deadline enforced by
 * the owner through {@link #expire(String)}.
 * Not thread-safe except {@link #expire(String)} and {@link #failure()}, which may be called from a timer thread;
 * every state change takes the monitor {@code expire} takes, so that an expiry is final.
 */
final class LeaderHandshake {
    enum State { SNIFF, REQUEST_HEADER, HELLO, REPLY, DECISION, AWAIT_STREAM, TCP, RDMA, FAILED }

    private static final SecureRandom TOKENS = new SecureRandom();
    private static final byte TLS_HANDSHAKE_RECORD = 0x16;
    /** Request size, api key, api version, correlation id, client id length: Kafka's request header up to the id. */
    private static final int REQUEST_HEADER_FIXED = 4 + 2 + 2 + 4 + 2;
    /** Longest client id read: "broker-2147483647-fetcher-2147483647". */
    private static final int MAX_CLIENT_ID = 36;
    /** A first request larger than this is not a replica fetcher's; it is handed to Kafka without being looked at. */
    private static final int MAX_SNIFFED_REQUEST = 64 * 1024;
    private static final String FETCHER_CLIENT_ID_PREFIX = "broker-";
    private static final String FETCHER_CLIENT_ID_INFIX = "-fetcher-";

    private final ByteChannel tcp;
    private final RdmaStreamTransport transport;
    private final int localBrokerId;
    private final SourceAdmission admission;
    private final InetAddress source;
    private final SourceAdmission connections;
    private final Runnable wakeup;

    private final ByteBuffer in = ByteBuffer.allocate(Preamble.HELLO_LENGTH);
    private volatile State state = State.SNIFF;
    private volatile String failure;
    private ByteBuffer out;
    private ByteBuffer head;
    private ByteBuffer replay;
    private CompletableFuture<RdmaStream> pending;
    private RdmaStream stream;
    private boolean admitted;
    /** Why no place was taken, when not {@link #admitted}. */
    private String refusal;
    /** Holds one of {@code connections}: from the accepting reply until the upgrade fails or the connection closes. */
    private boolean connectionHeld;
    /**
     * A stream this handshake took and then closed holds the place until its queue pair is released: its close first
     * delivers what was written (the token's acknowledgement), for up to its linger.
     */
    private boolean placeHeldByClosingStream;
    private int peerBrokerId = -1;
    private String fallbackReason;

    /**
     * @param source      the follower's address, which may hold only its share of the admission's places
     * @param admission   places for handshakes in progress, shared by all connections of one listener
     * @param connections places for RDMA connections open, shared likewise, of which {@code source} may also hold only
     *                    its share
     * @param wakeup      run (from any thread) when the state machine can make progress without TCP input
     */
    LeaderHandshake(ByteChannel tcp, InetAddress source, RdmaStreamTransport transport, int localBrokerId,
                    SourceAdmission admission, SourceAdmission connections, Runnable wakeup) {
        this.tcp = tcp;
        this.source = source;
        this.transport = transport;
        this.localBrokerId = localBrokerId;
        this.admission = admission;
        this.connections = connections;
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

    /** The follower's broker id from its HELLO or its first request's client id, or -1 before (or without) one. */
    int peerBrokerId() {
        return peerBrokerId;
    }

    /** Why an upgrade attempt ended on TCP, or {@code null} when none was attempted or it succeeded. */
    String fallbackReason() {
        return fallbackReason;
    }

    /** True once the exchange started (a HELLO's first byte arrived): the upgrade was attempted. */
    boolean attempted() {
        State s = state;
        return s != State.SNIFF && s != State.REQUEST_HEADER && !(s == State.TCP && fallbackReason == null);
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
                    if (n < 0 || in.get(0) == TLS_HANDSHAKE_RECORD) {
                        // An end of stream Kafka should see, or a TLS handshake: hand back what was read.
                        replay = in.flip();
                        enter(State.TCP);
                        return state;
                    }
                    if (in.get(0) != Preamble.MAGIC_FIRST_BYTE) {
                        head = ByteBuffer.allocate(REQUEST_HEADER_FIXED + MAX_CLIENT_ID).put(in.get(0));
                        enter(State.REQUEST_HEADER);
                        break;
                    }
                    refusal = admission.admit(source);
                    admitted = refusal == null;
                    if (!enter(State.HELLO)) {
                        release();
                    }
                    break;
                }
                case REQUEST_HEADER: {
                    if (!readRequestHeader()) {
                        return state;
                    }
                    replay = head.flip();
                    enter(State.TCP);
                    return state;
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
                        enter(State.DECISION);
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
                        // The follower gave up, but its stream may have arrived all the same: close it, not leak it.
                        cleanUp();
                        fallbackReason = "follower " + peerBrokerId + " could not open its RDMA stream (its log "
                                + "names the cause)";
                        toTcp();
                        return state;
                    }
                    if (decision != Preamble.DECISION_RDMA) {
                        return fail("invalid RDMA decision byte 0x" + Integer.toHexString(decision & 0xff)
                                + " (expected: 'D' or 'T')");
                    }
                    enter(State.AWAIT_STREAM);
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
                    if (!enter(State.RDMA)) {
                        closeTaken(stream);
                    }
                    return state;
                }
                default:
                    return state;
            }
        }
    }

    /**
     * Reads Kafka's first request header up to the end of its client id, without reading past the request, and
     * takes the follower's broker id from a replica fetcher's client id.
     *
     * @return false while more bytes are needed; true once the bytes are Kafka's to read (complete, not a request
     *         header worth reading, or end of stream)
     */
    private boolean readRequestHeader() throws IOException {
        while (true) {
            int p = head.position();
            int want;
            if (p < 4) {
                want = 4;
            } else {
                int size = head.getInt(0);
                if (size < REQUEST_HEADER_FIXED - 4 || size > MAX_SNIFFED_REQUEST) {
                    return true;
                }
                if (p < REQUEST_HEADER_FIXED) {
                    want = REQUEST_HEADER_FIXED;
                } else {
                    short idLength = head.getShort(REQUEST_HEADER_FIXED - 2);
                    if (idLength <= 0 || idLength > MAX_CLIENT_ID || REQUEST_HEADER_FIXED - 4 + idLength > size) {
                        return true;
                    }
                    want = REQUEST_HEADER_FIXED + idLength;
                    if (p == want) {
                        peerBrokerId = fetcherBrokerId(head, REQUEST_HEADER_FIXED, idLength);
                        return true;
                    }
                }
            }
            head.limit(want);
            int n = tcp.read(head);
            head.limit(head.capacity());
            if (n < 0) {
                return true;
            }
            if (n == 0) {
                return false;
            }
        }
    }

    /** The broker id in a client id {@code broker-<id>-fetcher-<n>} (ASCII at {@code from}), or -1. */
    static int fetcherBrokerId(ByteBuffer b, int from, int length) {
        int end = from + length;
        int i = from;
        for (int k = 0; k < FETCHER_CLIENT_ID_PREFIX.length(); k++, i++) {
            if (i >= end || b.get(i) != FETCHER_CLIENT_ID_PREFIX.charAt(k)) {
                return -1;
            }
        }
        long id = 0;
        int digits = 0;
        while (i < end && b.get(i) >= '0' && b.get(i) <= '9' && digits < 10) {
            id = id * 10 + (b.get(i++) - '0');
            digits++;
        }
        if (digits == 0 || id > Integer.MAX_VALUE) {
            return -1;
        }
        for (int k = 0; k < FETCHER_CLIENT_ID_INFIX.length(); k++, i++) {
            if (i >= end || b.get(i) != FETCHER_CLIENT_ID_INFIX.charAt(k)) {
                return -1;
            }
        }
        int fetcherDigits = 0;
        while (i < end && b.get(i) >= '0' && b.get(i) <= '9') {
            i++;
            fetcherDigits++;
        }
        return fetcherDigits > 0 && i == end ? (int) id : -1;
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
            fallbackReason = refusal;
        } else if ((fallbackReason = acquireConnection()) != null) {
            status = Preamble.STATUS_DECLINE_BUSY;
        } else {
            status = Preamble.STATUS_ACCEPT;
            do {
                token = TOKENS.nextLong();
            } while (token == Preamble.PROBE_TOKEN);
            port = transport.listenPort();
            pending = transport.expect(token);
            pending.whenComplete((s, e) -> wakeup.run());
        }
        out = Preamble.reply(status, port, localBrokerId, token);
        if (!enter(State.REPLY)) {
            // Expired while the HELLO was read: forget the token just handed out.
            cleanUp();
        }
    }

    private void toTcp() {
        release();
        connectionClosed();
        replay = ByteBuffer.allocate(0);
        enter(State.TCP);
    }

    /**
     * Moves to {@code next} unless {@link #expire} ended the handshake first; under expire's monitor, so that an
     * expiry (whose clean-up may already have closed the stream) is never overwritten and the connection never goes
     * on as TCP or RDMA after it.
     *
     * @return false when the handshake has FAILED, which it stays
     */
    private synchronized boolean enter(State next) {
        if (state == State.FAILED) {
            return false;
        }
        state = next;
        return true;
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
                closeTaken(s);
            }
        }
        release();
        if (state != State.RDMA) {
            connectionClosed();
        }
    }

    private synchronized void release() {
        if (admitted) {
            admitted = false;
            admission.release(source);
        }
    }

    /** Takes a place under {@code rdma.max.connections}; {@code null} when taken, otherwise why not. */
    private synchronized String acquireConnection() {
        String refused = connections.admit(source);
        connectionHeld = refused == null;
        return refused;
    }

    /**
     * Gives back the connection's place under {@code rdma.max.connections}: called by the owner once the connection
     * is closed (on RDMA: once the stream's queue pair is released), and here when the upgrade ends anywhere but on
     * RDMA, unless a stream it took and closed still holds the place. Idempotent; any thread.
     */
    synchronized void connectionClosed() {
        if (!placeHeldByClosingStream) {
            givePlaceBack();
        }
    }

    /** Closes a stream the handshake took but does not use; the place goes back once its queue pair is released. */
    private void closeTaken(RdmaStream s) {
        synchronized (this) {
            placeHeldByClosingStream = connectionHeld;
        }
        s.whenClosed(this::closedStreamReleased);
        closeQuietly(s);
    }

    private synchronized void closedStreamReleased() {
        placeHeldByClosingStream = false;
        givePlaceBack();
    }

    private synchronized void givePlaceBack() {
        if (connectionHeld) {
            connectionHeld = false;
            connections.release(source);
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
