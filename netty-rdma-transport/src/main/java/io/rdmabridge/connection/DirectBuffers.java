package io.rdmabridge.connection;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;

/**
 * Allocates and frees the direct memory that gets registered. Registered memory is pinned and large, so it is given
 * back at once ({@code Unsafe.invokeCleaner}) rather than whenever the garbage collector gets to it. Thread-safe.
 */
final class DirectBuffers {
    private static final Object UNSAFE;
    private static final Method INVOKE_CLEANER;

    static {
        Object unsafe = null;
        Method invokeCleaner = null;
        try {
            Class<?> type = Class.forName("sun.misc.Unsafe");
            Field f = type.getDeclaredField("theUnsafe");
            f.setAccessible(true);
            unsafe = f.get(null);
            invokeCleaner = type.getMethod("invokeCleaner", ByteBuffer.class);
        } catch (ReflectiveOperationException | RuntimeException e) {
            // Without it the garbage collector frees the memory later; nothing else changes.
        }
        UNSAFE = unsafe;
        INVOKE_CLEANER = invokeCleaner;
    }

    private DirectBuffers() {
    }

    static ByteBuffer allocate(int capacity) {
        return ByteBuffer.allocateDirect(capacity);
    }

    /** Frees a buffer obtained from {@link #allocate(int)} (not a slice or duplicate of it). */
    static void free(ByteBuffer buffer) {
        if (INVOKE_CLEANER != null) {
            try {
                INVOKE_CLEANER.invoke(UNSAFE, buffer);
            } catch (ReflectiveOperationException | RuntimeException e) {
                // Leave it to the garbage collector.
            }
        }
    }
}
