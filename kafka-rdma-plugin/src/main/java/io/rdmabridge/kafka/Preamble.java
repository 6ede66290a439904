package io.rdmabridge.kafka;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * Wire frames of the RDMA upgrade, exchanged on the replication TCP connection before Kafka's first byte. All fields
 * big-endian (network order, like Kafka's own).
 *
 * <pre>
 * HELLO (follower to leader), 16 bytes
 *  0                   1                   2                   3
 * +-------+-------+-------+-------+-------+-------+-------+-------+
 * |  'R'    'D'     'M'     'A'   |version| flags |   reserved    |
 * +-------+-------+-------+-------+-------+-------+-------+-------+
 * |       follower broker id      |           reserved            |
 * +-------+-------+-------+-------+-------+-------+-------+-------+
 *
 * REPLY (leader to follower), 24 bytes
 * +-------+-------+-------+-------+-------+-------+-------+-------+
 * |  'R'    'D'     'M'     'A'   |version| status|   reserved    |
 * +-------+-------+-------+-------+-------+-------+-------+-------+
 * |        RDMA listen port       |        leader broker id       |
 * +-------+-------+-------+-------+-------+-------+-------+-------+
 * |                     token (one-time, random)                  |
 * +-------+-------+-------+-------+-------+-------+-------+-------+
 *
 * DECISION (follower to leader, after an ACCEPT reply), 1 byte: 'D' (bytes follow over RDMA) or 'T' (stay on TCP)
 *
 * PROBE ANSWER (leader to follower, on the leader's RDMA port, after the follower presented {@link #PROBE_TOKEN}),
 * and TOKEN ACKNOWLEDGEMENT (likewise, after the follower presented the token the leader expects), 8 bytes
 * +-------+-------+-------+-------+-------+-------+-------+-------+
 * |  'R'    'D'     'M'     'A'   |        leader broker id       |
 * +-------+-------+-------+-------+-------+-------+-------+-------+
 * </pre>
 *
 * The follower decides on RDMA only once the leader has acknowledged its token on its own stream. The token crosses
 * the network in clear before Kafka's TLS or SASL: without the acknowledgement, a connection that presented a
 * sniffed token first would take the leader's side of the stream while the follower, whose token the leader then
 * refuses, had already decided on RDMA, and so on at every reconnect. With it, the follower's stream is refused, it
 * decides on TCP, and the leader closes the other connection: the connection stays on TCP.
 *
 * A HELLO goes only to a leader whose plugin answered the probe on its RDMA port: a stock broker would read "RDMA" as
 * a 1.38 GB request size and log the connection as invalid, so it must never receive one. The leader tells an
 * upgrade from a plain connection by the first byte: Kafka's own first four bytes are a request size (far below what
 * "RDMA" reads as), or a TLS record header starting with 0x16.
 */
final class Preamble {
    static final int MAGIC = 0x52444D41; // "RDMA"
    static final byte MAGIC_FIRST_BYTE = 0x52;
    /** 2: the leader acknowledges the token on the RDMA stream (version 1 did not; its followers are declined). */
    static final byte VERSION = 2;

    static final int HELLO_LENGTH = 16;
    static final int HELLO_VERSION_OFFSET = 4;
    static final int HELLO_FLAGS_OFFSET = 5;
    static final int HELLO_RESERVED_OFFSET = 6;
    static final int HELLO_BROKER_ID_OFFSET = 8;
    static final int HELLO_RESERVED2_OFFSET = 12;

    static final int REPLY_LENGTH = 24;
    static final int REPLY_VERSION_OFFSET = 4;
    static final int REPLY_STATUS_OFFSET = 5;
    static final int REPLY_PORT_OFFSET = 8;
    static final int REPLY_BROKER_ID_OFFSET = 12;
    static final int REPLY_TOKEN_OFFSET = 16;

    /** The leader offers an RDMA stream at the port, for the token. */
    static final byte STATUS_ACCEPT = 0;
    /** The leader has no usable RDMA provider: the connection stays on TCP. */
    static final byte STATUS_DECLINE_UNAVAILABLE = 1;
    /** The leader does not speak the follower's version: the connection stays on TCP. */
    static final byte STATUS_DECLINE_VERSION = 2;
    /** The leader has too many handshakes in progress: the connection stays on TCP. */
    static final byte STATUS_DECLINE_BUSY = 3;

    static final byte DECISION_RDMA = 'D';
    static final byte DECISION_TCP = 'T';

    /** The token a follower presents on the leader's RDMA port to ask "which broker's plugin listens here?". */
    static final long PROBE_TOKEN = 0L;
    static final int PROBE_ANSWER_LENGTH = 8;
    static final int TOKEN_ACK_LENGTH = PROBE_ANSWER_LENGTH;

    private Preamble() {
    }

    static ByteBuffer hello(int brokerId) {
        ByteBuffer b = ByteBuffer.allocate(HELLO_LENGTH).order(ByteOrder.BIG_ENDIAN);
        b.putInt(0, MAGIC).put(HELLO_VERSION_OFFSET, VERSION).put(HELLO_FLAGS_OFFSET, (byte) 0)
                .putShort(HELLO_RESERVED_OFFSET, (short) 0).putInt(HELLO_BROKER_ID_OFFSET, brokerId)
                .putInt(HELLO_RESERVED2_OFFSET, 0);
        return b;
    }

    static ByteBuffer reply(byte status, int port, int brokerId, long token) {
        ByteBuffer b = ByteBuffer.allocate(REPLY_LENGTH).order(ByteOrder.BIG_ENDIAN);
        b.putInt(0, MAGIC).put(REPLY_VERSION_OFFSET, VERSION).put(REPLY_STATUS_OFFSET, status)
                .putShort(6, (short) 0).putInt(REPLY_PORT_OFFSET, port).putInt(REPLY_BROKER_ID_OFFSET, brokerId)
                .putLong(REPLY_TOKEN_OFFSET, token);
        return b;
    }

    /** The 8-byte answer a leader's plugin gives a probe on its RDMA port, and its acknowledgement of a token. */
    static ByteBuffer probeAnswer(int brokerId) {
        return ByteBuffer.allocate(PROBE_ANSWER_LENGTH).order(ByteOrder.BIG_ENDIAN).putInt(0, MAGIC).putInt(4, brokerId);
    }

    /**
     * Validates a complete HELLO (position 0, {@value #HELLO_LENGTH} bytes).
     *
     * @return {@code null} when valid, otherwise what is wrong, in {@code key=value} form
     */
    static String validateHello(ByteBuffer b) {
        int magic = b.getInt(0);
        if (magic != MAGIC) {
            return "magic=0x" + Integer.toHexString(magic) + " (expected: 0x" + Integer.toHexString(MAGIC) + ")";
        }
        if (b.get(HELLO_FLAGS_OFFSET) != 0 || b.getShort(HELLO_RESERVED_OFFSET) != 0
                || b.getInt(HELLO_RESERVED2_OFFSET) != 0) {
            return "flags/reserved=0x" + Integer.toHexString(b.get(HELLO_FLAGS_OFFSET) & 0xff) + "/0x"
                    + Integer.toHexString(b.getShort(HELLO_RESERVED_OFFSET) & 0xffff) + "/0x"
                    + Integer.toHexString(b.getInt(HELLO_RESERVED2_OFFSET)) + " (expected: 0)";
        }
        int brokerId = b.getInt(HELLO_BROKER_ID_OFFSET);
        if (brokerId < 0) {
            return "brokerId=" + brokerId + " (expected: >= 0)";
        }
        return null;
    }

    /** Validates a complete REPLY; {@code null} when valid. */
    static String validateReply(ByteBuffer b) {
        int magic = b.getInt(0);
        if (magic != MAGIC) {
            return "magic=0x" + Integer.toHexString(magic) + " (expected: 0x" + Integer.toHexString(MAGIC) + ")";
        }
        byte status = b.get(REPLY_STATUS_OFFSET);
        if (status < STATUS_ACCEPT || status > STATUS_DECLINE_BUSY) {
            return "status=" + status + " (expected: 0..3)";
        }
        byte version = b.get(REPLY_VERSION_OFFSET);
        if (status == STATUS_ACCEPT && version != VERSION) {
            // A leader accepts only the version it was asked for; another one's reply may lay out port and token
            // elsewhere. A decline of any version is read: its status sits where every version puts it.
            return "an acceptance in version " + version + " (expected: " + VERSION + ", the one this broker asked)";
        }
        int port = b.getInt(REPLY_PORT_OFFSET);
        if (status == STATUS_ACCEPT && (port <= 0 || port > 65535)) {
            return "port=" + port + " (expected: 1..65535)";
        }
        return null;
    }

    static String statusName(byte status) {
        switch (status) {
            case STATUS_ACCEPT:
                return "accepted";
            case STATUS_DECLINE_UNAVAILABLE:
                return "declined: the leader's RDMA provider is unavailable (its log names the cause)";
            case STATUS_DECLINE_VERSION:
                return "declined: the leader does not speak preamble version " + VERSION;
            case STATUS_DECLINE_BUSY:
                return "declined as busy: the leader holds as many RDMA handshakes or connections as "
                        + RdmaReplicationConfig.MAX_HANDSHAKES + " and " + RdmaReplicationConfig.MAX_CONNECTIONS
                        + " allow, or this host's share of them (the leader's log says which)";
            default:
                return "status " + status;
        }
    }
}
