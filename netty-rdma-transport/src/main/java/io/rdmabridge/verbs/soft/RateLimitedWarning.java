package io.rdmabridge.verbs.soft;

import org.slf4j.Logger;

import java.util.concurrent.atomic.AtomicLong;

/**
 * A WARN that a peer can provoke over and over (a flood of sockets, bad handshakes): at most one line per interval,
 * and the next line says how many were suppressed since. Thread-safe and lock-free; a suppressed call allocates
 * nothing beyond its varargs array.
 */
final class RateLimitedWarning {
    private final Logger logger;
    private final long intervalNanos;
    private final AtomicLong nextAt = new AtomicLong(Long.MIN_VALUE);
    private final AtomicLong suppressed = new AtomicLong();
    private final AtomicLong emitted = new AtomicLong();

    RateLimitedWarning(Logger logger, long intervalMillis) {
        this.logger = logger;
        intervalNanos = intervalMillis * 1_000_000L;
    }

    /** Logs {@code format} (SLF4J style) unless a line went out less than an interval ago. */
    void warn(String format, Object... arguments) {
        long now = System.nanoTime();
        long next = nextAt.get();
        if (next != Long.MIN_VALUE && now - next < 0 || !nextAt.compareAndSet(next, now + intervalNanos)) {
            suppressed.incrementAndGet();
            return;
        }
        long dropped = suppressed.getAndSet(0);
        emitted.incrementAndGet();
        if (dropped == 0) {
            logger.warn(format, arguments);
        } else {
            logger.warn(format + " ({} more like this suppressed in the last {} s)",
                    append(arguments, dropped, intervalNanos / 1_000_000_000L));
        }
    }

    /** Lines logged so far (tests). */
    long emitted() {
        return emitted.get();
    }

    /** Calls suppressed since the last line (tests). */
    long suppressed() {
        return suppressed.get();
    }

    private static Object[] append(Object[] arguments, Object a, Object b) {
        Object[] all = java.util.Arrays.copyOf(arguments, arguments.length + 2);
        all[arguments.length] = a;
        all[arguments.length + 1] = b;
        return all;
    }
}
