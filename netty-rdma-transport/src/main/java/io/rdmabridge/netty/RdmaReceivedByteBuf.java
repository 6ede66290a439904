package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.buffer.UnpooledDirectByteBuf;

import java.nio.ByteBuffer;

/**
 * A receive buffer of an RDMA connection handed up the pipeline as is: the bytes of one eager frame, where the
 * device put them. Releasing it reposts the receive and returns a credit to the peer. One instance per receive slot,
 * reused for every frame that lands there (so receiving allocates nothing); its capacity is fixed.
 *
 * <p>May be released from any thread; the repost then hops to the channel's event loop.
 */
final class RdmaReceivedByteBuf extends UnpooledDirectByteBuf {
    private final RdmaChannelInbound inbound;
    private final int slot;

    RdmaReceivedByteBuf(ByteBufAllocator alloc, ByteBuffer payload, RdmaChannelInbound inbound, int slot) {
        super(alloc, payload, payload.capacity());
        this.inbound = inbound;
        this.slot = slot;
    }

    /** Prepares the slot's buffer for a frame of {@code length} payload bytes. */
    RdmaReceivedByteBuf reuse(int length) {
        resetRefCnt();
        setIndex(0, length);
        markReaderIndex();
        markWriterIndex();
        return this;
    }

    @Override
    protected void deallocate() {
        // Keep the memory: it belongs to the connection's receive slab and is reused for the next frame.
        inbound.receiveReleased(slot);
    }

    @Override
    public ByteBuf capacity(int newCapacity) {
        if (newCapacity == capacity()) {
            return this;
        }
        throw new UnsupportedOperationException("capacity: " + newCapacity + " (expected: " + capacity()
                + "; a received RDMA buffer cannot be resized, copy its bytes instead)");
    }
}
