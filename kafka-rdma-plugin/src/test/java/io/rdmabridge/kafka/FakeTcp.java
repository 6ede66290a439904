package io.rdmabridge.kafka;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.channels.ByteChannel;

/**
 * A scripted TCP side for handshake tests: bytes become readable as the test releases them. A test may override
 * {@link #write} to act when the handshake writes.
 */
class FakeTcp implements ByteChannel {
    private final ByteArrayOutputStream written = new ByteArrayOutputStream();
    private byte[] input = new byte[0];
    private int released;
    private int consumed;
    private boolean eof;

    /** Makes {@code bytes} readable after what was released before. */
    FakeTcp arrive(byte... bytes) {
        byte[] n = new byte[input.length + bytes.length];
        System.arraycopy(input, 0, n, 0, input.length);
        System.arraycopy(bytes, 0, n, input.length, bytes.length);
        input = n;
        released = n.length;
        return this;
    }

    FakeTcp arrive(ByteBuffer b) {
        byte[] a = new byte[b.remaining()];
        b.duplicate().get(a);
        return arrive(a);
    }

    FakeTcp eof() {
        eof = true;
        return this;
    }

    /** What the peer has not read yet: bytes the handshake must have left for Kafka. */
    byte[] unread() {
        byte[] r = new byte[released - consumed];
        System.arraycopy(input, consumed, r, 0, r.length);
        return r;
    }

    byte[] written() {
        return written.toByteArray();
    }

    @Override
    public int read(ByteBuffer dst) {
        int n = Math.min(dst.remaining(), released - consumed);
        if (n == 0) {
            return eof && released == consumed ? -1 : 0;
        }
        dst.put(input, consumed, n);
        consumed += n;
        return n;
    }

    @Override
    public int write(ByteBuffer src) {
        int n = src.remaining();
        byte[] a = new byte[n];
        src.get(a);
        written.write(a, 0, n);
        return n;
    }

    @Override
    public boolean isOpen() {
        return true;
    }

    @Override
    public void close() {
    }
}
