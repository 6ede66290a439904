package io.rdmabridge.connection;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * Flyweight over the header that starts every SEND of the protocol. All fields are little-endian (the byte order of
 * the hosts RDMA is deployed on, so encoding is a plain store).
 *
 * <pre>
 *  0                   1                   2                   3
 *  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
 * +---------------+---------------+-------------------------------+
 * |     type      |control credits|          data credits         |
 * +---------------+---------------+-------------------------------+
 * |        rendezvous acks        |  frames received (mod 65536)  |
 * +-------------------------------+-------------------------------+
 * |                          body length                          |
 * +---------------------------------------------------------------+
 * |                    body (body length bytes)                  ...
 * </pre>
 *
 * <ul>
 *   <li>{@code type}: {@link #DATA} (body: stream bytes), {@link #RENDEZVOUS} (body: address u64, length u32, rkey u32
 *       of a registered buffer the receiver RDMA READs), {@link #CREDIT} (no body: carries the three counters only),
 *       {@link #SHUTDOWN} (no body: the sender's output is closed, its peer sees end of stream), {@link #HELLO}
 *       (body: the sender's {@link Handshake}; the first frame each side sends, and only then).</li>
 *   <li>{@code control credits}, {@code data credits}: receive buffers the sender of the frame has reposted since its
 *       last frame, for control and for data frames (piggy-backed credit return).</li>
 *   <li>{@code rendezvous acks}: rendezvous buffers of the peer the sender has finished reading, in advertising
 *       order; the peer may release that many of its oldest advertised buffers.</li>
 *   <li>{@code frames received}: how many frames (of every type, HELLO included) the sender had received from the
 *       peer when it wrote this header, modulo 65536. It tells the peer which of its frames arrived before anything
 *       in this frame was sent, which the peer's own send completions may tell later than this frame arrives
 *       (see {@link RdmaConnection}, "Completions"). Unambiguous because the frames one side has sent and the other
 *       has not yet counted never outnumber the receive buffers the other side posts, at most 65535
 *       ({@link Handshake}).</li>
 * </ul>
 * Not thread-safe: one instance per thread, rewrapped per frame; allocates nothing.
 */
public final class FrameHeader {
    public static final byte DATA = 1;
    public static final byte RENDEZVOUS = 2;
    public static final byte CREDIT = 3;
    public static final byte SHUTDOWN = 4;
    public static final byte HELLO = 5;

    public static final int TYPE_FIELD_OFFSET = 0;
    public static final int CONTROL_CREDITS_FIELD_OFFSET = 1;
    public static final int DATA_CREDITS_FIELD_OFFSET = 2;
    public static final int RENDEZVOUS_ACKS_FIELD_OFFSET = 4;
    public static final int FRAMES_RECEIVED_FIELD_OFFSET = 6;
    public static final int BODY_LENGTH_FIELD_OFFSET = 8;
    public static final int HEADER_LENGTH = 12;

    /** Body of a {@link #RENDEZVOUS} frame. */
    public static final int RENDEZVOUS_ADDRESS_OFFSET = HEADER_LENGTH;
    public static final int RENDEZVOUS_LENGTH_OFFSET = HEADER_LENGTH + 8;
    public static final int RENDEZVOUS_RKEY_OFFSET = HEADER_LENGTH + 12;
    public static final int RENDEZVOUS_BODY_LENGTH = 16;

    /** Largest value of the counter fields. */
    public static final int MAX_DATA_CREDITS = 0xFFFF;
    public static final int MAX_CONTROL_CREDITS = 0xFF;
    public static final int MAX_RENDEZVOUS_ACKS = 0xFFFF;
    /** The frames-received field counts modulo this. */
    public static final int FRAMES_RECEIVED_MODULUS = 0x10000;

    private ByteBuffer buffer;
    private int offset;

    /** Points this flyweight at {@code buffer[offset..]}; the buffer's own byte order is ignored. */
    public FrameHeader wrap(ByteBuffer buffer, int offset) {
        this.buffer = buffer.order() == ByteOrder.LITTLE_ENDIAN ? buffer : buffer.duplicate()
                .order(ByteOrder.LITTLE_ENDIAN);
        this.offset = offset;
        return this;
    }

    public byte type() {
        return buffer.get(offset + TYPE_FIELD_OFFSET);
    }

    public FrameHeader type(byte type) {
        buffer.put(offset + TYPE_FIELD_OFFSET, type);
        return this;
    }

    public int controlCredits() {
        return buffer.get(offset + CONTROL_CREDITS_FIELD_OFFSET) & 0xFF;
    }

    public FrameHeader controlCredits(int credits) {
        buffer.put(offset + CONTROL_CREDITS_FIELD_OFFSET, (byte) credits);
        return this;
    }

    public int dataCredits() {
        return buffer.getShort(offset + DATA_CREDITS_FIELD_OFFSET) & 0xFFFF;
    }

    public FrameHeader dataCredits(int credits) {
        buffer.putShort(offset + DATA_CREDITS_FIELD_OFFSET, (short) credits);
        return this;
    }

    public int rendezvousAcks() {
        return buffer.getShort(offset + RENDEZVOUS_ACKS_FIELD_OFFSET) & 0xFFFF;
    }

    public FrameHeader rendezvousAcks(int acks) {
        buffer.putShort(offset + RENDEZVOUS_ACKS_FIELD_OFFSET, (short) acks);
        return this;
    }

    /** Frames the sender had received when it wrote this header, modulo {@link #FRAMES_RECEIVED_MODULUS}. */
    public int framesReceived() {
        return buffer.getShort(offset + FRAMES_RECEIVED_FIELD_OFFSET) & 0xFFFF;
    }

    /** Stores {@code count} modulo {@link #FRAMES_RECEIVED_MODULUS}. */
    public FrameHeader framesReceived(long count) {
        buffer.putShort(offset + FRAMES_RECEIVED_FIELD_OFFSET, (short) count);
        return this;
    }

    /** Unsigned, as a long so that values above {@link Integer#MAX_VALUE} are seen (and refused) as such. */
    public long bodyLength() {
        return buffer.getInt(offset + BODY_LENGTH_FIELD_OFFSET) & 0xFFFFFFFFL;
    }

    public FrameHeader bodyLength(int length) {
        buffer.putInt(offset + BODY_LENGTH_FIELD_OFFSET, length);
        return this;
    }

    public long rendezvousAddress() {
        return buffer.getLong(offset + RENDEZVOUS_ADDRESS_OFFSET);
    }

    public long rendezvousLength() {
        return buffer.getInt(offset + RENDEZVOUS_LENGTH_OFFSET) & 0xFFFFFFFFL;
    }

    public int rendezvousRkey() {
        return buffer.getInt(offset + RENDEZVOUS_RKEY_OFFSET);
    }

    public FrameHeader rendezvous(long address, int length, int rkey) {
        buffer.putLong(offset + RENDEZVOUS_ADDRESS_OFFSET, address);
        buffer.putInt(offset + RENDEZVOUS_LENGTH_OFFSET, length);
        buffer.putInt(offset + RENDEZVOUS_RKEY_OFFSET, rkey);
        return this;
    }

    /** Writes a whole header that counts no frame received. */
    public FrameHeader set(byte type, int controlCredits, int dataCredits, int rendezvousAcks, int bodyLength) {
        return set(type, controlCredits, dataCredits, rendezvousAcks, 0, bodyLength);
    }

    /** Writes a whole header. */
    public FrameHeader set(byte type, int controlCredits, int dataCredits, int rendezvousAcks, long framesReceived,
                           int bodyLength) {
        return type(type).controlCredits(controlCredits).dataCredits(dataCredits).rendezvousAcks(rendezvousAcks)
                .framesReceived(framesReceived).bodyLength(bodyLength);
    }

    /**
     * Checks a received frame of {@code frameLength} bytes (the completion's byte count) and returns {@code null}
     * when it is well-formed, otherwise a sentence naming what is wrong. Allocates only for malformed frames.
     */
    public String validate(int frameLength) {
        if (frameLength < HEADER_LENGTH) {
            return "frame too short: frameLength=" + frameLength + " (expected: >= " + HEADER_LENGTH + ")";
        }
        byte type = type();
        long body = bodyLength();
        if (body != frameLength - HEADER_LENGTH) {
            return "frame length mismatch: bodyLength=" + body + ", frameLength=" + frameLength
                    + " (expected: bodyLength == frameLength - " + HEADER_LENGTH + ")";
        }
        switch (type) {
            case DATA:
                if (body == 0) {
                    return "empty DATA frame: bodyLength=0 (expected: > 0)";
                }
                return null;
            case RENDEZVOUS:
                if (body != RENDEZVOUS_BODY_LENGTH) {
                    return "RENDEZVOUS frame: bodyLength=" + body + " (expected: " + RENDEZVOUS_BODY_LENGTH + ")";
                }
                long length = rendezvousLength();
                if (length == 0 || length > Integer.MAX_VALUE) {
                    return "RENDEZVOUS frame: length=" + length + " (expected: 1.." + Integer.MAX_VALUE + ")";
                }
                return null;
            case HELLO:
                if (body != Handshake.LENGTH) {
                    return "HELLO frame: bodyLength=" + body + " (expected: " + Handshake.LENGTH + ")";
                }
                return null;
            case CREDIT:
            case SHUTDOWN:
                if (body != 0) {
                    return typeName(type) + " frame: bodyLength=" + body + " (expected: 0)";
                }
                return null;
            default:
                return "unknown frame type: type=" + type + " (expected: 1..5)";
        }
    }

    public static String typeName(byte type) {
        switch (type) {
            case DATA:
                return "DATA";
            case RENDEZVOUS:
                return "RENDEZVOUS";
            case CREDIT:
                return "CREDIT";
            case SHUTDOWN:
                return "SHUTDOWN";
            case HELLO:
                return "HELLO";
            default:
                return "UNKNOWN(" + type + ")";
        }
    }
}
