package io.rdmabridge.kafka;

import io.rdmabridge.verbs.RateLimitedWarning;
import io.rdmabridge.verbs.SourceShares;
import java.io.FileDescriptor;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketAddress;
import java.net.SocketException;
import java.net.SocketOption;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.channels.AsynchronousCloseException;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.IllegalBlockingModeException;
import java.nio.channels.SelectionKey;
import java.nio.channels.SocketChannel;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import sun.nio.ch.Net;
import sun.nio.ch.SelChImpl;
import sun.nio.ch.SelectionKeyImpl;

/**
 * A replication connection as Kafka sees it: a {@link SocketChannel} that starts on the JDK's own TCP channel and,
 * when both brokers agree, carries Kafka's bytes over an {@link RdmaStream} instead. Everything Kafka does with a
 * socket channel keeps working: non-blocking reads and writes, registration with the JDK's
 * {@link java.nio.channels.Selector} (this class implements the JDK's internal {@code SelChImpl}), socket options
 * through {@link #socket()}, and {@code FileChannel.transferTo}, which stays {@code sendfile} on TCP and maps the file
 * for one copy into registered memory on RDMA.
 *
 * <p>The selector polls the TCP socket itself, so a connection costs one descriptor however it ends up. Readiness the
 * socket does not show (the RDMA stream's, the handshake's timer, bytes the handshake read for Kafka) is reported by
 * asking the selector to watch the socket for writability ({@link SelectorWakeups}): nothing is written to it then, so
 * it is writable, and the selector reports the channel, whose ready set then comes from the stream. Kafka registers
 * each channel with one selector; the channel wakes the one that last reported it.
 *
 * <p>Follower connections ({@link #forFollower}) negotiate in {@link #connect}, blocking the replica fetcher thread
 * for at most the handshake timeout. Leader connections ({@link #forLeader}) negotiate without blocking, driven by
 * Kafka's reads ({@link LeaderHandshake}).
 *
 * <p>Threading: as for the JDK's channels, one thread at a time reads and one writes (Kafka's network thread does
 * both); {@link #signal()} is the only entry from other threads (RDMA stream events, handshake timer).
 */
final class ReplicationSocketChannel extends SocketChannel implements SelChImpl {
    private static final Logger LOG = LoggerFactory.getLogger(ReplicationSocketChannel.class);
    /**
     * Any host that reaches the inter-broker port can make these lines, so each kind is limited to one a second on its
     * own: a flood of one cannot hide the other.
     */
    private static final RateLimitedWarning DECLINED = new RateLimitedWarning(LOG, 1000);
    private static final RateLimitedWarning REJECTED = new RateLimitedWarning(LOG, 1000);
    /** The pause before asking again a leader that refused a probe or declined as busy; it doubles up to the next. */
    static final long FIRST_RETRY_PAUSE_MS = 20;
    static final long MAX_RETRY_PAUSE_MS = 320;
    /** How long a follower keeps asking a busy leader, at most (never past the upgrade's deadline). */
    static final long BUSY_RETRY_MS = 1000;
    /** How many more times a failed probe of a leader never heard from is asked (after 20, 40 and 80 ms). */
    static final int UNKNOWN_LEADER_PROBE_RETRIES = 3;
    private static final ByteBuffer EMPTY = ByteBuffer.allocate(0);
    private static final int RESPONSE_SIZE_LENGTH = 4;
    private static final int POLLIN = Net.POLLIN;
    private static final int POLLOUT = Net.POLLOUT;
    private static final int POLLERR = Net.POLLERR;
    private static final int POLLHUP = Net.POLLHUP;

    private enum Mode { UNCONNECTED, HANDSHAKE, TCP, RDMA, FAILED }

    private final RdmaSelectorProvider provider;
    private final RdmaReplication replication;
    private final ReplicationSocket socket;
    private final LeaderHandshake handshake;
    private volatile SocketChannel tcp;
    private volatile Mode mode;
    private volatile int interest;
    /**
     * The key of the selector that last reported this channel, or {@code null} before: the JDK passes a channel its key
     * only then. Without it a wake-up cannot reach the selector, so the channel asks for one at once.
     */
    private volatile SelectionKeyImpl key;
    /** Set by {@link #signal()}: the selector is to report this channel once more; cleared by that report. */
    private volatile boolean signalled;
    /** The socket events the selector last took from {@link #translateInterestOps}; its thread only. */
    private int requested;
    private volatile String failure;
    /** Written by the thread that upgrades, read by a close from another. */
    private volatile RdmaStream stream;
    private ByteBuffer replay = EMPTY;
    private ReplicationMetrics.Peer peer;
    private ScheduledFuture<?> deadline;
    private boolean attemptCounted;
    /**
     * Leader side, plain TCP: {@code FileChannel.transferTo} sends the records of a fetch response with
     * {@code sendfile}, past {@link #write}, so TCP bytes sent are counted per response instead: each response's
     * 4-byte size prefix (always written by {@link #write}) adds 4 + size. Kafka reads a connection's next request
     * only once the previous response is sent, so the next response's prefix is the first byte written after a read.
     */
    private boolean countResponses;
    private int responsePrefixLeft;
    private int responseSize;

    private ReplicationSocketChannel(RdmaSelectorProvider provider, RdmaReplication replication, SocketChannel tcp,
                                     boolean leader) throws SocketException {
        super(provider);
        this.provider = provider;
        this.replication = replication;
        this.tcp = tcp;
        this.socket = new ReplicationSocket(this);
        if (leader) {
            mode = Mode.HANDSHAKE;
            RdmaStreamTransport transport = replication.transport();
            // The reply names the broker the RDMA listener answers probes and acknowledges tokens for.
            handshake = new LeaderHandshake(tcp, sourceOf(tcp), transport, transport.brokerId(),
                    replication.handshakeAdmission(), replication.connectionAdmission(), this::signal);
            // Kafka over plain TCP frames every response with its size: counting those counts what sendfile sends.
            countResponses = !replication.config().interBrokerTls();
            responsePrefixLeft = RESPONSE_SIZE_LENGTH;
        } else {
            mode = Mode.UNCONNECTED;
            handshake = null;
        }
    }

    /** A connection the replica fetcher thread of {@code leaderId} is about to open. */
    static ReplicationSocketChannel forFollower(RdmaSelectorProvider provider, RdmaReplication replication,
                                                SocketChannel tcp, String leaderId) throws SocketException {
        ReplicationSocketChannel ch = new ReplicationSocketChannel(provider, replication, tcp, false);
        ch.peer = replication.metrics().peer(leaderId);
        return ch;
    }

    /** A connection just accepted on the inter-broker listener. */
    static ReplicationSocketChannel forLeader(RdmaSelectorProvider provider, RdmaReplication replication,
                                              SocketChannel accepted) throws SocketException {
        return new ReplicationSocketChannel(provider, replication, accepted, true);
    }

    boolean isRdma() {
        return mode == Mode.RDMA;
    }

    /** The RDMA stream once upgraded, else {@code null}. */
    RdmaStream stream() {
        return stream;
    }

    // ---- connection set-up -------------------------------------------------------------------------------------

    @Override
    public boolean connect(SocketAddress remote) throws IOException {
        ensureOpen();
        if (mode != Mode.UNCONNECTED) {
            return tcp.connect(remote);
        }
        InetSocketAddress leader = (InetSocketAddress) remote;
        // The selector polls the socket's descriptor, which a redial after a broken preamble replaces: Kafka
        // registers after connecting, so only another caller meets this.
        String skip = isRegistered() ? "the channel was registered with a selector before connecting"
                : replication.followerSkipReason(leader);
        if (skip != null) {
            LOG.debug("Replication connection to {} stays on TCP: {}", leader, skip);
            mode = Mode.TCP;
            return tcp.connect(remote);
        }
        synchronized (blockingLock()) {
            try {
                upgrade(leader);
            } finally {
                if (!isOpen()) {
                    releaseWhatACloseMissed();
                }
            }
            ensureStillOpen();
        }
        return true;
    }

    /**
     * {@link #connect}'s upgrade, on a channel that was unconnected: connects the TCP socket, probes the leader's
     * plugin and negotiates; Kafka's bytes then go over RDMA or stay on TCP.
     *
     * @throws AsynchronousCloseException when another thread closed this channel meanwhile: what broke then says
     *         nothing of the leader, which is neither remembered as one without the plugin nor dialled again
     */
    private void upgrade(InetSocketAddress leader) throws IOException {
        int timeoutMs = replication.config().handshakeTimeoutMs();
        tcp.configureBlocking(true);
        tcp.socket().connect(leader, timeoutMs);
        // One deadline for the upgrade's steps (probe, preamble, RDMA connect), so that they hold the fetcher
        // thread at most the handshake timeout beyond Kafka's own connect.
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        // Connected first, so that a leader that is down is not taken for one without the plugin.
        NoUpgrade noPlugin = probeLeader(leader, deadline, timeoutMs);
        if (noPlugin != null) {
            // A probe that failed because this broker's own plugin closed meanwhile says nothing of the leader.
            if (replication.isActive()) {
                replication.rememberPlainPeer(leader, noPlugin.reason(), noPlugin.refused(),
                        noPlugin.refused() ? RdmaReplication.REFUSED_PEER_RETRY_MS
                                : RdmaReplication.PLAIN_PEER_RETRY_MS);
            }
            mode = Mode.TCP;
            tcp.configureBlocking(isBlocking());
            return;
        }
        replication.metrics().upgradeAttempted();
        FollowerHandshake.Outcome o = negotiateWhileBusy(leader, deadline, timeoutMs);
        switch (o.kind()) {
            case RDMA:
                stream = o.stream();
                mode = Mode.RDMA;
                stream.readinessListener(this::signal);
                replication.metrics().upgradeSucceeded();
                LOG.info("Replication connection to leader {} at {} upgraded to RDMA ({})", peer.id(), leader,
                        stream.describe());
                break;
            case TCP:
            case BUSY:
                mode = Mode.TCP;
                replication.metrics().upgradeFellBack();
                LOG.warn("Replication connection to leader {} at {} stays on TCP: {}", peer.id(), leader,
                        o.reason());
                break;
            default:
                ensureStillOpen();
                replication.metrics().upgradeFellBack();
                replication.rememberPlainPeer(leader, o.reason(), true, RdmaReplication.PLAIN_PEER_RETRY_MS);
                // Kafka's own plain connect, which the upgrade's deadline must not cut short.
                redial(leader, timeoutMs);
                mode = Mode.TCP;
                break;
        }
        tcp.configureBlocking(isBlocking());
    }

    /** Throws once another thread has closed this channel: a failure of the upgrade since then is not the leader's. */
    private void ensureStillOpen() throws AsynchronousCloseException {
        if (!isOpen()) {
            throw new AsynchronousCloseException();
        }
    }

    /**
     * A close from another thread during {@link #upgrade} closes the socket and stream it finds; the upgrade may have
     * made others after that (a socket dialled again, the stream): they are closed here. Both closes are idempotent.
     */
    private void releaseWhatACloseMissed() throws IOException {
        RdmaStream made = stream;
        try {
            if (made != null) {
                made.close();
            }
        } finally {
            tcp.close();
        }
    }

    /**
     * Negotiates the upgrade; while the leader declines it as busy (it holds as many handshakes or RDMA connections as
     * it allows), asks again on a fresh socket as {@link Retries} paces it: a declined socket stays on TCP for its
     * lifetime, and brokers that reconnect together must not leave each other there, while a leader at
     * {@code rdma.max.connections} stays full until a connection closes and must not hold every new fetcher for long.
     * The declined socket has carried no Kafka byte, so it is closed.
     */
    private FollowerHandshake.Outcome negotiateWhileBusy(InetSocketAddress leader, long deadline, int timeoutMs)
            throws IOException {
        Retries retries = new Retries(deadline, timeoutMs);
        // What the probe found (its answer was this id): the reply and the stream must name the same broker and port.
        int leaderId = Integer.parseInt(peer.id());
        int rdmaPort = replication.config().rdmaPortOf(leader);
        FollowerHandshake.Outcome o = FollowerHandshake.negotiate(tcp, replication.brokerId(),
                replication.transport(), leader, leaderId, rdmaPort, deadline, timeoutMs);
        while (o.kind() == FollowerHandshake.Kind.BUSY && retries.worthAskingAgain()) {
            if (!retries.pause()) {
                return o;
            }
            ensureStillOpen();
            SocketChannel fresh;
            try {
                fresh = dial(leader, millisLeft(retries.end()));
            } catch (IOException e) {
                // The declined socket still carries Kafka's bytes over TCP: keep it.
                LOG.debug("Replication connection to leader {} at {}: no fresh socket to ask again on", peer.id(),
                        leader, e);
                return o;
            }
            tcp.close();
            tcp = fresh;
            o = FollowerHandshake.negotiate(tcp, replication.brokerId(), replication.transport(), leader, leaderId,
                    rdmaPort, deadline, timeoutMs);
            if (o.kind() == FollowerHandshake.Kind.REDIAL) {
                ensureStillOpen();
                // The leader's plugin answered before: this says nothing of a leader without it, so it is not
                // remembered; Kafka's own plain connect, which the upgrade's deadline must not cut short.
                redial(leader, timeoutMs);
                return new FollowerHandshake.Outcome(FollowerHandshake.Kind.TCP, null, o.leaderBrokerId(),
                        "asked again after leader " + peer.id() + " declined as busy: " + o.reason());
            }
        }
        return o;
    }

    /**
     * The pacing of asking a leader again within one upgrade: pauses that double from {@value #FIRST_RETRY_PAUSE_MS}
     * ms up to {@value #MAX_RETRY_PAUSE_MS} ms, for up to {@value #BUSY_RETRY_MS} ms and never past the upgrade's
     * deadline. Used by the fetcher thread that upgrades, alone.
     */
    private static final class Retries {
        private final long deadline;
        private final int timeoutMs;
        private final long end;
        private long pauseMs = FIRST_RETRY_PAUSE_MS;

        Retries(long deadline, int timeoutMs) {
            this.deadline = deadline;
            this.timeoutMs = timeoutMs;
            long budgetEnd = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(BUSY_RETRY_MS);
            this.end = deadline - budgetEnd < 0 ? deadline : budgetEnd;
        }

        /** When asking again ends ({@link System#nanoTime()}). */
        long end() {
            return end;
        }

        /**
         * Whether the next pause still leaves room to ask again: within {@link #end()}, and with at least a quarter of
         * the handshake timeout before the deadline for the attempt itself, which would otherwise fail for want of time
         * and be taken for a broken leader.
         */
        boolean worthAskingAgain() {
            long now = System.nanoTime();
            return TimeUnit.NANOSECONDS.toMillis(end - now) > pauseMs
                    && TimeUnit.NANOSECONDS.toMillis(deadline - now) > pauseMs + timeoutMs / 4;
        }

        /** Sleeps the pause and doubles the next; {@code false} when interrupted, with the interrupt kept. */
        boolean pause() {
            try {
                Thread.sleep(pauseMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return false;
            }
            pauseMs = Math.min(2 * pauseMs, MAX_RETRY_PAUSE_MS);
            return true;
        }
    }

    /**
     * Why a connection stays on TCP without a preamble; {@code refused} when the leader's plugin is there but did not
     * answer (it is busy with handshakes, or closing), which is not the same as a leader without the plugin.
     */
    private record NoUpgrade(String reason, boolean refused) {
    }

    /**
     * Asks the leader's RDMA port whether the leader's plugin listens there, before a byte goes to the leader's
     * Kafka listener: a stock broker would take the preamble for a broken request and log it.
     *
     * <p>A leader's plugin that holds as many connections without a token as it allows refuses a probe's connection
     * before accepting it, and brokers that reconnect together must not push each other onto TCP for minutes, so a
     * failed probe is asked again after a pause that doubles each time. How long depends on what is known of the
     * leader. A probe the plugin accepted and closed before answering, or any failure of a leader that has answered
     * before, is asked again for up to {@value #BUSY_RETRY_MS} ms within the upgrade's deadline. A leader never heard
     * from is asked {@value #UNKNOWN_LEADER_PROBE_RETRIES} more times: on a NIC a refused request and a port where
     * nothing listens both read {@code REJECTED} (DiSNI passes no reason), and a stock leader must not cost each
     * connection long. So a follower that starts while hosts flood its leader's RDMA port from more than one address
     * can still take that leader for one without the plugin; only allowing the brokers' hosts to reach the port
     * prevents that.
     *
     * @return {@code null} when the plugin of the broker this fetcher follows answered; otherwise why the connection
     *         stays on TCP without a preamble
     */
    private NoUpgrade probeLeader(InetSocketAddress leader, long deadline, int timeoutMs) {
        int port = replication.config().rdmaPortOf(leader);
        if (port < 0) {
            return new NoUpgrade("leader " + peer.id() + "'s inter-broker port " + leader.getPort() + " + "
                    + RdmaReplicationConfig.RDMA_PORT_OFFSET + " " + replication.config().rdmaPortOffset()
                    + " is no port (expected: 1..65535)", false);
        }
        InetSocketAddress rdma = new InetSocketAddress(leader.getAddress(), port);
        long start = System.nanoTime();
        Retries retries = new Retries(deadline, timeoutMs);
        for (int failures = 0; ; failures++) {
            var answer = replication.transport().probe(rdma);
            try {
                int id = answer.get(Math.max(1, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
                if (!Integer.toString(id).equals(peer.id())) {
                    replication.forgetAnswer(leader);
                    return new NoUpgrade("the RDMA port " + rdma + " answers for broker " + id + ", not for leader "
                            + peer.id() + " (expected: " + RdmaReplicationConfig.RDMA_PORT_OFFSET
                            + " the same on every broker)", false);
                }
                replication.answered(leader);
                return null;
            } catch (TimeoutException e) {
                answer.cancel(false);
                return new NoUpgrade("no RDMA probe answer from " + rdma + " within the upgrade's " + timeoutMs
                        + " ms (rdma.handshake.timeout.ms)", false);
            } catch (ExecutionException e) {
                Throwable cause = e.getCause();
                boolean refused = cause instanceof RdmaStreamTransport.ProbeRefusedException
                        || replication.answeredBefore(leader);
                if (!retries.worthAskingAgain()
                        || !refused && failures >= UNKNOWN_LEADER_PROBE_RETRIES) {
                    if (refused) {
                        // Asked again later, as one never heard from: a leader whose plugin was turned off costs one
                        // connection those retries, not every one.
                        replication.forgetAnswer(leader);
                        return new NoUpgrade("leader " + peer.id() + "'s plugin did not answer " + (failures + 1)
                                + " RDMA probes at " + rdma + " within "
                                + TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start) + " ms, the last: " + cause,
                                true);
                    }
                    return new NoUpgrade("no RDMA replication plugin answers at " + rdma + " (" + cause + "): leader "
                            + peer.id() + " runs without the plugin, with " + RdmaReplicationConfig.ENABLE
                            + "=false, or without a usable RDMA provider, or the port " + leader.getPort()
                            + " it advertises is not the one it listens on (port mapping): its plugin listens at "
                            + "that listener's port + " + RdmaReplicationConfig.RDMA_PORT_OFFSET + "; or its plugin "
                            + "refused " + (failures + 1) + " probes in a row, holding as many connections without a "
                            + "token as " + RdmaReplicationConfig.MAX_HANDSHAKES + " allows, or this host's share of "
                            + "them (its log names the key and the address in a WARN)", false);
                }
                if (!retries.pause()) {
                    return new NoUpgrade("interrupted while probing " + rdma, false);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                answer.cancel(false);
                return new NoUpgrade("interrupted while probing " + rdma, false);
            }
        }
    }

    /** Milliseconds until {@code deadline}, at least 1: a socket's connect takes 0 for "no timeout". */
    static int millisLeft(long deadline) {
        return (int) Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime()));
    }

    /** Replaces a socket the handshake left unusable by a fresh plain one with the same options. */
    private void redial(InetSocketAddress leader, int timeoutMs) throws IOException {
        SocketChannel old = tcp;
        try {
            tcp = dial(leader, timeoutMs);
        } finally {
            old.close();
        }
    }

    /** A fresh blocking socket to {@code leader} with the current one's options. */
    private SocketChannel dial(InetSocketAddress leader, int timeoutMs) throws IOException {
        SocketChannel fresh = provider.jdk().openSocketChannel();
        try {
            for (SocketOption<?> option : List.of(StandardSocketOptions.SO_KEEPALIVE, StandardSocketOptions.SO_SNDBUF,
                    StandardSocketOptions.SO_RCVBUF, StandardSocketOptions.TCP_NODELAY)) {
                copyOption(tcp, fresh, option);
            }
            fresh.configureBlocking(true);
            fresh.socket().connect(leader, timeoutMs);
            return fresh;
        } catch (IOException e) {
            fresh.close();
            throw e;
        }
    }

    private static <T> void copyOption(SocketChannel from, SocketChannel to, SocketOption<T> option)
            throws IOException {
        to.setOption(option, from.getOption(option));
    }

    @Override
    public boolean finishConnect() throws IOException {
        ensureOpen();
        if (mode == Mode.TCP && tcp.isConnectionPending()) {
            return tcp.finishConnect();
        }
        return tcp.isConnected();
    }

    @Override
    public boolean isConnected() {
        return tcp.isConnected();
    }

    @Override
    public boolean isConnectionPending() {
        return tcp.isConnectionPending();
    }

    // ---- data ------------------------------------------------------------------------------------------------

    @Override
    public int read(ByteBuffer dst) throws IOException {
        ensureOpen();
        if (mode == Mode.HANDSHAKE) {
            advanceHandshake();
        }
        switch (mode) {
            case TCP: {
                int n = 0;
                if (replay.hasRemaining()) {
                    n = Math.min(replay.remaining(), dst.remaining());
                    ByteBuffer slice = replay.slice();
                    slice.limit(n);
                    dst.put(slice);
                    replay.position(replay.position() + n);
                    if (!dst.hasRemaining()) {
                        if (countResponses && responsePrefixLeft == 0) {
                            responsePrefixLeft = RESPONSE_SIZE_LENGTH;
                        }
                        peer.tcpReceived(n);
                        return n;
                    }
                }
                int m = tcp.read(dst);
                if (m < 0) {
                    return n > 0 ? n : -1;
                }
                if (countResponses && n + m > 0 && responsePrefixLeft == 0) {
                    responsePrefixLeft = RESPONSE_SIZE_LENGTH;
                }
                peer.tcpReceived(n + m);
                return n + m;
            }
            case RDMA: {
                checkBlocking();
                long copied = stream.copiedBytesReceived();
                int n = stream.read(dst);
                if (n > 0) {
                    peer.rdmaReceived(n, stream.copiedBytesReceived() - copied);
                }
                rearm();
                return n;
            }
            case FAILED:
                throw new IOException(failure);
            default:
                return 0;
        }
    }

    @Override
    public long read(ByteBuffer[] dsts, int offset, int length) throws IOException {
        long total = 0;
        for (int i = offset; i < offset + length; i++) {
            if (!dsts[i].hasRemaining()) {
                continue;
            }
            int n = read(dsts[i]);
            if (n < 0) {
                return total > 0 ? total : -1;
            }
            total += n;
            if (dsts[i].hasRemaining()) {
                break;
            }
        }
        return total;
    }

    @Override
    public int write(ByteBuffer src) throws IOException {
        ensureOpen();
        switch (mode) {
            case TCP: {
                if (!countResponses) {
                    int n = tcp.write(src);
                    peer.tcpSent(n);
                    return n;
                }
                int from = src.position();
                int n = tcp.write(src);
                for (int i = 0; i < n && responsePrefixLeft > 0; i++) {
                    responseSizeByte(src.get(from + i));
                }
                return n;
            }
            case RDMA: {
                checkBlocking();
                long copied = stream.copiedBytesSent();
                int n = stream.write(src);
                if (n > 0) {
                    peer.rdmaSent(n, stream.copiedBytesSent() - copied);
                }
                rearm();
                return n;
            }
            case FAILED:
                throw new IOException(failure);
            default:
                // Kafka writes only after connecting (follower) or after reading a request (leader).
                return 0;
        }
    }

    @Override
    public long write(ByteBuffer[] srcs, int offset, int length) throws IOException {
        if (mode == Mode.TCP) {
            if (!countResponses || responsePrefixLeft == 0) {
                long n = tcp.write(srcs, offset, length);
                if (!countResponses) {
                    peer.tcpSent(n);
                }
                return n;
            }
            // The size prefix may span buffers: peek at it before the JDK moves their positions.
            int peeked = 0;
            int got = 0;
            for (int i = offset; i < offset + length && got < responsePrefixLeft; i++) {
                ByteBuffer b = srcs[i];
                for (int j = b.position(); j < b.limit() && got < responsePrefixLeft; j++) {
                    peeked = peeked << 8 | (b.get(j) & 0xff);
                    got++;
                }
            }
            long n = tcp.write(srcs, offset, length);
            int sent = (int) Math.min(Math.max(n, 0), got);
            for (int k = 0; k < sent; k++) {
                responseSizeByte((byte) (peeked >>> (8 * (got - 1 - k))));
            }
            return n;
        }
        long total = 0;
        for (int i = offset; i < offset + length; i++) {
            if (!srcs[i].hasRemaining()) {
                continue;
            }
            total += write(srcs[i]);
            if (srcs[i].hasRemaining()) {
                break;
            }
        }
        return total;
    }

    /** Takes one byte of a response's size prefix; the last one counts the whole response as sent over TCP. */
    private void responseSizeByte(byte b) {
        responseSize = responseSize << 8 | (b & 0xff);
        if (--responsePrefixLeft == 0) {
            peer.tcpSent(RESPONSE_SIZE_LENGTH + (responseSize & 0xffffffffL));
            responseSize = 0;
        }
    }

    private void checkBlocking() {
        if (isBlocking()) {
            throw new IllegalBlockingModeException();
        }
    }

    private void advanceHandshake() throws IOException {
        LeaderHandshake.State s = handshake.advance();
        if (!attemptCounted && handshake.attempted()) {
            attemptCounted = true;
            replication.metrics().upgradeAttempted();
            if (handshake.inProgress()) {
                startDeadline();
                s = handshake.state();
            }
        }
        switch (s) {
            case TCP:
                cancelDeadline();
                replay = handshake.replay();
                peer = replication.metrics().peer(handshake.peerBrokerId() >= 0
                        ? Integer.toString(handshake.peerBrokerId()) : ReplicationMetrics.UNKNOWN_PEER);
                if (handshake.fallbackReason() != null) {
                    replication.metrics().upgradeFellBack();
                    // Rate-limited: any host that reaches the inter-broker port can send a HELLO that is declined.
                    DECLINED.warn("Replication connection stays on TCP: from broker {} at {}: {}",
                            handshake.peerBrokerId(), remote(), handshake.fallbackReason());
                }
                mode = Mode.TCP;
                refresh();
                break;
            case RDMA:
                cancelDeadline();
                stream = handshake.stream();
                stream.readinessListener(this::signal);
                peer = replication.metrics().peer(Integer.toString(handshake.peerBrokerId()));
                replication.metrics().upgradeSucceeded();
                // Not INFO: anyone who reaches the listener can upgrade connections, under a broker id of its choosing,
                // so this would be a line per connection a peer opens. Counted by upgrades-succeeded-total; the
                // follower, which chose to connect, logs its upgrade at INFO.
                LOG.debug("Replication connection from broker {} at {} upgraded to RDMA ({})",
                        handshake.peerBrokerId(), remote(), stream.describe());
                mode = Mode.RDMA;
                refresh();
                break;
            case FAILED:
                cancelDeadline();
                failure = "RDMA handshake from " + remote() + " rejected: " + handshake.failure();
                replication.metrics().handshakeRejected();
                REJECTED.warn("Closing connection: {}", failure);
                mode = Mode.FAILED;
                refresh();
                break;
            default:
                refresh();
                break;
        }
    }

    /**
     * Bounds the handshake by {@code rdma.handshake.timeout.ms} on the plugin's timer. A plugin closed since this
     * connection was accepted (its reporter removed from {@code metric.reporters} at runtime, or the broker stopping)
     * has no timer left: the handshake ends at once, which closes the connection with that cause.
     */
    private void startDeadline() {
        int timeoutMs = replication.config().handshakeTimeoutMs();
        ScheduledExecutorService timer = replication.scheduler();
        if (timer != null) {
            try {
                deadline = timer.schedule(() -> handshake.expire("RDMA handshake did not complete within "
                        + timeoutMs + " ms (rdma.handshake.timeout.ms)"), timeoutMs, TimeUnit.MILLISECONDS);
                return;
            } catch (RejectedExecutionException e) {
                // Shut down since it was read: the plugin is closing.
            }
        }
        handshake.expire("the RDMA replication plugin was closed during the handshake (its reporter removed from "
                + "metric.reporters, or the broker stopping); the follower's next connection stays on TCP");
    }

    private void cancelDeadline() {
        if (deadline != null) {
            deadline.cancel(false);
            deadline = null;
        }
    }

    /** The accepted connection's peer address, where a handshake's place is counted. */
    private static InetAddress sourceOf(SocketChannel tcp) {
        try {
            return SourceShares.sourceOf(tcp.getRemoteAddress());
        } catch (IOException e) {
            return SourceShares.UNKNOWN_SOURCE;
        }
    }

    private String remote() {
        try {
            return String.valueOf(tcp.getRemoteAddress());
        } catch (IOException e) {
            return "(closed socket)";
        }
    }

    // ---- readiness (called by the JDK selector) ----------------------------------------------------------------

    @Override
    public FileDescriptor getFD() {
        // FileChannel.transferTo uses this for sendfile: only the TCP socket may receive it; null makes the JDK map
        // the file and call write() instead.
        return mode == Mode.TCP ? ((SelChImpl) tcp).getFD() : null;
    }

    @Override
    public int getFDVal() {
        return ((SelChImpl) tcp).getFDVal();
    }

    @Override
    public int translateInterestOps(int ops) {
        interest = ops;
        requested = socketEvents(ops);
        return requested;
    }

    /**
     * The events of the TCP socket the selector is to watch for the interest set {@code ops}. POLLOUT beyond what
     * the socket's own state asks for is a wake-up (see the class comment): nothing waits to be written then.
     */
    private int socketEvents(int ops) {
        if (ops == 0) {
            return 0;
        }
        switch (mode) {
            case UNCONNECTED:
            case TCP: {
                int events = 0;
                if ((ops & SelectionKey.OP_READ) != 0) {
                    events |= POLLIN;
                    if (replay.hasRemaining()) {
                        events |= POLLOUT;
                    }
                }
                if ((ops & (SelectionKey.OP_WRITE | SelectionKey.OP_CONNECT)) != 0) {
                    events |= POLLOUT;
                }
                return events;
            }
            case HANDSHAKE: {
                LeaderHandshake.State s = handshake.state();
                int events = s == LeaderHandshake.State.REPLY ? POLLOUT
                        : s == LeaderHandshake.State.AWAIT_STREAM ? 0 : POLLIN;
                // Once the exchange has started, the stream's arrival and the timer wake the selector.
                return signalled || (liveKey() == null && handshake.attempted()) ? events | POLLOUT : events;
            }
            case RDMA:
                return signalled || liveKey() == null || streamReady(ops) ? POLLOUT : 0;
            default:
                return POLLOUT;
        }
    }

    private boolean streamReady(int ops) {
        RdmaStream s = stream;
        return ((ops & SelectionKey.OP_READ) != 0 && s.isReadable())
                || ((ops & SelectionKey.OP_WRITE) != 0 && s.isWritable());
    }

    /** The key learned from the selector's last report, unless cancelled since (a channel may register again). */
    private SelectionKeyImpl liveKey() {
        SelectionKeyImpl k = key;
        return k != null && k.isValid() ? k : null;
    }

    /** Has the selector report this channel once more. Any thread; after the close it does nothing that matters. */
    private void signal() {
        if (signalled) {
            // The report still to come reads the stream's state after this change.
            return;
        }
        signalled = true;
        SelectionKeyImpl k = liveKey();
        if (k != null) {
            SelectorWakeups.wake(k);
        }
    }

    /** Has the selector ask for this channel's events again, which a change of mode or handshake state changed. */
    private void refresh() {
        SelectionKeyImpl k = liveKey();
        if (k != null) {
            SelectorWakeups.requestUpdate(k);
        }
    }

    /**
     * Keeps the selector reporting while the stream has something the key is interested in (level-triggered). Kafka
     * reads and writes on the selector's own thread, whose next select asks for the events again: no wake-up.
     */
    private void rearm() {
        if (streamReady(interest)) {
            refresh();
        }
    }

    @Override
    public boolean translateAndUpdateReadyOps(int ops, SelectionKeyImpl ski) {
        return translateReadyOps(ops, ski.nioReadyOps(), ski);
    }

    @Override
    public boolean translateAndSetReadyOps(int ops, SelectionKeyImpl ski) {
        return translateReadyOps(ops, 0, ski);
    }

    /** @param polled the TCP socket's events, as the selector's epoll reported them */
    private boolean translateReadyOps(int polled, int initialOps, SelectionKeyImpl ski) {
        if (key != ski) {
            // A signal that found no key set its flag first, so the events asked for below include its wake-up.
            key = ski;
        }
        // This report is the wake-up asked for: what the stream has is read below, after a signal can set it again.
        signalled = false;
        int ops = ski.nioInterestOps();
        int ready = 0;
        switch (mode) {
            case UNCONNECTED:
            case TCP: {
                boolean error = (polled & (POLLERR | POLLHUP)) != 0;
                if ((polled & POLLIN) != 0 || error || replay.hasRemaining()) {
                    ready |= SelectionKey.OP_READ;
                }
                if ((polled & POLLOUT) != 0 || error) {
                    ready |= tcp.isConnectionPending() ? SelectionKey.OP_CONNECT : SelectionKey.OP_WRITE;
                }
                break;
            }
            case HANDSHAKE:
                // Kafka's read drives the handshake; a spurious wake-up reads 0 bytes.
                ready = SelectionKey.OP_READ;
                break;
            case RDMA: {
                RdmaStream s = stream;
                if (s.isReadable()) {
                    ready |= SelectionKey.OP_READ;
                }
                if (s.isWritable()) {
                    ready |= SelectionKey.OP_WRITE;
                }
                break;
            }
            default:
                ready = SelectionKey.OP_READ | SelectionKey.OP_WRITE | SelectionKey.OP_CONNECT;
                break;
        }
        if (socketEvents(ops) != requested) {
            // A wake-up delivered, or the replay read: the socket's writability stops standing for one.
            SelectorWakeups.requestUpdate(ski);
        }
        ready &= ops;
        int newOps = initialOps | ready;
        ski.nioReadyOps(newOps);
        return (newOps & ~initialOps) != 0;
    }

    /** Called by the selector once it no longer polls the closed channel's socket: its number may be reused now. */
    @Override
    public void kill() {
        try {
            tcp.close();
        } catch (IOException e) {
            // As the JDK's own channels: the selector's clean-up goes on, and the socket is gone either way.
            LOG.debug("Closing the socket of {} failed", this, e);
        }
    }

    // ---- the rest of SocketChannel: delegated to the TCP socket -------------------------------------------------

    @Override
    public SocketChannel bind(SocketAddress local) throws IOException {
        tcp.bind(local);
        return this;
    }

    @Override
    public <T> SocketChannel setOption(SocketOption<T> name, T value) throws IOException {
        tcp.setOption(name, value);
        return this;
    }

    @Override
    public <T> T getOption(SocketOption<T> name) throws IOException {
        return tcp.getOption(name);
    }

    @Override
    public Set<SocketOption<?>> supportedOptions() {
        return tcp.supportedOptions();
    }

    @Override
    public SocketChannel shutdownInput() throws IOException {
        tcp.shutdownInput();
        return this;
    }

    @Override
    public SocketChannel shutdownOutput() throws IOException {
        if (mode == Mode.RDMA) {
            stream.shutdownOutput();
        } else {
            tcp.shutdownOutput();
        }
        return this;
    }

    @Override
    public Socket socket() {
        return socket;
    }

    /** The TCP channel's own socket, for {@link ReplicationSocket}'s addresses and options. */
    Socket tcpSocket() {
        return tcp.socket();
    }

    @Override
    public SocketAddress getRemoteAddress() throws IOException {
        return tcp.getRemoteAddress();
    }

    @Override
    public SocketAddress getLocalAddress() throws IOException {
        return tcp.getLocalAddress();
    }

    @Override
    protected void implConfigureBlocking(boolean block) throws IOException {
        tcp.configureBlocking(block);
    }

    @Override
    protected void implCloseSelectableChannel() throws IOException {
        cancelDeadline();
        if (handshake != null) {
            handshake.expire("channel closed during the RDMA handshake");
        }
        try {
            if (stream != null) {
                // The stream's event loop still reports its own close: nobody polls this channel any more.
                stream.readinessListener(() -> { });
                if (handshake != null) {
                    // The place under rdma.max.connections stands for the queue pair and its memory, which outlive
                    // this close while the stream delivers what it took (up to its linger).
                    stream.whenClosed(handshake::connectionClosed);
                }
                stream.close();
            } else if (handshake != null) {
                handshake.connectionClosed();
            }
        } finally {
            if (peer != null) {
                // Its counters may give their place in the peer table to another peer's now.
                peer.release();
            }
            if (isRegistered()) {
                endTcpOutput();
            } else {
                tcp.close();
            }
        }
    }

    /**
     * What the JDK's own channel does when closed while registered: the peer reads the end of the stream now, the
     * socket keeps its number until {@link #kill()}, and the close there does not wait for a linger.
     */
    private void endTcpOutput() {
        try {
            int linger = tcp.getOption(StandardSocketOptions.SO_LINGER);
            if (linger != 0 && tcp.isConnected()) {
                if (linger > 0) {
                    tcp.setOption(StandardSocketOptions.SO_LINGER, -1);
                }
                tcp.shutdownOutput();
            }
        } catch (IOException e) {
            // Reset by the peer, or closed by a deregistration meanwhile: nothing is left to end.
        }
    }

    private void ensureOpen() throws ClosedChannelException {
        if (!isOpen()) {
            throw new ClosedChannelException();
        }
    }

    @Override
    public String toString() {
        return "ReplicationSocketChannel[" + mode + ", peer=" + (peer == null ? "?" : peer.id()) + ", " + tcp + "]";
    }
}
