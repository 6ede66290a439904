package io.rdmabridge.netty;

import io.netty.buffer.AbstractByteBufAllocator;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.buffer.UnpooledDirectByteBuf;
import io.netty.buffer.UnpooledHeapByteBuf;
import io.netty.util.internal.CleanableDirectBuffer;
import io.netty.util.internal.PlatformDependent;
import io.rdmabridge.connection.RegisteredMemory;
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
 * thread may allocate and release.
 */
public final class RdmaByteBufAllocator extends AbstractByteBufAllocator {
    private final RegisteredMemory memory;

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
        return new RegisteredByteBuf(this, initialCapacity, maxCapacity);
    }

    @Override
    public boolean isDirectBufferPooled() {
        return true;
    }

    /** A direct buffer whose memory (also after it grows) comes from registered blocks. */
    static final class RegisteredByteBuf extends UnpooledDirectByteBuf {
        RegisteredByteBuf(ByteBufAllocator alloc, int initialCapacity, int maxCapacity) {
            // Netty's constructor allocates through a package-private method; start empty and grow through the
            // overridable one, so even the first memory is a registered block.
            super(alloc, 0, maxCapacity);
            if (initialCapacity > 0) {
                capacity(initialCapacity);
            }
        }

        @Override
        protected CleanableDirectBuffer allocateDirectBuffer(int capacity) {
            RegisteredMemory memory = ((RdmaByteBufAllocator) alloc()).memory;
            if (!memory.isClosed()) {
                try {
                    return BlockBuffer.of(memory.allocate(capacity), capacity);
                } catch (RdmaException | RuntimeException e) {
                    // Registration refused (memory limit) or the group shut down: unregistered memory still works,
                    // it is only copied when written.
                }
            }
            return PlatformDependent.allocateDirect(capacity);
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
