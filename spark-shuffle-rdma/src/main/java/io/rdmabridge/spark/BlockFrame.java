package io.rdmabridge.spark;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.channel.ChannelHandlerContext;
import io.netty.handler.codec.CorruptedFrameException;
import io.netty.handler.codec.LengthFieldBasedFrameDecoder;
import io.rdmabridge.verbs.PeerText;
import java.nio.charset.StandardCharsets;
import java.util.function.BooleanSupplier;

/**
 * Wire format of the shuffle block protocol. Every frame is big-endian:
 *
 * <pre>
 *  0                   1                   2                   3
 *  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
 * +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
 * |                  frame length (bytes after it)                |
 * +---------------+-----------------------------------------------+
 * |     type      |  body ...                                     |
 * +---------------+-----------------------------------------------+
 *
 * CHALLENGE  server to client, first frame:  flags (1: auth required), nonce (32 bytes)
 * RESPONSE   client to server, answer:       HMAC-SHA256(secret, "client", both nonces) (32 bytes; zeros without a
 *                                            secret), the client's nonce (32 bytes)
 * PROOF      server to client, right after:  HMAC-SHA256(secret, "server", both nonces) (32 bytes; zeros without a
 *            accepting the RESPONSE          secret)
 * FETCH      client to server:               request id (8), block id length (2), block id (UTF-8)
 * BLOCK      server to client:               request id (8), block bytes (the rest of the frame)
 * FAILURE    either way:                     request id (8; -1: the connection), message (UTF-8, the rest, max. 64 KiB)
 * </pre>
 *
 * The client may pipeline FETCH frames behind its RESPONSE, but takes no BLOCK before a PROOF that verifies
 * ({@link PeerAuthenticator}).
 *
 * <p>A BLOCK frame's payload is written as its own buffer or file region after the header, so block bytes are never
 * copied into the frame. Decoding validates every length before reading; a violation is a
 * {@link CorruptedFrameException} naming the field, and the connection is closed.
 */
final class BlockFrame {
    static final int LENGTH_FIELD_LENGTH = 4;
    static final int TYPE_LENGTH = 1;
    static final int REQUEST_ID_LENGTH = 8;
    static final int NONCE_LENGTH = 32;
    static final int MAC_LENGTH = 32;
    /** Longest block id accepted; Spark's shuffle block ids are a few dozen characters. */
    static final int MAX_BLOCK_ID_LENGTH = 256;
    /** Largest length field a server accepts: requests are small, a client never sends block bytes. */
    static final int MAX_REQUEST_FRAME_LENGTH = TYPE_LENGTH + REQUEST_ID_LENGTH + 2 + MAX_BLOCK_ID_LENGTH;
    static final int BLOCK_HEADER_LENGTH = LENGTH_FIELD_LENGTH + TYPE_LENGTH + REQUEST_ID_LENGTH;
    /**
     * Largest block a frame can carry: the receiver's decoder takes frames of at most {@link Integer#MAX_VALUE}
     * bytes, its length field and header included.
     */
    static final long MAX_BLOCK_LENGTH = Integer.MAX_VALUE - BLOCK_HEADER_LENGTH;
    /** The length field of every CHALLENGE frame: flags and nonce. */
    static final int CHALLENGE_FRAME_LENGTH = TYPE_LENGTH + 1 + NONCE_LENGTH;
    /** The length field of every RESPONSE frame: MAC and the client's nonce. */
    static final int RESPONSE_FRAME_LENGTH = TYPE_LENGTH + MAC_LENGTH + NONCE_LENGTH;
    /** The length field of every PROOF frame. */
    static final int PROOF_FRAME_LENGTH = TYPE_LENGTH + MAC_LENGTH;
    /** Longest FAILURE message, in UTF-8 bytes: {@link #failure} truncates to it, a client refuses longer ones. */
    static final int MAX_FAILURE_MESSAGE_LENGTH = 64 * 1024;
    static final int MAX_FAILURE_FRAME_LENGTH = TYPE_LENGTH + REQUEST_ID_LENGTH + MAX_FAILURE_MESSAGE_LENGTH;

    static final byte CHALLENGE = 1;
    static final byte RESPONSE = 2;
    static final byte FETCH = 3;
    static final byte BLOCK = 4;
    static final byte FAILURE = 5;
    static final byte PROOF = 6;

    static final byte FLAG_AUTH_REQUIRED = 1;
    static final long CONNECTION_REQUEST_ID = -1;

    private BlockFrame() {
    }

    /**
     * Splits the stream into frames (length field stripped); {@code maxLength} bounds the length field a peer may
     * claim, at most {@code Integer.MAX_VALUE - LENGTH_FIELD_LENGTH}.
     */
    static LengthFieldBasedFrameDecoder newFrameDecoder(int maxLength) {
        return newFrameDecoder(maxLength, () -> false);
    }

    /**
     * As {@link #newFrameDecoder(int)}, but while {@code holdBack} is true it decodes nothing: received bytes stay in
     * the decoder (a reader that pauses also stops reading, so that is at most what one read handed up). An empty
     * buffer sent through the pipeline later decodes what was held back.
     */
    static LengthFieldBasedFrameDecoder newFrameDecoder(int maxLength, BooleanSupplier holdBack) {
        if (maxLength > Integer.MAX_VALUE - LENGTH_FIELD_LENGTH) {
            throw new IllegalArgumentException("maxLength: " + maxLength + " (expected: at most "
                    + (Integer.MAX_VALUE - LENGTH_FIELD_LENGTH) + ", the length field included)");
        }
        // Netty's bound counts the length field too.
        LengthFieldBasedFrameDecoder decoder = new LengthFieldBasedFrameDecoder(maxLength + LENGTH_FIELD_LENGTH, 0,
                LENGTH_FIELD_LENGTH, 0, LENGTH_FIELD_LENGTH, true) {
            @Override
            protected Object decode(ChannelHandlerContext ctx, ByteBuf in) throws Exception {
                return holdBack.getAsBoolean() ? null : super.decode(ctx, in);
            }
        };
        // A peer's one-byte sends are merged, not kept one buffer each while a frame is incomplete.
        decoder.setCumulator(new AdaptiveCumulator());
        return decoder;
    }

    /**
     * A frame decoder that hands each frame's header to {@code check} as soon as it has arrived (the length field, the
     * type and, for BLOCK and FAILURE, the request id) and buffers the body only once the check has passed: a peer
     * cannot make the receiver hold bytes it would refuse. A refused header fails the connection; nothing after it is
     * decoded.
     */
    static CheckedFrameDecoder newFrameDecoder(HeaderCheck check) {
        return new CheckedFrameDecoder(check);
    }

    /** The decoder of {@link #newFrameDecoder(HeaderCheck)}; it tells how many received bytes it holds undecoded. */
    static final class CheckedFrameDecoder extends LengthFieldBasedFrameDecoder {
        private final HeaderCheck check;

        private CheckedFrameDecoder(HeaderCheck check) {
            super(Integer.MAX_VALUE, 0, LENGTH_FIELD_LENGTH, 0, LENGTH_FIELD_LENGTH, true);
            this.check = check;
            // Small received buffers are merged, large ones composed: a block stays in the buffers it arrived in.
            setCumulator(new AdaptiveCumulator());
        }

        /** Received bytes not yet decoded into a frame: the start of the next one. Event loop only. */
        int bufferedBytes() {
            return actualReadableBytes();
        }

        @Override
        protected Object decode(ChannelHandlerContext ctx, ByteBuf in) throws Exception {
            if (in.readableBytes() < LENGTH_FIELD_LENGTH + TYPE_LENGTH) {
                return null;
            }
            int start = in.readerIndex();
            int length = in.getInt(start);
            byte type = in.getByte(start + LENGTH_FIELD_LENGTH);
            boolean hasRequestId = type == BLOCK || type == FAILURE;
            try {
                int minLength = TYPE_LENGTH + (hasRequestId ? REQUEST_ID_LENGTH : 0);
                if (length < minLength) {
                    throw new CorruptedFrameException("frame length=" + length + " of type=" + type
                            + " (expected: at least " + minLength + ")");
                }
                if (hasRequestId && in.readableBytes() < BLOCK_HEADER_LENGTH) {
                    return null;
                }
                check.check(length, type, hasRequestId ? in.getLong(start + LENGTH_FIELD_LENGTH + TYPE_LENGTH) : 0);
            } catch (CorruptedFrameException e) {
                in.skipBytes(in.readableBytes());
                throw e;
            }
            return super.decode(ctx, in);
        }
    }

    /** Checks a frame's header before its body is buffered. */
    @FunctionalInterface
    interface HeaderCheck {
        /**
         * Throws {@link CorruptedFrameException}, naming the field, to refuse the frame. {@code requestId} is that of a
         * BLOCK or FAILURE frame, 0 for the types that carry none.
         */
        void check(int frameLength, byte type, long requestId);
    }

    static ByteBuf challenge(ByteBufAllocator alloc, boolean authRequired, byte[] nonce) {
        ByteBuf buf = alloc.buffer(LENGTH_FIELD_LENGTH + CHALLENGE_FRAME_LENGTH);
        buf.writeInt(CHALLENGE_FRAME_LENGTH).writeByte(CHALLENGE)
                .writeByte(authRequired ? FLAG_AUTH_REQUIRED : 0).writeBytes(nonce, 0, NONCE_LENGTH);
        return buf;
    }

    static ByteBuf response(ByteBufAllocator alloc, byte[] mac, byte[] clientNonce) {
        ByteBuf buf = alloc.buffer(LENGTH_FIELD_LENGTH + RESPONSE_FRAME_LENGTH);
        buf.writeInt(RESPONSE_FRAME_LENGTH).writeByte(RESPONSE).writeBytes(mac, 0, MAC_LENGTH)
                .writeBytes(clientNonce, 0, NONCE_LENGTH);
        return buf;
    }

    static ByteBuf proof(ByteBufAllocator alloc, byte[] mac) {
        ByteBuf buf = alloc.buffer(LENGTH_FIELD_LENGTH + PROOF_FRAME_LENGTH);
        buf.writeInt(PROOF_FRAME_LENGTH).writeByte(PROOF).writeBytes(mac, 0, MAC_LENGTH);
        return buf;
    }

    static ByteBuf fetch(ByteBufAllocator alloc, long requestId, String blockId) {
        byte[] id = blockId.getBytes(StandardCharsets.UTF_8);
        if (id.length > MAX_BLOCK_ID_LENGTH) {
            throw new IllegalArgumentException("blockId: " + blockId + " (expected: at most " + MAX_BLOCK_ID_LENGTH
                    + " UTF-8 bytes)");
        }
        ByteBuf buf = alloc.buffer(LENGTH_FIELD_LENGTH + TYPE_LENGTH + REQUEST_ID_LENGTH + 2 + id.length);
        buf.writeInt(TYPE_LENGTH + REQUEST_ID_LENGTH + 2 + id.length).writeByte(FETCH).writeLong(requestId)
                .writeShort(id.length).writeBytes(id);
        return buf;
    }

    /** The header of a BLOCK frame whose {@code blockLength} payload bytes follow as a separate message. */
    static ByteBuf blockHeader(ByteBufAllocator alloc, long requestId, long blockLength) {
        if (blockLength < 0 || blockLength > MAX_BLOCK_LENGTH) {
            throw new IllegalArgumentException("blockLength: " + blockLength + " (expected: 0-" + MAX_BLOCK_LENGTH
                    + ")");
        }
        ByteBuf buf = alloc.buffer(BLOCK_HEADER_LENGTH);
        buf.writeInt((int) (TYPE_LENGTH + REQUEST_ID_LENGTH + blockLength)).writeByte(BLOCK).writeLong(requestId);
        return buf;
    }

    /** A FAILURE frame, its message cut to {@link #MAX_FAILURE_MESSAGE_LENGTH} bytes: clients refuse longer ones. */
    static ByteBuf failure(ByteBufAllocator alloc, long requestId, String message) {
        byte[] text = message.getBytes(StandardCharsets.UTF_8);
        int length = text.length;
        if (length > MAX_FAILURE_MESSAGE_LENGTH) {
            length = MAX_FAILURE_MESSAGE_LENGTH;
            // Cut before a character, not inside one: back over UTF-8 continuation bytes.
            while ((text[length] & 0xC0) == 0x80) {
                length--;
            }
        }
        ByteBuf buf = alloc.buffer(LENGTH_FIELD_LENGTH + TYPE_LENGTH + REQUEST_ID_LENGTH + length);
        buf.writeInt(TYPE_LENGTH + REQUEST_ID_LENGTH + length).writeByte(FAILURE).writeLong(requestId)
                .writeBytes(text, 0, length);
        return buf;
    }

    /** Reads and checks the type byte of a decoded frame (length field already stripped). */
    static byte readType(ByteBuf frame) {
        require(frame, TYPE_LENGTH, "type");
        byte type = frame.readByte();
        if (type < CHALLENGE || type > PROOF) {
            throw new CorruptedFrameException("type=" + type + " (expected: " + CHALLENGE + "-" + PROOF + ")");
        }
        return type;
    }

    static long readRequestId(ByteBuf frame) {
        require(frame, REQUEST_ID_LENGTH, "requestId");
        return frame.readLong();
    }

    /** The block id of a FETCH frame after its request id; the frame must end with it. */
    static String readBlockId(ByteBuf frame) {
        require(frame, 2, "blockIdLength");
        int length = frame.readUnsignedShort();
        if (length == 0 || length > MAX_BLOCK_ID_LENGTH || length != frame.readableBytes()) {
            throw new CorruptedFrameException("blockIdLength=" + length + " (expected: 1-" + MAX_BLOCK_ID_LENGTH
                    + " and equal to the " + frame.readableBytes() + " bytes left in the frame)");
        }
        return frame.readCharSequence(length, StandardCharsets.UTF_8).toString();
    }

    /** Copies a fixed-length field (nonce or MAC) that the frame ends with. */
    static byte[] readExact(ByteBuf frame, int length, String field) {
        return readField(frame, length, 0, field);
    }

    /** Copies a fixed-length field (nonce or MAC) after which exactly {@code after} bytes are left in the frame. */
    static byte[] readField(ByteBuf frame, int length, int after, String field) {
        if (frame.readableBytes() != length + after) {
            throw new CorruptedFrameException(field + ": " + frame.readableBytes() + " bytes to the end of the frame "
                    + "(expected: " + (length + after) + ")");
        }
        byte[] bytes = new byte[length];
        frame.readBytes(bytes);
        return bytes;
    }

    /** A FAILURE's message, for the reducer's exceptions and logs: the peer wrote it ({@link PeerText}). */
    static String readMessage(ByteBuf frame) {
        return PeerText.printable(frame.readCharSequence(frame.readableBytes(), StandardCharsets.UTF_8));
    }

    private static void require(ByteBuf frame, int length, String field) {
        if (frame.readableBytes() < length) {
            throw new CorruptedFrameException(field + ": " + frame.readableBytes() + " bytes left (expected: "
                    + length + ")");
        }
    }
}
