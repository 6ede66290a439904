package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.buffer.UnpooledDirectByteBuf;
import io.netty.util.ResourceLeakDetector;
import io.netty.util.ResourceLeakDetectorFactory;
import io.netty.util.ResourceLeakTracker;

import java.nio.ByteBuffer;

/**
 * A receive buffer of an RDMA connection handed up the pipeline as is: the bytes of one eager frame, where the
 * device put them. Releasing it reposts the receive and returns a credit to the peer. One instance per receive slot,
 * reused for every frame that lands there (so receiving allocates nothing); its capacity is fixed.
 *
 * <p>Netty's leak detector samples these as it samples its own buffers ({@code io.netty.leakDetection.level}). A
 * sampled buffer is handed up as the only reference to it ({@link #trackLeak}): the slot gets a new instance for its
 * next frame, so that a buffer the application drops unreleased is garbage-collected and reported, where otherwise
 * its slot would silently stay out of the receive queue, with a credit of the peer's.
 *
 * <p>May be released from any thread; the repost then hops to the channel's event loop.
 */
final class RdmaReceivedByteBuf extends UnpooledDirectByteBuf {
    static final ResourceLeakDetector<RdmaReceivedByteBuf> LEAKS =
            ResourceLeakDetectorFactory.instance().newResourceLeakDetector(RdmaReceivedByteBuf.class);

    private final RdmaChannelInbound inbound;
    private final int slot;
    private ResourceLeakTracker<RdmaReceivedByteBuf> leak;

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

    /**
     * Asks the leak detector whether to track this handing-up; the loop, before the buffer goes up.
     *
     * @return whether it is tracked: then the caller must drop its own reference to this instance
     */
    boolean trackLeak() {
        leak = LEAKS.track(this);
        return leak != null;
    }

    @Override
    protected void deallocate() {
        ResourceLeakTracker<RdmaReceivedByteBuf> l = leak;
        if (l != null) {
            leak = null;
            l.close(this);
        }
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
