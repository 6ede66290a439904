package io.rdmabridge.verbs.disni;

import com.ibm.disni.verbs.RdmaCm;
import com.ibm.disni.verbs.impl.NatCmaIdPrivate;
import com.ibm.disni.verbs.impl.NatRdmaEventChannel;
import com.ibm.disni.verbs.impl.NativeDispatcher;
import io.rdmabridge.internal.LinuxEpoll;
import io.rdmabridge.verbs.CmEvent;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.RateLimitedWarning;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.locks.ReentrantLock;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A connection-manager event channel over DiSNI's {@code RdmaEventChannel}.
 *
 * <p>A daemon thread per channel waits for events (the channel's descriptor in an epoll set, or, where epoll is not
 * usable, {@code rdma_get_cm_event} behind a {@code poll}; with a short timeout either way, so that it notices
 * {@link #close()}), queues each as a raw triple (type, id, listening id) on a lock-free queue and signals the
 * notifier. {@link #poll(CmEvent)} converts them on the owning thread: ids of connect requests are created there,
 * route resolution follows address resolution there, and queue-pair states change there.
 *
 * <p>A connect request past its listener's backlog, counting those queued and not yet polled, is rejected on the
 * event thread: the kernel bounds the requests not yet taken from it by that backlog (past it, it leaves a request
 * unanswered for the connector's CM to send again), and the event thread takes each at once, so a listener whose loop
 * is busy could otherwise be flooded with native ids. A request taken from the kernel can only be rejected.
 *
 * <p>The thread calls DiSNI's native dispatcher directly rather than {@code RdmaEventChannel.getCmEvent}: that
 * method allocates per call and reads and writes a plain {@code HashMap} of ids that {@code createId} writes from
 * the owning thread at the same time.
 *
 * <p>What DiSNI loses: its native code acknowledges every event before returning it and copies neither status nor
 * private data, so events carry status 0 and no private data; failure events name the rdma_cm event in
 * {@link CmEvent#detail()}.
 *
 * <p>Threading: owned by one thread; the event thread only reads the native channel, appends to the queue and marks
 * an id's connect answered. A queue pair closed while its connect is pending is destroyed between two of the event
 * thread's waits ({@link #outsideEventWait}): librdmacm modifies it inside {@code rdma_get_cm_event}.
 */
final class DisniEventChannel implements RdmaEventChannel {
    private static final Logger logger = LoggerFactory.getLogger(DisniEventChannel.class);
    /** How long the event thread blocks in {@code poll} before it looks at {@code running} again. */
    static final int EVENT_WAIT_MILLIS = 100;
    private static final byte[] NO_DATA = new byte[0];

    // enum rdma_cm_event_type
    private static final int ADDR_RESOLVED = 0;
    private static final int ADDR_ERROR = 1;
    private static final int ROUTE_RESOLVED = 2;
    private static final int ROUTE_ERROR = 3;
    private static final int CONNECT_REQUEST = 4;
    private static final int CONNECT_RESPONSE = 5;
    private static final int CONNECT_ERROR = 6;
    private static final int UNREACHABLE = 7;
    private static final int REJECTED = 8;
    private static final int ESTABLISHED = 9;
    private static final int DISCONNECTED = 10;
    private static final int DEVICE_REMOVAL = 11;

    /** {@code listener}: the listener whose backlog a connect request counts against, else {@code null}. */
    private record RawEvent(int type, long id, long listenId, DisniCmId listener) {
    }

    private static final RateLimitedWarning REFUSALS = new RateLimitedWarning(logger, 10_000);

    private final DisniProvider provider;
    private final NativeDispatcher dispatcher;
    private final com.ibm.disni.verbs.RdmaEventChannel channel;
    private final long channelHandle;
    private final EventNotifier notifier;
    private final ConcurrentLinkedQueue<RawEvent> events = new ConcurrentLinkedQueue<>();
    /** Ids whose native object exists, by native handle: where events are routed. */
    private final ConcurrentHashMap<Long, DisniCmId> ids = new ConcurrentHashMap<>();
    /** Ids not yet closed (a rejected id has no native object but still counts until closed). */
    private final Set<DisniCmId> open = ConcurrentHashMap.newKeySet();
    private final Thread eventThread;
    /**
     * Held by the event thread while it is inside {@code rdma_get_cm_event}, so that an id's queue pair can be
     * destroyed while librdmacm cannot be modifying it there ({@link #outsideEventWait}). Where epoll is usable the
     * thread waits for the channel to be readable without it, and holds it only while it takes one event; elsewhere
     * it also holds it during the poll before (up to {@value #EVENT_WAIT_MILLIS} ms), and a close of a queue pair
     * whose connect is pending waits that long. Fair: a waiting owner gets it when the current wait ends, not after
     * the next one.
     */
    private final ReentrantLock eventWait = new ReentrantLock(true);
    private volatile boolean running = true;
    private boolean closed;

    DisniEventChannel(DisniProvider provider, EventNotifier notifier) throws RdmaException {
        this.provider = provider;
        this.dispatcher = provider.dispatcher();
        this.notifier = notifier;
        try {
            channel = com.ibm.disni.verbs.RdmaEventChannel.createEventChannel();
        } catch (IOException e) {
            throw new RdmaException("rdma_create_event_channel failed: " + DisniErrors.clean(e), e);
        }
        channelHandle = ((NatRdmaEventChannel) channel).getObjId();
        eventThread = new Thread(this::waitForEvents, "disni-cm-events");
        eventThread.setDaemon(true);
        eventThread.start();
        provider.usage().eventChannels(1);
    }

    DisniProvider disniProvider() {
        return provider;
    }

    @Override
    public RdmaProvider provider() {
        return provider;
    }

    @Override
    public RdmaCmId createId() throws RdmaException {
        if (closed) {
            throw new RdmaException("createId: event channel is closed");
        }
        com.ibm.disni.verbs.RdmaCmId nat;
        try {
            nat = channel.createId(RdmaCm.RDMA_PS_TCP);
        } catch (IOException e) {
            throw new RdmaException("rdma_create_id failed: " + DisniErrors.clean(e), e);
        }
        return register(nat, ((NatCmaIdPrivate) nat).getObjId());
    }

    private DisniCmId register(com.ibm.disni.verbs.RdmaCmId nat, long handle) {
        DisniCmId id = new DisniCmId(this, nat, handle);
        ids.put(handle, id);
        open.add(id);
        provider.usage().cmIds(1);
        return id;
    }

    private void waitForEvents() {
        ByteBuffer out = ByteBuffer.allocateDirect(16).order(ByteOrder.nativeOrder());
        long address = DirectMemory.address(out);
        LinuxEpoll.WakeableSet readable = watchChannel();
        try {
            while (running) {
                if (readable != null) {
                    try {
                        if (readable.wait(EVENT_WAIT_MILLIS) == 0) {
                            continue;
                        }
                    } catch (IOException e) {
                        logger.warn("Waiting for connection-manager events with epoll failed ({}); waiting inside "
                                + "rdma_get_cm_event from now on", e.toString());
                        readable.close();
                        readable = null;
                    }
                }
                int type;
                eventWait.lock();
                try {
                    // Writes the listening id at address and the event's id at address + 8; -1 when none came in
                    // time. Once epoll has seen the channel readable, the event is taken without waiting.
                    type = dispatcher._getCmEvent(channelHandle, address, address + 8,
                            readable != null ? 0 : EVENT_WAIT_MILLIS);
                    if (answersConnect(type)) {
                        DisniCmId id = ids.get(out.getLong(8));
                        if (id != null) {
                            id.connectPending = false;
                        }
                    }
                } catch (RuntimeException e) {
                    logger.warn("Connection-manager events stopped: {}", DisniErrors.clean(e));
                    return;
                } finally {
                    eventWait.unlock();
                }
                if (type < 0) {
                    continue;
                }
                DisniCmId listener = null;
                if (type == CONNECT_REQUEST) {
                    listener = ids.get(out.getLong(0));
                    if (listener != null && !listener.takeRequestPlace()) {
                        refuse(out.getLong(8), listener);
                        continue;
                    }
                }
                events.add(new RawEvent(type, out.getLong(8), out.getLong(0), listener));
                if (notifier != null) {
                    notifier.signal();
                }
            }
        } finally {
            if (readable != null) {
                readable.close();
            }
        }
    }

    /**
     * Event thread: rejects a connect request past its listener's backlog by destroying the request's id, which makes
     * the kernel send a reject (where the kernel itself, past the backlog, leaves a request for its connector to send
     * again: one taken from it can no longer be left so).
     */
    private void refuse(long requestId, DisniCmId listener) {
        REFUSALS.warn("Refused a connection request to {}: {} requests wait for the listener's loop to take them, its"
                + " backlog (raise SO_BACKLOG for bursts of connections, or keep the listener's event loop free of"
                + " long tasks)", listener.listeningAddress(), listener.listenBacklog());
        int rc = dispatcher._destroyCmId(requestId);
        if (rc != 0) {
            logger.warn("rdma_destroy_id of a refused connect request failed ({}); its peer waits for its connect"
                    + " timeout", rc);
        }
    }

    /**
     * An epoll set watching the channel's descriptor, so that the event thread waits for events outside
     * {@link #eventWait}; {@code null} where epoll is not usable ({@code sun.nio.ch} not opened: docs/disni.md), and
     * the thread then waits inside {@code rdma_get_cm_event}, holding it.
     */
    private LinuxEpoll.WakeableSet watchChannel() {
        if (LinuxEpoll.unavailabilityCause() != null) {
            return null;
        }
        // struct rdma_event_channel { int fd; }: the descriptor librdmacm reads the events from.
        int fd = NativeWords.getInt(channelHandle);
        try {
            LinuxEpoll.WakeableSet set = LinuxEpoll.WakeableSet.open(2);
            int rc = set.ctl(LinuxEpoll.CTL_ADD, fd, LinuxEpoll.EPOLLIN);
            if (rc == 0) {
                return set;
            }
            set.close();
            logger.warn("epoll_ctl(ADD) of connection-manager channel {} failed: errno {}; waiting inside "
                    + "rdma_get_cm_event instead", fd, rc);
        } catch (IOException e) {
            logger.warn("No epoll set for connection-manager events ({}); waiting inside rdma_get_cm_event instead",
                    e.toString());
        }
        return null;
    }

    /**
     * Whether an event of {@code type} answers a connect or an accept: librdmacm touches the queue pair no more after
     * it.
     */
    private static boolean answersConnect(int type) {
        return type == ESTABLISHED || type == CONNECT_RESPONSE || type == CONNECT_ERROR || type == UNREACHABLE
                || type == REJECTED || type == DISCONNECTED || type == DEVICE_REMOVAL;
    }

    /**
     * Runs {@code action} while the event thread is outside {@code rdma_get_cm_event}; waits while it takes an event,
     * or, where epoll is not usable, at most one event wait ({@value #EVENT_WAIT_MILLIS} ms). Any thread but the
     * event thread.
     */
    void outsideEventWait(Runnable action) {
        eventWait.lock();
        try {
            action.run();
        } finally {
            eventWait.unlock();
        }
    }

    @Override
    public boolean poll(CmEvent event) {
        RawEvent raw;
        while ((raw = events.poll()) != null) {
            if (convert(raw, event)) {
                return true;
            }
        }
        return false;
    }

    /**
     * Events the event thread has queued and {@link #poll} has not taken. An event still in the kernel, or between
     * {@code rdma_get_cm_event} and the queue, is not seen: the event thread moves it within microseconds of its
     * arrival, a window no longer than a socket's for an RST still on the wire.
     */
    @Override
    public boolean hasPendingEvents() {
        return !events.isEmpty();
    }

    private boolean convert(RawEvent raw, CmEvent out) {
        if (raw.type() == CONNECT_REQUEST) {
            return connectRequest(raw, out);
        }
        DisniCmId id = ids.get(raw.id());
        if (id == null) {
            return false; // the id was closed after the event was queued
        }
        boolean resolution = raw.type() <= ROUTE_ERROR;
        if (raw.type() <= DISCONNECTED && !id.expects(resolution)) {
            // A destroyed id's event, taken before it was destroyed and queued after: this id reuses its address.
            logger.debug("Dropping connection-manager event {} for {}: it asked for nothing that causes it",
                    raw.type(), id);
            return false;
        }
        switch (raw.type()) {
            case ADDR_RESOLVED:
                try {
                    id.resolveRoute();
                    return false; // ROUTE_RESOLVED completes the SPI's ADDR_RESOLVED
                } catch (RdmaException e) {
                    out.set(CmEventType.ADDR_ERROR, id, null, NO_DATA, 0, e.getMessage());
                    return true;
                }
            case ROUTE_RESOLVED:
                out.set(CmEventType.ADDR_RESOLVED, id, null, NO_DATA, 0, null);
                return true;
            case ADDR_ERROR:
                return failure(CmEventType.ADDR_ERROR, id, out, "address resolution failed (RDMA_CM_EVENT_ADDR_ERROR):"
                        + " no RDMA device reaches " + id.remoteAddress() + ", or it did not answer in time");
            case ROUTE_ERROR:
                return failure(CmEventType.ADDR_ERROR, id, out, "route resolution failed (RDMA_CM_EVENT_ROUTE_ERROR)"
                        + " to " + id.remoteAddress());
            case CONNECT_RESPONSE:
            case CONNECT_ERROR:
                return failure(CmEventType.CONNECT_ERROR, id, out, "connection handshake failed ("
                        + (raw.type() == CONNECT_ERROR ? "RDMA_CM_EVENT_CONNECT_ERROR" : "RDMA_CM_EVENT_CONNECT_RESPONSE")
                        + "; DiSNI 2.1 does not pass the status on)");
            case UNREACHABLE:
                return failure(CmEventType.UNREACHABLE, id, out, "peer " + id.remoteAddress() + " did not answer"
                        + " (RDMA_CM_EVENT_UNREACHABLE)");
            case REJECTED:
                return failure(CmEventType.REJECTED, id, out, "peer " + id.remoteAddress() + " rejected the connection"
                        + " or nothing listens there (RDMA_CM_EVENT_REJECTED; DiSNI 2.1 does not pass the reason or"
                        + " private data on)");
            case ESTABLISHED:
                id.established();
                out.set(CmEventType.ESTABLISHED, id, null, NO_DATA, 0, null);
                return true;
            case DISCONNECTED:
                id.disconnected();
                out.set(CmEventType.DISCONNECTED, id, null, NO_DATA, 0, null);
                return true;
            case DEVICE_REMOVAL:
                id.failed();
                out.set(CmEventType.DEVICE_REMOVAL, id, null, NO_DATA, 0, "the RDMA device was removed"
                        + " (RDMA_CM_EVENT_DEVICE_REMOVAL)");
                return true;
            default:
                return false; // multicast, address change, timewait exit: nothing a connected endpoint acts on
        }
    }

    private static boolean failure(CmEventType type, DisniCmId id, CmEvent out, String detail) {
        id.failed();
        out.set(type, id, null, NO_DATA, 0, detail);
        return true;
    }

    private boolean connectRequest(RawEvent raw, CmEvent out) {
        if (raw.listener() != null) {
            raw.listener().requestPolled();
        }
        DisniCmId listener = ids.get(raw.listenId());
        if (raw.listener() != null && listener != raw.listener()) {
            // Its listener was closed after the event thread queued it, and a new id reuses the address.
            listener = null;
        }
        NatCmaIdPrivate nat;
        try {
            nat = new NatCmaIdPrivate(raw.id(), channel, dispatcher);
        } catch (IOException e) {
            logger.warn("Dropping a connect request: cannot wrap its id: {}", DisniErrors.clean(e));
            return false;
        }
        if (listener == null || closed) {
            // The listener is gone: destroying the request's id makes the kernel reject it.
            try {
                nat.destroyId();
            } catch (IOException e) {
                logger.warn("Cannot reject a connect request for a closed listener: {}", DisniErrors.clean(e));
            }
            return false;
        }
        DisniCmId id = register(nat, raw.id());
        id.requested();
        out.set(CmEventType.CONNECT_REQUEST, id, listener, NO_DATA, 0, null);
        return true;
    }

    /** The id's native object is gone: drop it and any event still queued for it (its address may be reused). */
    void forget(DisniCmId id) {
        ids.remove(id.handle(), id);
        long handle = id.handle();
        events.removeIf(e -> e.id() == handle && e.type() != CONNECT_REQUEST);
    }

    /** The id was closed: it no longer counts. */
    void idClosed(DisniCmId id) {
        if (open.remove(id)) {
            provider.usage().cmIds(-1);
        }
    }

    /** Stops the event thread, closes every id still alive (and its queue pair), then destroys the channel. */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        running = false;
        DisniCompletionQueue.joinUninterruptibly(eventThread);
        List<DisniCmId> alive = new ArrayList<>(open);
        RuntimeException failure = null;
        for (DisniCmId id : alive) {
            try {
                id.close();
            } catch (RuntimeException e) {
                failure = e;
            }
        }
        // Connect requests queued but never polled: their ids exist natively and must go too.
        for (RawEvent raw : events) {
            if (raw.type() == CONNECT_REQUEST) {
                try {
                    new NatCmaIdPrivate(raw.id(), channel, dispatcher).destroyId();
                } catch (IOException e) {
                    logger.warn("Cannot reject a pending connect request: {}", DisniErrors.clean(e));
                }
            }
        }
        events.clear();
        try {
            channel.destroyEventChannel();
        } catch (IOException e) {
            failure = new IllegalStateException("rdma_destroy_event_channel failed: " + DisniErrors.clean(e), e);
        } finally {
            provider.usage().eventChannels(-1);
        }
        if (failure != null) {
            throw failure;
        }
    }
}
