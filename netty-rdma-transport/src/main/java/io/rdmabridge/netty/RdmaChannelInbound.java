package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.netty.channel.EventLoop;
import io.netty.channel.RecvByteBufAllocator;
import io.netty.channel.socket.ChannelInputShutdownEvent;
import io.netty.channel.socket.ChannelInputShutdownReadComplete;
import io.netty.util.concurrent.SingleThreadEventExecutor;
import io.rdmabridge.connection.RdmaConnection;
import io.rdmabridge.connection.ReceiveBuffers;
import io.rdmabridge.connection.RegisteredMemory;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.RdmaException;

import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicIntegerArray;

/**
 * The read path of an {@link RdmaSocketChannel}: hands received messages up the pipeline (eager frames as the
 * receive buffers they landed in, rendezvous messages once their READ has completed), slices them to the read's
 * {@code guess()}, copies when the application holds most receive buffers, tells the peer's end of stream
 * ({@code ChannelInputShutdownEvent} or a close), drops what arrives after {@code shutdownInput()}, and reposts the
 * receive buffers the application releases.
 *
 * <p>Threading: the channel's event loop, except {@link #receiveReleased} and {@link #clearReadPending}, which any
 * thread may call: they hand their work to the loop through a preallocated task (a released buffer only marks its
 * slot), so receiving allocates nothing per message and takes no lock.
 *
 * <p>It never posts a send nor touches the outbound buffer; it closes the channel only as Netty's reads do (end of
 * stream, a failed rendezvous), and leaves the queue pair and receive buffers to the channel's set-up and close.
 */
final class RdmaChannelInbound {
    /** Wakes the loop so that it runs the release task queued without a wake-up. */
    private static final Runnable WAKE = () -> { };

    private final RdmaSocketChannel channel;
    private final Runnable readTask = this::scheduledRead;
    // Received buffers released on other threads, reposted by one task on the loop.
    private final Runnable releaseTask = this::releaseMarkedSlots;
    private final AtomicBoolean releaseScheduled = new AtomicBoolean();
    private final AtomicInteger releasesWaiting = new AtomicInteger();
    private volatile int eagerReleases = 1;
    private volatile AtomicIntegerArray releasedElsewhere;

    private final ReadPending readPending;
    private boolean readScheduled;
    private ReceiveBuffers recv;
    private RdmaReceivedByteBuf[] slotBuffers;
    private int pressureThreshold;
    private ByteBuf rendezvousTarget;
    // Bytes of the loop's rendezvous budget held for rendezvousTarget; whether this channel waits for budget.
    private int budgetHeld;
    // Bytes of the loop's parked allowance held for rendezvousTarget instead (landed while no read was pending).
    private int parkedHeld;
    private long budgetSince;
    // Since when a landed message, unread and not parked (the allowance was full), holds budgetHeld; 0 when none.
    private long unreadSince;
    private boolean awaitingBudget;
    // A rendezvous waits for room in the send queue for its READ (nothing is reserved for it meanwhile).
    private boolean readAwaitsSendQueue;
    // A received message handed up in part (the read's guess() was smaller): its rest goes up with the next reads.
    private ByteBuf partial;
    private volatile boolean inputShutdown;
    private boolean inputEndSeen;

    RdmaChannelInbound(RdmaSocketChannel channel) {
        this.channel = channel;
        this.readPending = new ReadPending(channel);
    }

    /** The channel became active: one reusable buffer per receive slot of {@code recv}. */
    void activate(ReceiveBuffers recv, int receiveQueueDepth) {
        this.recv = recv;
        pressureThreshold = Math.max(1, receiveQueueDepth * 3 / 4);
        eagerReleases = Math.max(1, receiveQueueDepth / 4);
        slotBuffers = new RdmaReceivedByteBuf[recv.count()];
        releasedElsewhere = new AtomicIntegerArray(recv.count());
        for (int i = 0; i < slotBuffers.length; i++) {
            slotBuffers[i] = newSlotBuffer(i);
        }
    }

    private RdmaReceivedByteBuf newSlotBuffer(int slot) {
        return new RdmaReceivedByteBuf(channel.config().getAllocator(), recv.payloadView(slot), this, slot);
    }

    boolean isInputShutdown() {
        return inputShutdown;
    }

    boolean isReadPending() {
        return readPending.isPending();
    }

    /** Whether a rendezvous waits for send-queue room for its READ: the next poll should read again. */
    boolean isReadAwaitingSendQueue() {
        return readAwaitsSendQueue;
    }

    /**
     * Whether this channel's rendezvous READ is posted and not yet complete: only then does its budget's hold
     * count against the READ timeout. A READ that has landed waits for the application's next read, which is the
     * application's to pace ({@code autoRead} off), not the peer's.
     */
    boolean isReadOutstanding() {
        RdmaConnection c = channel.connection;
        return rendezvousTarget != null && c != null && c.isRendezvousReadPosted();
    }

    /** {@code doBeginRead}: reads once the loop is free, if anything waits. */
    void beginRead() {
        if (inputShutdown && inputEndSeen) {
            return;
        }
        readPending.set();
        RdmaConnection c = channel.connection;
        if (c != null && (hasInbound(c) || channel.closing.isPeerGone()) && !readScheduled) {
            readScheduled = true;
            channel.eventLoop().execute(readTask);
        }
    }

    /** {@code autoRead} was turned off (any thread): no message is read from now on until the next read. */
    void clearReadPending() {
        readPending.cancel();
    }

    private void scheduledRead() {
        readScheduled = false;
        try {
            if (readPending.isPending() && channel.state == RdmaSocketChannel.STATE_ACTIVE) {
                readNow();
                RdmaConnection c = channel.connection;
                if (channel.closing.isPeerGone() && c != null && !hasInbound(c)) {
                    channel.closing.closeAfterPeerGone();
                }
            }
        } catch (Throwable t) {
            // As when the loop's poll reads: the channel fails with the cause. Netty would only log a task's
            // exception, and the channel would read on past the message it lost.
            ioHandle().failed(t);
        }
    }

    /** Whether a message, or the rest of one, waits to be handed up. */
    boolean hasInbound(RdmaConnection c) {
        return partial != null || c.hasInbound();
    }

    /** Hands up what has arrived, as far as the read's allocator handle allows; drops it after shutdownInput(). */
    void readNow() {
        RdmaConnection c = channel.connection;
        if (inputShutdown) {
            dropInbound(c);
            return;
        }
        if (channel.closing.isCloseRequested()) {
            // Closing, by the application or after a failure (a close may wait for posted work): a closed socket
            // hands up nothing more, and a failed channel must not read on past what it lost.
            return;
        }
        RecvByteBufAllocator.Handle allocHandle = channel.unsafe().recvBufAllocHandle();
        allocHandle.reset(channel.config());
        boolean delivered = false;
        boolean endOfStream = false;
        do {
            ByteBuf buf = partial;
            partial = null;
            if (buf == null) {
                int kind = c.pollInbound();
                if (kind == RdmaConnection.NONE) {
                    break;
                }
                if (kind == RdmaConnection.END_OF_STREAM) {
                    endOfStream = true;
                    break;
                }
                if (kind == RdmaConnection.RENDEZVOUS) {
                    if (!startRendezvousRead(c)) {
                        break;
                    }
                    continue;
                }
                buf = received(c, kind);
            }
            delivered = true;
            fireRead(buf, allocHandle);
            if (channel.state != RdmaSocketChannel.STATE_ACTIVE) {
                break;
            }
        } while (allocHandle.continueReading());
        if (delivered) {
            allocHandle.readComplete();
            channel.pipeline().fireChannelReadComplete();
        }
        if (endOfStream) {
            inputEnded();
        }
    }

    /** The message {@code pollInbound()} just returned as {@code kind}, as a buffer to hand up. */
    private ByteBuf received(RdmaConnection c, int kind) {
        int length = c.inboundLength();
        RdmaChannelMetrics metrics = channel.metrics();
        ByteBuf buf;
        if (kind == RdmaConnection.DATA) {
            int slot = c.inboundSlot();
            RdmaReceivedByteBuf slotBuffer = slotBuffers[slot];
            if (slotBuffer == null) {
                // Its last buffer went up tracked by the leak detector, as the only reference to it.
                slotBuffer = newSlotBuffer(slot);
                slotBuffers[slot] = slotBuffer;
            }
            buf = slotBuffer.reuse(length);
            if (recv.held() > pressureThreshold && releaseScheduled.get()) {
                // Buffers released on other threads wait for the loop's release task: they are not held, repost
                // them first instead of copying this one.
                releaseMarkedSlots();
            }
            if (recv.held() > pressureThreshold) {
                // The application holds most receive buffers: copy, so the peer keeps its credits.
                ByteBuf copy;
                try {
                    copy = channel.config().getAllocator().buffer(length);
                } catch (Throwable t) {
                    // Out of memory, say: the receive buffer goes back before the channel fails.
                    buf.release();
                    throw t;
                }
                copy.writeBytes(buf);
                buf.release();
                buf = copy;
                metrics.addReceivedCopied(length);
                channel.handler.metrics().addReceivedCopied(length);
            } else if (slotBuffer.trackLeak()) {
                slotBuffers[slot] = null;
            }
        } else {
            buf = rendezvousTarget;
            rendezvousTarget = null;
            // Handed up, the bytes are the application's (its reads pace the peer from here).
            releaseBudget();
            buf.writerIndex(length);
        }
        metrics.addReceived(length);
        channel.handler.metrics().addReceived(length);
        return buf;
    }

    /** Input shut down: drops everything that has arrived, so the peer gets its credits back, up to end of stream. */
    private void dropInbound(RdmaConnection c) {
        if (partial != null) {
            partial.release();
            partial = null;
        }
        for (;;) {
            int kind = c.pollInbound();
            if (kind == RdmaConnection.NONE) {
                return;
            }
            if (kind == RdmaConnection.END_OF_STREAM) {
                inputEnded();
                return;
            }
            if (kind == RdmaConnection.RENDEZVOUS) {
                readAwaitsSendQueue = false;
                c.discardRendezvous();
            } else if (kind == RdmaConnection.DATA) {
                c.releaseReceive(c.inboundSlot());
            } else {
                rendezvousTarget.release();
                rendezvousTarget = null;
                releaseBudget();
            }
        }
    }

    /** Hands up {@code buf}, or its first {@code guess()} bytes as a slice when it holds more (the rest waits). */
    private void fireRead(ByteBuf buf, RecvByteBufAllocator.Handle allocHandle) {
        int guess = Math.max(1, allocHandle.guess());
        ByteBuf piece = buf;
        if (buf.readableBytes() > guess) {
            piece = buf.readRetainedSlice(guess);
            partial = buf;
        }
        int bytes = piece.readableBytes();
        allocHandle.attemptedBytesRead(bytes);
        allocHandle.lastBytesRead(bytes);
        allocHandle.incMessagesRead(1);
        readPending.delivered();
        channel.pipeline().fireChannelRead(piece);
    }

    /**
     * Allocates a registered buffer for the pending rendezvous and posts the READ. Budget and buffer are taken only
     * when the READ can be posted at once, so they are held exactly while a READ is posted or has landed: a READ
     * that waited for send-queue room used to hold them with nothing to answer, and its channel failed as if the
     * peer had stalled the READ.
     */
    private boolean startRendezvousRead(RdmaConnection c) {
        if (!c.canReadRendezvous()) {
            readAwaitsSendQueue = true;
            return false;
        }
        readAwaitsSendQueue = false;
        int length = c.inboundLength();
        // Memory is granted, never taken: the advertisement waits until the loop's budget allows. The budget counts
        // the block the READ lands in, which a pooled size class rounds up to a power of two (else lengths just
        // above one would hold twice the budget).
        int reserved = RegisteredMemory.blockCapacity(length);
        if (!channel.handler.reserveRendezvous(this, reserved)) {
            if (!awaitingBudget) {
                awaitingBudget = true;
                channel.handler.awaitRendezvousBudget(this);
            }
            return false;
        }
        budgetHeld = reserved;
        budgetSince = System.nanoTime();
        RdmaDomain domain = channel.domain;
        ByteBuf target;
        try {
            target = domain.allocator.directBuffer(length, length);
        } catch (Throwable t) {
            releaseBudget();
            throw t;
        }
        long address = ByteBufAddress.of(target, 0, length);
        MemoryRegion mr = domain.memory.regions().find(address, length);
        if (mr == null) {
            target.release();
            releaseBudget();
            channel.closing.connectionFailed(new RdmaException("no registered memory for a rendezvous of " + length
                    + " bytes (the device refused the registration); closing"));
            return false;
        }
        rendezvousTarget = target;
        c.readRendezvous(address, mr.lkey());
        return true;
    }

    /**
     * Something arrived while no read is pending ({@code autoRead=false}). A rendezvous READ that has landed moves its
     * share of the loop's budget to the loop's parked allowance ({@link RdmaIoHandler#RENDEZVOUS_PARKED_PROPERTY}),
     * while that has room: the channel posts no other READ until the application reads, so it holds one such message,
     * and an application that pauses does not stall the rendezvous of the loop's other channels (a peer can make some
     * pause: Kafka stops reading a connection whose response the peer does not take). And the peer's end of stream is
     * told at once when it is next ({@link #endOfStreamIfNext}).
     */
    void arrivedWithoutRead(RdmaConnection c) {
        if (budgetHeld != 0 && !c.isRendezvousReadPosted()) {
            if (channel.handler.parkRendezvous(this, budgetHeld)) {
                parkedHeld = budgetHeld;
                budgetHeld = 0;
            } else if (unreadSince == 0) {
                // Past the allowance it keeps its share, and must give it back if others wait too long for it.
                unreadSince = System.nanoTime() | 1;
                channel.handler.holdUnread(this);
            }
        }
        endOfStreamIfNext(c);
    }

    /**
     * Like epoll's RDHUP: the peer's end of stream is told at once when every byte before it has been read, even
     * with no read pending ({@code autoRead=false}).
     */
    void endOfStreamIfNext(RdmaConnection c) {
        if (channel.state == RdmaSocketChannel.STATE_ACTIVE && !inputEndSeen && partial == null
                && c.endOfStreamNext()) {
            c.pollInbound();
            inputEnded();
        }
    }

    private void inputEnded() {
        inputEndSeen = true;
        if (channel.config().isAllowHalfClosure()) {
            if (!inputShutdown) {
                inputShutdown = true;
                channel.pipeline().fireUserEventTriggered(ChannelInputShutdownEvent.INSTANCE);
            }
            channel.pipeline().fireUserEventTriggered(ChannelInputShutdownReadComplete.INSTANCE);
            if (channel.closing.isOutputShutdown()) {
                channel.unsafe().close(channel.voidPromise());
            }
        } else {
            inputShutdown = true;
            channel.unsafe().close(channel.voidPromise());
        }
    }

    /** {@code shutdownInput()} on an active channel: drops what has arrived, and later frames as they come. */
    void shutdownInput() {
        inputShutdown = true;
        // Drop what has arrived so the peer keeps its credits; later frames are dropped as they come.
        if (channel.connection != null) {
            readNow();
        }
    }

    /**
     * A received buffer was released (any thread). Off the loop the repost waits for the loop's next wake-up
     * (another thread releasing a buffer it read usually writes next, or the peer sends, and either wakes the loop),
     * so releasing costs the loop no wake-up of its own: that was one more sleeping thread woken per message, on top
     * of the message's own. The loop is woken at once when a quarter of the receive queue waits to be reposted (so
     * at most that many of the peer's credits wait on a repost, and the peer never stalls on one), when the loop
     * cannot defer a task, and when the channel is no longer active (its loop may have nothing else to wake it).
     */
    void receiveReleased(int slot) {
        // The loop that owns the queue pair, even once eventLoop() has moved on (AbstractRdmaChannel#eventLoop).
        EventLoop loop = channel.firstLoop();
        if (loop.inEventLoop()) {
            releaseSlot(slot);
            return;
        }
        // Mark the slot and schedule the one shared task: no object per released buffer.
        releasedElsewhere.set(slot, 1);
        // Never fewer than the marks not yet taken (a mark precedes its count, the task zeroes the count first).
        int waiting = releasesWaiting.incrementAndGet();
        try {
            if (releaseScheduled.compareAndSet(false, true)) {
                if (waiting < eagerReleases && loop instanceof SingleThreadEventExecutor deferring) {
                    deferring.lazyExecute(releaseTask);
                    // Read after the task is queued: a loop that deactivates the channel later runs it anyway.
                    if (!channel.isActive()) {
                        loop.execute(WAKE);
                    }
                } else {
                    loop.execute(releaseTask);
                }
            } else if (waiting == eagerReleases) {
                loop.execute(WAKE);
            }
            if (loop.isShutdown()) {
                // A task queued just after the loop's last pass is dropped unrun without a rejection.
                releaseOnceTerminated(loop);
            }
        } catch (RejectedExecutionException e) {
            releaseOnceTerminated(loop);
        }
    }

    /**
     * The loop takes no more tasks, but its thread may still be destroying this connection (Netty rejects tasks before
     * its final cleanup): the marked slots go back once it has terminated, never beside it. Listeners of the
     * termination run one at a time, on one thread, and each takes only the marks still set.
     */
    private void releaseOnceTerminated(EventLoop loop) {
        loop.terminationFuture().addListener(f -> releaseMarkedSlots());
    }

    private void releaseMarkedSlots() {
        releaseScheduled.set(false);
        releasesWaiting.set(0);
        AtomicIntegerArray marked = releasedElsewhere;
        for (int i = 0; i < marked.length(); i++) {
            if (marked.get(i) != 0 && marked.getAndSet(i, 0) != 0) {
                releaseSlot(i);
            }
        }
    }

    private void releaseBudget() {
        if (budgetHeld != 0) {
            channel.handler.releaseRendezvous(this, budgetHeld);
            budgetHeld = 0;
            unreadSince = 0;
        }
        if (parkedHeld != 0) {
            channel.handler.unparkRendezvous(parkedHeld);
            parkedHeld = 0;
        }
    }

    /** Whether this channel's rendezvous waits for the loop's budget ({@link RdmaIoHandler#awaitRendezvousBudget}). */
    boolean isAwaitingBudget() {
        return awaitingBudget;
    }

    /** The loop's rendezvous budget grew: read the waiting rendezvous if a read is pending. Loop thread. */
    void budgetMayBeAvailable() {
        awaitingBudget = false;
        if (channel.state == RdmaSocketChannel.STATE_ACTIVE && readPending.isPending()) {
            readNow();
        }
    }

    /** When this channel's READ took its share of the budget ({@link System#nanoTime()}). */
    long budgetSince() {
        return budgetSince;
    }

    int budgetBytes() {
        return budgetHeld;
    }

    /**
     * Since when this channel's landed message, unread and not parked, holds its share of the budget
     * ({@link System#nanoTime()}, never 0); 0 when it does not.
     */
    long unreadSince() {
        return unreadSince;
    }

    RdmaIoHandle ioHandle() {
        return (RdmaIoHandle) channel.unsafe();
    }

    private void releaseSlot(int slot) {
        channel.connection.releaseReceive(slot);
    }

    /** Frees the rendezvous target and the rest of a message handed up in part (the queue pair is gone). */
    void releaseBuffers() {
        if (rendezvousTarget != null) {
            rendezvousTarget.release();
            rendezvousTarget = null;
        }
        releaseBudget();
        if (partial != null) {
            partial.release();
            partial = null;
        }
    }
}
