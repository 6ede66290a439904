package io.rdmabridge.verbs;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.ServiceConfigurationError;
import java.util.ServiceLoader;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Finds {@link RdmaProvider}s with {@link ServiceLoader} and chooses one.
 *
 * <p>The choice comes from the system property {@value #PROVIDER_PROPERTY} (or a framework's own key mapped onto
 * the same values):
 * <ul>
 *   <li>{@code auto} (the default): the available hardware provider of highest priority; the software provider is
 *       never picked silently. With no hardware usable, the selection is empty and its reason names every cause;
 *       callers fall back to TCP or fail with that reason.</li>
 *   <li>a provider name ({@code disni}, {@code soft}): that provider if it is available, otherwise empty with its
 *       cause.</li>
 * </ul>
 * Thread-safe.
 */
public final class RdmaProviders {
    /** System property naming the provider: {@code auto}, {@code disni} or {@code soft}. */
    public static final String PROVIDER_PROPERTY = "rdmabridge.provider";
    public static final String AUTO = "auto";

    private static final Logger LOG = LoggerFactory.getLogger(RdmaProviders.class);

    private static volatile List<RdmaProvider> providers;

    private RdmaProviders() {
    }

    /** Every provider on the class path, hardware first, then by descending priority. */
    public static List<RdmaProvider> all() {
        List<RdmaProvider> list = providers;
        if (list == null) {
            synchronized (RdmaProviders.class) {
                list = providers;
                if (list == null) {
                    list = load(RdmaProviders.class.getClassLoader());
                    providers = list;
                }
            }
        }
        return list;
    }

    private static List<RdmaProvider> load(ClassLoader loader) {
        List<RdmaProvider> list = new ArrayList<>();
        var it = ServiceLoader.load(RdmaProvider.class, loader).iterator();
        while (true) {
            try {
                if (!it.hasNext()) {
                    break;
                }
                list.add(it.next());
            } catch (ServiceConfigurationError e) {
                // A broken provider must not hide the working ones; it is simply not offered.
                LOG.warn("Skipping an RDMA provider that cannot be loaded: {}", e.toString());
            }
        }
        list.sort(Comparator.comparing((RdmaProvider p) -> !p.isHardware())
                .thenComparing(Comparator.comparingInt(RdmaProvider::priority).reversed()));
        return List.copyOf(list);
    }

    /** The provider called {@code name}, available or not, or {@code null}. */
    public static RdmaProvider byName(String name) {
        for (RdmaProvider p : all()) {
            if (p.name().equalsIgnoreCase(name)) {
                return p;
            }
        }
        return null;
    }

    /** Chooses according to {@value #PROVIDER_PROPERTY} (default {@code auto}). */
    public static ProviderSelection select() {
        return select(System.getProperty(PROVIDER_PROPERTY, AUTO));
    }

    /**
     * Chooses according to {@code requested}: {@code auto}, or a provider's name, given as {@value #PROVIDER_PROPERTY}.
     */
    public static ProviderSelection select(String requested) {
        return select(requested, PROVIDER_PROPERTY);
    }

    /**
     * Chooses according to {@code requested}: {@code auto}, or a provider's name, given as the setting called
     * {@code setting} (a framework's own key, such as {@code spark.shuffle.rdma.provider}), which the reasons then
     * name as the one to change.
     */
    public static ProviderSelection select(String requested, String setting) {
        return select(requested, setting, all());
    }

    /** {@link #select(String, String)} over an explicit candidate list, ordered as {@link #all()} orders. */
    static ProviderSelection select(String requested, String setting, List<RdmaProvider> candidates) {
        String choice = requested == null || requested.isBlank() ? AUTO : requested.trim().toLowerCase(Locale.ROOT);
        Map<String, String> rejected = new LinkedHashMap<>();
        if (AUTO.equals(choice)) {
            RdmaProvider chosen = null;
            StringBuilder causes = new StringBuilder();
            for (RdmaProvider p : candidates) {
                if (!p.isHardware()) {
                    rejected.put(p.name(), "software provider: chosen only when asked for (" + setting + "=" + p.name()
                            + ")");
                } else if (chosen == null && p.isAvailable()) {
                    chosen = p;
                } else if (chosen != null) {
                    rejected.put(p.name(), "lower priority than " + chosen.name());
                } else {
                    String cause = describe(p.unavailabilityCause());
                    rejected.put(p.name(), cause);
                    causes.append("; ").append(p.name()).append(": ").append(cause);
                }
            }
            if (chosen != null) {
                return new ProviderSelection(choice, chosen, "auto: " + chosen.name() + " is available", rejected);
            }
            if (causes.length() == 0) {
                causes.append("; no hardware provider is on the class path");
            }
            return new ProviderSelection(choice, null, "auto: no RDMA hardware provider is usable" + causes
                    + ". Fix the cause above, or set " + setting + "=soft to use the software RDMA provider",
                    rejected);
        }
        RdmaProvider chosen = null;
        List<String> names = new ArrayList<>();
        for (RdmaProvider p : candidates) {
            names.add(p.name());
            if (p.name().equalsIgnoreCase(choice)) {
                chosen = p;
            }
        }
        if (chosen == null) {
            return new ProviderSelection(choice, null, "unknown RDMA provider '" + requested
                    + "' (expected: auto or one of " + names + "; set " + setting + " accordingly)",
                    rejected);
        }
        if (!chosen.isAvailable()) {
            rejected.put(chosen.name(), describe(chosen.unavailabilityCause()));
            return new ProviderSelection(choice, null, chosen.name() + " was requested (" + setting + "=" + choice
                    + ") but is unavailable: "
                    + describe(chosen.unavailabilityCause()), rejected);
        }
        for (RdmaProvider q : candidates) {
            if (q != chosen) {
                rejected.put(q.name(), "not requested (" + setting + "=" + choice + ")");
            }
        }
        return new ProviderSelection(choice, chosen, chosen.name() + " was requested and is available", rejected);
    }

    /** A cause as one readable sentence: the message of our own exceptions, the full text of anything else. */
    private static String describe(Throwable cause) {
        if (cause instanceof RdmaException && cause.getMessage() != null) {
            return cause.getMessage();
        }
        return String.valueOf(cause);
    }
}
