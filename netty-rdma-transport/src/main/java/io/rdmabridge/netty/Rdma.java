package io.rdmabridge.netty;

import io.rdmabridge.verbs.ProviderSelection;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RdmaProviders;

/**
 * Whether the RDMA transport can be used in this process, with the provider chosen by
 * {@link RdmaProviders#select()} (system property {@value RdmaProviders#PROVIDER_PROPERTY}: {@code auto},
 * {@code disni} or {@code soft}). Probed once, on first use; never throws from its initializer. Thread-safe.
 */
public final class Rdma {
    private static final RdmaProvider PROVIDER;
    private static final Throwable UNAVAILABILITY_CAUSE;

    static {
        RdmaProvider provider = null;
        Throwable cause;
        try {
            ProviderSelection selection = RdmaProviders.select();
            provider = selection.provider();
            cause = provider == null ? new RdmaException(selection.reason()) : null;
        } catch (Throwable t) {
            cause = t;
        }
        PROVIDER = provider;
        UNAVAILABILITY_CAUSE = cause;
    }

    private Rdma() {
    }

    /** Whether an RDMA provider is available (hardware, or the software provider when asked for). */
    public static boolean isAvailable() {
        return UNAVAILABILITY_CAUSE == null;
    }

    /** Why {@link #isAvailable()} is false, naming the cause and the fix; {@code null} when available. */
    public static Throwable unavailabilityCause() {
        return UNAVAILABILITY_CAUSE;
    }

    /**
     * @throws IllegalStateException carrying {@link #unavailabilityCause()} when the transport cannot be used
     */
    public static void ensureAvailability() {
        if (UNAVAILABILITY_CAUSE != null) {
            throw new IllegalStateException("RDMA transport unavailable: " + UNAVAILABILITY_CAUSE.getMessage(),
                    UNAVAILABILITY_CAUSE);
        }
    }

    /** The chosen provider. */
    static RdmaProvider provider() {
        ensureAvailability();
        return PROVIDER;
    }
}
