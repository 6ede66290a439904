package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.netty.channel.ChannelOutboundBuffer;
import io.netty.channel.DefaultFileRegion;
import io.netty.channel.FileRegion;
import io.rdmabridge.connection.FileChunkCache;
import io.rdmabridge.connection.FrameHeader;
import io.rdmabridge.connection.RdmaConnection;
import io.rdmabridge.connection.RegisteredMemory;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.RdmaException;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.WritableByteChannel;

/**
 * One flush of an {@link RdmaSocketChannel}: walks the flushed messages after those already posted and posts frames
 * for them. Small buffers are gathered into one eager frame, large ones go as rendezvous; registered memory goes by
 * reference, anything else is copied into registered memory first (the connection's scratch space or a staging
 * block). File regions go through {@link RdmaFileWriter} (a {@link DefaultFileRegion}) or are copied out with
 * {@code transferTo} (any other region). Each posted operation is recorded with {@link RdmaChannelOutbound}, which
 * owns what happens on completion.
 *
 * <p>Threading: the channel's event loop only. One instance per channel, reused for every flush, so a flush
 * allocates nothing beyond the staging blocks of copied bytes.
 *
 * <p>It only posts: it never removes messages from the outbound buffer, completes promises or frees the staging
 * blocks it hands over with an operation.
 */
final class RdmaWriteProcessor implements ChannelOutboundBuffer.MessageProcessor, RdmaFileWriter.Sink {
    /**
     * Largest rendezvous part copied into a staging block (16 MiB, the default largest message). The block stays
     * pinned until the peer acknowledges its READ, which a peer may never do: its size is this side's to bound, not
     * the peer's announcement (a peer announcing 2 GiB with one credit made a 1 GiB heap write pin 1 GiB more).
     */
    static final int MAX_STAGED_PART = 16 * 1024 * 1024;
    /**
     * Most staging memory a connection's posted operations hold at a time (two parts): beyond it a copied rendezvous
     * waits in the outbound buffer, counted against writability, until the peer acknowledges what it holds, as a
     * socket's bytes wait while the peer's window is closed. The peer's credits and the send queue alone let a peer
     * that never acknowledges pin 4 GiB per connection, and one flush copy as much on the event loop.
     */
    static final long MAX_STAGED_BYTES = 2L * MAX_STAGED_PART;

    private final RdmaSocketChannel channel;
    private final RdmaChannelOutbound outbound;
    private final RdmaChannelConfig config;
    private final RdmaChannelMetrics metrics;
    private final StagingChannel stagingChannel = new StagingChannel();
    private RdmaFileWriter fileWriter;

    // The walk under way: the bytes still to skip, the work requests it may still post, the eager frame it fills.
    private RdmaConnection c;
    private boolean first;
    private long skip;
    private int budget;
    private boolean yielded;
    private boolean framing;
    private int frameBytes;
    private RegisteredMemory.Block frameStaging;
    private int stagingUsed;
    // Bytes at the head of the outbound buffer posted from copies, with nothing sent by reference before them.
    private boolean copiedRun;
    private long copiedPrefix;

    RdmaWriteProcessor(RdmaSocketChannel channel, RdmaChannelOutbound outbound) {
        this.channel = channel;
        this.outbound = outbound;
        config = channel.config();
        metrics = channel.metrics();
    }

    /**
     * Prepares a walk that skips the first {@code postedBytes} flushed bytes and posts at most {@code spinCount}.
     *
     * @param countCopies whether to count the bytes this walk copies before the first it sends by reference
     *                    ({@link #copiedPrefix()}); only meaningful when nothing posted is left at the head
     */
    void start(RdmaConnection c, long postedBytes, int spinCount, boolean countCopies) {
        this.c = c;
        skip = postedBytes;
        copiedRun = countCopies;
        copiedPrefix = 0;
        first = true;
        budget = Math.max(1, spinCount);
        yielded = false;
        framing = false;
    }

    @Override
    public boolean processMessage(Object msg) throws Exception {
        boolean head = first;
        first = false;
        if (msg instanceof ByteBuf) {
            ByteBuf buf = (ByteBuf) msg;
            int readable = buf.readableBytes();
            if (skip >= readable) {
                skip -= readable;
                return true;
            }
            int index = buf.readerIndex() + (int) skip;
            int length = readable - (int) skip;
            skip = 0;
            return writeBytes(buf, index, length);
        }
        if (msg instanceof FileRegion) {
            FileRegion region = (FileRegion) msg;
            // Completed bytes of the head region were reported with progress(), not removed.
            long done = head ? outbound.fileSent() : 0;
            long remaining = region.count() - done;
            if (skip >= remaining) {
                skip -= remaining;
                return true;
            }
            long offset = done + skip;
            skip = 0;
            endFrame();
            copiedRun = false;
            if (region instanceof DefaultFileRegion) {
                if (offset == 0) {
                    // A region made from a File opens its FileChannel lazily; validation reads the channel's size.
                    ((DefaultFileRegion) region).open();
                    channel.checkFileRegion((DefaultFileRegion) region, region.transferred());
                }
                return fileWriter().write((DefaultFileRegion) region, offset, this, config.rendezvousThreshold());
            }
            // Other regions can only be copied out in order through transferTo(), once they are at the head.
            return head && writeCustomRegion(region, offset);
        }
        return false;
    }

    /**
     * Whether {@code bytes} more may be staged within {@link #MAX_STAGED_BYTES}; one part always may, when nothing is
     * staged. The completions that free staging memory flush again.
     */
    private boolean roomToStage(long bytes) {
        long staged = outbound.stagedBytes();
        return staged == 0 || staged + bytes <= MAX_STAGED_BYTES;
    }

    private boolean spend() {
        if (budget == 0) {
            yielded = true;
            return false;
        }
        budget--;
        return true;
    }

    private boolean writeBytes(ByteBuf buf, int index, int length) throws RdmaException {
        while (length > 0) {
            if (length >= config.rendezvousThreshold()) {
                endFrame();
                if (!c.canSendData() || !spend()) {
                    return false;
                }
                // The peer announced the largest message it accepts: a larger write goes as several.
                int part = Math.min(length, c.maxRendezvousLength());
                long address = ByteBufAddress.of(buf, index, part);
                RegisteredMemory.Block staging = null;
                if (address == 0 || channel.domain.memory.regions().find(address, part) == null) {
                    part = Math.min(part, MAX_STAGED_PART);
                    if (!roomToStage(part)) {
                        unspend();
                        return false;
                    }
                    staging = channel.domain.memory.allocate(part);
                    try {
                        copy(buf, index, part, staging.buffer(), 0);
                    } catch (RuntimeException e) {
                        // A buffer the application released while it was queued: nothing was posted.
                        staging.free();
                        unspend();
                        throw e;
                    }
                    address = staging.address();
                    copied(part);
                }
                long op;
                try {
                    op = c.sendRendezvous(address, part);
                } catch (RdmaException | RuntimeException e) {
                    if (staging != null) {
                        staging.free();
                    }
                    throw e;
                }
                outbound.record(op, part, staging, false);
                // Even a copy completes only once the peer has READ it: its staging block is pinned until the peer
                // acknowledges, which a peer may never do, so completing it on posting would let a writer that heeds
                // writability pin a block per write without end. Held in the outbound buffer, it counts there.
                copiedOrReferenced(false, part);
                metrics.addRendezvous(part);
                channel.handler.metrics().addRendezvous(part);
                index += part;
                length -= part;
                continue;
            }
            if (!framing) {
                if (!c.canSendData() || !spend()) {
                    return false;
                }
                c.beginData();
                framing = true;
                frameBytes = 0;
                frameStaging = null;
                stagingUsed = 0;
            }
            int chunk = Math.min(length, c.framePayloadRemaining());
            if (!addToFrame(buf, index, chunk)) {
                endFrame();
                continue;
            }
            frameBytes += chunk;
            index += chunk;
            length -= chunk;
            if (c.framePayloadRemaining() == 0) {
                endFrame();
            }
        }
        return true;
    }

    /** @return {@code false} when the frame cannot take this chunk (out of segments or staging room) */
    private boolean addToFrame(ByteBuf buf, int index, int chunk) throws RdmaException {
        long address = ByteBufAddress.of(buf, index, chunk);
        MemoryRegion mr = address == 0 ? null : channel.domain.memory.regions().find(address, chunk);
        if (mr != null) {
            if (!c.canAppend(address, mr.lkey())) {
                return false;
            }
            c.addSegment(address, chunk, mr.lkey());
            copiedOrReferenced(false, chunk);
            return true;
        }
        // Copies go to the frame's scratch area, or to its staging block once the scratch area is too small. Either
        // continues its own last segment only while nothing was referenced after it.
        if (frameStaging == null && chunk <= c.scratchRemaining()) {
            if (!c.canAppendScratch()) {
                return false;
            }
            copy(buf, index, chunk, c.scratchBuffer(), c.scratchOffset());
            c.addScratch(chunk);
            copied(chunk);
            copiedOrReferenced(true, chunk);
            return true;
        }
        if (frameStaging == null) {
            if (!c.hasSegmentRoom()) {
                return false;
            }
            frameStaging = channel.domain.memory.allocate(c.framePayloadRemaining());
            stagingUsed = 0;
        } else if (frameStaging.capacity() - stagingUsed < chunk
                || !c.canAppend(frameStaging.address() + stagingUsed, frameStaging.memoryRegion().lkey())) {
            return false;
        }
        copy(buf, index, chunk, frameStaging.buffer(), stagingUsed);
        c.addSegment(frameStaging.address() + stagingUsed, chunk, frameStaging.memoryRegion().lkey());
        stagingUsed += chunk;
        copied(chunk);
        copiedOrReferenced(true, chunk);
        return true;
    }

    /**
     * A {@link FileRegion} of unknown kind can only be read through {@code transferTo}: copy it into registered
     * staging memory, piece by piece (counted as copied).
     */
    private boolean writeCustomRegion(FileRegion region, long offset) throws IOException {
        // transferTo() must be called at transferred(): the region tracks its own progress.
        while (region.transferred() < region.count()) {
            if (!canSend()) {
                return false;
            }
            long before = region.transferred();
            int chunk = (int) Math.min(region.count() - before,
                    Math.min(RegisteredMemory.maxPooledSize(), c.maxRendezvousLength()));
            if (!roomToStage(chunk)) {
                unspend();
                return false;
            }
            RegisteredMemory.Block block = channel.domain.memory.allocate(chunk);
            StagingChannel target = stagingChannel.reset(block.buffer(), chunk);
            try {
                region.transferTo(target, before);
            } catch (IOException | RuntimeException e) {
                block.free();
                throw e;
            }
            int length = target.written();
            if (length <= 0) {
                block.free();
                unspend();
                return false;
            }
            copied(length);
            long op;
            if (length >= config.rendezvousThreshold() || length > c.maxFramePayload()) {
                try {
                    op = c.sendRendezvous(block.address(), length);
                } catch (RdmaException | RuntimeException e) {
                    block.free();
                    throw e;
                }
                metrics.addRendezvous(length);
                channel.handler.metrics().addRendezvous(length);
            } else {
                c.beginData();
                c.addSegment(block.address(), length, block.memoryRegion().lkey());
                op = c.sendData();
                countEager(length);
            }
            metrics.addFile(length);
            channel.handler.metrics().addFile(length);
            // Progress is what the region reports: a framing or encrypting region may count more (or fewer)
            // bytes than it wrote, and must never be called again once transferred() reached count().
            outbound.record(op, region.transferred() - before, block, true);
        }
        return true;
    }

    @Override
    public boolean canSend() {
        return c.canSendData() && spend();
    }

    @Override
    public void unspend() {
        budget++;
    }

    @Override
    public int maxFramePayload() {
        return c.maxFramePayload();
    }

    @Override
    public int maxRendezvousLength() {
        return c.maxRendezvousLength();
    }

    @Override
    public void send(long address, int length, FileChunkCache.Chunk chunk, boolean rendezvous) throws RdmaException {
        long op;
        if (rendezvous) {
            try {
                op = c.sendRendezvous(address, length);
            } catch (RdmaException | RuntimeException e) {
                chunk.release();
                throw e;
            }
            metrics.addRendezvous(length);
            channel.handler.metrics().addRendezvous(length);
        } else {
            c.beginData();
            c.addSegment(address, length, chunk.memoryRegion().lkey());
            op = c.sendData();
            countEager(length);
        }
        metrics.addFile(length);
        channel.handler.metrics().addFile(length);
        if (chunk.isCopy()) {
            copied(length); // the kernel refused to register the file's mapping: its bytes were read into memory
        }
        outbound.record(op, length, chunk, true);
    }

    private void copiedOrReferenced(boolean copy, long n) {
        if (!copy) {
            copiedRun = false;
        } else if (copiedRun) {
            copiedPrefix += n;
        }
    }

    /**
     * Bytes the last walk posted from copies before anything it sent by reference or from a file, counted from the
     * first byte it posted; all posted once {@link #finish()} returned.
     */
    long copiedPrefix() {
        return copiedPrefix;
    }

    private void copied(int n) {
        metrics.addCopied(n);
        channel.handler.metrics().addCopied(n);
    }

    private void countEager(int payload) {
        if (payload + FrameHeader.HEADER_LENGTH <= config.inlineThreshold()
                && payload + FrameHeader.HEADER_LENGTH
                <= channel.domain.device.attributes().maxInlineData()) {
            metrics.addInline(payload);
            channel.handler.metrics().addInline(payload);
        } else {
            metrics.addEager(payload);
            channel.handler.metrics().addEager(payload);
        }
    }

    private void endFrame() {
        if (!framing) {
            return;
        }
        framing = false;
        long op = c.sendData();
        outbound.record(op, frameBytes, frameStaging, false);
        countEager(frameBytes);
        frameStaging = null;
    }

    void finish() {
        endFrame();
    }

    /** Drops the frame being built, unposted, and frees its staging block: a message threw part-way through it. */
    void abandonFrame() {
        if (!framing) {
            return;
        }
        framing = false;
        c.abandonData();
        if (frameStaging != null) {
            frameStaging.free();
            frameStaging = null;
        }
    }

    /** Whether the last walk stopped on its spin count with work left. */
    boolean yielded() {
        return yielded;
    }

    /** Closes the file writer's cached file chunks (the queue pair is gone). */
    void close() {
        if (fileWriter != null) {
            fileWriter.close();
        }
    }

    /** Lets {@code FileRegion.transferTo} write into a registered staging block. */
    private static final class StagingChannel implements WritableByteChannel {
        private ByteBuffer target;

        StagingChannel reset(ByteBuffer buffer, int limit) {
            target = buffer;
            buffer.clear().limit(limit);
            return this;
        }

        int written() {
            return target.position();
        }

        @Override
        public int write(ByteBuffer src) {
            int n = Math.min(src.remaining(), target.remaining());
            ByteBuffer part = src.duplicate();
            part.limit(part.position() + n);
            target.put(part);
            src.position(src.position() + n);
            return n;
        }

        @Override
        public boolean isOpen() {
            return true;
        }

        @Override
        public void close() {
        }
    }

    private RdmaFileWriter fileWriter() {
        if (fileWriter == null) {
            fileWriter = new RdmaFileWriter(channel.domain.memory);
        }
        return fileWriter;
    }

    private static void copy(ByteBuf src, int index, int length, ByteBuffer dst, int dstOffset) {
        dst.clear().position(dstOffset).limit(dstOffset + length);
        src.getBytes(index, dst);
    }
}
