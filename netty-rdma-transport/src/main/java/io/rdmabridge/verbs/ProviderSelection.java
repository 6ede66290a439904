package io.rdmabridge.verbs;

import java.util.Map;

/**
 * The outcome of choosing a provider: which one was asked for, which one was chosen (if any), and why every other
 * candidate was not usable. It never pretends: when nothing fits, {@link #provider()} is {@code null} and
 * {@link #reason()} says what to do.
 *
 * @param requested   {@code auto}, {@code disni}, {@code soft} or another provider name
 * @param provider    the chosen, available provider, or {@code null}
 * @param reason      one sentence: why this provider, or why none (naming the causes and the fix)
 * @param rejected    provider name → why it was not chosen, for every provider considered and not chosen
 */
public record ProviderSelection(String requested, RdmaProvider provider, String reason, Map<String, String> rejected) {

    public ProviderSelection {
        rejected = Map.copyOf(rejected);
    }

    public boolean isAvailable() {
        return provider != null;
    }

    /**
     * The chosen provider.
     *
     * @throws RdmaException carrying {@link #reason()} when none could be chosen
     */
    public RdmaProvider orElseThrow() throws RdmaException {
        if (provider == null) {
            throw new RdmaException(reason);
        }
        return provider;
    }
}
