package io.rdmabridge.netty;

import io.netty.channel.ChannelOutboundBuffer;
import io.netty.channel.ChannelPromise;
import io.netty.channel.IoEvent;
import io.netty.channel.IoRegistration;
import io.netty.channel.RecvByteBufAllocator;
import io.netty.channel.socket.ServerSocketChannel;
import io.netty.channel.socket.ServerSocketChannelConfig;
import io.netty.util.internal.logging.InternalLogger;
import io.netty.util.internal.logging.InternalLoggerFactory;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.ConnectionParameters;
import io.rdmabridge.verbs.RateLimitedWarning;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaException;

import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.channels.AlreadyBoundException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.LoggerFactory;

/**
 * A {@link ServerSocketChannel} listening for RDMA connections through the connection manager.
 * <pre>
 * new ServerBootstrap().group(group).channel(RdmaServerSocketChannel.class)
 * </pre>
 * Each connect request is handed up as a new {@link RdmaSocketChannel}; the request is answered once that child is
 * registered on its event loop, where its queue pair lives, and the child becomes active once the peer's handshake
 * (its first frame on the queue pair) has arrived and been validated, or closes with the cause named. At most
 * {@code SO_BACKLOG} requests wait to be read; beyond that they are rejected.
 *
 * <p>Threading: one event-loop thread owns the listening id and the connection-manager events of the children's ids.
 */
public final class RdmaServerSocketChannel extends AbstractRdmaChannel implements ServerSocketChannel {
    private static final InternalLogger logger = InternalLoggerFactory.getInstance(RdmaServerSocketChannel.class);
    static final RateLimitedWarning REFUSALS =
            new RateLimitedWarning(LoggerFactory.getLogger(RdmaServerSocketChannel.class), 10_000);

    private final RdmaServerChannelConfig config = new RdmaServerChannelConfig(this);
    private final ArrayDeque<RdmaSocketChannel> pending = new ArrayDeque<>();
    /**
     * Accepted channels read and not yet active nor closed: each holds, or is about to hold once its own loop has
     * registered it, a queue pair and its receive buffers, so {@code SO_BACKLOG} bounds them with the requests not yet
     * read, as a TCP listener's backlog bounds its half-open connections. Counted when read (this loop), ended on the
     * children's own loops.
     */
    private final AtomicInteger handshaking = new AtomicInteger();
    private RdmaCmId id;
    private volatile boolean active;
    private volatile boolean open = true;
    private final ReadPending readPending = new ReadPending(this);
    private boolean readScheduled;

    /** Creates an unbound listener. */
    public RdmaServerSocketChannel() {
        super(null);
    }

    @Override
    public ServerSocketChannelConfig config() {
        return config;
    }

    @Override
    public boolean isOpen() {
        return open;
    }

    @Override
    public boolean isActive() {
        return active;
    }

    @Override
    public InetSocketAddress remoteAddress() {
        return null;
    }

    @Override
    protected SocketAddress remoteAddress0() {
        return null;
    }

    @Override
    protected AbstractUnsafe newUnsafe() {
        return new RdmaServerUnsafe();
    }

    @Override
    protected void doBind(SocketAddress localAddress) throws Exception {
        if (!(localAddress instanceof InetSocketAddress)) {
            throw new IllegalArgumentException("localAddress: " + localAddress + " (expected: an InetSocketAddress)");
        }
        if (id != null) {
            throw new AlreadyBoundException(); // as a JDK server channel: the first listener would be lost
        }
        RdmaCmId listener = handler.eventChannel().createId();
        try {
            listener.attach(unsafe());
            local = listener.listen((InetSocketAddress) localAddress, config.getBacklog());
        } catch (RdmaException | RuntimeException e) {
            listener.close();
            throw e;
        }
        id = listener;
        active = true;
    }

    // A listener carries no bytes: like every Netty server channel it refuses to disconnect or write.
    @Override
    protected void doDisconnect() {
        throw new UnsupportedOperationException();
    }

    @Override
    protected void doWrite(ChannelOutboundBuffer in) {
        throw new UnsupportedOperationException();
    }

    @Override
    protected Object filterOutboundMessage(Object msg) {
        throw new UnsupportedOperationException();
    }

    @Override
    protected void doBeginRead() {
        readPending.set();
        if (!pending.isEmpty() && !readScheduled) {
            readScheduled = true;
            eventLoop().execute(() -> {
                readScheduled = false;
                readAccepted();
            });
        }
    }

    /** {@code autoRead} was turned off (any thread): accepted channels wait in the backlog until the next read. */
    void clearReadPending() {
        readPending.cancel();
    }

    private void readAccepted() {
        if (!readPending.isPending() || pending.isEmpty() || !isOpen()) {
            return;
        }
        RecvByteBufAllocator.Handle allocHandle = unsafe().recvBufAllocHandle();
        allocHandle.reset(config);
        boolean delivered = false;
        do {
            RdmaSocketChannel child = pending.poll();
            if (child == null) {
                break;
            }
            allocHandle.incMessagesRead(1);
            readPending.delivered();
            delivered = true;
            child.setup.handshakeStarted();
            pipeline().fireChannelRead(child);
        } while (allocHandle.continueReading());
        if (delivered) {
            allocHandle.readComplete();
            pipeline().fireChannelReadComplete();
        }
    }

    private void connectRequest(RdmaCmIoEvent event) {
        RdmaCmId request = event.id();
        int waiting = pending.size() + handshaking.get();
        if (!isActive()) {
            reject(request, "the listener is closing");
            return;
        }
        if (waiting >= config.getBacklog()) {
            // The reason goes to the peer (where the device delivers reject data); the operator gets the fix.
            REFUSALS.warn("{}: refused a connection request from {}: {} connections are not accepted or have not"
                    + " completed their handshake, SO_BACKLOG is {} (raise it for bursts of connections, or read"
                    + " accepted channels sooner)", this, request.remoteAddress(), waiting, config.getBacklog());
            reject(request, "backlog full: " + waiting + " connections are not accepted or have not completed "
                    + "their handshake (the server may raise SO_BACKLOG)");
            return;
        }
        RdmaSocketChannel child;
        try {
            child = new RdmaSocketChannel(this, request, handler);
            request.attach(child.unsafe());
        } catch (Throwable t) {
            // Out of memory, say: this request is refused and the listener goes on, as an NIO acceptor does.
            reject(request, "cannot accept: " + t);
            pipeline().fireExceptionCaught(t);
            return;
        }
        pending.add(child);
        if (readPending.isPending()) {
            readAccepted();
        }
    }

    /** An accepted channel left the backlog for the pipeline: it counts against it until active or closed. */
    void handshakeStarted() {
        handshaking.incrementAndGet();
    }

    /** An accepted channel that was read became active or closed (on its own event loop). */
    void handshakeEnded() {
        handshaking.decrementAndGet();
    }

    private static void reject(RdmaCmId request, String reason) {
        byte[] why = reason.getBytes(StandardCharsets.UTF_8);
        try {
            request.reject(Arrays.copyOf(why, Math.min(why.length, ConnectionParameters.MAX_REJECT_PRIVATE_DATA)));
        } catch (RdmaException | RuntimeException e) {
            logger.debug("Rejecting an RDMA connection request failed", e);
        } finally {
            request.close();
        }
    }

    @Override
    protected void doClose() {
        open = false;
        active = false;
        RdmaCmId listener = id;
        id = null;
        if (listener != null) {
            listener.close();
        }
        RdmaSocketChannel child;
        while ((child = pending.poll()) != null) {
            child.unsafe().closeForcibly();
        }
    }

    private final class RdmaServerUnsafe extends AbstractRdmaUnsafe {
        @Override
        public void connect(SocketAddress remoteAddress, SocketAddress localAddress, ChannelPromise promise) {
            promise.setFailure(new UnsupportedOperationException("a server channel does not connect"));
        }

        @Override
        public void handle(IoRegistration registration, IoEvent event) {
            RdmaCmIoEvent e = (RdmaCmIoEvent) event;
            if (e.type() == CmEventType.CONNECT_REQUEST) {
                connectRequest(e);
            } else {
                logger.debug("Unexpected connection-manager event on listener {}: {}", local, e.describe());
            }
        }

        @Override
        public int poll(RdmaIoHandler h) {
            return 0;
        }

        @Override
        public void arm() {
        }

        @Override
        public void destroyNow() {
            if (open) {
                doClose();
            }
        }

        @Override
        public long busyPollBudgetNanos() {
            return 0;
        }

        @Override
        public long sendCompletionPollDeadline(long now) {
            return now;
        }
    }
}
