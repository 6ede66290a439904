package io.rdmabridge.spark;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufInputStream;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.network.buffer.ManagedBuffer;

/**
 * A fetched block handed to Spark without a copy: a view of the transport's receive buffers (registered memory on an
 * RDMA channel). Spark's retain/release drive the buffer's reference count; the last release returns the memory to the
 * transport, and tells the fetch client, which counts the bytes Spark holds against its budget. Thread-safe as far as
 * the underlying buffer's reference counting is.
 */
final class FetchedBlockBuffer extends ManagedBuffer {
    private final ByteBuf buf;
    /**
     * References held through this buffer: a view shares its reference count with the whole cumulation it was cut
     * from, whose count does not say when this block is released.
     */
    private final AtomicInteger references = new AtomicInteger(1);
    private final Runnable onReleased;

    /** @param onReleased runs once, on the thread of the release that drops the last reference */
    FetchedBlockBuffer(ByteBuf buf, Runnable onReleased) {
        this.buf = buf;
        this.onReleased = onReleased;
    }

    @Override
    public long size() {
        return buf.readableBytes();
    }

    @Override
    public ByteBuffer nioByteBuffer() {
        // A view when the block arrived in one buffer; a block that spans receive buffers is gathered once.
        return buf.nioBuffer();
    }

    @Override
    public InputStream createInputStream() {
        return new ByteBufInputStream(buf.duplicate());
    }

    @Override
    public ManagedBuffer retain() {
        buf.retain();
        references.incrementAndGet();
        return this;
    }

    @Override
    public ManagedBuffer release() {
        // First, so that a release the buffer refuses counts nothing here.
        buf.release();
        if (references.decrementAndGet() == 0) {
            onReleased.run();
        }
        return this;
    }

    /** Fetched blocks are consumed in this executor and never sent on over Spark's own (differently packaged) Netty. */
    @Override
    public Object convertToNetty() {
        throw new UnsupportedOperationException("a block fetched over the RDMA shuffle transport cannot be re-sent "
                + "over Spark's transport");
    }

    /** Spark 4.0 and later declare it (abstract); Spark 3.5 does not, hence no {@code @Override}. */
    public Object convertToNettyForSsl() {
        return convertToNetty();
    }

    int refCnt() {
        return buf.refCnt();
    }

    @Override
    public String toString() {
        return "FetchedBlockBuffer(" + buf.readableBytes() + " bytes)";
    }
}
