package io.rdmabridge.grpc;

import io.netty.util.ResourceLeakDetector;

import java.util.concurrent.atomic.AtomicInteger;

/**
 * Netty's leak detector, counting what it reports: installed with {@code -Dio.netty.customResourceLeakDetector}
 * (this module's test JVMs), so a test can assert that the leak detector at paranoid stayed quiet.
 */
public final class CountingLeakDetector<T> extends ResourceLeakDetector<T> {
    static final AtomicInteger LEAKS = new AtomicInteger();

    public CountingLeakDetector(Class<?> resourceType, int samplingInterval) {
        super(resourceType, samplingInterval);
    }

    /** The constructor Netty's factory looks for first. */
    @SuppressWarnings("deprecation")
    public CountingLeakDetector(Class<?> resourceType, int samplingInterval, long maxActive) {
        super(resourceType, samplingInterval, maxActive);
    }

    @Override
    protected void reportTracedLeak(String resourceType, String records) {
        LEAKS.incrementAndGet();
        super.reportTracedLeak(resourceType, records);
    }

    @Override
    protected void reportUntracedLeak(String resourceType) {
        LEAKS.incrementAndGet();
        super.reportUntracedLeak(resourceType);
    }
}
