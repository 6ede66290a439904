package io.rdmabridge.verbs.soft;

import io.rdmabridge.verbs.ConnectionParameters;
import java.nio.ByteBuffer;

/**
 * Flyweight over the handshake that opens every soft TCP connection, in network byte order (big-endian). The
 * connecting side sends one {@link #CONNECT}; the listening side answers with one {@link #ACCEPT} or {@link #REJECT};
 * data frames ({@link SoftFrame}) follow an ACCEPT. CONNECT and ACCEPT carry the sender's same-host token
 * ({@link SharedMemoryFiles#hostToken()}, zeros when it offers no shared memory): equal non-zero tokens tell both
 * ends they share a host and its shared-memory directory.
 *
 * <pre>
 *  0                   1                   2                   3
 *  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
 * +---------------------------------------------------------------+
 * |                    Magic 0x52425357 "RBSW"                    |  0
 * +-------------------------------+---------------+---------------+
 * |          Version (2)          |     Kind      | Reserved (0)  |  4
 * +-------------------------------+---------------+---------------+
 * |                      Queue Pair Number                        |  8
 * +---------------+---------------+---------------+---------------+
 * | Resp. Resourc.| Init. Depth   |  Retry Count  | RNR Retry Cnt | 12
 * +---------------+---------------+---------------+---------------+
 * |      Private Data Length      |         Reserved (0)          | 16
 * +-------------------------------+-------------------------------+
 * |                  Status (REJECT: CM reason)                   | 20
 * +---------------------------------------------------------------+
 * |              Same-Host Token (16 bytes; REJECT: 0)            | 24
 * |                                                               |
 * +---------------------------------------------------------------+
 * |                 Process Id (with a token; else 0)             | 40
 * |                                                               |
 * +---------------------------------------------------------------+
 * |       Private Data (CONNECT <= 56, ACCEPT <= 196,           ...
 * |                     REJECT <= 148 bytes)                      |
 * +---------------------------------------------------------------+
 * </pre>
 * Not thread-safe.
 */
final class SoftHandshake {
    static final int MAGIC = 0x52425357;
    static final int VERSION = 2;
    static final int MAGIC_OFFSET = 0;
    static final int VERSION_OFFSET = 4;
    static final int KIND_OFFSET = 6;
    static final int RESERVED1_OFFSET = 7;
    static final int QPN_OFFSET = 8;
    static final int RESPONDER_RESOURCES_OFFSET = 12;
    static final int INITIATOR_DEPTH_OFFSET = 13;
    static final int RETRY_COUNT_OFFSET = 14;
    static final int RNR_RETRY_COUNT_OFFSET = 15;
    static final int PRIVATE_DATA_LENGTH_OFFSET = 16;
    static final int RESERVED2_OFFSET = 18;
    static final int STATUS_OFFSET = 20;
    static final int TOKEN_OFFSET = 24;
    static final int PID_OFFSET = TOKEN_OFFSET + SharedMemoryFiles.TOKEN_LENGTH;
    static final int HEADER_LENGTH = PID_OFFSET + 8;

    static final int CONNECT = 1;
    static final int ACCEPT = 2;
    static final int REJECT = 3;

    private ByteBuffer buffer;
    private int offset;

    SoftHandshake wrap(ByteBuffer buffer, int offset) {
        this.buffer = buffer;
        this.offset = offset;
        return this;
    }

    int magic() {
        return buffer.getInt(offset + MAGIC_OFFSET);
    }

    int version() {
        return buffer.getShort(offset + VERSION_OFFSET) & 0xffff;
    }

    int kind() {
        return buffer.get(offset + KIND_OFFSET) & 0xff;
    }

    int qpNumber() {
        return buffer.getInt(offset + QPN_OFFSET);
    }

    int privateDataLength() {
        return buffer.getShort(offset + PRIVATE_DATA_LENGTH_OFFSET) & 0xffff;
    }

    int status() {
        return buffer.getInt(offset + STATUS_OFFSET);
    }

    /** The sender's same-host token, copied out. */
    byte[] hostToken() {
        byte[] token = new byte[SharedMemoryFiles.TOKEN_LENGTH];
        buffer.get(offset + TOKEN_OFFSET, token);
        return token;
    }

    /** The sender's process id, which names its shared files; meaningful with a non-zero token only. */
    long pid() {
        return buffer.getLong(offset + PID_OFFSET);
    }

    /** The parameters carried by a CONNECT or ACCEPT whose header passed {@link #validate(int)}. */
    ConnectionParameters parameters(byte[] privateData) {
        return new ConnectionParameters(privateData, buffer.get(offset + RESPONDER_RESOURCES_OFFSET) & 0xff,
                buffer.get(offset + INITIATOR_DEPTH_OFFSET) & 0xff, buffer.get(offset + RETRY_COUNT_OFFSET) & 0xff,
                buffer.get(offset + RNR_RETRY_COUNT_OFFSET) & 0xff);
    }

    /** Encodes a whole handshake (header and private data), with no same-host token, into a new array. */
    static byte[] encode(int kind, int qpNumber, ConnectionParameters parameters, byte[] privateData, int status) {
        return encode(kind, qpNumber, parameters, privateData, status, new byte[SharedMemoryFiles.TOKEN_LENGTH], 0);
    }

    /** Encodes a whole handshake (header, {@code hostToken}, {@code pid} and private data) into a new array. */
    static byte[] encode(int kind, int qpNumber, ConnectionParameters parameters, byte[] privateData, int status,
                         byte[] hostToken, long pid) {
        ByteBuffer b = ByteBuffer.allocate(HEADER_LENGTH + privateData.length);
        b.putInt(MAGIC).putShort((short) VERSION).put((byte) kind).put((byte) 0).putInt(qpNumber);
        if (parameters != null) {
            b.put((byte) parameters.responderResources()).put((byte) parameters.initiatorDepth())
                    .put((byte) parameters.retryCount()).put((byte) parameters.rnrRetryCount());
        } else {
            b.putInt(0);
        }
        b.putShort((short) privateData.length).putShort((short) 0).putInt(status).put(hostToken).putLong(pid).put(privateData);
        return b.array();
    }

    static int maxPrivateData(int kind) {
        switch (kind) {
            case CONNECT:
                return ConnectionParameters.MAX_CONNECT_PRIVATE_DATA;
            case ACCEPT:
                return ConnectionParameters.MAX_ACCEPT_PRIVATE_DATA;
            default:
                return ConnectionParameters.MAX_REJECT_PRIVATE_DATA;
        }
    }

    /**
     * Checks every header field against what this side expects next.
     *
     * @param expectedKinds a bit per acceptable kind ({@code 1 << kind})
     * @return {@code null}, or what is wrong as {@code key=value} text
     */
    String validate(int expectedKinds) {
        if (magic() != MAGIC) {
            return "magic=0x" + Integer.toHexString(magic()) + " (expected: 0x" + Integer.toHexString(MAGIC)
                    + ", a soft RDMA peer)";
        }
        if (version() != VERSION) {
            return "version=" + version() + " (expected: " + VERSION + ")";
        }
        int kind = kind();
        if (kind > 31 || (expectedKinds & (1 << kind)) == 0) {
            return "kind=" + kind + " (expected: mask 0x" + Integer.toHexString(expectedKinds) + ")";
        }
        if (buffer.get(offset + RESERVED1_OFFSET) != 0 || buffer.getShort(offset + RESERVED2_OFFSET) != 0) {
            return "reserved fields not 0";
        }
        int max = maxPrivateData(kind);
        if (privateDataLength() > max) {
            return "privateDataLength=" + privateDataLength() + " (expected: <= " + max + ")";
        }
        if (kind != REJECT) {
            int retry = buffer.get(offset + RETRY_COUNT_OFFSET) & 0xff;
            int rnr = buffer.get(offset + RNR_RETRY_COUNT_OFFSET) & 0xff;
            if (retry > 7) {
                return "retryCount=" + retry + " (expected: 0..7)";
            }
            if (rnr > 6) {
                return "rnrRetryCount=" + rnr + " (expected: 0..6)";
            }
        }
        return null;
    }
}
