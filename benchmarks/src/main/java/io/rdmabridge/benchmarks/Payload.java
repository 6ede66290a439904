package io.rdmabridge.benchmarks;

import java.util.Locale;

/** What the client writes: where the bytes of each message live. */
public enum Payload {
    /** A direct buffer from the channel's own allocator (registered memory on the RDMA channel). */
    ALLOCATOR,
    /** A heap buffer: the RDMA channel must copy it into registered memory. */
    HEAP,
    /** A {@code DefaultFileRegion} over a temporary file. */
    FILE;

    public static Payload of(String name) {
        try {
            return valueOf(name.trim().toUpperCase(Locale.ROOT));
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException("payload: " + name + " (expected: allocator, heap or file)");
        }
    }

    public String id() {
        return name().toLowerCase(Locale.ROOT);
    }
}
