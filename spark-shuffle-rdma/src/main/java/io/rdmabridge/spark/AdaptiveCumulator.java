package io.rdmabridge.spark;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.buffer.CompositeByteBuf;
import io.netty.handler.codec.ByteToMessageDecoder;

/**
 * The block protocol's frame cumulator: gathers a frame that spans received buffers without keeping each small one.
 * Netty's {@link ByteToMessageDecoder#COMPOSITE_CUMULATOR} keeps every received buffer as a component until its frame
 * is complete. An RDMA channel hands up each SEND as its own buffer, and one it copied out of its receive buffer (as it
 * does while the application holds most of them) takes a registered block of at least 256 bytes: a peer that sent a
 * frame one byte per SEND made the receiver hold some 400 times the frame (a 200 MiB block: about 50 GiB of registered
 * memory and heap). {@link ByteToMessageDecoder#MERGE_CUMULATOR} would copy every block, which this transport exists
 * to avoid.
 *
 * <p>So inputs are taken by size. One of at least {@link #COPY_THRESHOLD} bytes becomes a component as it is, without a
 * copy. So do the first {@link #MAX_SMALL_COMPONENTS} smaller ones of a cumulation: a block server's frame arrives in
 * few pieces (a header, whole receive buffers, a last piece), which so stay uncopied, and the transport's copy counters
 * still count every copy of its bytes. Any further small input, and
 * any input that fits in the room left, is copied into the cumulation's tail, a buffer from the channel's allocator,
 * and released at once. Tails double from {@link #MIN_TAIL} up to {@link #MAX_TAIL} bytes while small inputs keep
 * coming, and start small again after a composed one; the room a tail gives up is less than the input that took its
 * place. A cumulation so holds its bytes, at most as much again in given-up room, the last tail's unwritten room, and
 * the buffers its inputs were composed in: {@link #MAX_SMALL_COMPONENTS} small ones, and one for each input of at
 * least {@link #COPY_THRESHOLD} bytes.
 *
 * <p>One per decoder (it remembers how large its last tail was); used on the decoder's event loop only.
 */
final class AdaptiveCumulator implements ByteToMessageDecoder.Cumulator {
    /** Inputs smaller than this are copied: as components, each would cost a buffer and a registered block. */
    static final int COPY_THRESHOLD = 4 * 1024;
    /** Small inputs of a cumulation composed before any is copied. */
    static final int MAX_SMALL_COMPONENTS = 8;
    /** The first tail's size, the smallest block the RDMA channel's allocator hands out. */
    static final int MIN_TAIL = 256;
    /** The largest tail: a long run of small inputs goes into tails of this size, one after another. */
    static final int MAX_TAIL = 64 * 1024;

    private int nextTail = MIN_TAIL;
    private int smallComponents;

    @Override
    public ByteBuf cumulate(ByteBufAllocator alloc, ByteBuf cumulation, ByteBuf in) {
        if (cumulation == in) {
            // As with Netty's cumulators: a decoder handed its own cumulation holds it twice.
            in.release();
            return cumulation;
        }
        if (!cumulation.isReadable()) {
            // A frame that starts in this buffer, most often whole: decoded from the buffer as it is.
            cumulation.release();
            nextTail = MIN_TAIL;
            smallComponents = 0;
            return in;
        }
        if (!in.isReadable()) {
            // An empty buffer, sent through the pipeline to decode what was held back.
            in.release();
            return cumulation;
        }
        if (cumulation instanceof CompositeByteBuf composite && composite.refCnt() == 1) {
            append(alloc, composite, in);
            return composite;
        }
        // A frame decoded from the cumulation may still hold it (a block handed to Spark), and must keep seeing its
        // bytes as they are: the rest goes on in a new composite, which takes the decoder's reference only once all
        // is in, so that a failure leaves the decoder its cumulation.
        CompositeByteBuf fresh = null;
        ByteBuf pending = in;
        try {
            fresh = alloc.compositeBuffer(Integer.MAX_VALUE);
            nextTail = MIN_TAIL;
            smallComponents = 0;
            append(alloc, fresh, cumulation.retain());
            pending = null;
            append(alloc, fresh, in);
        } catch (Throwable t) {
            if (pending != null) {
                pending.release();
            }
            if (fresh != null) {
                fresh.release();
            }
            throw t;
        }
        cumulation.release();
        return fresh;
    }

    /**
     * Appends {@code buf}'s readable bytes to {@code composite}, copied or as a component, leaving {@code buf}'s
     * indices as they are. Takes {@code buf}, also when it throws.
     */
    private void append(ByteBufAllocator alloc, CompositeByteBuf composite, ByteBuf buf) {
        int length = buf.readableBytes();
        if (length > composite.writableBytes()) {
            // The tail's unwritten room would lie between the bytes and what follows: give it up.
            composite.capacity(composite.writerIndex());
            if (length >= COPY_THRESHOLD || smallComponents < MAX_SMALL_COMPONENTS) {
                if (length < COPY_THRESHOLD) {
                    smallComponents++;
                }
                nextTail = MIN_TAIL;
                composite.addFlattenedComponents(true, buf);
                return;
            }
        }
        try {
            if (length > composite.writableBytes()) {
                ByteBuf tail = alloc.buffer(Math.max(nextTail, Integer.highestOneBit(length - 1) << 1));
                nextTail = Math.min(MAX_TAIL, tail.capacity() << 1);
                // All of the tail joins the composite; its writer index keeps the unwritten room out of the bytes.
                composite.addComponent(false, tail.setIndex(0, tail.capacity()));
            }
            composite.writeBytes(buf, buf.readerIndex(), length);
        } finally {
            buf.release();
        }
    }
}
