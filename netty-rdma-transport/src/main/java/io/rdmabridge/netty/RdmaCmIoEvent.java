package io.rdmabridge.netty;

import io.netty.channel.IoEvent;
import io.rdmabridge.verbs.CmEvent;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.RdmaCmId;

/**
 * A connection-manager event, copied out of the reusable {@link CmEvent} so that it can be handed to the event loop
 * that owns the channel (the child of a listener lives on another loop than the listener's event channel).
 * Immutable; one per connection-manager event, never per message.
 */
record RdmaCmIoEvent(CmEventType type, RdmaCmId id, RdmaCmId listenId, byte[] privateData, int status,
                     String detail) implements IoEvent {

    static RdmaCmIoEvent copyOf(CmEvent e) {
        return new RdmaCmIoEvent(e.type(), e.id(), e.listenId(), e.privateData().clone(), e.status(), e.detail());
    }

    String describe() {
        return type + (detail != null ? ": " + detail : "") + (status != 0 ? " (status " + status + ")" : "");
    }
}
