package io.rdmabridge.connection;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * What each side of a connection tells the other in its first frame on the new queue pair (the body of a
 * {@link FrameHeader#HELLO} frame), little-endian:
 *
 * <pre>
 *  0                   1                   2                   3
 *  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
 * +---------------------------------------------------------------+
 * |                        magic 'RDBR'                           |
 * +-------------------------------+-------------------------------+
 * |       protocol version        |          reserved (0)         |
 * +-------------------------------+-------------------------------+
 * |                  receive buffer size (bytes)                  |
 * +-------------------------------+-------------------------------+
 * |   data credits (receives)     | control credits |  reserved   |
 * +-------------------------------+-------------------------------+
 * |              largest message accepted (bytes)                 |
 * +---------------------------------------------------------------+
 * </pre>
 *
 * The receive buffer size bounds an eager frame (header included); the credits are the receive buffers posted for
 * data and for control frames; the largest message bounds a rendezvous. Every field is validated on decode; a bad
 * handshake fails the connection with a message naming the field. Immutable; decoded once per connection, on the
 * event loop that owns the queue pair.
 *
 * <p>Why on the queue pair and not in the connection manager's private data: DiSNI 2.1 delivers no private data to
 * Java (measured on rxe), and other stacks cap or drop it (iWARP's MPA, some proxies). A HELLO frame works wherever a
 * SEND does, costs one one-way trip that both sides make at once, and is validated like every other frame. It needs
 * one rule known before any handshake: each side posts at least {@link #MIN_CONTROL_CREDITS} receive buffers of at
 * least {@link #MIN_RECEIVE_BUFFER_SIZE} bytes before it connects or accepts, so the peer's HELLO, which spends one
 * control credit, always finds a buffer that fits it.
 *
 * @param receiveBufferSize bytes of each posted receive buffer, header included
 * @param dataCredits       receive buffers posted for data frames
 * @param controlCredits    receive buffers posted for control frames
 * @param maxMessageSize    largest rendezvous message this side accepts
 */
public record Handshake(int receiveBufferSize, int dataCredits, int controlCredits, int maxMessageSize) {
    public static final int MAGIC = 0x52424452; // "RDBR" little-endian
    /**
     * 3: every frame header counts the frames its sender has received (2 left that field reserved; 1 carried the
     * handshake in connection-manager private data).
     */
    public static final int VERSION = 3;
    public static final int LENGTH = 20;

    /**
     * The smallest receive buffer a side may post and announce. It holds far more than the largest fixed-size frame
     * (a HELLO or a RENDEZVOUS advertisement), because frames sent to a peer are at most its buffers' size: a peer
     * announcing buffers of a few dozen bytes would turn each eager write into a SEND per few bytes on the writer's
     * event loop (13,000 work requests for a 255 KiB write at 32 bytes).
     */
    public static final int MIN_RECEIVE_BUFFER_SIZE = 1024;
    public static final int MAX_RECEIVE_BUFFER_SIZE = 16 * 1024 * 1024;
    /**
     * The smallest rendezvous message a side may accept. A message larger than the peer's limit goes as parts of that
     * size, each exposed for the peer's READ and acknowledged on its own: a peer announcing 1 byte would turn one
     * 16 MiB write into 16 million exposures on the writer's event loop.
     */
    public static final int MIN_MAX_MESSAGE_SIZE = 4096;
    /** Control frames need at least two credits: the last one may only carry credit returns (see RdmaConnection). */
    public static final int MIN_CONTROL_CREDITS = 2;
    /**
     * Most receive buffers one side may post: the frames a peer has sent and this side has not yet counted never
     * outnumber them, and the header's frames-received field must tell them apart modulo 65536.
     */
    public static final int MAX_RECEIVE_QUEUE_DEPTH = FrameHeader.FRAMES_RECEIVED_MODULUS - 1;

    public Handshake {
        if (receiveBufferSize < MIN_RECEIVE_BUFFER_SIZE || receiveBufferSize > MAX_RECEIVE_BUFFER_SIZE) {
            throw new IllegalArgumentException("receiveBufferSize: " + receiveBufferSize + " (expected: "
                    + MIN_RECEIVE_BUFFER_SIZE + ".." + MAX_RECEIVE_BUFFER_SIZE + ")");
        }
        if (dataCredits < 1 || dataCredits > FrameHeader.MAX_DATA_CREDITS) {
            throw new IllegalArgumentException("dataCredits: " + dataCredits + " (expected: 1.."
                    + FrameHeader.MAX_DATA_CREDITS + ")");
        }
        if (controlCredits < MIN_CONTROL_CREDITS || controlCredits > FrameHeader.MAX_CONTROL_CREDITS) {
            throw new IllegalArgumentException("controlCredits: " + controlCredits + " (expected: "
                    + MIN_CONTROL_CREDITS + ".." + FrameHeader.MAX_CONTROL_CREDITS + ")");
        }
        if (dataCredits + controlCredits > MAX_RECEIVE_QUEUE_DEPTH) {
            throw new IllegalArgumentException("dataCredits + controlCredits: " + (dataCredits + controlCredits)
                    + " (expected: <= " + MAX_RECEIVE_QUEUE_DEPTH + ", the receive buffers one side may post)");
        }
        if (maxMessageSize < MIN_MAX_MESSAGE_SIZE) {
            throw new IllegalArgumentException("maxMessageSize: " + maxMessageSize + " (expected: >= "
                    + MIN_MAX_MESSAGE_SIZE + ")");
        }
    }

    /** The receive buffers this side posts: one per data and one per control credit. */
    public int receiveQueueDepth() {
        return dataCredits + controlCredits;
    }

    /** The largest payload of one eager DATA frame a peer may send to this side. */
    public int maxEagerPayload() {
        return receiveBufferSize - FrameHeader.HEADER_LENGTH;
    }

    public byte[] encode() {
        ByteBuffer b = ByteBuffer.allocate(LENGTH).order(ByteOrder.LITTLE_ENDIAN);
        b.putInt(MAGIC).putShort((short) VERSION).putShort((short) 0).putInt(receiveBufferSize)
                .putShort((short) dataCredits).put((byte) controlCredits).put((byte) 0).putInt(maxMessageSize);
        return b.array();
    }

    /**
     * Decodes and validates a peer's handshake.
     *
     * @throws HandshakeException naming the first field that is wrong
     */
    public static Handshake decode(byte[] wire) throws HandshakeException {
        if (wire == null || wire.length < LENGTH) {
            throw new HandshakeException("handshake too short: " + (wire == null ? 0 : wire.length)
                    + " bytes (expected: >= " + LENGTH + "; is the peer an rdma-bridge endpoint?)");
        }
        ByteBuffer b = ByteBuffer.wrap(wire).order(ByteOrder.LITTLE_ENDIAN);
        int magic = b.getInt();
        if (magic != MAGIC) {
            throw new HandshakeException("handshake magic: 0x" + Integer.toHexString(magic) + " (expected: 0x"
                    + Integer.toHexString(MAGIC) + "; the peer does not speak the rdma-bridge protocol)");
        }
        int version = b.getShort() & 0xFFFF;
        if (version != VERSION) {
            throw new HandshakeException("protocol version: " + version + " (expected: " + VERSION
                    + "; run the same rdma-bridge version on both ends)");
        }
        b.getShort();
        int receiveBufferSize = b.getInt();
        int dataCredits = b.getShort() & 0xFFFF;
        int controlCredits = b.get() & 0xFF;
        b.get();
        int maxMessageSize = b.getInt();
        try {
            return new Handshake(receiveBufferSize, dataCredits, controlCredits, maxMessageSize);
        } catch (IllegalArgumentException e) {
            // The peer's settings, not ours: its own RdmaChannelOption must change (or it is not an rdma-bridge peer).
            throw new HandshakeException("bad handshake from peer: " + e.getMessage() + " (the peer's setting: change"
                    + " it there, e.g. its RECEIVE_BUFFER_SIZE or MAX_MESSAGE_SIZE)");
        }
    }

    /** A peer's handshake could not be accepted. */
    public static final class HandshakeException extends Exception {
        private static final long serialVersionUID = 1L;

        public HandshakeException(String message) {
            super(message);
        }
    }
}
