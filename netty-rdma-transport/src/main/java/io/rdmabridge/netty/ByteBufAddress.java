package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.rdmabridge.verbs.DirectMemory;

import java.nio.ByteBuffer;

/** Native addresses of {@link ByteBuf} bytes, found without allocating where Netty allows it. Thread-safe. */
final class ByteBufAddress {
    private ByteBufAddress() {
    }

    /**
     * The native address of {@code buf[index]} when {@code [index, index + length)} is one contiguous piece of
     * direct memory; {@code 0} otherwise (heap, or composite over several pieces).
     */
    static long of(ByteBuf buf, int index, int length) {
        if (buf.hasMemoryAddress()) {
            return buf.memoryAddress() + index;
        }
        if (!buf.isDirect() || buf.nioBufferCount() != 1) {
            return 0;
        }
        ByteBuffer nio = buf.internalNioBuffer(index, length);
        if (!nio.isDirect()) {
            return 0;
        }
        return DirectMemory.address(nio) + nio.position();
    }
}
