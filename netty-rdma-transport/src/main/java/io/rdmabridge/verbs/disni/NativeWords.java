package io.rdmabridge.verbs.disni;

import java.lang.reflect.Field;
import sun.misc.Unsafe;

/**
 * Reads and writes of native ints and longs by address, in native byte order. Used for the fields of DiSNI's
 * serialized work requests that DiSNI 2.1 offers no setter for (opcode, scatter/gather count, immediate, and every
 * field of a receive request). Every method trusts its arguments. Thread-safe.
 */
final class NativeWords {
    private static final Unsafe UNSAFE;
    private static final Throwable UNAVAILABILITY_CAUSE;

    static {
        Unsafe unsafe = null;
        Throwable cause = null;
        try {
            Field f = Unsafe.class.getDeclaredField("theUnsafe");
            f.setAccessible(true);
            unsafe = (Unsafe) f.get(null);
        } catch (ReflectiveOperationException | RuntimeException e) {
            cause = e;
        }
        UNSAFE = unsafe;
        UNAVAILABILITY_CAUSE = cause;
    }

    private NativeWords() {
    }

    /** Why native words cannot be written in this JVM, or {@code null}. */
    static Throwable unavailabilityCause() {
        return UNAVAILABILITY_CAUSE;
    }

    static void putInt(long address, int value) {
        UNSAFE.putInt(address, value);
    }

    static void putLong(long address, long value) {
        UNSAFE.putLong(address, value);
    }

    static int getInt(long address) {
        return UNSAFE.getInt(address);
    }

    static long getLong(long address) {
        return UNSAFE.getLong(address);
    }
}
