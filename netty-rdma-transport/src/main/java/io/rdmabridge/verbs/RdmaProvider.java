package io.rdmabridge.verbs;

import java.util.List;

/**
 * An implementation of the verbs SPI: real hardware (DiSNI) or the software device.
 *
 * <h2>Provider contract</h2>
 * <ul>
 *   <li>A public zero-argument constructor and a {@code META-INF/services/io.rdmabridge.verbs.RdmaProvider} entry.</li>
 *   <li>The constructor and static initializers never throw and never load native code eagerly; the availability
 *       probe runs on the first call of {@link #isAvailable()} or {@link #unavailabilityCause()}, opens real resources,
 *       and remembers its result (Netty's {@code Epoll} pattern).</li>
 *   <li>Every other method may be called only when {@link #isAvailable()} is true; otherwise it throws an
 *       {@link RdmaException} carrying {@link #unavailabilityCause()}.</li>
 * </ul>
 * Instances are thread-safe.
 */
public interface RdmaProvider {

    /** The name users choose it by with {@code rdmabridge.provider}: {@code disni} or {@code soft}. */
    String name();

    /**
     * Whether this provider drives a real RDMA device. {@code auto} selection considers hardware providers only: the
     * software device is never picked without being asked for.
     */
    boolean isHardware();

    /** Higher wins among available hardware providers under {@code auto}. */
    int priority();

    /**
     * Whether {@link CmEvent#privateData()} and {@link RdmaCmId#peerParameters()} carry what the peer sent with
     * connect, accept and reject, and whether {@link RdmaCmId#accept} and {@link RdmaCmId#reject} can send private
     * data. True by default; a provider whose connection manager drops private data (DiSNI 2.1) answers false, and
     * protocols then exchange their handshake in their first messages instead.
     */
    default boolean deliversPrivateData() {
        return true;
    }

    /** Whether the provider can be used in this process. Never throws. */
    boolean isAvailable();

    /** Why {@link #isAvailable()} is false (its message names the cause and the fix), or {@code null}. Never throws. */
    Throwable unavailabilityCause();

    /** The devices this provider can drive, opened on first use and owned by the provider. */
    List<RdmaDevice> devices() throws RdmaException;

    /**
     * Creates a connection-manager event channel ({@code rdma_create_event_channel}).
     *
     * @param notifier signalled whenever an event becomes available to {@link RdmaEventChannel#poll(CmEvent)};
     *                 may be {@code null} when the caller polls without waiting
     */
    RdmaEventChannel createEventChannel(EventNotifier notifier) throws RdmaException;

    /** Live resources of this provider, across all devices, for accounting and tests. */
    ResourceUsage resourceUsage();
}
