package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.CmEvent;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.RdmaCmId;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A connection-manager event channel: a queue of events that provider threads add to and the owner polls. Private
 * data reaches the events only when the channel's provider delivers it ({@link SoftProvider.PrivateDataMode}).
 * {@link #emit} is thread-safe; {@link #poll} belongs to the owner.
 */
final class SoftEventChannel implements RdmaEventChannel {
    private record Event(CmEventType type, RdmaCmId id, RdmaCmId listenId, byte[] privateData, int status,
                         String detail) {
    }

    private static final byte[] NO_DATA = new byte[0];

    final SoftEngine engine;
    /** The device of the provider instance that made this channel: what its ids answer for {@code device()}. */
    final SoftDevice device;
    private final SoftProvider provider;
    private final EventNotifier notifier;
    private final ConcurrentLinkedQueue<Event> events = new ConcurrentLinkedQueue<>();
    final Set<SoftCmId> ids = ConcurrentHashMap.newKeySet();
    private final AtomicBoolean closed = new AtomicBoolean();
    /** The thread that made this channel: an event loop's, or an application's (in a leak report). */
    private final String maker = Thread.currentThread().getName();

    SoftEventChannel(SoftProvider provider, SoftDevice device, SoftEngine engine, EventNotifier notifier) {
        this.provider = provider;
        this.device = device;
        this.engine = engine;
        this.notifier = notifier;
        engine.usage.eventChannels(1);
        engine.liveEventChannels.add(this);
    }

    void emit(CmEventType type, RdmaCmId id, RdmaCmId listenId, byte[] privateData, int status, String detail) {
        if (closed.get()) {
            return;
        }
        byte[] data = provider.deliversPrivateData() ? privateData : NO_DATA;
        events.add(new Event(type, id, listenId, data, status, detail));
        if (notifier != null) {
            notifier.signal();
        }
    }

    /** Whether this channel's provider instance delivers private data. */
    boolean deliversPrivateData() {
        return provider.deliversPrivateData();
    }

    @Override
    public RdmaProvider provider() {
        return provider;
    }

    @Override
    public RdmaCmId createId() throws RdmaException {
        if (closed.get()) {
            throw new RdmaException("event channel is closed (expected: create ids on an open channel)");
        }
        return new SoftCmId(this);
    }

    @Override
    public boolean poll(CmEvent event) {
        Event e = events.poll();
        if (e == null) {
            return false;
        }
        if (e.type == CmEventType.CONNECT_REQUEST) {
            ((SoftCmId) e.listenId).requestPolled();
        }
        event.set(e.type, e.id, e.listenId, e.privateData, e.status, e.detail);
        return true;
    }

    @Override
    public boolean hasPendingEvents() {
        return !events.isEmpty();
    }

    /** Closes every id still alive on the channel, their queue pairs included, then the channel. */
    @Override
    public void close() {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        for (SoftCmId id : ids) {
            id.forceClose();
        }
        events.clear();
        engine.usage.eventChannels(-1);
        engine.liveEventChannels.remove(this);
    }

    @Override
    public String toString() {
        return "SoftEventChannel{made on " + maker + ", ids=" + ids + '}';
    }
}
