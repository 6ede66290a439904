package io.rdmabridge.kafka;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.nio.channels.ClosedSelectorException;
import sun.nio.ch.SelectionKeyImpl;
import sun.nio.ch.SelectorImpl;

/**
 * Has a JDK selector ask a channel again which events of its descriptor to watch ({@code SelectorImpl.setEventOps},
 * which {@code SelectionKey.interestOps} calls only when the interest set changes). A {@link ReplicationSocketChannel}
 * shows the selector its TCP socket; when the RDMA stream or the handshake has something the socket does not show, the
 * channel asks for the socket's writability through this, and the selector wakes.
 *
 * <p>Built on the JDK's {@code sun.nio.ch} classes, which the agent opens to this module. Thread-safe.
 */
final class SelectorWakeups {
    private static final MethodHandle SET_EVENT_OPS;
    private static final Throwable UNAVAILABILITY_CAUSE;

    static {
        MethodHandle h = null;
        Throwable cause = null;
        try {
            h = MethodHandles.privateLookupIn(SelectorImpl.class, MethodHandles.lookup()).findVirtual(
                    SelectorImpl.class, "setEventOps", MethodType.methodType(void.class, SelectionKeyImpl.class));
        } catch (Throwable t) {
            cause = new IllegalStateException("the JDK's selector (sun.nio.ch.SelectorImpl.setEventOps) is not usable ("
                    + t + "): the plugin needs an OpenJDK-based JDK 17 or later, whose selector has it, with "
                    + "java.base/sun.nio.ch opened to the plugin, which the plugin's -javaagent does", t);
        }
        SET_EVENT_OPS = h;
        UNAVAILABILITY_CAUSE = cause;
    }

    private SelectorWakeups() {
    }

    /** Why the selector's classes cannot be used in this JVM (naming the fix), or {@code null} when they can. */
    static Throwable unavailabilityCause() {
        return UNAVAILABILITY_CAUSE;
    }

    /**
     * Queues {@code key} for its selector's next select, which asks the channel for its events again; for the
     * selector's own thread, whose next select has not started. Nothing happens when the selector has closed.
     */
    static void requestUpdate(SelectionKeyImpl key) {
        try {
            SET_EVENT_OPS.invokeExact((SelectorImpl) key.selector(), key);
        } catch (ClosedSelectorException closed) {
            // Its keys are gone with it: nothing is left to wake.
        } catch (Throwable t) {
            // setEventOps only queues the key; nothing else can fail where the class loaded.
            throw new IllegalStateException(t);
        }
    }

    /** {@link #requestUpdate}, then wakes the selector should it wait in a select already; any thread. */
    static void wake(SelectionKeyImpl key) {
        requestUpdate(key);
        key.selector().wakeup();
    }
}
