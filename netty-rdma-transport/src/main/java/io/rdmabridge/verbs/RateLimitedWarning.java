package io.rdmabridge.verbs;

import java.util.Arrays;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.slf4j.Logger;

/**
 * A WARN that a peer can cause over and over (refused or closed connections, failed sends): at most one line per
 * interval; the next line that is logged says how many were left out since the previous one, so a flood of hostile
 * connections costs a few lines, not one per connection. Thread-safe.
 */
public final class RateLimitedWarning {
    private final Logger log;
    private final long intervalNanos;
    private final AtomicLong nextNanos;
    private final AtomicLong suppressed = new AtomicLong();
    private final AtomicLong emitted = new AtomicLong();

    /** @param intervalMillis at most one line per this many milliseconds */
    public RateLimitedWarning(Logger log, long intervalMillis) {
        this.log = log;
        intervalNanos = TimeUnit.MILLISECONDS.toNanos(intervalMillis);
        nextNanos = new AtomicLong(System.nanoTime());
    }

    /** As {@link Logger#warn(String, Object...)}; a trailing {@link Throwable} stays the logged cause. */
    public void warn(String format, Object... args) {
        if (!log.isWarnEnabled()) {
            return;
        }
        long now = System.nanoTime();
        long next = nextNanos.get();
        if (now - next < 0 || !nextNanos.compareAndSet(next, now + intervalNanos)) {
            suppressed.incrementAndGet();
            return;
        }
        long left = suppressed.getAndSet(0);
        emitted.incrementAndGet();
        if (left == 0) {
            log.warn(format, args);
            return;
        }
        boolean withCause = args.length > 0 && args[args.length - 1] instanceof Throwable;
        int plain = withCause ? args.length - 1 : args.length;
        Object[] all = Arrays.copyOf(args, args.length + 2);
        all[plain] = left;
        all[plain + 1] = TimeUnit.NANOSECONDS.toMillis(intervalNanos);
        if (withCause) {
            all[all.length - 1] = args[plain];
        }
        log.warn(format + " ({} more like this suppressed, at most one line per {} ms)", all);
    }

    /** Lines logged so far. */
    public long emitted() {
        return emitted.get();
    }

    /** Calls left out since the last line logged. */
    public long suppressed() {
        return suppressed.get();
    }
}
