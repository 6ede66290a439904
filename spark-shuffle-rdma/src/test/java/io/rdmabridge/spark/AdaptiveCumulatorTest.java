package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.AbstractByteBufAllocator;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufUtil;
import io.netty.buffer.CompositeByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.buffer.UnpooledDirectByteBuf;
import io.netty.buffer.UnpooledHeapByteBuf;
import io.netty.channel.embedded.EmbeddedChannel;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;

/**
 * The frame cumulator on its own: small inputs merged into tails, large ones composed as they are, every input
 * released exactly once, and what a cumulation holds about its bytes, however the peer cuts them.
 */
class AdaptiveCumulatorTest {
    private final FailingAllocator alloc = new FailingAllocator();
    private final AdaptiveCumulator cumulator = new AdaptiveCumulator();
    private final List<ByteBuf> inputs = new ArrayList<>();

    /** As a peer that sends a frame one byte per SEND: after the first few, each byte is copied, its buffer freed. */
    @Test
    void shouldMergeSmallInputsIntoTailsThatDoubleAndReleaseEach() {
        byte[] bytes = randomBytes(10_000);
        ByteBuf cumulation = Unpooled.EMPTY_BUFFER;
        for (byte b : bytes) {
            cumulation = cumulate(cumulation, input(1).writeByte(b));
        }
        CompositeByteBuf composite = (CompositeByteBuf) cumulation;
        assertArrayEquals(bytes, ByteBufUtil.getBytes(composite));
        // The first few stay in their own buffers (256 bytes each); then tails of 256, 512, ... 8192 bytes.
        int composed = AdaptiveCumulator.MAX_SMALL_COMPONENTS;
        assertEquals(composed + 6, composite.numComponents());
        assertEquals(composed * 256 + 256 + 512 + 1024 + 2048 + 4096 + 8192, heldBytes(composite));
        inputs.subList(composed, inputs.size()).forEach(in -> assertEquals(0, in.refCnt(), "released once copied"));
        composite.release();
        inputs.forEach(in -> assertEquals(0, in.refCnt()));
    }

    @Test
    void shouldComposeALargeInputWithoutCopyingIt() {
        ByteBuf cumulation = cumulate(Unpooled.EMPTY_BUFFER, input(100).writeZero(100));
        ByteBuf large = input(AdaptiveCumulator.COPY_THRESHOLD).writeZero(AdaptiveCumulator.COPY_THRESHOLD);
        CompositeByteBuf composite = (CompositeByteBuf) cumulate(cumulation, large);
        assertEquals(2, composite.numComponents(), "the buffer of the 100 bytes, and the large input");
        assertEquals(1, large.refCnt(), "the large input is the composite's now");
        // The same memory, not a copy of it.
        large.setByte(7, 42);
        assertEquals(42, composite.getByte(100 + 7));
        assertEquals(100 + AdaptiveCumulator.COPY_THRESHOLD, composite.readableBytes());
        composite.release();
        assertEquals(0, large.refCnt());
    }

    /**
     * Whatever sizes the peer sends (here runs of tiny sends, each followed by one of any size), a cumulation holds its
     * bytes, at most as much again in the power-of-two blocks that inputs arrived in, as much again in tails' room
     * given up (each time less than the input that took its place), the last tail's unwritten room, and the blocks of
     * the few small inputs it composed. Netty's composite cumulator held every input's block, on an RDMA channel at
     * least 256 bytes for each send.
     */
    @Test
    void shouldHoldAboutItsBytesWhateverSizesArrive() {
        Random random = new Random(7);
        ByteBuf cumulation = Unpooled.EMPTY_BUFFER;
        ByteBuf expected = Unpooled.buffer();
        for (int run = 0; run < 30; run++) {
            int tiny = random.nextInt(2_000);
            for (int i = 0; i <= tiny; i++) {
                int size = i < tiny ? 1 + random.nextInt(8) : 1 + random.nextInt(70_000);
                byte[] bytes = randomBytes(size);
                expected.writeBytes(bytes);
                cumulation = cumulate(cumulation, input(size).writeBytes(bytes));
                long readable = cumulation.readableBytes();
                long held = heldBytes(cumulation);
                long bound = 3 * readable + AdaptiveCumulator.MAX_TAIL
                        + (AdaptiveCumulator.MAX_SMALL_COMPONENTS + 1) * AdaptiveCumulator.COPY_THRESHOLD;
                assertTrue(held <= bound, held + " bytes held for " + readable + " (expected: at most " + bound + ")");
            }
        }
        assertEquals(expected, cumulation);
        expected.release();
        cumulation.release();
        inputs.forEach(in -> assertEquals(0, in.refCnt()));
    }

    /** A frame the decoder cut from the cumulation (a block Spark holds) keeps the cumulation, and its bytes, alive. */
    @Test
    void shouldLeaveACumulationAFrameHoldsAsTheFrameSeesIt() {
        ByteBuf cumulation = cumulate(Unpooled.EMPTY_BUFFER, input(3).writeBytes(new byte[] {1, 2, 3}));
        cumulation = cumulate(cumulation, input(2).writeBytes(new byte[] {4, 5}));
        ByteBuf frame = cumulation.readRetainedSlice(4);
        ByteBuf next = cumulate(cumulation, input(2).writeBytes(new byte[] {6, 7}));
        assertNotSame(cumulation, next);
        assertArrayEquals(new byte[] {1, 2, 3, 4}, ByteBufUtil.getBytes(frame));
        assertEquals(5, cumulation.writerIndex(), "nothing written into the cumulation the frame holds");
        assertArrayEquals(new byte[] {5, 6, 7}, ByteBufUtil.getBytes(next));
        assertEquals(1, cumulation.refCnt(), "the decoder's reference went to the new cumulation");
        frame.release();
        assertEquals(0, cumulation.refCnt());
        next.release();
        inputs.forEach(in -> assertEquals(0, in.refCnt()));
    }

    /** Out of memory for a tail: the input is released, and the decoder keeps its cumulation as it was. */
    @Test
    void shouldReleaseTheInputAndKeepTheCumulationWhenATailCannotBeAllocated() {
        byte[] bytes = randomBytes(AdaptiveCumulator.MAX_SMALL_COMPONENTS + 2);
        ByteBuf cumulation = Unpooled.EMPTY_BUFFER;
        for (byte b : bytes) {
            cumulation = cumulate(cumulation, input(1).writeByte(b));
        }
        // More than the first tail's room left: it needs a new one.
        ByteBuf in = input(300).writeZero(300);
        alloc.failing = true;
        ByteBuf before = cumulation;
        assertThrows(OutOfMemoryError.class, () -> cumulator.cumulate(alloc, before, in));
        alloc.failing = false;
        assertEquals(0, in.refCnt());
        assertEquals(1, cumulation.refCnt());
        assertArrayEquals(bytes, ByteBufUtil.getBytes(cumulation));
        cumulation = cumulate(cumulation, input(2).writeByte(1).writeByte(2));
        assertEquals(bytes.length + 2, cumulation.readableBytes(), "the cumulation goes on after the failure");
        cumulation.release();
        inputs.forEach(buf -> assertEquals(0, buf.refCnt()));
    }

    @Test
    void shouldDecodeABlockFrameThatArrivesOneBytePerBuffer() {
        BlockFrame.CheckedFrameDecoder decoder = BlockFrame.newFrameDecoder((length, type, requestId) -> { });
        EmbeddedChannel ch = new EmbeddedChannel(decoder);
        byte[] block = randomBytes(20_000);
        ByteBuf frame = BlockFrame.blockHeader(ch.alloc(), 5, block.length).writeBytes(block);
        while (frame.isReadable()) {
            ch.writeInbound(frame.readRetainedSlice(1));
        }
        frame.release();
        assertEquals(0, decoder.bufferedBytes());
        ByteBuf decoded = ch.readInbound();
        assertEquals(BlockFrame.BLOCK, BlockFrame.readType(decoded));
        assertEquals(5, BlockFrame.readRequestId(decoded));
        assertArrayEquals(block, ByteBufUtil.getBytes(decoded));
        decoded.release();
        assertFalse(ch.finish(), "nothing more decoded");
    }

    private ByteBuf cumulate(ByteBuf cumulation, ByteBuf in) {
        return cumulator.cumulate(alloc, cumulation, in);
    }

    /** A received buffer for {@code size} bytes, in a block as the RDMA channel's copies take: 256 bytes at least. */
    private ByteBuf input(int size) {
        ByteBuf in = alloc.directBuffer(Math.max(256, Integer.highestOneBit(size - 1) << 1));
        inputs.add(in);
        return in;
    }

    /** The memory of the buffers a cumulation lies in, unwritten room included. */
    private static long heldBytes(ByteBuf cumulation) {
        if (!(cumulation instanceof CompositeByteBuf composite)) {
            return cumulation.capacity();
        }
        long held = 0;
        for (int i = 0; i < composite.numComponents(); i++) {
            held += composite.component(i).capacity();
        }
        return held;
    }

    private static byte[] randomBytes(int size) {
        byte[] bytes = new byte[size];
        new Random(size).nextBytes(bytes);
        return bytes;
    }

    /** Unpooled buffers, which fail to allocate once told to, as a full memory would. */
    private static final class FailingAllocator extends AbstractByteBufAllocator {
        boolean failing;

        FailingAllocator() {
            super(true);
        }

        @Override
        protected ByteBuf newHeapBuffer(int initialCapacity, int maxCapacity) {
            failIfTold(initialCapacity);
            return new UnpooledHeapByteBuf(this, initialCapacity, maxCapacity);
        }

        @Override
        protected ByteBuf newDirectBuffer(int initialCapacity, int maxCapacity) {
            failIfTold(initialCapacity);
            return new UnpooledDirectByteBuf(this, initialCapacity, maxCapacity);
        }

        @Override
        public boolean isDirectBufferPooled() {
            return false;
        }

        private void failIfTold(int capacity) {
            if (failing) {
                throw new OutOfMemoryError("test: no memory for " + capacity + " bytes");
            }
        }
    }
}
