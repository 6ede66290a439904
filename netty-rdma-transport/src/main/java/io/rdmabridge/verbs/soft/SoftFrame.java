package io.rdmabridge.verbs.soft;

import java.nio.ByteBuffer;

/**
 * Flyweight over one frame of the soft wire protocol's data phase, in network byte order (big-endian) on every field.
 * A frame is a fixed 32-byte header followed by {@code Payload Length} bytes.
 *
 * <pre>
 *  0                   1                   2                   3
 *  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
 * +---------------+---------------+-------------------------------+
 * |    Opcode     |     Flags     |         Reserved (0)          |  0
 * +---------------+---------------+-------------------------------+
 * |                Packet Sequence Number (PSN)                   |  4
 * +---------------------------------------------------------------+
 * |                       Payload Length                          |  8
 * +---------------------------------------------------------------+
 * |                       Message Length                          | 12
 * +---------------------------------------------------------------+
 * |                                                               | 16
 * +            Remote Address (READ_RESPONSE: offset)             +
 * |                                                               |
 * +---------------------------------------------------------------+
 * |                            R_Key                              | 24
 * +---------------------------------------------------------------+
 * |                 Immediate Data (NAK: status)                  | 28
 * +---------------------------------------------------------------+
 * |                 Payload (Payload Length bytes)              ...
 * +---------------------------------------------------------------+
 * </pre>
 *
 * <ul>
 *   <li>Requests ({@link #SEND}, {@link #SEND_WITH_IMM}, {@link #WRITE}, {@link #WRITE_WITH_IMM},
 *       {@link #READ_REQUEST}) carry the requester's PSN; one work request is one PSN, cut into frames of at most
 *       {@link #MAX_PAYLOAD} bytes, the first flagged {@link #FIRST}, the last {@link #LAST}. Every frame repeats the
 *       message length; a WRITE frame names the remote address of its own first byte.</li>
 *   <li>Responses: {@link #ACK} (cumulative: every request up to PSN is done), {@link #NAK} (the request PSN failed
 *       with the status in the immediate field; earlier ones are done; the connection ends), {@link #RNR_NAK}
 *       (no receive was posted for PSN: the requester retransmits from PSN after its RNR timer, the responder drops
 *       later requests until then), {@link #READ_RESPONSE} (data of READ PSN at an offset).</li>
 *   <li>{@link #DISCONNECT}: the sender leaves; the receiver flushes and closes.</li>
 *   <li>{@link #DIRECT} (same-host links): the requester executed Message Length requests from PSN on itself, in
 *       shared memory ({@link SharedPeer}); the responder moves its expected PSN past them. Sent before the next
 *       request frame, never acknowledged.</li>
 *   <li>{@link #RING} (same-host links, on the socket only): the sender's later frames are in its
 *       {@link ShmRing}, shared file number Remote Address of Message Length data bytes; its last frame on the socket
 *       but for {@link #DOORBELL}s and a final DISCONNECT or NAK, each of which the receiver takes only after
 *       draining the ring.</li>
 *   <li>{@link #DOORBELL} (same-host links, on the socket only): look at the rings again; the receiver had parked
 *       or the sender found its ring full.</li>
 * </ul>
 * Not thread-safe: one instance per reading or writing thread.
 */
final class SoftFrame {
    static final int OPCODE_OFFSET = 0;
    static final int FLAGS_OFFSET = 1;
    static final int RESERVED_OFFSET = 2;
    static final int PSN_OFFSET = 4;
    static final int PAYLOAD_LENGTH_OFFSET = 8;
    static final int MESSAGE_LENGTH_OFFSET = 12;
    static final int ADDRESS_OFFSET = 16;
    static final int RKEY_OFFSET = 24;
    static final int IMM_OFFSET = 28;
    static final int HEADER_LENGTH = 32;

    /** Largest payload of one frame; the reader's buffer always holds one whole frame. */
    static final int MAX_PAYLOAD = 128 * 1024;

    static final int SEND = 1;
    static final int SEND_WITH_IMM = 2;
    static final int WRITE = 3;
    static final int WRITE_WITH_IMM = 4;
    static final int READ_REQUEST = 5;
    static final int READ_RESPONSE = 6;
    static final int ACK = 7;
    static final int NAK = 8;
    static final int RNR_NAK = 9;
    static final int DISCONNECT = 10;
    static final int DIRECT = 11;
    static final int RING = 12;
    static final int DOORBELL = 13;
    static final int MAX_OPCODE = DOORBELL;

    static final int FIRST = 1;
    static final int LAST = 2;
    static final int KNOWN_FLAGS = FIRST | LAST;

    private ByteBuffer buffer;
    private int offset;

    SoftFrame wrap(ByteBuffer buffer, int offset) {
        this.buffer = buffer;
        this.offset = offset;
        return this;
    }

    int opcode() {
        return buffer.get(offset + OPCODE_OFFSET) & 0xff;
    }

    int flags() {
        return buffer.get(offset + FLAGS_OFFSET) & 0xff;
    }

    int reserved() {
        return buffer.getShort(offset + RESERVED_OFFSET) & 0xffff;
    }

    int psn() {
        return buffer.getInt(offset + PSN_OFFSET);
    }

    int payloadLength() {
        return buffer.getInt(offset + PAYLOAD_LENGTH_OFFSET);
    }

    int messageLength() {
        return buffer.getInt(offset + MESSAGE_LENGTH_OFFSET);
    }

    long address() {
        return buffer.getLong(offset + ADDRESS_OFFSET);
    }

    int rkey() {
        return buffer.getInt(offset + RKEY_OFFSET);
    }

    int imm() {
        return buffer.getInt(offset + IMM_OFFSET);
    }

    /** Writes a whole header. */
    SoftFrame header(int opcode, int flags, int psn, int payloadLength, int messageLength, long address, int rkey,
                     int imm) {
        buffer.put(offset + OPCODE_OFFSET, (byte) opcode);
        buffer.put(offset + FLAGS_OFFSET, (byte) flags);
        buffer.putShort(offset + RESERVED_OFFSET, (short) 0);
        buffer.putInt(offset + PSN_OFFSET, psn);
        buffer.putInt(offset + PAYLOAD_LENGTH_OFFSET, payloadLength);
        buffer.putInt(offset + MESSAGE_LENGTH_OFFSET, messageLength);
        buffer.putLong(offset + ADDRESS_OFFSET, address);
        buffer.putInt(offset + RKEY_OFFSET, rkey);
        buffer.putInt(offset + IMM_OFFSET, imm);
        return this;
    }

    /**
     * Checks the fields every frame must satisfy, whatever its opcode.
     *
     * @return {@code null}, or what is wrong as {@code key=value} text
     */
    String validateHeader() {
        int op = opcode();
        if (op < SEND || op > MAX_OPCODE) {
            return "opcode=" + op + " (expected: 1.." + MAX_OPCODE + ")";
        }
        int f = flags();
        if ((f & ~KNOWN_FLAGS) != 0) {
            return "flags=0x" + Integer.toHexString(f) + " (expected: FIRST|LAST only)";
        }
        if (reserved() != 0) {
            return "reserved=" + reserved() + " (expected: 0)";
        }
        int payload = payloadLength();
        if (payload < 0 || payload > MAX_PAYLOAD) {
            return "payloadLength=" + payload + " (expected: 0.." + MAX_PAYLOAD + ")";
        }
        if (messageLength() < 0) {
            return "messageLength=" + messageLength() + " (expected: 0.." + Integer.MAX_VALUE + ")";
        }
        if (payload > 0 && op != SEND && op != SEND_WITH_IMM && op != WRITE && op != WRITE_WITH_IMM
                && op != READ_RESPONSE) {
            return "payloadLength=" + payload + " on opcode " + name(op) + " (expected: 0)";
        }
        return null;
    }

    static String name(int opcode) {
        switch (opcode) {
            case SEND:
                return "SEND";
            case SEND_WITH_IMM:
                return "SEND_WITH_IMM";
            case WRITE:
                return "WRITE";
            case WRITE_WITH_IMM:
                return "WRITE_WITH_IMM";
            case READ_REQUEST:
                return "READ_REQUEST";
            case READ_RESPONSE:
                return "READ_RESPONSE";
            case ACK:
                return "ACK";
            case NAK:
                return "NAK";
            case RNR_NAK:
                return "RNR_NAK";
            case DISCONNECT:
                return "DISCONNECT";
            case DIRECT:
                return "DIRECT";
            case RING:
                return "RING";
            case DOORBELL:
                return "DOORBELL";
            default:
                return "UNKNOWN(" + opcode + ")";
        }
    }
}
