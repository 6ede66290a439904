package io.rdmabridge.netty;

import io.netty.buffer.AbstractByteBufAllocator;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.UnpooledDirectByteBuf;
import io.netty.buffer.UnpooledHeapByteBuf;
import io.netty.util.Recycler;
import io.netty.util.internal.CleanableDirectBuffer;
import io.netty.util.internal.PlatformDependent;
import io.rdmabridge.connection.RegisteredMemory;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.RdmaException;

import java.nio.ByteBuffer;

/**
 * The default allocator of RDMA channels: direct buffers live in memory regions registered once (pooled blocks of
 * {@link RegisteredMemory}; above {@link RegisteredMemory#maxPooledSize()} a registration of their own), so writing
 * them costs no CPU copy and large ones go by rendezvous straight from where the application wrote them. Heap
 * buffers are ordinary heap buffers (writing them copies once).
 *
 * <p>Obtain it from a registered channel: {@code channel.alloc()} (unless {@code ChannelOption.ALLOCATOR} was set).
 * Once its event loop group has shut down, new direct buffers fall back to unregistered memory. Thread-safe: any
 * thread may allocate and release. Direct buffers are recycled, buffer object and registered block alike, so
 * allocating one per message on an event loop creates no garbage and takes no lock once warm (with leak detection
 * off; its records allocate by design).
 */
public final class RdmaByteBufAllocator extends AbstractByteBufAllocator {
    private final RegisteredMemory memory;
    private final Recycler<RegisteredByteBuf> recycler = new Recycler<RegisteredByteBuf>() {
        @Override
        protected RegisteredByteBuf newObject(Handle<RegisteredByteBuf> handle) {
            return new RegisteredByteBuf(RdmaByteBufAllocator.this, handle);
        }
    };

    RdmaByteBufAllocator(RegisteredMemory memory) {
        super(true);
        this.memory = memory;
    }

    RegisteredMemory memory() {
        return memory;
    }

    @Override
    protected ByteBuf newHeapBuffer(int initialCapacity, int maxCapacity) {
        return new UnpooledHeapByteBuf(this, initialCapacity, maxCapacity);
    }

    @Override
    protected ByteBuf newDirectBuffer(int initialCapacity, int maxCapacity) {
        return recycler.get().reuse(initialCapacity, maxCapacity);
    }

    @Override
    public boolean isDirectBufferPooled() {
        return true;
    }

    /**
     * A direct buffer whose memory (also after it grows) comes from registered blocks. Released, it gives its block
     * back and itself to the allocator's {@link Recycler} (as Netty's pooled buffers do), so a steady stream of
     * allocations creates no objects. Reference counting is thread-safe; the contents are the owner's, as with any
     * {@link ByteBuf}.
     */
    static final class RegisteredByteBuf extends UnpooledDirectByteBuf {
        private static final boolean ADDRESSABLE = PlatformDependent.hasUnsafe();
        private static final ByteBuffer EMPTY = ByteBuffer.allocateDirect(0);

        private final Recycler.Handle<RegisteredByteBuf> handle;
        // Storage of a released buffer waiting in the recycler: empty, never freed.
        private final CleanableDirectBuffer parked = new Parked(EMPTY.duplicate());
        private long address;

        RegisteredByteBuf(RdmaByteBufAllocator alloc, Recycler.Handle<RegisteredByteBuf> handle) {
            // Netty's constructor allocates through a package-private method; start empty and grow through the
            // overridable one, so all later memory is a registered block.
            super(alloc, 0, Integer.MAX_VALUE);
            this.handle = handle;
            address = ADDRESSABLE ? DirectMemory.address(internalNioBuffer(0, 0)) : 0;
        }

        RegisteredByteBuf reuse(int initialCapacity, int maxCapacity) {
            resetRefCnt();
            maxCapacity(maxCapacity);
            setIndex(0, 0);
            markReaderIndex();
            markWriterIndex();
            if (initialCapacity > 0) {
                capacity(initialCapacity);
            }
            return this;
        }

        @Override
        protected CleanableDirectBuffer allocateDirectBuffer(int capacity) {
            if (capacity == 0) {
                address = ADDRESSABLE ? DirectMemory.address(parked.buffer()) : 0;
                return parked;
            }
            RegisteredMemory memory = ((RdmaByteBufAllocator) alloc()).memory;
            if (!memory.isClosed()) {
                try {
                    BlockBuffer b = BlockBuffer.of(memory.allocate(capacity), capacity);
                    address = b.memoryAddress();
                    return b;
                } catch (RdmaException | RuntimeException e) {
                    // Registration refused (memory limit) or the group shut down: unregistered memory still works,
                    // it is only copied when written.
                }
            }
            CleanableDirectBuffer b = PlatformDependent.allocateDirect(capacity);
            address = ADDRESSABLE ? DirectMemory.address(b.buffer()) : 0;
            return b;
        }

        @Override
        protected void deallocate() {
            // Give the memory back but keep this object: shrinking to the parked storage frees the block (capacity()
            // insists on a live buffer, hence the count), then the count says released again until reuse().
            setRefCnt(1);
            capacity(0);
            setRefCnt(0);
            handle.recycle(this);
        }

        // Registered memory is native memory at a known address; saying so lets the channel (and Netty's own
        // copies) use it directly instead of creating a ByteBuffer view per write.
        @Override
        public boolean hasMemoryAddress() {
            return ADDRESSABLE;
        }

        @Override
        public long memoryAddress() {
            if (!ADDRESSABLE) {
                throw new UnsupportedOperationException("no sun.misc.Unsafe: the address of a direct buffer is unknown");
            }
            ensureAccessible();
            return address;
        }
    }

    /** The empty storage of a buffer in the recycler. */
    private static final class Parked implements CleanableDirectBuffer {
        private final ByteBuffer buffer;

        Parked(ByteBuffer buffer) {
            this.buffer = buffer;
        }

        @Override
        public ByteBuffer buffer() {
            return buffer;
        }

        @Override
        public void clean() {
            // Nothing to free: the storage is shared and empty.
        }
    }

    /** Adapts a registered block to the buffer's storage; pooled blocks keep theirs across uses. */
    static final class BlockBuffer implements CleanableDirectBuffer {
        private final RegisteredMemory.Block block;

        private BlockBuffer(RegisteredMemory.Block block) {
            this.block = block;
        }

        static BlockBuffer of(RegisteredMemory.Block block, int capacity) {
            BlockBuffer b = (BlockBuffer) block.attachment();
            if (b == null) {
                b = new BlockBuffer(block);
                block.attach(b);
            }
            block.buffer().clear().limit(capacity);
            return b;
        }

        @Override
        public ByteBuffer buffer() {
            return block.buffer();
        }

        @Override
        public void clean() {
            block.free();
        }

        @Override
        public boolean hasMemoryAddress() {
            return true;
        }

        @Override
        public long memoryAddress() {
            return block.address();
        }
    }
}
