package io.rdmabridge.verbs;

import java.time.Duration;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Supplier;

/**
 * Live verbs resources of a provider. Providers update it as resources come and go; anyone may read it from any
 * thread. Tests assert {@link #isZero()} after every case: nothing registered, connected or queued is leaked.
 *
 * <p>The peer counts ({@link #peerFiles()}, {@link #peerKeyTables()}, {@link #peerBytes()}) are the soft provider's
 * same-host path: a peer process's memory files open and its key tables mapped. They are released when the link's
 * socket closes, which the verbs calls do not wait for, so they are left out of {@link #isZero()}; tests wait for
 * {@link #peerMappingsReleased()} instead. {@link #sameHostConnections()} counts, from the start, the connections that
 * took that path: which path a job's connections took, for reports.
 *
 * <p>A resource is counted until the provider has destroyed it, which may be shortly after the call that released it
 * returned: a DiSNI completion queue with an event thread is destroyed by that thread (see {@link #awaitZero}).
 */
public final class ResourceUsage {
    private final AtomicLong registeredBytes = new AtomicLong();
    private final AtomicLong memoryRegions = new AtomicLong();
    private final AtomicLong queuePairs = new AtomicLong();
    private final AtomicLong completionQueues = new AtomicLong();
    private final AtomicLong protectionDomains = new AtomicLong();
    private final AtomicLong cmIds = new AtomicLong();
    private final AtomicLong eventChannels = new AtomicLong();
    private final AtomicLong peerFiles = new AtomicLong();
    private final AtomicLong peerKeyTables = new AtomicLong();
    private final AtomicLong peerBytes = new AtomicLong();
    private final AtomicLong sameHostConnections = new AtomicLong();
    /** What the provider can say of its live resources, for {@link #toString()} while any are left. */
    private volatile Supplier<String> liveResources;

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

    /** Same-host peers' memory files open. */
    public long peerFiles() {
        return peerFiles.get();
    }

    /** Same-host peers' key tables mapped. */
    public long peerKeyTables() {
        return peerKeyTables.get();
    }

    /** The bytes of the peer files and key tables above. */
    public long peerBytes() {
        return peerBytes.get();
    }

    /**
     * Connections established so far, closed ones included, that took the soft provider's same-host path (shared
     * memory instead of the TCP link); 0 on a device and when every peer was on another host.
     */
    public long sameHostConnections() {
        return sameHostConnections.get();
    }

    /** Whether no same-host peer's file or key table is held. */
    public boolean peerMappingsReleased() {
        return peerFiles() == 0 && peerKeyTables() == 0 && peerBytes() == 0;
    }

    public boolean isZero() {
        return registeredBytes() == 0 && memoryRegions() == 0 && queuePairs() == 0 && completionQueues() == 0
                && protectionDomains() == 0 && cmIds() == 0 && eventChannels() == 0;
    }

    /**
     * Waits until {@link #isZero()}, for {@code timeout} at most: for releases that a provider finishes on a thread of
     * its own after the closing call returned.
     *
     * @return whether it reached zero in time
     */
    public boolean awaitZero(Duration timeout) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!isZero()) {
            if (System.nanoTime() - deadline >= 0) {
                return false;
            }
            TimeUnit.MILLISECONDS.sleep(5);
        }
        return true;
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

    /**
     * Provider side; {@code delta} is +1 or -1, {@code bytes} the file's size with the same sign; or {@code delta} 0
     * and {@code bytes} what an open file grew by.
     */
    public void peerFiles(int delta, long bytes) {
        peerFiles.addAndGet(delta);
        peerBytes.addAndGet(bytes);
    }

    /** Provider side; as {@link #peerFiles(int, long)}. */
    public void peerKeyTables(int delta, long bytes) {
        peerKeyTables.addAndGet(delta);
        peerBytes.addAndGet(bytes);
    }

    /** Provider side: a connection took the same-host path. */
    public void sameHostConnected() {
        sameHostConnections.incrementAndGet();
    }

    @Override
    public String toString() {
        Supplier<String> live = liveResources;
        return "registeredBytes=" + registeredBytes() + ", memoryRegions=" + memoryRegions() + ", queuePairs="
                + queuePairs() + ", completionQueues=" + completionQueues() + ", protectionDomains="
                + protectionDomains() + ", cmIds=" + cmIds() + ", eventChannels=" + eventChannels() + ", peerFiles="
                + peerFiles() + ", peerKeyTables=" + peerKeyTables() + ", peerBytes=" + peerBytes()
                + (live != null && !isZero() ? "; live: " + live.get() : "");
    }

    /**
     * Provider side: describes the live resources (who made them, in what state) when a test finds some left, so that
     * a leak names its maker.
     */
    public void describeLiveResourcesWith(Supplier<String> description) {
        liveResources = description;
    }
}
