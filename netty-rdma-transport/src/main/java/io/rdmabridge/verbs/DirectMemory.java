package io.rdmabridge.verbs;

import java.lang.reflect.Field;
import java.nio.Buffer;
import java.nio.ByteBuffer;
import sun.misc.Unsafe;

/**
 * Raw access to off-heap memory by address, for providers that move registered bytes in software and for callers
 * that register direct buffers. Uses {@code sun.misc.Unsafe} (module {@code jdk.unsupported}, open by default), so
 * no {@code --add-opens} is needed. Every method trusts its arguments: callers validate addresses against a
 * {@link MemoryRegion} first. Thread-safe.
 */
public final class DirectMemory {
    private static final Unsafe UNSAFE;
    private static final long BUFFER_ADDRESS_OFFSET;
    private static final long BUFFER_CAPACITY_OFFSET;
    private static final long BYTE_ARRAY_BASE;
    private static final Throwable UNAVAILABILITY_CAUSE;

    static {
        Unsafe unsafe = null;
        long offset = -1;
        long capacityOffset = -1;
        Throwable cause = null;
        try {
            Field f = Unsafe.class.getDeclaredField("theUnsafe");
            f.setAccessible(true);
            unsafe = (Unsafe) f.get(null);
            offset = unsafe.objectFieldOffset(Buffer.class.getDeclaredField("address"));
            capacityOffset = unsafe.objectFieldOffset(Buffer.class.getDeclaredField("capacity"));
        } catch (ReflectiveOperationException | RuntimeException e) {
            cause = e;
        }
        UNSAFE = unsafe;
        BUFFER_ADDRESS_OFFSET = offset;
        BUFFER_CAPACITY_OFFSET = capacityOffset;
        BYTE_ARRAY_BASE = unsafe == null ? 0 : unsafe.arrayBaseOffset(byte[].class);
        UNAVAILABILITY_CAUSE = cause;
    }

    private DirectMemory() {
    }

    /** Why raw memory access is not possible in this JVM, or {@code null}. */
    public static Throwable unavailabilityCause() {
        return UNAVAILABILITY_CAUSE;
    }

    private static Unsafe unsafe() {
        if (UNSAFE == null) {
            throw new IllegalStateException("sun.misc.Unsafe is not accessible (" + UNAVAILABILITY_CAUSE
                    + "): run on a JDK that ships the jdk.unsupported module", UNAVAILABILITY_CAUSE);
        }
        return UNSAFE;
    }

    /** The native address of a direct buffer's first byte (index 0, not its position). */
    public static long address(ByteBuffer directBuffer) {
        if (!directBuffer.isDirect()) {
            throw new IllegalArgumentException("buffer: heap ByteBuffer (expected: a direct ByteBuffer)");
        }
        return unsafe().getLong(directBuffer, BUFFER_ADDRESS_OFFSET);
    }

    /**
     * Points {@code view}, a duplicate of a direct buffer made for this purpose and used by one thread, at the
     * {@code length} bytes at {@code address}, with position 0 and limit {@code length}, so that channel I/O can read
     * into or write from memory known only by its address, with no copy. The caller keeps the memory alive while the
     * view is used and never frees the view (a duplicate frees nothing).
     */
    public static ByteBuffer retarget(ByteBuffer view, long address, int length) {
        Unsafe u = unsafe();
        view.clear();
        u.putLong(view, BUFFER_ADDRESS_OFFSET, address);
        u.putInt(view, BUFFER_CAPACITY_OFFSET, length);
        return view.limit(length);
    }

    /**
     * Frees a direct buffer's memory (or unmaps a mapped buffer) at once, rather than whenever the garbage collector
     * gets to it; the buffer must be the allocated one, not a slice or duplicate, and must not be used afterwards.
     * Where that is not possible the garbage collector frees it later; nothing else changes.
     */
    public static void free(ByteBuffer directBuffer) {
        if (UNSAFE != null) {
            try {
                UNSAFE.invokeCleaner(directBuffer);
            } catch (RuntimeException e) {
                // A slice, duplicate or heap buffer: left to the garbage collector.
            }
        }
    }

    /** Copies {@code length} bytes between native addresses; the ranges may overlap. */
    public static void copy(long srcAddress, long dstAddress, long length) {
        unsafe().copyMemory(srcAddress, dstAddress, length);
    }

    /** Copies native memory into a heap array. */
    public static void copyToArray(long srcAddress, byte[] dst, int dstIndex, int length) {
        java.util.Objects.checkFromIndexSize(dstIndex, length, dst.length);
        unsafe().copyMemory(null, srcAddress, dst, BYTE_ARRAY_BASE + dstIndex, length);
    }

    /** Copies a heap array into native memory. */
    public static void copyFromArray(byte[] src, int srcIndex, long dstAddress, int length) {
        java.util.Objects.checkFromIndexSize(srcIndex, length, src.length);
        unsafe().copyMemory(src, BYTE_ARRAY_BASE + srcIndex, null, dstAddress, length);
    }

    public static byte getByte(long address) {
        return unsafe().getByte(address);
    }

    public static void putByte(long address, byte value) {
        unsafe().putByte(address, value);
    }
}
