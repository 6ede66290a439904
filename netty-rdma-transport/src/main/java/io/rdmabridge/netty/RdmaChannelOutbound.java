package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.netty.channel.ChannelOutboundBuffer;
import io.netty.channel.FileRegion;
import io.netty.util.ReferenceCountUtil;
import io.rdmabridge.connection.FileChunkCache;
import io.rdmabridge.connection.RdmaConnection;
import io.rdmabridge.connection.RegisteredMemory;
import io.rdmabridge.verbs.QpState;

import java.io.IOException;

/**
 * The write path of an {@link RdmaSocketChannel}: each flush hands the flushed messages not yet posted to the
 * {@link RdmaWriteProcessor}, which posts them. As the operations are delivered, in posting order, this removes
 * their bytes from the {@link ChannelOutboundBuffer} and so completes their promises, except that bytes the walk
 * copied before anything it sent by reference are removed right after posting (their promises complete, their
 * buffers are released): the device reads only the copies. {@value #COMPLETE_COPIES_ON_POST_PROPERTY}{@code =false}
 * turns that off. As operations complete, this frees their staging copies and file chunks. Also adds the connection's
 * flow-control counters (credit stalls, receiver not ready) to the metrics.
 *
 * <p>Why promises follow delivery, not completion: the peer's answer to a write may arrive before the write's send
 * completion (see {@link RdmaConnection}), and Netty's applications rely on every transport completing a write's
 * promise before its answer is read (gRPC fails a stream whose HEADERS write completes after the stream ended). A
 * message removed from the outbound buffer before its completion is released by Netty, so this keeps a reference
 * to it until the completion: the device may still be reading its memory.
 *
 * <p>Why copied writes may go early: a socket completes a write once the kernel has the bytes, and applications pace
 * themselves on those promises (gRPC's {@code isReady()} allows 32 KiB of unfinished writes per stream). Waiting for
 * the peer's count makes each such window a round trip to the peer, where the socket's is a copy. A copy sent by
 * rendezvous does not go early: its staging block stays pinned until the peer has READ it and says so, and the
 * peer's receive credits do not bound those as they bound eager frames, so the write stays in the outbound buffer,
 * counted against writability, as a socket's bytes stay in its bounded send buffer.
 *
 * <p>Threading: the channel's event loop only. The operation ring is sized once, when the channel becomes active,
 * the ring of held messages grows only when more wait than ever before on the channel, and the flush task is
 * preallocated: writing, delivering and completing allocate nothing per message.
 *
 * <p>It does not read, close or shut down: a connection that can no longer send fails the write with an exception,
 * which Netty turns into failed promises (and, with {@code AUTO_CLOSE}, a close); the close path calls
 * {@link #releaseOperations()} once the queue pair is gone.
 */
final class RdmaChannelOutbound implements RdmaConnection.Listener {
    /**
     * System property, read once: {@code false} completes the promises of copied writes only on delivery, as every
     * other write's; by default ({@code true}) they complete once their copies are posted, unless the queue pair is
     * broken or the loop's connection-manager events are not all read (see {@link #write}).
     */
    static final String COMPLETE_COPIES_ON_POST_PROPERTY = "rdmabridge.channel.completeCopiesOnPost";
    static final boolean COMPLETE_COPIES_ON_POST =
            !"false".equalsIgnoreCase(System.getProperty(COMPLETE_COPIES_ON_POST_PROPERTY, "true").trim());
    private final RdmaSocketChannel channel;
    private final RdmaWriteProcessor processor;
    private final Runnable flushTask = this::scheduledFlush;

    // Per operation: the outbound bytes it carries, the staging block or file chunk it holds (if any), and whether
    // its bytes belong to a file region.
    private long[] opBytes;
    private Object[] opRelease;
    private boolean[] opFile;
    private int opMask;
    // Messages removed from the outbound buffer on delivery, each with the operation whose completion frees it.
    private Object[] held;
    private long[] heldUntil;
    private long heldHead;
    private long heldTail;
    // While a delivery removes messages: the operation they wait for, or -1 when they need not wait.
    private long holdFor = -1;
    // Bytes posted and not yet delivered: a flush skips them at the head of the outbound buffer.
    private long postedBytes;
    // Operations posted so far: a write that posted none opens no send-completion polling window.
    private long recorded;
    // Bytes removed when posted, because they went from copies, and not yet delivered: deliveries skip them.
    private long removedEarly;
    // Completed bytes of the file region at the head of the outbound buffer (reported as progress, not removed).
    private long fileSent;
    // Registered staging memory held by posted operations until they complete (RdmaWriteProcessor bounds it).
    private long stagedBytes;
    private boolean flushScheduled;

    // Flow-control counters of the connection already added to the metrics.
    private long reportedStalls;
    private long reportedRnr;

    RdmaChannelOutbound(RdmaSocketChannel channel) {
        this.channel = channel;
        processor = new RdmaWriteProcessor(channel, this);
    }

    /** The channel became active: one ring slot per operation the send queue can hold in flight, twice over. */
    void activate(int sendQueueDepth) {
        int opCapacity = Integer.highestOneBit(sendQueueDepth) * 2;
        opBytes = new long[opCapacity];
        opRelease = new Object[opCapacity];
        opFile = new boolean[opCapacity];
        opMask = opCapacity - 1;
        held = new Object[opCapacity];
        heldUntil = new long[opCapacity];
    }

    /** {@code doWrite}: posts what was flushed after the bytes already posted. */
    void write(ChannelOutboundBuffer in) throws Exception {
        RdmaConnection c = channel.connection;
        if (c == null || channel.closing.isCloseRequested() || channel.closing.isOutputShutdown()) {
            return;
        }
        if (c.isLost() || channel.closing.isPeerGone()) {
            throw new IOException("connection reset by peer " + channel.remote + ": the queue pair is disconnected,"
                    + " nothing more can be sent");
        }
        if (postedBytes == 0) {
            removeEmptyHead(in);
        }
        if (in.isEmpty()) {
            return;
        }
        long recordedBefore = recorded;
        processor.start(c, postedBytes, channel.config().getWriteSpinCount(),
                COMPLETE_COPIES_ON_POST && postedBytes == 0);
        try {
            in.forEachFlushedMessage(processor);
            processor.finish();
        } catch (Throwable t) {
            // A message that threw part-way through a frame (a buffer released while it was queued): the frames
            // before it go out; the one it was being copied into is dropped with its staging block, which was
            // otherwise never freed, and the connection could send no control frame any more.
            processor.abandonFrame();
            throw t;
        } finally {
            c.flush();
        }
        if (c.failure() != null) {
            throw c.failure();
        }
        if (recorded != recordedBefore) {
            channel.sendPosted();
        }
        long copied = processor.copiedPrefix();
        if (copied > 0 && c.queuePair().state() == QpState.RTS && !channel.setup.connectionEventsMayWait()) {
            // The device reads only the copies: these messages are written, as a socket's are once in the kernel.
            // Not into a queue pair the provider knows is broken, nor while connection-manager events wait unread:
            // on a device a peer's reset shows only as an event (the queue pair still says RTS), and a socket's
            // write fails once the RST has arrived, read or not. Those writes complete, or fail, on delivery.
            removedEarly += copied;
            removeSent(in, copied);
            if (!in.isEmpty() && !flushScheduled) {
                // A promise listener that wrote and flushed meanwhile was not written: this write was under way.
                flushScheduled = true;
                channel.eventLoop().execute(flushTask);
            }
        }
        if (processor.yielded() && !flushScheduled) {
            // Spin count used up with work left: let the loop's other channels go first.
            flushScheduled = true;
            channel.eventLoop().execute(flushTask);
        }
    }

    private void scheduledFlush() {
        flushScheduled = false;
        writeMore();
    }

    /** Posts more of what is flushed, if anything is (completions or credits made room). */
    void writeMore() {
        ChannelOutboundBuffer in = channel.unsafe().outboundBuffer();
        if (in != null && !in.isEmpty() && channel.isActive()) {
            channel.flushNow();
        }
    }

    /** Adds the connection's new credit stalls and receiver-not-ready retries to the metrics. */
    void accountFlowControl(RdmaConnection c) {
        if (c.creditStalls() == reportedStalls && c.receiverNotReady() == reportedRnr) {
            return;
        }
        long stalls = c.creditStalls() - reportedStalls;
        long rnr = c.receiverNotReady() - reportedRnr;
        reportedStalls = c.creditStalls();
        reportedRnr = c.receiverNotReady();
        RdmaChannelMetrics metrics = channel.metrics();
        if (stalls > 0) {
            metrics.addCreditStalls(stalls);
            channel.handler.metrics().addCreditStalls(stalls);
        }
        if (rnr > 0) {
            metrics.addReceiverNotReady(rnr);
            channel.handler.metrics().addReceiverNotReady(rnr);
        }
    }

    /** Completed bytes of the file region at the head of the outbound buffer. */
    long fileSent() {
        return fileSent;
    }

    /** Registered staging memory that posted operations hold until they complete. */
    long stagedBytes() {
        return stagedBytes;
    }

    /** Operation {@code op} was posted: it carries {@code bytes} outbound bytes and holds {@code release}. */
    void record(long op, long bytes, Object release, boolean file) {
        int i = (int) (op & opMask);
        opBytes[i] = bytes;
        opRelease[i] = release;
        opFile[i] = file;
        recorded++;
        postedBytes += bytes;
        if (release instanceof RegisteredMemory.Block) {
            stagedBytes += ((RegisteredMemory.Block) release).capacity();
        }
    }

    /** The connection reports operation {@code op} delivered, in posting order: its bytes count as written. */
    @Override
    public void delivered(long op, boolean completed) {
        int i = (int) (op & opMask);
        long bytes = opBytes[i];
        // Deliveries come in posting order, and bytes removed on posting were the first posted after the last
        // delivery: they are this operation's first bytes.
        long early = Math.min(bytes, removedEarly);
        removedEarly -= early;
        bytes -= early;
        if (bytes == 0) {
            return;
        }
        ChannelOutboundBuffer in = channel.unsafe().outboundBuffer();
        if (in == null) {
            postedBytes -= bytes;
            return;
        }
        holdFor = completed ? -1 : op;
        try {
            if (opFile[i]) {
                removeEmptyHead(in);
                fileProgress(in, bytes);
            } else {
                removeSent(in, bytes);
            }
        } finally {
            holdFor = -1;
        }
        removeEmptyHead(in);
    }

    /** The connection reports operation {@code op} complete, in posting order: its memory may be reused. */
    @Override
    public void sendCompleted(long op) {
        int i = (int) (op & opMask);
        Object release = opRelease[i];
        if (release != null) {
            opRelease[i] = null;
            release(release);
        }
        // Operations complete in order, so what waited for an earlier one may go too.
        while (heldHead < heldTail && heldUntil[(int) (heldHead & (held.length - 1))] <= op) {
            releaseHeld();
        }
    }

    /**
     * Removes the message at the head of {@code in}, completing its promise; during a delivery before the
     * completion, keeps it (its memory may still be read by the device) until {@link #holdFor} completes.
     */
    private void removeHead(ChannelOutboundBuffer in) {
        if (holdFor >= 0) {
            hold(in.current(), holdFor);
        }
        in.remove();
    }

    private void hold(Object msg, long op) {
        if (heldTail - heldHead == held.length) {
            growHeld();
        }
        ReferenceCountUtil.retain(msg);
        int i = (int) (heldTail++ & (held.length - 1));
        held[i] = msg;
        heldUntil[i] = op;
    }

    private void growHeld() {
        int n = held.length;
        Object[] grownHeld = new Object[n * 2];
        long[] grownUntil = new long[n * 2];
        for (int k = 0; k < n; k++) {
            int from = (int) ((heldHead + k) & (n - 1));
            grownHeld[k] = held[from];
            grownUntil[k] = heldUntil[from];
        }
        held = grownHeld;
        heldUntil = grownUntil;
        heldTail = n;
        heldHead = 0;
    }

    private void releaseHeld() {
        int i = (int) (heldHead++ & (held.length - 1));
        Object msg = held[i];
        held[i] = null;
        ReferenceCountUtil.release(msg);
    }

    /**
     * Removes {@code bytes} sent bytes from the head of {@code in}, as {@link ChannelOutboundBuffer#removeBytes}
     * does, but keeps {@link #postedBytes} in step before each message's promise completes: a listener may write and
     * flush at once, and the {@link #write} it runs skips exactly the bytes still posted.
     */
    private void removeSent(ChannelOutboundBuffer in, long bytes) {
        while (bytes > 0) {
            Object msg = in.current();
            if (msg instanceof FileRegion && ((FileRegion) msg).count() == 0) {
                // Empty, between two buffers copied into one frame: the frame's bytes go on past it.
                in.remove();
                continue;
            }
            if (!(msg instanceof ByteBuf)) {
                // Posted bytes are always flushed buffer bytes; only a close (which failed them) gets here.
                postedBytes -= bytes;
                return;
            }
            ByteBuf buf = (ByteBuf) msg;
            int readable = buf.readableBytes();
            if (readable <= bytes) {
                bytes -= readable;
                postedBytes -= readable;
                in.progress(readable);
                removeHead(in);
            } else {
                buf.readerIndex(buf.readerIndex() + (int) bytes);
                postedBytes -= bytes;
                in.progress(bytes);
                return;
            }
        }
    }

    /** Empty buffers and regions carry no bytes, so no completion will ever remove them: remove them at the head. */
    private static void removeEmptyHead(ChannelOutboundBuffer in) {
        for (;;) {
            Object msg = in.current();
            if (msg instanceof ByteBuf && !((ByteBuf) msg).isReadable()) {
                in.remove();
            } else if (msg instanceof FileRegion && ((FileRegion) msg).count() == 0) {
                in.remove();
            } else {
                return;
            }
        }
    }

    private void fileProgress(ChannelOutboundBuffer in, long bytes) {
        postedBytes -= bytes;
        Object msg = in.current();
        if (msg instanceof FileRegion) {
            FileRegion region = (FileRegion) msg;
            fileSent += bytes;
            in.progress(bytes);
            if (fileSent >= region.count()) {
                fileSent = 0;
                removeHead(in);
            }
        }
    }

    private void release(Object o) {
        if (o instanceof RegisteredMemory.Block) {
            RegisteredMemory.Block b = (RegisteredMemory.Block) o;
            stagedBytes -= b.capacity();
            b.free();
        } else {
            ((FileChunkCache.Chunk) o).release();
        }
    }

    /**
     * Frees every staging copy, file chunk and delivered message still held by posted operations (the queue pair is
     * gone).
     */
    void releaseOperations() {
        if (opRelease != null) {
            for (int i = 0; i < opRelease.length; i++) {
                if (opRelease[i] != null) {
                    release(opRelease[i]);
                    opRelease[i] = null;
                }
            }
        }
        if (held != null) {
            while (heldHead < heldTail) {
                releaseHeld();
            }
        }
        postedBytes = 0;
        removedEarly = 0;
        stagedBytes = 0;
        processor.close();
    }
}
