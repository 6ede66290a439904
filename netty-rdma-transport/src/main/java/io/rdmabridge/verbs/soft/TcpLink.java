package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.Access;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.QpState;
import io.rdmabridge.verbs.RateLimitedWarning;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WcOpcode;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WrOpcode;
import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.net.ConnectException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.StandardProtocolFamily;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.channels.DatagramChannel;
import java.nio.channels.SelectionKey;
import java.nio.channels.SocketChannel;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

/**
 * One TCP connection carrying one reliable-connected queue pair, as an RC connection of hardware does.
 *
 * <h2>Protocol</h2>
 * A {@link SoftHandshake} (CONNECT, then ACCEPT or REJECT), then {@link SoftFrame}s both ways. Each side is at once a
 * requester (its send queue becomes request frames; ACK, NAK, RNR_NAK and READ_RESPONSE come back) and a responder
 * (it executes the peer's requests against its registered memory and receive queue, in PSN order). Everything read
 * is validated; a violation is logged at WARN with the peer's address and closes the connection.
 *
 * <h2>Threads and buffering</h2>
 * The engine thread reads and executes frames. Writing is a drain loop ({@link #pump()}) that whichever thread has
 * work runs (the posting thread when the socket has room, the engine when it becomes writable, the timer for
 * retries); a compare-and-set of the drainer's thread keeps one drainer at a time without a lock. Per connection
 * there is one read buffer and one write buffer of fixed size; large work requests stream through them in frames of
 * at most {@link SoftFrame#MAX_PAYLOAD} bytes, straight from and into registered memory. Pending acknowledgements are
 * one coalesced PSN, pending READ responses a ring bounded by the negotiated responder resources, so nothing a peer
 * sends can grow memory.
 *
 * <h2>Same-host rings</h2>
 * On a same-host link ({@link #sameHost()}, with {@value ShmRing#PROPERTY} on) each side creates a {@link ShmRing} at
 * CONNECTED and its drainer announces it with a {@link SoftFrame#RING} frame, its last frame on the socket; from then
 * on {@link #fill()} encodes frames straight into the ring's free window instead of the write buffer, and the socket
 * carries only DOORBELLs and the final DISCONNECT or NAK. The engine thread maps the peer's ring when it processes
 * the peer's RING frame, so it reads the ring only after everything sent before it; it then executes frames in place,
 * from the ring to registered memory, and drains the ring before it takes any later frame from the socket and before
 * it acts on the socket's end, so order holds across both. It polls the rings of all such links (see
 * {@link SoftEngine}); parking and doorbells follow {@link ShmRing}'s handshakes. A peer's ring is as untrusted as
 * its socket: headers are copied to private memory before they are checked, counters validated, and a fault on a
 * truncated mapping ({@link InternalError}) closes, with a WARN, the links whose ring files were cut and the link in
 * whose code HotSpot raised it (see {@link SoftEngine#closeTruncatedRings}). The ring path allocates nothing and takes
 * no lock per frame; executing a frame takes the queue pair's lock as on the socket path.
 *
 * <h2>Who executes the peer's frames</h2>
 * The engine thread, or a thread polling one of the queue pair's completion queues ({@link #progress}), whichever
 * takes the link's consumer slot first (a compare-and-set; a poller never waits for it, the engine waits out a
 * poller's drain). So an event loop that is awake executes its own connections' frames without waiting for the engine
 * to wake, as a NIC's completions reach a polling thread without a hand-off. A poller that stays awake also takes the
 * ring's parked flag from the engine, so that the peer stops ringing the engine's doorbell. When it sleeps (it arms
 * its completion queue) it parks on the ring itself, with its loop's wake socket as the target
 * ({@link #pollerSleeps}), so that the peer's next frame wakes the loop directly ({@link #wakePeerLoop}); without a
 * wake socket it gives the flag back to the engine. The peer's ring is unmapped on the engine thread only, holding the
 * consumer slot, so no poller reads it after.
 */
final class TcpLink extends SoftLink implements SoftEngine.Handler {
    static final int READ_BUFFER_SIZE = 2 * (SoftFrame.HEADER_LENGTH + SoftFrame.MAX_PAYLOAD);
    static final int WRITE_BUFFER_SIZE = 2 * (SoftFrame.HEADER_LENGTH + SoftFrame.MAX_PAYLOAD);
    /** A data frame is not cut smaller than this to fill the tail of the write buffer. */
    static final int MIN_CHUNK = 4096;
    static final long LINGER_NANOS = 2_000_000_000L;
    static final int HANDSHAKE_BUFFER_SIZE = 512;
    /** Accepted sockets that have not finished their handshake, across the JVM; more are closed at once. */
    static final int MAX_PENDING_HANDSHAKES = 1024;
    private static final AtomicInteger PENDING_HANDSHAKES = new AtomicInteger();
    /** A flood of sockets can refuse thousands a second: one WARN per interval says how many. */
    static final RateLimitedWarning REFUSALS = new RateLimitedWarning(SoftEngine.logger, 10_000);
    /** Protocol violations of sockets that have not sent a connect request: at most one line per interval. */
    static final RateLimitedWarning VIOLATIONS = new RateLimitedWarning(SoftEngine.logger, 10_000);
    /** A ring that cannot be made keeps that link's frames on the socket: one WARN per process says so. */
    private static final AtomicBoolean RING_FALLBACK_LOGGED = new AtomicBoolean();
    private static final AtomicBoolean UNPROVEN_LOGGED = new AtomicBoolean();

    static final int ACTIVE_CONNECTING = 0;
    static final int ACTIVE_WAIT_REPLY = 1;
    static final int PASSIVE_WAIT_REQUEST = 2;
    static final int PASSIVE_WAIT_APP = 3;
    static final int CONNECTED = 4;
    static final int CLOSING = 5;
    static final int CLOSED = 6;

    /**
     * How long a connected link between hosts may go without a sign of its peer while work requests wait for it,
     * before the oldest fails with {@code RETRY_EXC_ERR} and the connection ends, as on a NIC whose transport retries
     * ran out (its local ACK timeout times its retry count: seconds to tens of seconds). A sign is a byte read from
     * the peer, or room coming back in our full socket (the peer's TCP acknowledged data). Without it a peer host that
     * vanished without a reset (power lost, cable cut, partition) left those requests to TCP's own retransmission
     * timeout, about 15 minutes. Longer than a NIC's, since here the signs come from the peer's process (a pause in
     * it counts), not from its adapter; for the same reason it is off on same-host links, whose peer cannot vanish
     * without its kernel resetting the socket, and whose adapter, were it a NIC, would keep answering for a stopped
     * process. Milliseconds, at least 100; {@code 0} turns it off; read when a connection is established.
     */
    static final String TRANSPORT_TIMEOUT_PROPERTY = "rdmabridge.soft.transportTimeoutMillis";
    static final long DEFAULT_TRANSPORT_TIMEOUT_MILLIS = 30_000;
    /**
     * The timeout is checked this many times over its length; it fires at the check after the last of them, so
     * between one and one and a quarter timeouts after the first request left unanswered.
     */
    private static final int LIVENESS_CHECKS = 4;
    /**
     * System property: {@code false} makes a poller that executes ring frames publish their acknowledgement at once.
     * By default ({@code true}) an acknowledgement due for messages the poller is about to hand up is held until a
     * post on the queue pair carries it (the poller's answer), the poller arms its completion queue or polls again
     * (a second poll that completes more receives acknowledges them all), the link ends (a pending acknowledgement
     * goes before the socket closes), or the engine thread next polls the rings ({@link SoftEngine#PARK_MILLIS} at
     * most while it parks, when no poller holds the link), so the requester is woken once for the answer and the
     * acknowledgement instead of twice. Read once. For comparison and diagnosis.
     */
    static final String HOLD_ACKS_PROPERTY = "rdmabridge.soft.holdAcknowledgements";
    static final boolean HOLD_ACKS = !"false".equalsIgnoreCase(System.getProperty(HOLD_ACKS_PROPERTY, "true").trim());
    private static final VarHandle HEARD;
    private static final VarHandle DELIVERED;

    static {
        try {
            MethodHandles.Lookup l = MethodHandles.lookup();
            HEARD = l.findVarHandle(TcpLink.class, "heard", long.class);
            DELIVERED = l.findVarHandle(TcpLink.class, "delivered", long.class);
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError(e);
        }
    }

    /** Most one-sided requests one DIRECT frame reports; more wait for the next one. */
    static final int MAX_DIRECT = 1 << 24;
    /**
     * From this size a WRITE or READ behind unacknowledged requests waits for their acknowledgement (a round trip)
     * to run one-sided, rather than streaming through the socket; smaller ones go over the wire at once.
     */
    static final int ONE_SIDED_WAIT_BYTES = 64 * 1024;

    private volatile int phase;
    private final SoftCmId listener;
    private volatile SoftCmId id;
    private volatile SoftQueuePair qp;
    private volatile SocketChannel ch;
    private volatile SelectionKey key;
    private volatile String peer;
    /** The same-host token this side sent in its CONNECT or ACCEPT, and the peer's token, pid and qpn. */
    private byte[] localToken;
    private byte[] peerToken;
    private long peerPid;
    private int peerQpn;
    /**
     * Both ends offered shared memory on one host and directory ({@link SharedMemoryFiles#sameHost}); set before
     * ESTABLISHED, with {@link #sharedPeer}, through which RDMA WRITE and READ run one-sided when they can.
     */
    private volatile boolean sameHost;
    /** The peer sent our token, but its socket is not our user's on this host ({@link PeerSockets}). */
    private boolean peerUnproven;
    private volatile SharedPeer sharedPeer;
    /** Requests executed one-sided whose PSNs the responder has not been told of yet: a DIRECT frame; drainer. */
    private int directPsn;
    private int directCount;
    /** A one-sided request completed and a failed one behind it retired: the link ends after the drain. */
    private boolean sharedFailed;
    /** The next request waits to run one-sided until the earlier ones are done; an ACK wakes the pump. */
    private volatile boolean sharedWaiting;
    /** Our ring, made at CONNECTED on a same-host link; the drainer announces it and then writes into it. */
    private volatile ShmRing ringToAnnounce;
    // ---- our ring's writer (the drainer); private counters, since the peer can spoil the published ones
    private ShmRing outRing;
    private long outTail;
    private long outPublished;
    private long outHead;
    /** A DOORBELL for the peer: it parked on our ring, or found its own full; the next fill() sends it. */
    private volatile boolean doorbellPending;
    /** Where {@link #fill()} encodes frames: the write buffer, or the window of {@link #outRing}; drainer. */
    private ByteBuffer out;
    private long outAddress;
    /**
     * The thread executing the peer's frames now (see Same-host rings): the engine, or a thread polling one of the
     * queue pair's completion queues; {@code null} when none. Everything read from the socket or the peer's ring, and
     * the responder and requester-response state below, is touched only by the holder.
     */
    private final AtomicReference<Thread> consumer = new AtomicReference<>();
    private final Runnable failureTask = this::actOnFailure;
    /**
     * Whether a completion-queue poller holds the peer ring's parked flag ({@link #POLLER_NONE}, {@link #POLLER_AWAKE},
     * {@link #POLLER_ASLEEP}); written under the consumer slot, read by the engine without it.
     */
    private volatile int pollerPark;
    /** The engine parks for the ring (or nobody: it is awake, or a poller gave the flag back). */
    private static final int POLLER_NONE = 0;
    /** A poller took the flag and polls in the engine's stead; the peer rings nobody while it is awake. */
    private static final int POLLER_AWAKE = 1;
    /** A poller sleeping with its own wake socket set the flag: the peer wakes its loop, not the engine. */
    private static final int POLLER_ASLEEP = 2;
    // ---- wake-ups of the peer's sleeping poller (drainer): a datagram to its loop's wake socket, see pump()
    private DatagramChannel wakeOut;
    private int wakeOutPort;
    private final ByteBuffer wakeDatagram = ByteBuffer.allocateDirect(1);
    // ---- the peer's ring, mapped when its RING frame is processed (engine thread)
    private boolean peerSwitched;
    private ShmRing inRing;
    private long inHead;
    private long inTail;
    /** Each header read from the peer's ring is copied here before it is checked and used. */
    private final ByteBuffer ringHeader = ByteBuffer.allocateDirect(SoftFrame.HEADER_LENGTH);
    private final long ringHeaderAddress = DirectMemory.address(ringHeader);
    private final SoftFrame ringFrame = new SoftFrame();

    // Small while the handshake runs (a stranger's socket costs little), full size once connected.
    private ByteBuffer readBuf = ByteBuffer.allocateDirect(HANDSHAKE_BUFFER_SIZE);
    private ByteBuffer writeBuf = ByteBuffer.allocateDirect(HANDSHAKE_BUFFER_SIZE);
    private long readAddress = DirectMemory.address(readBuf);
    private long writeAddress = DirectMemory.address(writeBuf);
    private boolean pendingHandshake;
    private volatile ScheduledFuture<?> handshakeTimeout;
    private final SoftFrame inFrame = new SoftFrame();
    private final SoftFrame outFrame = new SoftFrame();
    private final SoftHandshake handshake = new SoftHandshake();
    // The drainer of pump(), named rather than counted: a thread can then tell after the fact whether it still holds
    // the slot, which a counter's lost return value cannot (see pump()). A request marks pumpRequested first.
    private final AtomicReference<Thread> drainer = new AtomicReference<>();
    private volatile boolean pumpRequested;
    // A fault of a shared mapping that HotSpot raised past drain()'s catch; the next drainer breaks the link with it.
    private volatile InternalError lateFault;
    private final Runnable pumpTask = this::pump;
    private final Runnable writeInterestTask = this::watchWritable;
    private final Runnable lingerTask = this::linger;
    private final Runnable closeTask = this::closeNow;
    private final Runnable livenessTask = this::checkLiveness;

    // ---- liveness: plain counters on the hot paths, read by the engine's check (opaque)
    /** Reads that brought bytes from the peer; by the consumer. */
    private long heard;
    /** Times room came back in our full socket; by the drainer. */
    private long delivered;
    /** Our last socket write left bytes behind: the socket was full; drainer. */
    private boolean socketFull;
    private long transportTimeoutNanos;
    /** The next liveness check; cancelled at close, so that no timer pins a closed link. */
    private volatile ScheduledFuture<?> livenessCheck;
    private long lastSigns;
    private int quietChecks;
    /** {@link SoftFaults#silence}: this side neither reads nor writes, as a host that vanished. */
    private volatile boolean silenced;

    // ---- writer side (owned by the drainer of pump())
    private volatile byte[] handshakeOut;
    private volatile boolean closeAfterFlush;
    private volatile int terminalOp;
    private volatile int terminalPsn;
    private volatile int terminalStatus;
    private boolean terminalWritten;
    private int cursorOffset;
    private volatile long rewindSeq = -1;
    private volatile long resumeAt;
    private volatile boolean resumeScheduled;
    private final AtomicInteger readsInFlight = new AtomicInteger();
    private volatile int readLimit = 1;
    private boolean gatherFailed;
    private boolean readResponseFailed;
    private int readResponseFailedPsn;

    // ---- responder (engine thread, under qp.rqLock)
    private int expectedPsn;
    private boolean inMessage;
    private int msgPsn;
    private int msgOp;
    private int msgLength;
    private int msgOffset;
    private long msgAddress;
    private int msgRkey;
    private long msgRecv;
    private boolean discarding;
    private int discardPsn;
    private volatile int ackPsn;
    private volatile boolean ackPending;
    // Receives this link completed from the peer's requests; the holder of the consumer slot compares it.
    private int receivesCompleted;
    // A poller's drain left the acknowledgement for the poller's answer to carry (consumer slot).
    private boolean ackHeld;
    private volatile int rnrNakPsn;
    private volatile boolean rnrNakPending;
    private int[] rrPsn = new int[1];
    private long[] rrAddress = new long[1];
    private int[] rrLength = new int[1];
    private int[] rrRkey = new int[1];
    private int rrMask;
    private volatile long rrHead;
    private volatile long rrTail;
    private int rrOffset;

    // ---- requester responses (engine thread, under qp.sqLock)
    private long ackFloor;
    private long readScan;
    private int readOffset;

    // ---- failure recorded while a lock was held, acted on after
    private String failReason;
    private int failTerminal;
    private int failPsn;
    private int failStatus;

    private TcpLink(SoftEngine engine, int phase, SoftCmId listener, SoftCmId id) {
        super(engine);
        this.phase = phase;
        this.listener = listener;
        this.id = id;
    }

    // ------------------------------------------------------------------ connection setup

    /** Starts the active side's TCP connect and handshake; reports through {@code id}'s channel. */
    static void connect(SoftCmId id, InetSocketAddress target, ConnectionParameters parameters, int timeoutMillis) {
        TcpLink link = new TcpLink(id.engine, ACTIVE_CONNECTING, null, id);
        link.peer = String.valueOf(target);
        SoftQueuePair q = id.softQueuePair();
        link.localToken = id.engine.sharedMemory.hostToken();
        link.handshakeOut = SoftHandshake.encode(SoftHandshake.CONNECT, q.qpn, parameters, parameters.privateData(),
                0, link.localToken, id.engine.sharedMemory.pid());
        synchronized (id) {
            id.tcpLink = link;
        }
        SoftEngine engine = id.engine;
        try {
            java.nio.channels.Selector selector = engine.selector();
            engine.execute(() -> link.startConnect(selector, target));
        } catch (IOException e) {
            id.connectFailed(CmEventType.CONNECT_ERROR, null, -1, e.getMessage());
            return;
        }
        id.connectTimeout(engine.schedule(id::connectTimedOut, timeoutMillis * 1_000_000L));
    }

    private void startConnect(java.nio.channels.Selector selector, InetSocketAddress target) {
        if (phase != ACTIVE_CONNECTING) {
            return;
        }
        try {
            SocketChannel c = id.connectSocket();
            ch = c;
            c.configureBlocking(false);
            c.setOption(StandardSocketOptions.TCP_NODELAY, true);
            boolean done = c.connect(target);
            key = c.register(selector, done ? SelectionKey.OP_READ : SelectionKey.OP_CONNECT, this);
            if (done) {
                connected();
            }
        } catch (IOException | RuntimeException e) {
            connectError(e);
        }
    }

    private void connectError(Exception e) {
        closeNow();
        SoftCmId i = id;
        String message = String.valueOf(e.getMessage());
        if (e instanceof ConnectException && message.contains("refused")) {
            i.connectFailed(CmEventType.REJECTED, null, SoftCmId.REJECT_NO_LISTENER, "nothing listens at " + peer
                    + " (" + message + ")");
        } else if (e instanceof java.nio.channels.UnresolvedAddressException || e instanceof ConnectException
                || e instanceof java.net.NoRouteToHostException || message.contains("unreachable")) {
            i.connectFailed(CmEventType.UNREACHABLE, null, -1, "cannot reach " + peer + ": " + e);
        } else {
            i.connectFailed(CmEventType.CONNECT_ERROR, null, -1, "connect to " + peer + " failed: " + e);
        }
    }

    private void connected() throws IOException {
        phase = ACTIVE_WAIT_REPLY;
        key.interestOps(SelectionKey.OP_READ);
        id.addresses((InetSocketAddress) ch.getLocalAddress(), id.remoteAddress());
        pump();
    }

    /** A socket accepted by {@code listener}'s port; engine thread. */
    static void accepted(SoftCmId listener, SocketChannel c) {
        SoftEngine engine = listener.engine;
        TcpLink link = new TcpLink(engine, PASSIVE_WAIT_REQUEST, listener, null);
        link.ch = c;
        // Per listener first, so silent sockets aimed at one port cannot block the others; the JVM-wide cap bounds
        // the sum.
        int perListener = SoftEngine.maxPendingHandshakesPerListener();
        if (listener.pendingHandshakes.incrementAndGet() > perListener) {
            listener.pendingHandshakes.decrementAndGet();
            REFUSALS.warn("soft0: refusing connections to {}: {} handshakes already pending on it (connected sockets "
                    + "that sent no connect request yet; raise rdmabridge.soft.maxPendingHandshakes if legitimate)",
                    listener.localAddress(), perListener);
            link.closeNow();
            return;
        }
        if (PENDING_HANDSHAKES.incrementAndGet() > MAX_PENDING_HANDSHAKES) {
            PENDING_HANDSHAKES.decrementAndGet();
            listener.pendingHandshakes.decrementAndGet();
            REFUSALS.warn("soft0: refusing connections to {}: {} handshakes already pending in this JVM",
                    listener.localAddress(), MAX_PENDING_HANDSHAKES);
            link.closeNow();
            return;
        }
        link.pendingHandshake = true;
        try {
            link.peer = String.valueOf(c.getRemoteAddress());
            c.configureBlocking(false);
            c.setOption(StandardSocketOptions.TCP_NODELAY, true);
            link.key = c.register(engine.selector(), SelectionKey.OP_READ, link);
        } catch (IOException e) {
            SoftEngine.logger.warn("soft0: cannot serve the connection from {}: {}", link.peer, e.toString());
            link.closeNow();
            return;
        }
        long timeout = SoftEngine.handshakeTimeoutMillis();
        link.handshakeTimeout = engine.schedule(() -> engine.execute(() -> {
            if (link.phase == PASSIVE_WAIT_REQUEST) {
                REFUSALS.warn("soft0: closing the connection from {}: handshake not completed within {} ms",
                        link.peer, timeout);
                link.closeNow();
            }
        }), timeout * 1_000_000L);
    }

    /** The application accepted the request on {@code passiveId}; any thread. */
    void accept(SoftCmId passiveId, SoftQueuePair q, ConnectionParameters parameters) {
        engine.execute(() -> {
            if (phase != PASSIVE_WAIT_APP) {
                passiveId.onDisconnected("the connecting peer at " + peer + " went away before accept");
                return;
            }
            if (q.state == QpState.DESTROYED) {
                // Destroyed after accept() and before this ran: nothing would ever close the link it got.
                closeNow();
                passiveId.onDisconnected("the queue pair accepting " + peer + " was destroyed before the accept "
                        + "went out");
                return;
            }
            localToken = engine.sharedMemory.hostToken();
            prepareRing();
            if (!sameHost) {
                // Our token tells the peer we are not sharing memory with it, and is no business of another host's.
                localToken = SharedMemoryFiles.NO_TOKEN;
            }
            try {
                attach(q, parameters, q.peerParams, false);
            } catch (Throwable t) {
                // Out of direct memory, say: this connection fails, its socket and the peer's wait end now.
                closeNow();
                passiveId.onDisconnected("accepting the connection from " + peer + " failed: " + t);
                return;
            }
            handshakeOut = SoftHandshake.encode(SoftHandshake.ACCEPT, q.qpn, parameters, parameters.privateData(), 0,
                    localToken, sameHost ? engine.sharedMemory.pid() : 0);
            phase = CONNECTED;
            engine.links.add(this);
            watchLiveness();
            q.markReadyToSend(this);
            if (q.state == QpState.DESTROYED) {
                // Destroyed meanwhile: its close() may have looked for the link before markReadyToSend set it.
                teardown("queue pair " + q.qpn + " destroyed", SoftFrame.DISCONNECT, 0, 0);
                return;
            }
            startSharing(q);
            passiveId.emit(CmEventType.ESTABLISHED, null, 0, null);
            try {
                key.interestOps(SelectionKey.OP_READ);
            } catch (RuntimeException e) {
                teardown("connection from " + peer + " closed before accept", 0, 0, 0);
                return;
            }
            pump();
            if (readBuf.position() > 0) {
                boolean locked = lockConsumer();
                try {
                    readBuf.flip();
                    processInput();
                } finally {
                    if (locked) {
                        unlockConsumer();
                    }
                }
            }
        });
    }

    /** The application rejected the request; any thread. */
    void reject(byte[] privateData) {
        engine.execute(() -> {
            if (phase != PASSIVE_WAIT_APP) {
                return;
            }
            handshakeOut = SoftHandshake.encode(SoftHandshake.REJECT, 0, null, privateData, SoftCmId.REJECT_CONSUMER);
            closeAfterFlush = true;
            phase = CLOSING;
            pump();
        });
        engine.schedule(() -> engine.execute(closeTask), LINGER_NANOS);
    }

    /** The active side gave up (timeout, disconnect, close) before the handshake completed. */
    void abortHandshake() {
        engine.execute(closeTask);
    }

    /**
     * Decides whether the link is same-host and, if it is and rings are on, makes our ring, which the RING frame
     * announces as our first frame after the handshake; engine thread, once both tokens are known and before
     * {@link #attach}, which sizes the socket's buffers by it. A ring that cannot be made leaves the frames on the
     * socket.
     */
    private void prepareRing() {
        sameHost = SharedMemoryFiles.sameHost(localToken, peerToken) && peerPid > 0;
        if (sameHost && !PeerSockets.otherEndIsOurUser(ch)) {
            // The token is no secret (every handshake carries it): a remote peer, or a local one of another user,
            // that repeats ours would have us map the files of whatever process of ours it names.
            sameHost = false;
            peerUnproven = true;
            if (UNPROVEN_LOGGED.compareAndSet(false, true)) {
                SoftEngine.logger.warn("soft0: {} sent this host's same-host token, but its socket is not one of this"
                        + " host's owned by this user: the link stays on the TCP path (a peer replaying the token, or "
                        + "a proxy between the two processes; logged once per process; -D{}=tcp keeps every link "
                        + "there)", peer, SharedMemoryFiles.SAME_HOST_PROPERTY);
            }
        }
        if (sameHost && ShmRing.enabled()) {
            try {
                ShmRing ring = ShmRing.create(engine.sharedMemory, ShmRing.configuredCapacity(),
                        peerPid == engine.sharedMemory.pid() ? this : null);
                ringToAnnounce = ring;
            } catch (IOException e) {
                if (RING_FALLBACK_LOGGED.compareAndSet(false, true)) {
                    SoftEngine.logger.warn("soft0: {}: frames to {} stay on the socket (later links' too, when the"
                            + " same happens to them; fix the directory's space or permissions, or set -D{}=false)",
                            e.getMessage(), peer, ShmRing.PROPERTY);
                }
            }
        }
    }

    /**
     * On a same-host link, publishes our queue pair for the peer's one-sided requests and prepares ours; engine
     * thread, once the queue pair is RTS and before ESTABLISHED.
     */
    private void startSharing(SoftQueuePair q) {
        if (sameHost) {
            q.publishShared();
            sharedPeer = new SharedPeer(engine.sharedMemory, peerPid, engine.usage, engine.copyHelper);
            engine.usage.sameHostConnected();
        }
    }

    /**
     * Binds the queue pair and grows the socket's buffers to full size, unless our frames go to a ring
     * ({@link #prepareRing}): the socket then carries only our RING frame, doorbells and the final frame, and the
     * handshake's buffers do (the peer's frames on the socket grow the read buffer if they need it, see
     * {@link #processInput}). Engine thread, before phase CONNECTED.
     */
    private void attach(SoftQueuePair q, ConnectionParameters local, ConnectionParameters remote,
                        boolean readBufInReadMode) {
        if (ringToAnnounce == null) {
            growReadBuffer(readBufInReadMode);
            ByteBuffer w = ByteBuffer.allocateDirect(WRITE_BUFFER_SIZE);
            w.put(writeBuf.flip());
            writeBuf = w;
            writeAddress = DirectMemory.address(w);
        }
        qp = q;
        int rr = Math.max(1, local.responderResources());
        int size = Integer.highestOneBit(rr) == rr ? rr : Integer.highestOneBit(rr) << 1;
        rrPsn = new int[size];
        rrAddress = new long[size];
        rrLength = new int[size];
        rrRkey = new int[size];
        rrMask = size - 1;
        readLimit = Math.max(1, Math.min(local.initiatorDepth(), remote.responderResources()));
    }

    /**
     * Replaces the read buffer with one of {@link #READ_BUFFER_SIZE}, keeping its unread bytes and its mode (read mode
     * from position 0, or write mode after them); engine thread, holding the consumer slot once connected.
     */
    private void growReadBuffer(boolean readMode) {
        ByteBuffer r = ByteBuffer.allocateDirect(READ_BUFFER_SIZE);
        if (readMode) {
            r.put(readBuf).flip();
        } else {
            r.put(readBuf.flip());
        }
        readBuf = r;
        readAddress = DirectMemory.address(r);
    }

    // ------------------------------------------------------------------ engine events

    @Override
    public void onSelected(SelectionKey k) {
        if (silenced) {
            k.interestOps(0);
            return;
        }
        int ready = k.readyOps();
        if ((ready & SelectionKey.OP_CONNECT) != 0) {
            try {
                if (ch.finishConnect()) {
                    connected();
                }
            } catch (IOException e) {
                connectError(e);
                return;
            }
        }
        if ((ready & SelectionKey.OP_WRITE) != 0 && k.isValid()) {
            k.interestOps(k.interestOps() & ~SelectionKey.OP_WRITE);
            pump();
        }
        if ((ready & SelectionKey.OP_READ) != 0 && k.isValid()) {
            onReadable();
        }
    }

    @Override
    public void onFailure(Throwable cause) {
        if (cause instanceof InternalError) {
            ringFault(cause);
            return;
        }
        teardown("internal failure: " + cause, 0, 0, 0);
        closeNow();
    }

    /**
     * A fault on a shared mapping (JDK 17 reports an access to a truncated file so) surfaced in this link's code;
     * engine thread. The links whose files were cut close too (see {@link SoftEngine#closeTruncatedRings}).
     */
    private void ringFault(Throwable cause) {
        engine.closeTruncatedRings(cause, this);
        closeForRingFault(cause);
    }

    /** Closes this link for a fault on a shared mapping, its own or one that surfaced here; engine thread. */
    void closeForRingFault(Throwable cause) {
        String reason = ringFaultReason(cause);
        SoftEngine.logger.warn("soft0: closing the connection with {}: {}", peer, reason);
        teardown(reason, 0, 0, 0);
        closeNow();
    }

    private String ringFaultReason(Throwable cause) {
        if (!ringTruncated()) {
            return "a fault on another link's shared memory (" + cause.getMessage() + ") interrupted the link with "
                    + peer + ": HotSpot raised it here, after the access";
        }
        return "shared-memory ring with " + peer + " faulted (" + cause.getMessage() + "): its file was truncated";
    }

    /** Whether the file of our ring or of the peer's is now shorter than its mapping; any thread. */
    boolean ringTruncated() {
        ShmRing in = inRing;
        ShmRing ours = outRing;
        return in != null && in.truncated() || ours != null && ours.truncated();
    }

    private void watchWritable() {
        SelectionKey k = key;
        if (k != null && k.isValid()) {
            k.interestOps(k.interestOps() | SelectionKey.OP_WRITE);
        }
    }

    private void onReadable() {
        boolean locked = lockConsumer();
        try {
            readAndProcess();
        } finally {
            if (locked) {
                unlockConsumer();
            }
        }
    }

    private void readAndProcess() {
        int n;
        try {
            n = ch.read(readBuf);
        } catch (IOException e) {
            peerGone("connection to " + peer + " reset (" + e.getMessage() + ")");
            return;
        }
        if (n < 0) {
            if (inRing != null && phase == CONNECTED) {
                drainInRing(); // what the peer published before it closed comes first
            }
            String reason = failReason;
            failReason = null;
            peerGone(reason != null ? reason : "peer " + peer + " closed the connection");
            return;
        }
        if (n > 0) {
            heard++;
        }
        if (phase == CLOSING) {
            readBuf.clear();
            return;
        }
        readBuf.flip();
        processInput();
    }

    private void peerGone(String reason) {
        int p = phase;
        if (p == ACTIVE_WAIT_REPLY || p == ACTIVE_CONNECTING) {
            closeNow();
            id.connectFailed(CmEventType.CONNECT_ERROR, null, -1, reason + " during the handshake");
        } else if (p == CONNECTED) {
            teardown(reason, 0, 0, 0);
            closeNow();
        } else {
            SoftCmId i = id;
            closeNow();
            if (i != null && p == PASSIVE_WAIT_APP) {
                i.onDisconnected(reason);
            }
        }
    }

    /** Parses and executes what {@code readBuf} (in read mode) holds, then compacts it and sends responses. */
    private void processInput() {
        try {
            while (failReason == null) {
                int p = phase;
                if (p == ACTIVE_WAIT_REPLY || p == PASSIVE_WAIT_REQUEST) {
                    if (!processHandshake()) {
                        break;
                    }
                    continue;
                }
                if (p != CONNECTED) {
                    if (p != PASSIVE_WAIT_APP) {
                        readBuf.position(readBuf.limit());
                    }
                    break;
                }
                int pos = readBuf.position();
                if (readBuf.remaining() < SoftFrame.HEADER_LENGTH) {
                    break;
                }
                SoftFrame f = inFrame.wrap(readBuf, pos);
                String bad = f.validateHeader();
                if (bad != null) {
                    violation("malformed frame header: " + bad);
                    break;
                }
                int payload = f.payloadLength();
                if (readBuf.capacity() < READ_BUFFER_SIZE && (SoftFrame.HEADER_LENGTH + payload > readBuf.capacity()
                        || !peerSwitched && carriesWork(f.opcode()))) {
                    // A ring link's small buffer, and the peer sends its frames on the socket (it has no ring, or
                    // these came before its RING frame), or one that does not fit: room for the largest, as on any
                    // other link, then parse again from the new buffer's start.
                    try {
                        growReadBuffer(true);
                    } catch (OutOfMemoryError e) {
                        fail("out of direct memory for the socket's read buffer of " + READ_BUFFER_SIZE + " bytes ("
                                + e.getMessage() + "; raise -XX:MaxDirectMemorySize)", 0, 0, 0);
                        break;
                    }
                    continue;
                }
                if (readBuf.remaining() < SoftFrame.HEADER_LENGTH + payload) {
                    break;
                }
                if (peerSwitched) {
                    // The peer published these before it wrote this frame to the socket: they come first.
                    if (inRing != null) {
                        drainInRing();
                    }
                    if (failReason != null) {
                        break;
                    }
                    int op = f.opcode();
                    if (op != SoftFrame.DOORBELL && op != SoftFrame.DISCONNECT && op != SoftFrame.NAK) {
                        violation(SoftFrame.name(op) + " on the socket after the peer's RING frame (expected: "
                                + "DOORBELL, DISCONNECT or NAK; the rest comes through the ring)");
                        break;
                    }
                }
                dispatch(f, readAddress + pos + SoftFrame.HEADER_LENGTH);
                readBuf.position(pos + SoftFrame.HEADER_LENGTH + payload);
            }
        } finally {
            readBuf.compact();
        }
        afterInput();
    }

    /** Whether a frame on the socket does work at the peer's queue pair (not the switch, a doorbell or the end). */
    private static boolean carriesWork(int op) {
        return op != SoftFrame.RING && op != SoftFrame.DOORBELL && op != SoftFrame.DISCONNECT && op != SoftFrame.NAK;
    }

    /** Acts on a failure recorded while executing input, else sends what the input made due. */
    private void afterInput() {
        String reason = failReason;
        if (reason != null) {
            failReason = null;
            teardown(reason, failTerminal, failPsn, failStatus);
            if (failTerminal == 0) {
                closeNow();
            }
            return;
        }
        pump();
    }

    // ------------------------------------------------------------------ the peer's ring (engine thread)

    /** The peer's RING frame: map its ring; from now on its frames come from there. */
    private void onRingAnnounced(SoftFrame f) {
        if (peerUnproven) {
            violation("RING frame from a peer that sent this host's same-host token from a socket that is not one of "
                    + "this host's owned by this user (expected: no ring; a peer replaying the token, or a proxy "
                    + "between the two processes: set -D" + SharedMemoryFiles.SAME_HOST_PROPERTY + "=tcp on both)");
            return;
        }
        if (!sameHost || peerSwitched || f.flags() != 0 || f.psn() != 0 || f.rkey() != 0 || f.imm() != 0) {
            violation("RING frame flags=" + f.flags() + " psn=" + f.psn() + " rkey=" + f.rkey() + " imm=" + f.imm()
                    + " (expected: once, on a same-host link, with flags, psn, rkey and imm 0)");
            return;
        }
        peerSwitched = true;
        SharedMemoryFiles files = engine.sharedMemory;
        if (peerPid == files.pid() && !files.claimOwnRing(f.address(), this)) {
            violation("RING frame names file " + f.address() + " of this process (expected: the peer's own ring: one"
                    + " of ours that no link reads yet and not the ring this link writes)");
            return;
        }
        try {
            inRing = ShmRing.open(engine.sharedMemory.directory, peerPid, f.address(), f.messageLength());
        } catch (java.nio.file.NoSuchFileException e) {
            // The peer closed its end and deleted the ring before we got here (our DISCONNECT crossed its RING
            // frame, say): it writes no more, and its final frame and the socket's end still come.
            return;
        } catch (IOException | RuntimeException | InternalError e) {
            violation("cannot map the ring the peer announced: " + e.getMessage());
            return;
        }
        engine.addRingLink(this);
        SoftQueuePair q = qp;
        q.sendCq.addProgress(this);
        if (q.recvCq != q.sendCq) {
            // Once per queue (a channel has one for both): each entry is a drain attempt per poll.
            q.recvCq.addProgress(this);
        }
    }

    /**
     * Executes the frames the peer published in its ring since the last call; engine thread. Each header is copied
     * out of the mapping before it is checked and used (the peer can rewrite the ring meanwhile); a payload is copied
     * once, from the ring straight into its destination. Failures are recorded with {@link #fail}.
     *
     * @return whether it consumed anything
     */
    private boolean drainInRing() {
        ShmRing r = inRing;
        long start = inHead;
        int frames = 0;
        try {
            long tail = r.tail();
            if (tail == inHead) {
                return false;
            }
            if (tail < inTail || tail - inHead > r.capacity) {
                violation("ring tail=" + tail + " (expected: " + inTail + " or more, at most " + r.capacity
                        + " bytes past the head " + inHead + ")");
                return false;
            }
            inTail = tail;
            while (inHead < tail && failReason == null && phase == CONNECTED) {
                int at = (int) inHead & r.mask;
                int room = r.capacity - at;
                long published = tail - inHead;
                if (room >= SoftFrame.HEADER_LENGTH) {
                    DirectMemory.copy(r.data + at, ringHeaderAddress, SoftFrame.HEADER_LENGTH);
                }
                if (room < SoftFrame.HEADER_LENGTH || ringHeader.get(0) == ShmRing.PAD) {
                    if (published < room) {
                        violation("ring padding at " + inHead + " before the tail passed the end (tail " + tail + ")");
                        break;
                    }
                    inHead += room;
                    r.publishHead(inHead);
                    continue;
                }
                SoftFrame f = ringFrame.wrap(ringHeader, 0);
                String bad = f.validateHeader();
                if (bad != null) {
                    violation("malformed frame header in the ring: " + bad);
                    break;
                }
                int op = f.opcode();
                if (op == SoftFrame.RING || op == SoftFrame.DOORBELL) {
                    violation(SoftFrame.name(op) + " in the ring (expected: on the socket only)");
                    break;
                }
                int length = SoftFrame.HEADER_LENGTH + f.payloadLength();
                if (length > room || length > published) {
                    violation("ring frame of " + length + " bytes at " + inHead + " (expected: whole before the end of"
                            + " the ring, " + room + " bytes, and before the tail, " + published + " bytes)");
                    break;
                }
                dispatch(f, r.data + at + SoftFrame.HEADER_LENGTH);
                inHead += length;
                frames++;
                // Per frame: the writer reuses the room as soon as possible.
                r.publishHead(inHead);
            }
            ShmRing.fence(); // head published, then the writer's flag read: see ShmRing, Ordering
            if (r.takeWriterWaiting()) {
                doorbellPending = true;
            }
        } catch (InternalError e) {
            engine.closeTruncatedRings(e, this);
            String reason = ringFaultReason(e);
            SoftEngine.logger.warn("soft0: closing the connection with {}: {}", peer, reason);
            fail(reason, 0, 0, 0);
        }
        if (frames > 0) {
            engine.sharedMemory.ringFrames.addAndGet(frames);
        }
        return inHead != start;
    }

    /**
     * Engine thread: executes what the peer's ring holds and answers it; whether there was anything. Nothing when a
     * thread polling the queue pair's completion queues is at it ({@link #progress(boolean)}).
     */
    boolean pollRing() {
        if (silenced || !consumer.compareAndSet(null, Thread.currentThread())) {
            return false;
        }
        try {
            if (inRing == null || phase != CONNECTED) {
                return false;
            }
            boolean consumed = drainInRing();
            if (consumed || failReason != null || doorbellPending || ackHeld) {
                // A held acknowledgement waits no longer than the engine's park: its poller may not poll again.
                ackHeld = false;
                afterInput();
            }
            return consumed;
        } finally {
            unlockConsumer();
        }
    }

    /**
     * Executes what the peer's ring holds, on the thread polling one of the queue pair's completion queues: its
     * SENDs land in posted receives and its acknowledgements complete sends without waiting for the engine thread,
     * which a poller that is awake anyway (a busy event loop) would otherwise wake and wait for. Returns at once when
     * the engine or another poller is at it; a failure is handed to the engine thread, which ends the link.
     * Allocates nothing.
     *
     * @param takePark whether the poller stays awake until it arms its completion queue ({@link #pollerSleeps()}):
     *                 it then takes the parked flag the engine set, so that the peer stops ringing the engine's
     *                 doorbell for frames the poller executes anyway
     */
    void progress(boolean takePark) {
        if (silenced || !consumer.compareAndSet(null, Thread.currentThread())) {
            return;
        }
        boolean failed;
        try {
            ShmRing r = inRing;
            if (r == null || phase != CONNECTED || failReason != null) {
                // A failure already recorded is the engine's to act on, handed over once by the poll that found it
                // (not once per poll: a busy-polling loop would queue a task and wake the engine on every poll).
                return;
            }
            try {
                int p = pollerPark;
                if (takePark && p != POLLER_AWAKE && (p == POLLER_ASLEEP || r.isReaderParked())) {
                    // An atomic exchange, so the tail read below sees any frame whose writer found the flag gone.
                    if (r.takeReaderParked() || p == POLLER_ASLEEP) {
                        pollerPark = POLLER_AWAKE;
                    }
                }
            } catch (InternalError e) {
                fail(ringFaultReason(e), 0, 0, 0);
            }
            int received = receivesCompleted;
            boolean consumed = failReason == null && drainInRing();
            failed = failReason != null;
            if (!failed) {
                if (consumed && HOLD_ACKS && !ackHeld && receivesCompleted != received && !doorbellPending
                        && !rnrNakPending && rrHead == rrTail) {
                    // Only an acknowledgement is due, for a message this poller is about to hand up: the answer it
                    // may post goes with it, so the requester wakes once for both (a device's acknowledgement comes
                    // before the requester sleeps; ours comes after our own wake-up, when it does sleep). Never twice in
                    // a row: in a stream of messages that nobody answers, every other poll acknowledges.
                    ackHeld = true;
                } else if (consumed || doorbellPending || (ackHeld && ackPending)) {
                    ackHeld = false;
                    pump();
                } else {
                    ackHeld = false;
                }
            }
        } finally {
            unlockConsumer();
        }
        if (failed) {
            engine.execute(failureTask);
        }
    }

    /**
     * The poller is about to sleep (it armed its completion queue); its next poll (the one after arming) is the last
     * look. With a wake socket ({@code wakePort} > 0) it parks on the ring itself: the peer's next publication sends
     * a datagram that wakes its loop directly, with no engine in between. Without one it gives back the parked flag
     * it took, so that the peer rings the engine's doorbell again. If the engine or another poller holds the link now,
     * the flag stays with them; a poller that stops without arming, or whose datagram is lost, is covered by the
     * engine's short park ({@link SoftEngine}), which polls every ring.
     *
     * @param wakePort the UDP port of the poller's {@link io.rdmabridge.verbs.EventNotifier#loopbackWakePort() wake
     *                 socket}, or {@code 0}
     */
    void pollerSleeps(int wakePort) {
        if (!consumer.compareAndSet(null, Thread.currentThread())) {
            return;
        }
        try {
            if (ackHeld) {
                ackHeld = false;
                pump();
            }
            ShmRing r = inRing;
            if (r != null && phase == CONNECTED) {
                long wake = ShmRing.wakeAddress(wakePort);
                if (wake != 0) {
                    r.readerWake(wake);
                    r.readerParked(true);
                    pollerPark = POLLER_ASLEEP;
                    ShmRing.fence(); // flag stored, then the caller's poll reads the tail: see ShmRing, Ordering
                } else if (pollerPark != POLLER_NONE) {
                    pollerPark = POLLER_NONE;
                    r.readerWake(0);
                    r.readerParked(true);
                    ShmRing.fence();
                }
            }
        } catch (InternalError e) {
            fail(ringFaultReason(e), 0, 0, 0);
            engine.execute(failureTask);
        } finally {
            unlockConsumer();
        }
    }

    /** Engine thread: ends the link for a failure a completion-queue poller recorded. */
    private void actOnFailure() {
        boolean locked = lockConsumer();
        try {
            if (failReason != null) {
                afterInput();
            }
        } finally {
            if (locked) {
                unlockConsumer();
            }
        }
    }

    /**
     * Takes {@link #consumer} for this thread, waiting out another holder (a poller's drain of at most one ring's
     * worth of frames); {@code false} when this thread holds it already.
     */
    private boolean lockConsumer() {
        Thread me = Thread.currentThread();
        if (consumer.get() == me) {
            return false;
        }
        int spins = 0;
        while (!consumer.compareAndSet(null, me)) {
            if (++spins < 100) {
                Thread.onSpinWait();
            } else {
                Thread.yield();
            }
        }
        return true;
    }

    private void unlockConsumer() {
        consumer.set(null);
    }

    /**
     * Engine thread, before it blocks: asks the peer for a DOORBELL when it publishes, then looks again.
     *
     * @return whether frames are there already (then the engine must not block)
     */
    boolean parkRing() {
        ShmRing r = inRing;
        if (r == null || phase != CONNECTED || silenced) {
            return false;
        }
        try {
            if (pollerPark != POLLER_ASLEEP) {
                r.readerWake(0);
            } // else the sleeping poller's wake socket stays the target; the flag is set again in case we cleared it
            r.readerParked(true);
            ShmRing.fence(); // flag stored, then the tail read: see ShmRing, Ordering
            // inHead may be a poller's, read racily: a stale value can only be older, so the look errs to "arrived";
            // and a poller that is draining now looks again itself before it sleeps (pollerSleeps).
            return r.tail() != inHead;
        } catch (InternalError e) {
            ringFault(e);
            return false;
        }
    }

    /** Engine thread, awake again: polling, it needs no doorbells (but a sleeping poller keeps its wake-up). */
    void unparkRing() {
        ShmRing r = inRing;
        if (r == null || pollerPark == POLLER_ASLEEP) {
            return;
        }
        try {
            r.readerParked(false);
        } catch (InternalError e) {
            ringFault(e);
        }
    }

    private void violation(String what) {
        if (phase == PASSIVE_WAIT_REQUEST) {
            // Before any connect request: any host that reaches a listener can send garbage, one socket after
            // another, and nothing else reports it. Once connected, the queue pair's failure names it too.
            VIOLATIONS.warn("soft0: closing the connection with {}: protocol violation: {}", peer, what);
        } else {
            SoftEngine.logger.warn("soft0: closing the connection with {}: protocol violation: {}", peer, what);
        }
        fail("protocol violation by " + peer + ": " + what, 0, 0, 0);
    }

    private void fail(String reason, int terminal, int psn, int status) {
        if (failReason == null) {
            failReason = reason;
            failTerminal = terminal;
            failPsn = psn;
            failStatus = status;
        }
    }

    /** @return whether parsing may go on with data frames */
    private boolean processHandshake() {
        int pos = readBuf.position();
        if (readBuf.remaining() < SoftHandshake.HEADER_LENGTH) {
            return false;
        }
        SoftHandshake h = handshake.wrap(readBuf, pos);
        boolean passive = phase == PASSIVE_WAIT_REQUEST;
        String bad = h.validate(passive ? 1 << SoftHandshake.CONNECT
                : (1 << SoftHandshake.ACCEPT) | (1 << SoftHandshake.REJECT));
        if (bad != null) {
            if (passive) {
                violation("bad handshake: " + bad);
            } else {
                closeNow();
                id.connectFailed(CmEventType.CONNECT_ERROR, null, -1, "bad handshake from " + peer + ": " + bad);
                SoftEngine.logger.warn("soft0: closing the connection with {}: bad handshake: {}", peer, bad);
            }
            return false;
        }
        int dataLength = h.privateDataLength();
        if (readBuf.remaining() < SoftHandshake.HEADER_LENGTH + dataLength) {
            return false;
        }
        byte[] data = new byte[dataLength];
        readBuf.get(pos + SoftHandshake.HEADER_LENGTH, data);
        readBuf.position(pos + SoftHandshake.HEADER_LENGTH + dataLength);
        int kind = h.kind();
        if (passive) {
            handshakeDone();
            ConnectionParameters params = h.parameters(data);
            SoftCmId l = listener;
            if (!l.isListening()) {
                handshakeOut = SoftHandshake.encode(SoftHandshake.REJECT, 0, null, new byte[0],
                        SoftCmId.REJECT_NO_LISTENER);
                closeAfterFlush = true;
                phase = CLOSING;
                engine.schedule(() -> engine.execute(closeTask), LINGER_NANOS);
                return false;
            }
            phase = PASSIVE_WAIT_APP;
            key.interestOps(0);
            InetSocketAddress localAddress;
            InetSocketAddress remoteAddress;
            try {
                localAddress = (InetSocketAddress) ch.getLocalAddress();
                remoteAddress = (InetSocketAddress) ch.getRemoteAddress();
            } catch (IOException e) {
                closeNow();
                return false;
            }
            peerToken = h.hostToken();
            peerPid = h.pid();
            peerQpn = h.qpNumber();
            SoftCmId p = SoftCmId.passive(l, localAddress, remoteAddress, params);
            p.tcpLink = this;
            id = p;
            p.requested(data);
            return false;
        }
        SoftCmId i = id;
        if (kind == SoftHandshake.REJECT) {
            closeNow();
            i.connectFailed(CmEventType.REJECTED, data, h.status(), "rejected by the peer at " + peer);
            return false;
        }
        ConnectionParameters params = h.parameters(data);
        InetSocketAddress localAddress;
        try {
            localAddress = (InetSocketAddress) ch.getLocalAddress();
        } catch (IOException e) {
            localAddress = null;
        }
        peerToken = h.hostToken();
        peerPid = h.pid();
        peerQpn = h.qpNumber();
        if (!i.connectAccepted(this, params, localAddress)) {
            closeNow();
            return false;
        }
        SoftQueuePair q = i.softQueuePair();
        q.peerParams = params;
        prepareRing();
        attach(q, q.localParams, params, true);
        phase = CONNECTED;
        engine.links.add(this);
        watchLiveness();
        if (q.state == QpState.DESTROYED) {
            teardown("queue pair " + q.qpn + " destroyed before the connection was up", SoftFrame.DISCONNECT, 0, 0);
            return false;
        }
        q.markReadyToSend(this);
        startSharing(q);
        i.emit(CmEventType.ESTABLISHED, data, 0, null);
        return true;
    }

    // ------------------------------------------------------------------ frame execution (engine thread)

    private void dispatch(SoftFrame f, long payloadAddress) {
        int op = f.opcode();
        switch (op) {
            case SoftFrame.SEND:
            case SoftFrame.SEND_WITH_IMM:
            case SoftFrame.WRITE:
            case SoftFrame.WRITE_WITH_IMM:
            case SoftFrame.READ_REQUEST:
            case SoftFrame.DIRECT:
                onRequest(f, payloadAddress);
                break;
            case SoftFrame.ACK:
            case SoftFrame.NAK:
            case SoftFrame.RNR_NAK:
            case SoftFrame.READ_RESPONSE:
                onResponse(f, payloadAddress);
                break;
            case SoftFrame.DISCONNECT:
                fail("peer " + peer + " disconnected", 0, 0, 0);
                break;
            case SoftFrame.RING:
                onRingAnnounced(f);
                break;
            case SoftFrame.DOORBELL:
                if (!sameHost) {
                    violation("DOORBELL on a link that is not same-host");
                }
                // Nothing else: the peer's ring was drained before this frame, and the pump that follows the input
                // finds the room the peer freed in ours.
                break;
            default:
                violation("opcode=" + op);
        }
    }

    private void onRequest(SoftFrame f, long payloadAddress) {
        SoftQueuePair q = qp;
        q.rqLock.lock();
        try {
            if (q.state != QpState.RTS) {
                return;
            }
            executeRequest(q, f, payloadAddress);
        } finally {
            q.rqLock.unlock();
        }
    }

    private void executeRequest(SoftQueuePair q, SoftFrame f, long payloadAddress) {
        int op = f.opcode();
        int flags = f.flags();
        int psn = f.psn();
        int payload = f.payloadLength();
        int length = f.messageLength();
        boolean first = (flags & SoftFrame.FIRST) != 0;
        boolean last = (flags & SoftFrame.LAST) != 0;
        if (op == SoftFrame.DIRECT) {
            // Named one by one: the WARN says which rule the peer broke.
            String bad = !sameHost ? "on a link that is not same-host (no one-sided requests allowed)"
                    : inMessage ? "inside message psn " + msgPsn + " (expected: between messages)"
                    : discarding ? "while waiting for the retransmission of psn " + discardPsn
                    : psn != expectedPsn ? "psn " + psn + " (expected: " + expectedPsn + ")"
                    : !first || !last ? "flags " + flags + " (expected: FIRST and LAST)"
                    : length < 1 || length > MAX_DIRECT ? "count " + length + " (expected: 1.." + MAX_DIRECT + ")"
                    : null;
            if (bad != null) {
                violation("DIRECT psn=" + psn + " count=" + length + " " + bad);
                return;
            }
            expectedPsn += length; // the requester executed them itself, in our shared memory
            return;
        }
        if (discarding) {
            int d = psn - discardPsn;
            if (d == 0 && first) {
                discarding = false;
            } else if (d >= 0 && d < SoftDevice.MAX_QP_WR) {
                return;
            } else {
                violation("psn=" + psn + " while waiting for the retransmission of psn " + discardPsn);
                return;
            }
        }
        boolean write = op == SoftFrame.WRITE || op == SoftFrame.WRITE_WITH_IMM;
        if (first) {
            if (inMessage) {
                violation("psn=" + psn + " starts a message inside message psn " + msgPsn);
                return;
            }
            if (psn != expectedPsn) {
                violation("psn=" + psn + " (expected: " + expectedPsn + ")");
                return;
            }
            if (op == SoftFrame.READ_REQUEST) {
                if (!last) {
                    violation("READ_REQUEST without LAST flag");
                    return;
                }
                if (length > 0 && !q.remotePermits(f.rkey(), f.address(), length, Access.REMOTE_READ)) {
                    q.markError();
                    fail("RDMA READ of " + length + " bytes at 0x" + Long.toHexString(f.address()) + " with rkey 0x"
                            + Integer.toHexString(f.rkey()) + " refused", SoftFrame.NAK, psn, WcStatus.REM_ACCESS_ERR);
                    return;
                }
                if (rrTail - rrHead > rrMask) {
                    violation("more than " + (rrMask + 1) + " RDMA READs outstanding (expected: at most the"
                            + " negotiated responder resources)");
                    return;
                }
                int k = (int) rrTail & rrMask;
                rrPsn[k] = psn;
                rrAddress[k] = f.address();
                rrLength[k] = length;
                rrRkey[k] = f.rkey();
                rrTail = rrTail + 1;
                expectedPsn++;
                return;
            }
            long recv = -1;
            if (op != SoftFrame.WRITE) {
                recv = q.rqHead;
                if (recv == q.rqTail) {
                    discarding = true;
                    discardPsn = psn;
                    rnrNakPsn = psn;
                    rnrNakPending = true;
                    return;
                }
            }
            if (write) {
                if (length > 0 && !q.remotePermits(f.rkey(), f.address(), length, Access.REMOTE_WRITE)) {
                    q.markError();
                    fail("RDMA WRITE of " + length + " bytes at 0x" + Long.toHexString(f.address()) + " with rkey 0x"
                            + Integer.toHexString(f.rkey()) + " refused", SoftFrame.NAK, psn, WcStatus.REM_ACCESS_ERR);
                    return;
                }
            } else {
                int r = q.rIndex(recv);
                if (q.checkRecv(r) != WcStatus.SUCCESS) {
                    q.failRecvLocked(recv, WcStatus.LOC_PROT_ERR);
                    fail("receive buffer of queue pair " + q.qpn + " not writable", SoftFrame.NAK, psn,
                            WcStatus.REM_OP_ERR);
                    return;
                }
                if (length > q.rLength[r]) {
                    // ibv_poll_cq(3)'s pair, as mlx5 reports it (rxe: LOC_QP_OP_ERR / REM_OP_ERR; both allowed).
                    q.failRecvLocked(recv, WcStatus.LOC_LEN_ERR);
                    fail("SEND of " + length + " bytes larger than the posted receive of " + q.rLength[r] + " bytes",
                            SoftFrame.NAK, psn, WcStatus.REM_INV_REQ_ERR);
                    return;
                }
            }
            inMessage = true;
            msgPsn = psn;
            msgOp = op;
            msgLength = length;
            msgOffset = 0;
            msgAddress = f.address();
            msgRkey = f.rkey();
            msgRecv = recv;
        } else {
            if (!inMessage || psn != msgPsn || op != msgOp || length != msgLength) {
                violation("continuation frame op=" + SoftFrame.name(op) + " psn=" + psn + " length=" + length
                        + " outside a message (expected: " + (inMessage ? "psn " + msgPsn : "a FIRST frame") + ")");
                return;
            }
        }
        if (write && (f.address() != msgAddress + msgOffset || f.rkey() != msgRkey)) {
            violation("WRITE frame address=0x" + Long.toHexString(f.address()) + " (expected: 0x"
                    + Long.toHexString(msgAddress + msgOffset) + ")");
            return;
        }
        if (payload > msgLength - msgOffset) {
            violation("payloadLength=" + payload + " beyond the message length " + msgLength + " at offset "
                    + msgOffset);
            return;
        }
        if (payload > 0) {
            if (write) {
                long dst = msgAddress + msgOffset;
                SoftMemoryRegion target = q.beginRemoteAccess(msgRkey, dst, payload, Access.REMOTE_WRITE);
                if (target == null) {
                    q.markError();
                    fail("RDMA WRITE into a region deregistered mid-message", SoftFrame.NAK, psn,
                            WcStatus.REM_ACCESS_ERR);
                    return;
                }
                try {
                    Runnable hook = engine.faults.beforeRemoteWriteCopy();
                    if (hook != null) {
                        hook.run();
                    }
                    DirectMemory.copy(payloadAddress, dst, payload);
                } finally {
                    target.endRemoteAccess();
                }
            } else {
                int r = q.rIndex(msgRecv);
                if (q.checkRecv(r) != WcStatus.SUCCESS) {
                    q.failRecvLocked(msgRecv, WcStatus.LOC_PROT_ERR);
                    fail("receive buffer of queue pair " + q.qpn + " deregistered mid-message", SoftFrame.NAK, psn,
                            WcStatus.REM_OP_ERR);
                    return;
                }
                q.scatterRecv(r, msgOffset, payloadAddress, payload);
            }
        }
        msgOffset += payload;
        if (last != (msgOffset == msgLength)) {
            violation("LAST flag " + last + " at offset " + msgOffset + " of a " + msgLength + "-byte message");
            return;
        }
        if (!last) {
            return;
        }
        inMessage = false;
        expectedPsn++;
        if (op != SoftFrame.WRITE) {
            boolean imm = op != SoftFrame.SEND;
            int wcOp = write ? WcOpcode.RECV_RDMA_WITH_IMM : WcOpcode.RECV;
            q.consumeRecvLocked(msgRecv, WcStatus.SUCCESS, wcOp, msgLength, imm, f.imm());
            receivesCompleted++;
        }
        ackPsn = psn;
        ackPending = true;
    }

    private void onResponse(SoftFrame f, long payloadAddress) {
        SoftQueuePair q = qp;
        boolean failed;
        boolean wake = false;
        q.sqLock.lock();
        try {
            long head = q.sqHead;
            long sent = q.sqSent;
            int op = f.opcode();
            int psn = f.psn();
            if (q.state != QpState.RTS) {
                return; // flushed already: responses that crossed the teardown change nothing
            }
            if (op == SoftFrame.READ_RESPONSE) {
                wake = onReadResponse(q, f, payloadAddress, head, sent);
            } else if (op == SoftFrame.ACK) {
                long seq = seqOf(psn, head - q.sqDepth, sent);
                if (seq < 0) {
                    violation("ACK psn=" + psn + " outside the window of sent requests");
                    return;
                }
                long refused = rewindSeq;
                if (refused >= 0 && seq >= refused) {
                    violation("ACK psn=" + psn + " for a request it refused with RNR_NAK (psn=" + (int) refused
                            + ") and has not received again");
                    return;
                }
                markAcked(q, head, seq + 1);
                if (sharedWaiting) {
                    sharedWaiting = false;
                    wake = true;
                }
            } else {
                long seq = seqOf(psn, head - q.sqDepth, sent);
                if (seq < 0) {
                    violation(SoftFrame.name(op) + " psn=" + psn + " outside the window of outstanding requests");
                    return;
                }
                if (seq < head) {
                    return; // about a request already completed: stale, as on a real fabric
                }
                // A responder executes requests in order and answers nothing past one it refuses or fails. Taken,
                // such a refusal rewound the send queue below requests that then completed (a READ before them was
                // answered), and the RNR timer sent their memory again, with whatever the application, or another
                // connection, keeps there now.
                if (seq < ackFloor) {
                    violation(SoftFrame.name(op) + " psn=" + psn + " for a request it acknowledged already");
                    return;
                }
                if (answeredReadFrom(q, seq, sent)) {
                    violation(SoftFrame.name(op) + " psn=" + psn + " before an RDMA READ it has answered since");
                    return;
                }
                markAcked(q, head, seq);
                int i = q.sIndex(seq);
                if (op == SoftFrame.NAK) {
                    int status = f.imm();
                    if (status != WcStatus.REM_ACCESS_ERR && status != WcStatus.REM_INV_REQ_ERR
                            && status != WcStatus.REM_OP_ERR) {
                        violation("NAK status=" + status + " (expected: REM_ACCESS_ERR, REM_INV_REQ_ERR or"
                                + " REM_OP_ERR)");
                        return;
                    }
                    q.sStatus[i] = status;
                    q.retireLocked();
                    fail("peer " + peer + " failed psn " + psn + " with " + WcStatus.name(status), 0, 0, 0);
                    return;
                }
                int wrOp = q.sOpcode[i];
                if (wrOp == WrOpcode.RDMA_WRITE || wrOp == WrOpcode.RDMA_READ) {
                    violation("RNR_NAK psn=" + psn + " for a " + WrOpcode.name(wrOp)
                            + " (expected: a request that consumes a receive)");
                    return;
                }
                int attempt = ++q.sRnrCount[i];
                if (attempt > q.peerParams.rnrRetryCount()) {
                    q.sStatus[i] = WcStatus.RNR_RETRY_EXC_ERR;
                } else {
                    long delay = SoftQueuePair.RNR_TIMER_NANOS;
                    resumeAt = System.nanoTime() + delay;
                    rewindSeq = seq;
                    engine.schedule(pumpTask, delay);
                }
            }
            failed = q.retireLocked();
        } finally {
            q.sqLock.unlock();
        }
        if (failed) {
            fail("queue pair " + q.qpn + " failed a work request", SoftFrame.DISCONNECT, 0, 0);
        } else if (wake) {
            if (engine.onEngineThread()) {
                pump();
            } else {
                // What waited is large one-sided work (a READ's copy of 64 KiB and more): the engine does it, as a
                // NIC would, rather than the completion-queue poller that happened to take this acknowledgement.
                engine.execute(pumpTask);
            }
        }
    }

    /** The sequence number in {@code [lo, hi)} whose low 32 bits are {@code psn}, or -1. */
    private static long seqOf(int psn, long lo, long hi) {
        long d = (psn - (int) lo) & 0xffffffffL;
        return d < hi - lo ? lo + d : -1;
    }

    /** Every non-READ request before {@code end} is done: its responder has executed it. */
    private void markAcked(SoftQueuePair q, long head, long end) {
        for (long s = Math.max(ackFloor, head); s < end; s++) {
            int i = q.sIndex(s);
            if (q.sOpcode[i] != WrOpcode.RDMA_READ) {
                q.sDone[i] = true;
            }
        }
        if (end > ackFloor) {
            ackFloor = end;
        }
    }

    /** Whether the peer has answered, whole or in part, an RDMA READ in {@code [seq, sent)}. */
    private boolean answeredReadFrom(SoftQueuePair q, long seq, long sent) {
        if (readOffset > 0 && readScan >= seq) {
            return true; // the READ at readScan is answered in part
        }
        for (long s = seq; s < Math.min(readScan, sent); s++) {
            int i = q.sIndex(s);
            if (q.sOpcode[i] == WrOpcode.RDMA_READ && q.sDone[i]) {
                return true;
            }
        }
        return false;
    }

    /** @return whether a READ completed (the pump may send READs it held back) */
    private boolean onReadResponse(SoftQueuePair q, SoftFrame f, long payloadAddress, long head, long sent) {
        long s = Math.max(readScan, head);
        while (s < sent) {
            int i = q.sIndex(s);
            if (q.sOpcode[i] == WrOpcode.RDMA_READ && !q.sDone[i]) {
                break;
            }
            s++;
        }
        readScan = s;
        int psn = f.psn();
        if (s >= sent || (int) s != psn) {
            violation("READ_RESPONSE psn=" + psn + " matches no outstanding RDMA READ");
            return false;
        }
        int i = q.sIndex(s);
        int length = q.sLength[i];
        int payload = f.payloadLength();
        if (f.address() != readOffset || f.messageLength() != length || payload > length - readOffset) {
            violation("READ_RESPONSE offset=" + f.address() + " payloadLength=" + payload + " messageLength="
                    + f.messageLength() + " (expected: offset " + readOffset + " of " + length + " bytes)");
            return false;
        }
        boolean last = readOffset + payload == length;
        if (last != ((f.flags() & SoftFrame.LAST) != 0)) {
            violation("READ_RESPONSE LAST flag mismatch at offset " + readOffset);
            return false;
        }
        if (payload > 0 && q.sStatus[i] == WcStatus.SUCCESS) {
            if (q.checkLocal(i) != WcStatus.SUCCESS) {
                q.sStatus[i] = WcStatus.LOC_PROT_ERR;
            } else {
                q.scatterRead(i, readOffset, payloadAddress, payload);
            }
        }
        readOffset += payload;
        if (!last) {
            return false;
        }
        readOffset = 0;
        q.sDone[i] = true;
        readScan = s + 1;
        readsInFlight.decrementAndGet();
        return true;
    }

    // ------------------------------------------------------------------ writing

    @Override
    void sendQueueReady(SoftQueuePair q) {
        pump();
    }

    /** Drains everything ready to go into the socket; one drainer at a time, any thread. */
    void pump() {
        if (silenced && phase != CLOSED) {
            return;
        }
        for (;;) {
            try {
                pumpOnce();
                return;
            } catch (InternalError late) {
                // HotSpot 17 raises a fault of a shared mapping at the thread's next safepoint or VM transition, which
                // may lie past drain()'s catch, in the bookkeeping below, even after this thread let go of the slot.
                // Whoever drains next breaks the link with it; this thread lets go if it still holds the slot.
                lateFault = late;
                drainer.compareAndSet(Thread.currentThread(), null);
            }
        }
    }

    private void pumpOnce() {
        Thread me = Thread.currentThread();
        boolean asked = false;
        boolean broken = false;
        Throwable cause = null;
        for (;;) {
            if (drainer.get() != null || !drainer.compareAndSet(null, me)) {
                if (asked) {
                    break;
                }
                // The drainer reads this after it lets go (both volatile): it drains again, or our next try does.
                asked = true;
                pumpRequested = true;
                continue;
            }
            do {
                if (pumpRequested) {
                    pumpRequested = false; // before drain(): it sees what the request was for
                }
                InternalError late = lateFault;
                if (late != null) {
                    lateFault = null;
                    if (!broken) {
                        broken = true;
                        cause = late;
                    }
                }
                if (!broken) {
                    try {
                        drain();
                    } catch (IOException | RuntimeException | Error e) {
                        // An Error too (out of memory, say): the link breaks with its cause, the slot is let go.
                        broken = true;
                        cause = e;
                    }
                    engine.faults.throwArmedLateMappingFault(qp);
                } else if (phase == CLOSED) {
                    // closeNow's pump merged into this broken run, which skips drain(): release our ring here, still
                    // as the only drainer, or nothing would (the close task's own pump has come and gone).
                    releaseOurRing();
                }
            } while (pumpRequested);
            drainer.set(null);
            if (!pumpRequested) {
                break;
            }
        }
        if (broken && phase != CLOSED) {
            if (phase == CONNECTED) {
                String reason = "connection to " + peer + " broke while writing: " + cause;
                if (cause instanceof RingFailure) {
                    reason = "protocol violation by " + peer + ": " + cause.getMessage();
                } else if (cause instanceof InternalError) {
                    reason = ringFaultReason(cause);
                    Throwable fault = cause;
                    engine.execute(() -> engine.closeTruncatedRings(fault, this));
                }
                if (cause instanceof RingFailure || cause instanceof InternalError) {
                    SoftEngine.logger.warn("soft0: closing the connection with {}: {}", peer, reason);
                } else if (!(cause instanceof IOException)) {
                    // Not the socket: a fault in this provider. Its stack is the only way to find it.
                    SoftEngine.logger.warn("soft0: closing the connection with {}: {}", peer, reason, cause);
                }
                teardown(reason, 0, 0, 0);
            }
            engine.execute(closeTask);
            return;
        }
        if (gatherFailed) {
            gatherFailed = false;
            SoftQueuePair q = qp;
            boolean failed;
            q.sqLock.lock();
            try {
                failed = q.retireLocked();
            } finally {
                q.sqLock.unlock();
            }
            if (failed) {
                teardown("queue pair " + q.qpn + " failed a work request", SoftFrame.DISCONNECT, 0, 0);
            }
        }
        if (sharedFailed) {
            sharedFailed = false;
            String why = sharedPeer.failure();
            teardown("queue pair " + qp.qpn + " failed a work request" + (why == null ? "" : ": " + why),
                    SoftFrame.DISCONNECT, 0, 0);
        }
        if (readResponseFailed) {
            readResponseFailed = false;
            teardown("RDMA READ source deregistered while answering", SoftFrame.NAK, readResponseFailedPsn,
                    WcStatus.REM_ACCESS_ERR);
        }
    }

    private void drain() throws IOException {
        if (phase == CLOSED) {
            releaseOurRing();
            return;
        }
        SocketChannel c = ch;
        if (c == null || phase == ACTIVE_CONNECTING) {
            return;
        }
        for (;;) {
            boolean ring = outRing != null;
            boolean added;
            if (ring) {
                added = fillRing();
            } else {
                out = writeBuf;
                outAddress = writeAddress;
                added = fill();
            }
            if (writeBuf.position() > 0) {
                writeBuf.flip();
                if (c.write(writeBuf) > 0 && socketFull) {
                    delivered++;
                }
                socketFull = writeBuf.hasRemaining();
                writeBuf.compact();
                if (writeBuf.position() > 0) {
                    engine.execute(writeInterestTask);
                    if (!ring || !added) {
                        return;
                    }
                }
                continue;
            }
            if (ring && added) {
                continue;
            }
            if (closeAfterFlush) {
                closeAfterFlush = false;
                engine.execute(lingerTask);
            }
            return;
        }
    }

    /**
     * The drainer's side of our ring: encodes ready frames straight into its free window, publishes them and rings
     * the peer's doorbell if it parked; until nothing more fits or is ready.
     *
     * @return whether it published anything
     */
    private boolean fillRing() throws RingFailure {
        ShmRing r = outRing;
        boolean progress = false;
        for (;;) {
            long head = r.head();
            if (head < outHead || head > outTail) {
                throw new RingFailure("head of our ring=" + head + " (expected: " + outHead + ".." + outTail + ")");
            }
            outHead = head;
            int at = (int) outTail & r.mask;
            int room = r.capacity - at;
            long free = r.capacity - (outTail - head);
            if (room < ShmRing.MIN_ROOM && free >= room) {
                // Frames never wrap: the rest is padding and the next frame starts at the beginning.
                r.pad(at);
                outTail += room;
                continue;
            }
            ByteBuffer w = r.window;
            w.limit(at + (int) Math.min(room, free)).position(at);
            out = w;
            outAddress = r.data;
            fill();
            int wrote = w.position() - at;
            outTail += wrote;
            if (outTail != outPublished) {
                r.publishTail(outTail);
                outPublished = outTail;
                progress = true;
                ShmRing.fence(); // tail published, then the reader's flag read: see ShmRing, Ordering
                if (r.takeReaderParked() && !wakePeerLoop(r.readerWake())) {
                    doorbellPending = true; // the next fill() sends it, after this publication
                }
            }
            if (wrote == 0) {
                if (free < ShmRing.MAX_FRAME) {
                    // Perhaps too full for what is ready: ask for a doorbell, then look at the head again.
                    r.writerWaiting();
                    ShmRing.fence();
                    if (r.head() != head) {
                        continue;
                    }
                }
                return progress;
            }
        }
    }

    /**
     * Drainer: wakes the peer's sleeping poller with a one-byte datagram to the wake socket its parked flag named;
     * whether it went. A peer may name any port: it is of our user (it opened our owner-only ring file) and could
     * send the datagram itself, and we send at most one per publication. Anything else (no port, another network
     * namespace, a full or closed socket) falls back to the DOORBELL, which always reaches the peer's engine.
     */
    private boolean wakePeerLoop(long wake) {
        int port = ShmRing.wakePort(wake);
        if (port == 0) {
            return false;
        }
        try {
            DatagramChannel ch = wakeOut;
            if (ch == null || port != wakeOutPort) {
                if (ch == null) {
                    ch = DatagramChannel.open(StandardProtocolFamily.INET);
                    ch.configureBlocking(false);
                    wakeOut = ch;
                } else {
                    ch.disconnect();
                }
                // Connected, so each wake-up is a plain write: no address to check or allocate.
                wakeOutPort = 0;
                ch.connect(new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
                wakeOutPort = port;
            }
            wakeDatagram.clear();
            if (ch.write(wakeDatagram) != 1) {
                return false;
            }
            engine.sharedMemory.directWakes.incrementAndGet();
            return true;
        } catch (IOException e) {
            // PortUnreachableException: the peer's loop is gone, its engine handles the rest. A channel closed by an
            // interrupt of the drainer thread is opened again by the next wake-up.
            DatagramChannel ch = wakeOut;
            if (ch != null && !ch.isOpen()) {
                wakeOut = null;
            }
            return false;
        }
    }

    /** Lets go of our ring and deletes its file (the peer keeps its mapping until it closes); drainer, once CLOSED. */
    private void releaseOurRing() {
        DatagramChannel w = wakeOut;
        wakeOut = null;
        if (w != null) {
            try {
                w.close();
            } catch (IOException e) {
                // Released either way.
            }
        }
        ShmRing a = ringToAnnounce;
        ringToAnnounce = null;
        ShmRing r = outRing;
        outRing = null;
        out = writeBuf;
        if (a != null) {
            a.closeFile();
            engine.sharedMemory.ringReleased(a.number);
            engine.sharedMemory.free(a.map);
        }
        if (r != null) {
            r.closeFile();
            engine.sharedMemory.ringReleased(r.number);
            engine.sharedMemory.free(r.map);
        }
    }

    /** The peer spoiled our ring's counter: a protocol violation found while writing. */
    static final class RingFailure extends IOException {
        RingFailure(String message) {
            super(message);
        }
    }

    /**
     * Encodes ready frames into {@link #out} (the write buffer, or our ring's window); returns whether it added any.
     * The handshake, DOORBELLs, the RING frame and the final DISCONNECT or NAK go to the write buffer whatever
     * {@code out} is: the socket carries them.
     */
    private boolean fill() {
        int start = out.position();
        byte[] hs = handshakeOut;
        if (hs != null) {
            if (writeBuf.remaining() < hs.length) {
                return false;
            }
            writeBuf.put(hs);
            handshakeOut = null;
        }
        if (phase != CONNECTED && terminalOp == 0) {
            return out.position() != start;
        }
        if (doorbellPending && writeBuf.remaining() >= SoftFrame.HEADER_LENGTH) {
            doorbellPending = false;
            putSocketHeader(SoftFrame.DOORBELL, 0, 0, 0, 0);
            engine.sharedMemory.doorbells.incrementAndGet();
        }
        ShmRing announce = ringToAnnounce;
        if (announce != null && outRing == null && terminalOp == 0) {
            if (writeBuf.remaining() < SoftFrame.HEADER_LENGTH) {
                return out.position() != start;
            }
            // The last frame before the switch: everything after it goes into the ring.
            putSocketHeader(SoftFrame.RING, 0, announce.capacity, announce.number, 0);
            ringToAnnounce = null;
            outRing = announce;
            return true;
        }
        if (ackPending && room() >= SoftFrame.HEADER_LENGTH) {
            ackPending = false;
            putHeader(SoftFrame.ACK, 0, ackPsn, 0, 0, 0, 0, 0);
        }
        if (rnrNakPending && room() >= SoftFrame.HEADER_LENGTH) {
            rnrNakPending = false;
            putHeader(SoftFrame.RNR_NAK, 0, rnrNakPsn, 0, 0, 0, 0, 0);
        }
        fillReadResponses();
        if (terminalOp != 0) {
            // On the socket even after the switch: the socket's end follows it, and the peer drains our ring first.
            if (!terminalWritten && writeBuf.remaining() >= SoftFrame.HEADER_LENGTH) {
                putSocketHeader(terminalOp, terminalPsn, 0, 0, terminalStatus);
                terminalWritten = true;
                closeAfterFlush = true;
            }
            return out.position() != start;
        }
        fillRequests();
        return out.position() != start;
    }

    private int room() {
        return out.remaining();
    }

    private void putHeader(int op, int flags, int psn, int payload, int length, long address, int rkey, int imm) {
        int pos = out.position();
        outFrame.wrap(out, pos).header(op, flags, psn, payload, length, address, rkey, imm);
        out.position(pos + SoftFrame.HEADER_LENGTH + payload);
    }

    /** A frame without payload into the write buffer, whatever {@link #out} is; the caller checked the room. */
    private void putSocketHeader(int op, int psn, int length, long address, int imm) {
        int pos = writeBuf.position();
        outFrame.wrap(writeBuf, pos).header(op, 0, psn, 0, length, address, 0, imm);
        writeBuf.position(pos + SoftFrame.HEADER_LENGTH);
    }

    /** How much of {@code remaining} bytes to put in the next frame, or -1 when the buffer is too full for it. */
    private int chunk(int remaining) {
        int c = Math.min(remaining, Math.min(SoftFrame.MAX_PAYLOAD, room() - SoftFrame.HEADER_LENGTH));
        if (c < 0 || (c < remaining && c < MIN_CHUNK)) {
            return -1;
        }
        return c;
    }

    private void fillReadResponses() {
        SoftQueuePair q = qp;
        QpState state = q.state;
        if (state == QpState.DESTROYED || state == QpState.ERROR) {
            // A device answers no READ for a queue pair that is gone or broken: the memory may be the
            // application's again.
            rrHead = rrTail;
            rrOffset = 0;
            return;
        }
        while (rrHead < rrTail) {
            int k = (int) rrHead & rrMask;
            int length = rrLength[k];
            int c = chunk(length - rrOffset);
            if (c < 0) {
                return;
            }
            long src = rrAddress[k] + rrOffset;
            if (c > 0) {
                // A region withdrawn from here on waits for the copy (its memory may be unmapped once it returns).
                SoftMemoryRegion source = q.beginRemoteAccess(rrRkey[k], src, c, Access.REMOTE_READ);
                if (source == null) {
                    readResponseFailed = true;
                    readResponseFailedPsn = rrPsn[k];
                    rrHead = rrTail;
                    return;
                }
                try {
                    Runnable hook = engine.faults.beforeReadResponseCopy();
                    if (hook != null) {
                        hook.run();
                    }
                    DirectMemory.copy(src, outAddress + out.position() + SoftFrame.HEADER_LENGTH, c);
                } finally {
                    source.endRemoteAccess();
                }
            }
            int flags = (rrOffset == 0 ? SoftFrame.FIRST : 0) | (rrOffset + c == length ? SoftFrame.LAST : 0);
            putHeader(SoftFrame.READ_RESPONSE, flags, rrPsn[k], c, length, rrOffset, 0, 0);
            rrOffset += c;
            if (rrOffset == length) {
                rrOffset = 0;
                rrHead = rrHead + 1;
            }
        }
    }

    /**
     * Sends again from the request the peer refused with RNR_NAK. Under {@code sqLock}, as acknowledgements are
     * handled, and never from below the send queue's head: a request completed meanwhile (the peer acknowledged what
     * it had refused) has handed its memory back to the application, and sending it again would send whatever the
     * application, or another connection, keeps there now.
     */
    private void rewindAfterReceiverNotReady(SoftQueuePair q) {
        q.sqLock.lock();
        try {
            long rewind = rewindSeq;
            if (rewind < 0) {
                return;
            }
            rewindSeq = -1;
            long from = Math.max(rewind, q.sqHead);
            long sent = q.sqSent;
            if (from >= sent) {
                return;
            }
            int voided = 0;
            for (long s = from; s < sent; s++) {
                if (q.sOpcode[q.sIndex(s)] == WrOpcode.RDMA_READ) {
                    voided++;
                }
            }
            readsInFlight.addAndGet(-voided);
            cursorOffset = 0;
            q.sqSent = from;
        } finally {
            q.sqLock.unlock();
        }
    }

    private void fillRequests() {
        SoftQueuePair q = qp;
        if (q == null || q.state != QpState.RTS || gatherFailed) {
            return;
        }
        if (rewindSeq >= 0) {
            rewindAfterReceiverNotReady(q);
        }
        long wait = resumeAt - System.nanoTime();
        if (resumeAt != 0 && wait > 0) {
            return;
        }
        resumeAt = 0;
        long seq = q.sqSent;
        long tail = q.sqTail;
        while (seq < tail) {
            int i = q.sIndex(seq);
            if (q.sStatus[i] != WcStatus.SUCCESS) {
                // A work request that failed locally: stop here; retiring it in order ends the connection.
                gatherFailed = true;
                return;
            }
            long due = q.sDue[i];
            if (due != 0) {
                long d = due - System.nanoTime();
                if (d > 0) {
                    if (!resumeScheduled) {
                        resumeScheduled = true;
                        engine.schedule(() -> {
                            resumeScheduled = false;
                            pump();
                        }, d);
                    }
                    return;
                }
            }
            int op = q.sOpcode[i];
            int length = q.sLength[i];
            if ((q.sFlags[i] & SendWorkRequest.FENCE) != 0 && cursorOffset == 0 && readsInFlight.get() > 0) {
                return; // IBV_SEND_FENCE: earlier RDMA READs first; their last response wakes the pump
            }
            SharedPeer shared = sharedPeer;
            if (shared != null && cursorOffset == 0 && length > 0 && directCount < MAX_DIRECT
                    && (op == WrOpcode.RDMA_WRITE || op == WrOpcode.RDMA_READ)) {
                int r = executeShared(q, shared, seq, i);
                if (r == SHARED_DONE) {
                    seq++;
                    q.sqSent = seq;
                    continue;
                }
                if (r == SHARED_FAILED) {
                    q.sqSent = seq + 1;
                    return;
                }
                if (r == SHARED_WAIT) {
                    return;
                }
            }
            if (directCount > 0) {
                if (room() < SoftFrame.HEADER_LENGTH) {
                    return;
                }
                putHeader(SoftFrame.DIRECT, SoftFrame.FIRST | SoftFrame.LAST, directPsn, 0, directCount, 0, 0, 0);
                directCount = 0;
            }
            if (op == WrOpcode.RDMA_READ) {
                if (readsInFlight.get() >= readLimit || room() < SoftFrame.HEADER_LENGTH) {
                    return;
                }
                putHeader(SoftFrame.READ_REQUEST, SoftFrame.FIRST | SoftFrame.LAST, (int) seq, 0, length,
                        q.sRemote[i], q.sRkey[i], 0);
                readsInFlight.incrementAndGet();
            } else {
                if (cursorOffset == 0 && q.checkLocal(i) != WcStatus.SUCCESS) {
                    q.sStatus[i] = WcStatus.LOC_PROT_ERR;
                    gatherFailed = true;
                    return;
                }
                int wireOp = wireOpcode(op);
                do {
                    int c = chunk(length - cursorOffset);
                    if (c < 0) {
                        return;
                    }
                    q.gather(i, cursorOffset, outAddress + out.position() + SoftFrame.HEADER_LENGTH, c);
                    int flags = (cursorOffset == 0 ? SoftFrame.FIRST : 0)
                            | (cursorOffset + c == length ? SoftFrame.LAST : 0);
                    long address = op == WrOpcode.RDMA_WRITE || op == WrOpcode.RDMA_WRITE_WITH_IMM
                            ? q.sRemote[i] + cursorOffset : 0;
                    putHeader(wireOp, flags, (int) seq, c, length, address, q.sRkey[i], q.sImm[i]);
                    cursorOffset += c;
                } while (cursorOffset < length);
                cursorOffset = 0;
            }
            seq++;
            q.sqSent = seq;
        }
    }

    private static final int SHARED_DONE = 0;
    private static final int SHARED_DECLINED = 1;
    private static final int SHARED_FAILED = 2;
    private static final int SHARED_WAIT = 3;

    /**
     * Tries RDMA WRITE or READ {@code seq} (slot {@code i}) one-sided, in the peer's shared memory; drainer.
     *
     * @return {@link #SHARED_DONE}; {@link #SHARED_DECLINED}: send it over the wire, where the peer decides;
     *         {@link #SHARED_FAILED}: done, but a failed request behind it completed and the link must end;
     *         {@link #SHARED_WAIT}: earlier requests are outstanding, try again when an acknowledgement comes
     */
    private int executeShared(SoftQueuePair q, SharedPeer shared, long seq, int i) {
        q.sqLock.lock();
        try {
            if (q.state != QpState.RTS || q.checkLocal(i) != WcStatus.SUCCESS) {
                return SHARED_DECLINED;
            }
            // Only with every earlier request done: the responder would have executed them first (RC order).
            sharedWaiting = true; // before the check, under the lock an acknowledgement takes too: no wake-up lost
            for (long s = q.sqHead; s < seq; s++) {
                if (!q.sDone[q.sIndex(s)]) {
                    if (q.sLength[i] >= ONE_SIDED_WAIT_BYTES) {
                        return SHARED_WAIT;
                    }
                    sharedWaiting = false;
                    return SHARED_DECLINED;
                }
            }
            sharedWaiting = false;
            int r = shared.execute(q, i, peerQpn);
            if (r == SharedPeer.DECLINED) {
                engine.sharedMemory.overTcp.incrementAndGet();
                return SHARED_DECLINED;
            }
            if (r == SharedPeer.FAILED) {
                q.sStatus[i] = WcStatus.REM_ACCESS_ERR; // retired in order below; the link then ends
            } else {
                engine.sharedMemory.oneSided.incrementAndGet();
            }
            q.sDone[i] = true;
            if (r == SharedPeer.DONE && directCount++ == 0) {
                directPsn = (int) seq;
            }
            if (q.retireLocked()) {
                sharedFailed = true;
                return SHARED_FAILED;
            }
            return SHARED_DONE;
        } finally {
            q.sqLock.unlock();
        }
    }

    private static int wireOpcode(int wrOpcode) {
        switch (wrOpcode) {
            case WrOpcode.SEND:
                return SoftFrame.SEND;
            case WrOpcode.SEND_WITH_IMM:
                return SoftFrame.SEND_WITH_IMM;
            case WrOpcode.RDMA_WRITE:
                return SoftFrame.WRITE;
            default:
                return SoftFrame.WRITE_WITH_IMM;
        }
    }

    // ------------------------------------------------------------------ liveness (engine thread)

    private void watchLiveness() {
        long millis = Long.getLong(TRANSPORT_TIMEOUT_PROPERTY, DEFAULT_TRANSPORT_TIMEOUT_MILLIS);
        if (millis > 0 && !sameHost) {
            transportTimeoutNanos = TimeUnit.MILLISECONDS.toNanos(Math.max(100, millis));
            scheduleLivenessCheck();
        }
    }

    private long signs() {
        return (long) HEARD.getOpaque(this) + (long) DELIVERED.getOpaque(this);
    }

    /**
     * Counts the checks in a row that found a work request waiting and no sign of the peer since the last; past
     * {@value #LIVENESS_CHECKS} the transport times out (the first such check may come just after the request). The last look and the failure are one hold of the send
     * queue's lock, so that an acknowledgement executed meanwhile (its bytes were read first) cancels it.
     */
    private void checkLiveness() {
        // A silenced link stands for a host that vanished: it runs no timer either, or its own timeout would close
        // the socket and tell the peer, which a host that lost power never does.
        if (phase != CONNECTED || torn.get() || silenced) {
            return;
        }
        long signs = signs();
        if (signs != lastSigns) {
            lastSigns = signs;
            quietChecks = 0;
            scheduleLivenessCheck();
            return;
        }
        SoftQueuePair q = qp;
        boolean timedOut = false;
        q.sqLock.lock();
        try {
            long waiting = oldestWaitingLocked(q);
            if (waiting < 0 || q.state != QpState.RTS) {
                quietChecks = 0;
            } else if (++quietChecks > LIVENESS_CHECKS && signs() == lastSigns) {
                q.sStatus[q.sIndex(waiting)] = WcStatus.RETRY_EXC_ERR;
                q.retireFailingLocked();
                timedOut = true;
            }
        } finally {
            q.sqLock.unlock();
        }
        if (timedOut) {
            transportTimedOut();
        } else {
            scheduleLivenessCheck();
        }
    }

    private void scheduleLivenessCheck() {
        livenessCheck = engine.schedule(() -> engine.execute(livenessTask), transportTimeoutNanos / LIVENESS_CHECKS);
    }

    /** The oldest work request that waits for the peer (posted, not yet acknowledged or answered), or -1. */
    private static long oldestWaitingLocked(SoftQueuePair q) {
        for (long s = q.sqHead; s < q.sqTail; s++) {
            int i = q.sIndex(s);
            if (!q.sDone[i] && q.sStatus[i] == WcStatus.SUCCESS) {
                return s;
            }
        }
        return -1;
    }

    /** The oldest waiting work request has failed with RETRY_EXC_ERR: the rest are flushed, the connection ends. */
    private void transportTimedOut() {
        String reason = "no sign of peer " + peer + " for " + transportTimeoutNanos / 1_000_000L + " ms while work "
                + "requests waited for it (" + TRANSPORT_TIMEOUT_PROPERTY + "): its host is down or cut off, or its "
                + "process is stopped; a NIC ends such a connection with RETRY_EXC_ERR once its retries run out";
        SoftEngine.logger.warn("soft0: closing the connection with {}: {}", peer, reason);
        teardown(reason, 0, 0, 0);
        closeNow();
    }

    /**
     * {@link SoftFaults#silence}: from now on this side neither reads nor writes nor times out, without closing its
     * socket.
     */
    void silence() {
        silenced = true;
        engine.execute(() -> {
            SelectionKey k = key;
            if (k != null && k.isValid()) {
                k.interestOps(0);
            }
        });
    }

    // ------------------------------------------------------------------ teardown

    /**
     * Local side to ERROR and flushed, DISCONNECTED reported, and a last frame ({@code terminal}: DISCONNECT or a
     * NAK) sent before the socket closes; once. Call with no queue-pair lock held.
     */
    void teardown(String reason, int terminal, int psn, int status) {
        if (!torn.compareAndSet(false, true)) {
            return;
        }
        // The one record of why a connection ended: DISCONNECTED carries the reason, but a channel that saw its
        // queue pair flushed first has closed before the event arrives.
        SoftEngine.logger.debug("soft0: the connection with {} ends: {}", peer, reason);
        engine.links.remove(this);
        SoftQueuePair q = qp;
        if (q != null) {
            q.enterError();
        }
        SoftCmId i = id;
        if (i != null) {
            i.onDisconnected(reason);
        }
        if (terminal != 0 && phase == CONNECTED) {
            terminalPsn = psn;
            terminalStatus = status;
            terminalOp = terminal;
            pump();
            engine.schedule(() -> engine.execute(closeTask), LINGER_NANOS);
        } else {
            if (phase == CONNECTED && ackPending) {
                // What was delivered stays delivered, as a device's acknowledgement would have said: one a poller held
                // for its answer goes before the socket closes (the queue pair is in ERROR: no request goes with it).
                pump();
            }
            engine.execute(closeTask);
        }
    }

    @Override
    void disconnect(String reason) {
        teardown(reason, SoftFrame.DISCONNECT, 0, 0);
    }

    @Override
    void drop(String reason) {
        teardown(reason, 0, 0, 0);
        engine.execute(closeTask);
    }

    /** The last frame is out: half-close and wait (bounded) for the peer's close, so it reads that frame. */
    private void linger() {
        if (phase == CLOSED) {
            return;
        }
        phase = CLOSING;
        try {
            ch.shutdownOutput();
        } catch (IOException | RuntimeException e) {
            closeNow();
        }
    }

    private void handshakeDone() {
        ScheduledFuture<?> timeout = handshakeTimeout;
        if (timeout != null) {
            handshakeTimeout = null;
            timeout.cancel(false);
        }
        if (pendingHandshake) {
            pendingHandshake = false;
            PENDING_HANDSHAKES.decrementAndGet();
            listener.pendingHandshakes.decrementAndGet();
        }
    }

    private void closeNow() {
        if (!engine.onEngineThread()) {
            // The peer's ring is unmapped on the engine thread only: the engine parks and unparks it (parkRing,
            // unparkRing) without taking the consumer slot.
            engine.execute(closeTask);
            return;
        }
        handshakeDone();
        phase = CLOSED;
        ScheduledFuture<?> liveness = livenessCheck;
        if (liveness != null) {
            livenessCheck = null;
            liveness.cancel(false);
        }
        if (inRing != null) {
            // A poller may be reading the ring: unmap it once the poller is done and before another can start.
            boolean locked = lockConsumer();
            try {
                ShmRing in = inRing;
                if (in != null) {
                    inRing = null;
                    engine.removeRingLink(this);
                    SoftQueuePair q = qp;
                    q.sendCq.removeProgress(this);
                    q.recvCq.removeProgress(this);
                    in.closeFile();
                    DirectMemory.free(in.map);
                }
            } finally {
                if (locked) {
                    unlockConsumer();
                }
            }
        }
        // The drainer lets go of our ring: it may be writing into it now.
        pump();
        SharedPeer shared = sharedPeer;
        if (shared != null) {
            shared.close();
        }
        SelectionKey k = key;
        if (k != null) {
            k.cancel();
        }
        SocketChannel c = ch;
        if (c != null) {
            try {
                c.close();
            } catch (IOException ignored) {
                // The descriptor is released either way.
            }
        }
        engine.links.remove(this);
    }

    /** The file number of the ring this side writes its frames into, or -1 while it writes to the socket; tests. */
    long ourRingNumber() {
        ShmRing r = outRing;
        return r != null ? r.number : -1;
    }

    /** The data bytes of the ring this side writes its frames into, or -1 while it writes to the socket; tests. */
    int ourRingCapacity() {
        ShmRing r = outRing;
        return r != null ? r.capacity : -1;
    }

    /** Capacities of the socket's read and write buffers, in bytes, as {@code {read, write}}; tests. */
    int[] socketBufferCapacities() {
        return new int[] {readBuf.capacity(), writeBuf.capacity()};
    }

    /** Whether this side reads the peer's frames from the peer's ring; tests. */
    boolean readsPeerRing() {
        return inRing != null;
    }

    /** Whether the peer shares this host and its shared-memory directory, and both ends offered shared memory. */
    boolean sameHost() {
        return sameHost;
    }

    @Override
    public String toString() {
        return "TcpLink{peer=" + peer + ", phase=" + phase + '}';
    }
}
