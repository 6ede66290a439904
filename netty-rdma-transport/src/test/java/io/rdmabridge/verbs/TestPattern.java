package io.rdmabridge.verbs;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.zip.CRC32;

/**
 * A seeded byte pattern both ends of a conformance test can produce independently, so that one end fills memory and
 * the other computes what a range of it must checksum to without the bytes ever crossing the test harness.
 *
 * <p>Byte {@code i} of the pattern is byte {@code i & 7} (little-endian) of {@code word(seed, i >>> 3)}, where
 * {@code word} is SplitMix64: every range is reproducible from {@code (seed, offset, length)} alone.
 */
final class TestPattern {
    private static final long GOLDEN = 0x9E3779B97F4A7C15L;

    private TestPattern() {
    }

    static long word(long seed, long index) {
        long z = seed + (index + 1) * GOLDEN;
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    static byte byteAt(long seed, long index) {
        return (byte) (word(seed, index >>> 3) >>> ((index & 7) << 3));
    }

    /** The seed of message {@code i} in a stream seeded with {@code seed}. */
    static long messageSeed(long seed, long i) {
        return word(seed ^ 0x5DEECE66DL, i);
    }

    /** Writes pattern bytes {@code [offset, offset + buf.remaining())} into {@code buf}'s remaining bytes. */
    static void fill(ByteBuffer buf, long seed, long offset) {
        ByteBuffer b = buf.duplicate().order(ByteOrder.LITTLE_ENDIAN);
        long i = offset;
        // Byte-wise up to a word boundary of the pattern, then whole words, then the tail.
        while (b.hasRemaining() && (i & 7) != 0) {
            b.put(byteAt(seed, i++));
        }
        while (b.remaining() >= 8) {
            b.putLong(word(seed, i >>> 3));
            i += 8;
        }
        while (b.hasRemaining()) {
            b.put(byteAt(seed, i++));
        }
    }

    /** Pattern bytes {@code [offset, offset + length)} as an array. */
    static byte[] bytes(long seed, long offset, int length) {
        byte[] out = new byte[length];
        fill(ByteBuffer.wrap(out), seed, offset);
        return out;
    }

    /** CRC-32 of pattern bytes {@code [offset, offset + length)}. */
    static long crc(long seed, long offset, long length) {
        CRC32 crc = new CRC32();
        ByteBuffer chunk = ByteBuffer.allocate((int) Math.min(length, 1 << 16));
        long done = 0;
        while (done < length) {
            int n = (int) Math.min(chunk.capacity(), length - done);
            chunk.clear().limit(n);
            fill(chunk, seed, offset + done);
            crc.update(chunk);
            done += n;
        }
        return crc.getValue();
    }

    /** CRC-32 of a buffer's remaining bytes (its position is left unchanged). */
    static long crc(ByteBuffer buf) {
        CRC32 crc = new CRC32();
        crc.update(buf.duplicate());
        return crc.getValue();
    }

    /** CRC-32 of {@code [index, index + length)} of a buffer, by absolute index. */
    static long crc(ByteBuffer buf, long index, long length) {
        ByteBuffer d = buf.duplicate();
        d.limit((int) (index + length)).position((int) index);
        return crc(d);
    }
}
