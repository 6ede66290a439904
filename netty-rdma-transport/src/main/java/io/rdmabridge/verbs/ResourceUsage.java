package io.rdmabridge.verbs;

import java.util.concurrent.atomic.AtomicLong;

/**
 * Live verbs resources of a provider. Providers update it as resources come and go; anyone may read it from any
 * thread. Tests assert {@link #isZero()} after every case: nothing registered, connected or queued is leaked.
 */
public final class ResourceUsage {
    private final AtomicLong registeredBytes = new AtomicLong();
    private final AtomicLong memoryRegions = new AtomicLong();
    private final AtomicLong queuePairs = new AtomicLong();
    private final AtomicLong completionQueues = new AtomicLong();
    private final AtomicLong protectionDomains = new AtomicLong();
    private final AtomicLong cmIds = new AtomicLong();
    private final AtomicLong eventChannels = new AtomicLong();

    public long registeredBytes() {
        return registeredBytes.get();
    }

    public long memoryRegions() {
        return memoryRegions.get();
    }

    public long queuePairs() {
        return queuePairs.get();
    }

    public long completionQueues() {
        return completionQueues.get();
    }

    public long protectionDomains() {
        return protectionDomains.get();
    }

    public long cmIds() {
        return cmIds.get();
    }

    public long eventChannels() {
        return eventChannels.get();
    }

    public boolean isZero() {
        return registeredBytes() == 0 && memoryRegions() == 0 && queuePairs() == 0 && completionQueues() == 0
                && protectionDomains() == 0 && cmIds() == 0 && eventChannels() == 0;
    }

    /** Provider side. */
    public void memoryRegistered(long bytes) {
        registeredBytes.addAndGet(bytes);
        memoryRegions.incrementAndGet();
    }

    /** Provider side. */
    public void memoryDeregistered(long bytes) {
        registeredBytes.addAndGet(-bytes);
        memoryRegions.decrementAndGet();
    }

    /** Provider side; {@code delta} is +1 or -1. */
    public void queuePairs(int delta) {
        queuePairs.addAndGet(delta);
    }

    /** Provider side. */
    public void completionQueues(int delta) {
        completionQueues.addAndGet(delta);
    }

    /** Provider side. */
    public void protectionDomains(int delta) {
        protectionDomains.addAndGet(delta);
    }

    /** Provider side. */
    public void cmIds(int delta) {
        cmIds.addAndGet(delta);
    }

    /** Provider side. */
    public void eventChannels(int delta) {
        eventChannels.addAndGet(delta);
    }

    @Override
    public String toString() {
        return "registeredBytes=" + registeredBytes() + ", memoryRegions=" + memoryRegions() + ", queuePairs="
                + queuePairs() + ", completionQueues=" + completionQueues() + ", protectionDomains="
                + protectionDomains() + ", cmIds=" + cmIds() + ", eventChannels=" + eventChannels();
    }
}
