package io.rdmabridge.connection;

import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.SendWorkRequest;
import io.rdmabridge.verbs.WcOpcode;
import io.rdmabridge.verbs.WcStatus;
import io.rdmabridge.verbs.WorkCompletions;
import io.rdmabridge.verbs.WrOpcode;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * The protocol engine of one reliable-connected queue pair: a byte stream (plus end of stream) in each direction,
 * framed by {@link FrameHeader}, flow-controlled by credits, with large messages moved by rendezvous.
 *
 * <h2>Handshake</h2>
 * Each side's first frame is a HELLO carrying its {@link Handshake}, posted by {@link #start()} once the connection
 * manager reports the connection established. Until the peer's HELLO has arrived, its header's counters checked, the
 * connection is not {@link #isReady() ready}: nothing else may be sent, because the peer's buffer size, credits and message limit are
 * unknown. A HELLO spends one control credit that exists before any handshake (both sides post at least
 * {@link Handshake#MIN_CONTROL_CREDITS} receives of {@link Handshake#MIN_RECEIVE_BUFFER_SIZE} bytes before connecting or
 * accepting) and is returned like any control credit. Any other first frame, a second HELLO or a bad handshake fails
 * the connection with the cause named. The connection manager's private data is not used at all.
 *
 * <h2>Credits</h2>
 * Each side posts {@code dataCredits + controlCredits} equal receive buffers ({@link Handshake}). A sender never
 * posts a SEND without a credit: DATA and RENDEZVOUS frames take a data credit, CREDIT and SHUTDOWN frames a control
 * credit. The receiver returns a data credit when the application is done with the frame (it released the bytes of
 * a DATA frame, or the rendezvous was read or dropped), a control credit at once; so frames waiting to be delivered
 * never outnumber the data credits, whatever the application's pace. Returns ride in the header of every frame; a
 * quiet side sends an explicit CREDIT frame once a quarter of the data credits, half of the control credits, or any rendezvous acknowledgement is due.
 * The last control credit may only be spent on a frame that also returns control credits, so two sides that both
 * run out can never wait on each other.
 *
 * <h2>Eager and rendezvous</h2>
 * Messages below the rendezvous threshold are sent eagerly: a SEND gathering the header and up to
 * {@code maxSendSge - 1} payload segments straight from the caller's registered memory (inline when the whole
 * frame fits the queue pair's inline limit). Larger messages are advertised in a RENDEZVOUS frame (address, length,
 * rkey); the receiver RDMA READs them into its own registered buffer and acknowledges, and only then does the sender
 * release the buffer. The rkey is that of a region registered for exactly the advertised bytes
 * ({@link RegisteredMemory#exposeForRead}) and deregistered when the acknowledgement arrives or the connection
 * fails or is destroyed, whichever comes first: an rkey is valid for every queue pair of the protection domain, so
 * this is what keeps a peer (or any other connection of the domain) from reading anything but the bytes being sent
 * to it, and from reading them after the transfer. READ-based rendezvous is chosen over receiver-advertised
 * WRITE_WITH_IMM because the receiver picks its own buffer and pace (an application that is not reading never has
 * memory written into it, so {@code autoRead=false} bounds memory on both sides), it needs no extra round trip to
 * ask for a target, and it keeps the receive queue for frames only.
 *
 * <h2>Completions</h2>
 * One send in {@code signalInterval} is signaled, and so is the last of every batch ({@link #flush()}); on RC a
 * completion covers every earlier send. Operations (eager frames and rendezvous) are reported to the
 * {@link Listener} strictly in posting order, twice: once {@link Listener#delivered delivered} (the peer has the
 * bytes: a stream caller can count them written) and once {@link Listener#sendCompleted completed} (the memory may be
 * reused), never the second before the first.
 *
 * <p>Why two reports: a send completion may reach this side after the peer's answer to the send has arrived. The
 * peer raises its receive as soon as the bytes land, while this side's completion waits for the transport's
 * acknowledgement, which devices may coalesce and report lazily, and which the soft provider's TCP path sends after
 * the receive. A caller that orders "my write is done" before "the answer was read", as every Netty transport does,
 * must not wait for the completion. So every frame header carries how many frames its sender had received
 * ({@link FrameHeader#framesReceived()}); when a frame arrives that says the peer had received an operation's frame
 * (and, for a rendezvous, the peer's READ is acknowledged), the operation is reported delivered during the same
 * {@link #poll}, before the frame is offered by {@link #pollInbound()}. The credit returns cannot tell this: a peer
 * returns a credit when its application releases the bytes, which may be after it answered them (an echo writes
 * the very buffer it received). Memory is still reused only on completion, so a device never reads memory that was
 * handed back.
 *
 * <h2>Threading</h2>
 * Owned by one thread (the event loop of its channel, which owns the queue pair): every method must be called from
 * it. The hot paths (posting, polling, receiving, reposting) allocate nothing per message and take no locks; only
 * failures allocate (their exception). A rendezvous also registers and deregisters its bytes, which is the
 * provider's work: on the soft provider it reuses the previous region object of its operation slot and allocates
 * nothing (the emulated device serialises its key table with a short lock); DiSNI allocates per registration.
 */
public final class RdmaConnection {
    /** {@link #pollInbound()}: nothing to deliver now. */
    public static final int NONE = 0;
    /** Eager bytes: {@link #inboundSlot()}, {@link #inboundAddress()}, {@link #inboundLength()}; give the slot back
     * with {@link #releaseReceive(int)}. */
    public static final int DATA = 1;
    /** A rendezvous of {@link #inboundLength()} bytes waits to be read: call {@link #readRendezvous(long, int)}. */
    public static final int RENDEZVOUS = 2;
    /** The rendezvous READ has landed in the buffer given to {@link #readRendezvous(long, int)}. */
    public static final int RENDEZVOUS_DATA = 3;
    /** The peer shut its output down: no more bytes will come. */
    public static final int END_OF_STREAM = 4;

    /** {@link #poll(WorkCompletions)} result bits. */
    public static final int EVENT_INBOUND = 1;
    public static final int EVENT_SENT = 2;
    public static final int EVENT_CREDITS = 4;
    public static final int EVENT_FAILED = 8;
    /** The peer's HELLO arrived and its header's counters held: the connection is {@link #isReady() ready}. */
    public static final int EVENT_READY = 16;

    /** Receives the progress of operations in posting order. */
    public interface Listener {
        /**
         * Operation {@code op} (as returned when it was posted) has reached the peer: its bytes count as written.
         * Called before anything the peer sent after receiving them is offered by {@link #pollInbound()}.
         *
         * @param completed whether its memory may already be reused ({@link #sendCompleted} follows at once)
         */
        void delivered(long op, boolean completed);

        /** Operation {@code op}, already {@link #delivered}, is complete: its memory may be reused. */
        void sendCompleted(long op);
    }

    private static final byte WR_DATA = 1;
    private static final byte WR_CONTROL = 2;
    private static final byte WR_READ = 3;

    private static final byte OP_SENT = 1;
    private static final byte OP_NEEDS_ACK = 2;
    private static final byte OP_ACKED = 4;

    private static final int READ_IDLE = 0;
    private static final int READ_POSTED = 1;
    private static final int READ_DONE = 2;

    static final int HEADER_SLOT_SIZE = 256;
    /**
     * Most gather entries a frame uses, the device's limit permitting: a flush of small registered buffers sends one
     * frame per {@code MAX_SGE - 1} of them (the header takes one), without copying them. Soft-RoCE allows 32,
     * ConnectX 30, DiSNI's queue pairs 4.
     */
    public static final int MAX_SGE = 32;

    private final QueuePair qp;
    private final CompletionQueue cq;
    private final ReceiveBuffers recv;
    private final Handshake local;
    // Null until the peer's HELLO has arrived.
    private Handshake peer;
    // The peer's HELLO arrived and its header's counters held: the handshake is done.
    private boolean ready;
    private int maxFramePayload;
    private final Listener listener;
    private final RegisteredMemory memory;
    private final int signalInterval;
    private final int maxInline;
    private final int maxSge;
    private final FrameHeader rxHeader = new FrameHeader();
    private final FrameHeader txHeader = new FrameHeader();

    // Send queue: a ring of work requests by sequence number, each with a header slot of its own.
    private final int sqDepth;
    private final int sqMask;
    private final byte[] wrKind;
    private final long[] wrOp;
    private long wrNext;
    private long wrTail;
    private final ByteBuffer headerRing;
    private final ByteBuffer scratchView;
    private final MemoryRegion headerMr;
    private final long headerBase;
    private final SendWorkRequest[] wrs;
    private boolean pendingValid;
    private int pendingIndex;
    private int unsignaled;

    // The DATA frame being built.
    private boolean building;
    private final long[] segAddress = new long[MAX_SGE];
    private final int[] segLength = new int[MAX_SGE];
    private final int[] segLkey = new int[MAX_SGE];
    private int segCount;
    private int buildPayload;
    private int buildScratch;

    // Operations (eager frames and rendezvous) in posting order: the frame that carries each, the next to report
    // delivered, the next to report completed.
    private final int opMask;
    private final byte[] opState;
    private final long[] opFrame;
    private long opNext;
    private long opDeliveredHead;
    private long opHead;

    // Frames (SENDs of every type) posted and received, and the frames of this side the peer says it received.
    private long framesSent;
    private long framesReceived;
    private long peerFramesReceived;
    private final long[] rendezvousOps;
    // Per operation slot: the region exposing a rendezvous in flight, kept once withdrawn for the next one to reuse.
    private final MemoryRegion[] exposure;
    private final boolean[] exposed;
    private int exposedCount;
    private long rendezvousHead;
    private long rendezvousTail;

    // Credits this side may spend, and credits it owes the peer.
    private int dataCredits;
    private int controlCredits;
    private int dataToReturn;
    private int controlToReturn;
    private int acksToReturn;
    private int peerDataInUse;
    private final int dataReturnThreshold;
    private final int controlReturnThreshold;

    // Inbound frames not yet delivered, in arrival order.
    private final int inMask;
    private final byte[] inType;
    private final int[] inSlot;
    private final long[] inAddress;
    private final int[] inLength;
    private final int[] inRkey;
    private long inHead;
    private long inTail;
    private int readState = READ_IDLE;
    private boolean endOfStreamReceived;

    private int currentSlot;
    private long currentAddress;
    private int currentLength;

    private boolean shutdownRequested;
    private boolean shutdownSent;
    private boolean closing;
    private boolean destroyed;
    private RdmaException failure;
    private boolean lost;
    private int events;

    private long creditStalls;
    private long receiverNotReady;

    /**
     * A connection whose handshake has not run yet: call {@link #start()}, then {@link #poll} until
     * {@link #isReady()}.
     *
     * @param qp     a connected queue pair whose receives {@code recv} has posted
     * @param cq     the completion queue of both its queues
     * @param local  what this side announces in its HELLO
     */
    public RdmaConnection(QueuePair qp, CompletionQueue cq, ReceiveBuffers recv, RegisteredMemory memory,
                          Handshake local, ConnectionConfig config, Listener listener)
            throws RdmaException {
        this.qp = qp;
        this.cq = cq;
        this.recv = recv;
        this.memory = memory;
        this.local = local;
        this.listener = listener;
        signalInterval = config.signalInterval();
        maxInline = qp.capabilities().maxInlineData();
        maxSge = Math.min(MAX_SGE, qp.capabilities().maxSendSge());
        sqDepth = Math.min(config.sendQueueDepth(), Integer.highestOneBit(qp.capabilities().maxSendWr()));
        sqMask = sqDepth - 1;
        wrKind = new byte[sqDepth];
        wrOp = new long[sqDepth];
        wrs = new SendWorkRequest[] {new SendWorkRequest(maxSge), new SendWorkRequest(maxSge)};
        headerRing = memory.protectionDomain().allocateMemory(sqDepth * HEADER_SLOT_SIZE).order(ByteOrder.LITTLE_ENDIAN);
        try {
            headerMr = memory.register(headerRing);
        } catch (RdmaException | RuntimeException e) {
            // The channel frees what it gave this connection, not what the connection allocated itself.
            memory.protectionDomain().freeMemory(headerRing);
            throw e;
        }
        headerBase = headerMr.address();
        scratchView = headerRing.duplicate();

        int opCapacity = sqDepth * 2;
        opMask = opCapacity - 1;
        opState = new byte[opCapacity];
        opFrame = new long[opCapacity];
        rendezvousOps = new long[opCapacity];
        exposure = new MemoryRegion[opCapacity];
        exposed = new boolean[opCapacity];

        dataReturnThreshold = Math.max(1, local.dataCredits() / 4);
        controlReturnThreshold = Math.max(1, local.controlCredits() / 2);

        int inCapacity = Integer.highestOneBit(Math.max(2, local.receiveQueueDepth()) * 2 - 1);
        inMask = inCapacity - 1;
        inType = new byte[inCapacity];
        inSlot = new int[inCapacity];
        inAddress = new long[inCapacity];
        inLength = new int[inCapacity];
        inRkey = new int[inCapacity];
    }

    /**
     * Posts every receive buffer of {@code recv} on {@code qp}; call once, before the connection is established.
     */
    public static void postReceives(QueuePair qp, ReceiveBuffers recv) throws RdmaException {
        recv.postAll(qp);
    }

    public QueuePair queuePair() {
        return qp;
    }

    /** Whether the peer's HELLO has arrived and its header's counters held: only then may data be sent. */
    public boolean isReady() {
        return ready;
    }

    /**
     * Posts this side's HELLO, the first frame on the queue pair; call once, when the connection manager reports the
     * connection established (the peer's receives are posted by then).
     */
    public void start() {
        if (wrNext != 0) {
            throw new IllegalStateException("start() called twice (expected: once, before anything is sent)");
        }
        long seq = wrNext;
        writeHeader(seq, FrameHeader.HELLO, Handshake.LENGTH);
        int offset = (int) (seq & sqMask) * HEADER_SLOT_SIZE + FrameHeader.HEADER_LENGTH;
        headerRing.put(offset, local.encode());
        int frameLength = FrameHeader.HEADER_LENGTH + Handshake.LENGTH;
        SendWorkRequest wr = nextWr();
        wr.reset().opcode(WrOpcode.SEND).flags(frameLength <= maxInline ? SendWorkRequest.INLINE : 0)
                .addSge(headerAddress(seq), frameLength, headerMr.lkey());
        submit(wr, WR_CONTROL, 0, true);
    }

    public Handshake localHandshake() {
        return local;
    }

    public ReceiveBuffers receiveBuffers() {
        return recv;
    }

    /** The first error, or {@code null}. Once set, nothing more is posted. */
    public RdmaException failure() {
        return failure;
    }

    /**
     * Whether the queue pair has gone to the error state: a failure, or work requests flushed because the
     * connection was disconnected (by either side). Nothing more can be sent or received.
     */
    public boolean isLost() {
        return lost || failure != null;
    }

    /** Times a data frame was wanted but no credit was left. */
    public long creditStalls() {
        return creditStalls;
    }

    /** Receiver-not-ready errors seen (a peer that ran out of posted receives despite credits). */
    public long receiverNotReady() {
        return receiverNotReady;
    }

    public int dataCredits() {
        return dataCredits;
    }

    // ------------------------------------------------------------------------------------------------ sending

    /** Largest rendezvous the peer accepts (its handshake): larger messages are sent as several. */
    public int maxRendezvousLength() {
        return peer.maxMessageSize();
    }

    /**
     * Largest payload of one eager frame: the smaller receive buffer of the two sides, less the header. Never the
     * peer's announcement alone: a peer that announces huge buffers must not make this side stage huge frames.
     */
    public int maxFramePayload() {
        return maxFramePayload;
    }

    /** Whether one more DATA or RENDEZVOUS frame may be posted now; counts a credit stall when credits are out. */
    public boolean canSendData() {
        if (failure != null || lost || shutdownRequested || closing || peer == null) {
            return false;
        }
        if (opNext - opHead > opMask || wrNext - wrTail >= sqDepth - 1) {
            return false;
        }
        if (dataCredits == 0) {
            creditStalls++;
            return false;
        }
        return true;
    }

    /** Starts a DATA frame; add payload with {@link #addSegment} and {@link #addScratch}, then {@link #sendData()}. */
    public void beginData() {
        building = true;
        segCount = 1;
        segAddress[0] = headerAddress(wrNext);
        segLength[0] = FrameHeader.HEADER_LENGTH;
        segLkey[0] = headerMr.lkey();
        buildPayload = 0;
        buildScratch = 0;
    }

    /** Bytes the frame being built can still take. */
    public int framePayloadRemaining() {
        return maxFramePayload - buildPayload;
    }

    public int framePayload() {
        return buildPayload;
    }

    /** Whether one more segment fits the frame being built (a segment contiguous with the last one always does). */
    public boolean hasSegmentRoom() {
        return segCount < maxSge;
    }

    /**
     * Whether bytes at {@code address} in the region of {@code lkey} can be appended to the frame being built: there
     * is a segment left, or they continue its last segment.
     */
    public boolean canAppend(long address, int lkey) {
        return segCount < maxSge || continuesLastSegment(address, lkey);
    }

    private boolean continuesLastSegment(long address, int lkey) {
        int last = segCount - 1;
        return segLkey[last] == lkey && segAddress[last] + segLength[last] == address;
    }

    /** Whether bytes copied to {@link #scratchAddress()} can be appended to the frame being built. */
    public boolean canAppendScratch() {
        return canAppend(scratchAddress(), headerMr.lkey());
    }

    /** Where to copy up to {@link #scratchRemaining()} bytes that are not in registered memory. */
    public long scratchAddress() {
        return headerAddress(wrNext) + FrameHeader.HEADER_LENGTH + buildScratch;
    }

    public int scratchRemaining() {
        return HEADER_SLOT_SIZE - FrameHeader.HEADER_LENGTH - buildScratch;
    }

    /**
     * The send-header memory as a buffer, for copying into the scratch area at {@link #scratchOffset()}. Position
     * and limit are the caller's to set.
     */
    public ByteBuffer scratchBuffer() {
        return scratchView;
    }

    public int scratchOffset() {
        return (int) (wrNext & sqMask) * HEADER_SLOT_SIZE + FrameHeader.HEADER_LENGTH + buildScratch;
    }

    /** Appends {@code length} bytes just copied to {@link #scratchAddress()}. */
    public void addScratch(int length) {
        long address = scratchAddress();
        buildScratch += length;
        addSegment(address, length, headerMr.lkey());
    }

    /** Appends registered memory to the frame being built. */
    public void addSegment(long address, int length, int lkey) {
        if (length > framePayloadRemaining()) {
            throw new IllegalArgumentException("length: " + length + " (expected: <= " + framePayloadRemaining()
                    + ", the room left in this frame)");
        }
        if (continuesLastSegment(address, lkey)) {
            segLength[segCount - 1] += length;
        } else {
            if (segCount == maxSge) {
                throw new IllegalStateException("segments: " + segCount + " (expected: < " + maxSge
                        + "; check hasSegmentRoom() first)");
            }
            segAddress[segCount] = address;
            segLength[segCount] = length;
            segLkey[segCount] = lkey;
            segCount++;
        }
        buildPayload += length;
    }

    /** Drops the frame being built, unposted: nothing of it was sent, and control frames may go again. */
    public void abandonData() {
        building = false;
    }

    /** Posts the frame being built. @return its operation number */
    public long sendData() {
        building = false;
        long seq = wrNext;
        int frameLength = FrameHeader.HEADER_LENGTH + buildPayload;
        writeHeader(seq, FrameHeader.DATA, buildPayload);
        SendWorkRequest wr = nextWr();
        wr.reset().opcode(WrOpcode.SEND).flags(frameLength <= maxInline ? SendWorkRequest.INLINE : 0);
        for (int i = 0; i < segCount; i++) {
            wr.addSge(segAddress[i], segLength[i], segLkey[i]);
        }
        long op = newOp((byte) 0);
        opFrame[(int) (op & opMask)] = framesSent;
        dataCredits--;
        submit(wr, WR_DATA, op, false);
        return op;
    }

    /**
     * Advertises {@code [address, address + length)} for the peer to READ: registers exactly those bytes for remote
     * read until the peer acknowledges (or the connection fails or is destroyed). The memory must stay allocated
     * until the operation completes or the connection is destroyed.
     *
     * @return its operation number
     * @throws RdmaException when the device refuses the registration; nothing was posted
     */
    public long sendRendezvous(long address, int length) throws RdmaException {
        int slot = (int) (opNext & opMask);
        if (exposed[slot]) {
            throw new IllegalStateException("operation " + opNext + " would reuse the slot of a rendezvous in flight"
                    + " (expected: check canSendData() first)");
        }
        MemoryRegion mr = memory.exposeForRead(exposure[slot], address, length);
        exposure[slot] = mr;
        exposed[slot] = true;
        exposedCount++;
        long seq = wrNext;
        writeHeader(seq, FrameHeader.RENDEZVOUS, FrameHeader.RENDEZVOUS_BODY_LENGTH);
        txHeader.rendezvous(address, length, mr.rkey());
        int frameLength = FrameHeader.HEADER_LENGTH + FrameHeader.RENDEZVOUS_BODY_LENGTH;
        SendWorkRequest wr = nextWr();
        wr.reset().opcode(WrOpcode.SEND).flags(frameLength <= maxInline ? SendWorkRequest.INLINE : 0)
                .addSge(headerAddress(seq), frameLength, headerMr.lkey());
        long op = newOp(OP_NEEDS_ACK);
        opFrame[(int) (op & opMask)] = framesSent;
        rendezvousOps[(int) (rendezvousTail++ & opMask)] = op;
        dataCredits--;
        submit(wr, WR_DATA, op, false);
        return op;
    }

    /** Posts whatever is still held back, signaled: the end of a batch. */
    public void flush() {
        if (pendingValid) {
            postPending(true);
        }
    }

    /**
     * Sends end of stream after everything posted so far; no data may follow. Idempotent.
     */
    public void shutdownOutput() {
        shutdownRequested = true;
        sendControlIfDue();
        flush();
    }

    public boolean isOutputShutdown() {
        return shutdownRequested;
    }

    /** Whether the SHUTDOWN frame has been posted (it is complete once {@link #isSendQueueIdle()}). */
    public boolean isEndOfStreamSent() {
        return shutdownSent;
    }

    private long newOp(byte state) {
        long op = opNext++;
        opState[(int) (op & opMask)] = state;
        return op;
    }

    private long headerAddress(long seq) {
        return headerBase + (seq & sqMask) * HEADER_SLOT_SIZE;
    }

    private void writeHeader(long seq, byte type, int bodyLength) {
        int control = Math.min(controlToReturn, FrameHeader.MAX_CONTROL_CREDITS);
        int data = Math.min(dataToReturn, FrameHeader.MAX_DATA_CREDITS);
        int acks = Math.min(acksToReturn, FrameHeader.MAX_RENDEZVOUS_ACKS);
        controlToReturn -= control;
        dataToReturn -= data;
        acksToReturn -= acks;
        txHeader.wrap(headerRing, (int) (seq & sqMask) * HEADER_SLOT_SIZE)
                .set(type, control, data, acks, framesReceived, bodyLength);
    }

    private SendWorkRequest nextWr() {
        return wrs[pendingValid ? 1 - pendingIndex : 0];
    }

    private void submit(SendWorkRequest wr, byte kind, long op, boolean signalNow) {
        long seq = wrNext++;
        int i = (int) (seq & sqMask);
        if (kind != WR_READ) {
            framesSent++;
        }
        wrKind[i] = kind;
        wrOp[i] = op;
        wr.wrId(seq);
        int index = wr == wrs[0] ? 0 : 1;
        if (pendingValid) {
            postPending(false);
        }
        pendingIndex = index;
        pendingValid = true;
        if (signalNow) {
            postPending(true);
        }
    }

    private void postPending(boolean signal) {
        pendingValid = false;
        SendWorkRequest wr = wrs[pendingIndex];
        if (signal || unsignaled + 1 >= signalInterval) {
            wr.flags(wr.flags() | SendWorkRequest.SIGNALED);
            unsignaled = 0;
        } else {
            unsignaled++;
        }
        if (failure != null || lost) {
            return;
        }
        try {
            qp.postSend(wr);
        } catch (RdmaException e) {
            fail(new RdmaException("posting " + WrOpcode.name(wr.opcode()) + " failed: " + e.getMessage(), e));
        }
    }

    private void sendControlIfDue() {
        if (building || failure != null || lost || closing || shutdownSent || peer == null
                || wrNext - wrTail >= sqDepth) {
            return;
        }
        boolean shutdownDue = shutdownRequested;
        boolean due = shutdownDue || acksToReturn > 0 || dataToReturn >= dataReturnThreshold
                || controlToReturn >= controlReturnThreshold;
        if (!due) {
            return;
        }
        // The last control credit only goes with control returns, so two starved sides can always unblock.
        if (controlCredits < 2 && (controlCredits == 0 || controlToReturn == 0)) {
            return;
        }
        long seq = wrNext;
        byte type = shutdownDue ? FrameHeader.SHUTDOWN : FrameHeader.CREDIT;
        writeHeader(seq, type, 0);
        SendWorkRequest wr = nextWr();
        wr.reset().opcode(WrOpcode.SEND)
                .flags(FrameHeader.HEADER_LENGTH <= maxInline ? SendWorkRequest.INLINE : 0)
                .addSge(headerAddress(seq), FrameHeader.HEADER_LENGTH, headerMr.lkey());
        controlCredits--;
        if (shutdownDue) {
            shutdownSent = true;
        }
        submit(wr, WR_CONTROL, 0, false);
    }

    // ------------------------------------------------------------------------------------------------ receiving

    /**
     * The next inbound item, in arrival order: {@link #NONE}, {@link #DATA}, {@link #RENDEZVOUS},
     * {@link #RENDEZVOUS_DATA} or {@link #END_OF_STREAM}.
     */
    public int pollInbound() {
        if (inHead == inTail || unreadableRendezvousNext()) {
            return NONE;
        }
        int i = (int) (inHead & inMask);
        switch (inType[i]) {
            case FrameHeader.DATA:
                inHead++;
                currentSlot = inSlot[i];
                currentAddress = recv.address(currentSlot) + FrameHeader.HEADER_LENGTH;
                currentLength = inLength[i];
                recv.handedUp(currentSlot);
                return DATA;
            case FrameHeader.RENDEZVOUS:
                currentLength = inLength[i];
                if (readState == READ_IDLE) {
                    return RENDEZVOUS;
                }
                if (readState == READ_POSTED) {
                    return NONE;
                }
                inHead++;
                readState = READ_IDLE;
                rendezvousConsumed();
                return RENDEZVOUS_DATA;
            default:
                inHead++;
                return END_OF_STREAM;
        }
    }

    /** Whether inbound items wait (a posted rendezvous READ counts once it has landed). */
    public boolean hasInbound() {
        if (inHead == inTail || unreadableRendezvousNext()) {
            return false;
        }
        return inType[(int) (inHead & inMask)] != FrameHeader.RENDEZVOUS || readState != READ_POSTED;
    }

    /**
     * Whether the next item is a rendezvous that can no longer be read: the queue pair is gone, so its bytes, and
     * every byte after them, will never arrive. Nothing from there on is delivered (a stream with a hole would be
     * corrupt); the peer's disconnect without end of stream reads as a reset.
     */
    private boolean unreadableRendezvousNext() {
        return (lost || failure != null) && inType[(int) (inHead & inMask)] == FrameHeader.RENDEZVOUS
                && readState != READ_DONE;
    }

    /** Whether the next inbound item is {@link #END_OF_STREAM} (every byte before it has been delivered). */
    public boolean endOfStreamNext() {
        return inHead != inTail && inType[(int) (inHead & inMask)] == FrameHeader.SHUTDOWN;
    }

    /** Whether the peer's SHUTDOWN has arrived: it closed its output gracefully. */
    public boolean isEndOfStreamReceived() {
        return endOfStreamReceived;
    }

    public int inboundSlot() {
        return currentSlot;
    }

    public long inboundAddress() {
        return currentAddress;
    }

    public int inboundLength() {
        return currentLength;
    }

    /**
     * Whether the pending rendezvous's READ can be posted now: not when the send queue is full (try again once
     * {@link #EVENT_SENT} made room) nor when the connection failed.
     */
    public boolean canReadRendezvous() {
        return failure == null && !lost && wrNext - wrTail < sqDepth;
    }

    /**
     * Reads the pending rendezvous into {@code [address, address + inboundLength())}, registered with local write.
     *
     * @throws IllegalStateException unless {@link #canReadRendezvous()}
     */
    public void readRendezvous(long address, int lkey) {
        if (!canReadRendezvous()) {
            throw new IllegalStateException("no room for the rendezvous READ (check canReadRendezvous() first)");
        }
        int i = (int) (inHead & inMask);
        SendWorkRequest wr = nextWr();
        wr.reset().opcode(WrOpcode.RDMA_READ).remote(inAddress[i], inRkey[i]).addSge(address, inLength[i], lkey);
        readState = READ_POSTED;
        submit(wr, WR_READ, 0, true);
    }

    /** Whether a rendezvous READ is posted and has not completed yet. */
    public boolean isRendezvousReadPosted() {
        return readState == READ_POSTED;
    }

    /**
     * Drops the pending rendezvous without reading it (input shut down) and acknowledges it, so the peer releases
     * its buffer.
     */
    public void discardRendezvous() {
        if (readState == READ_POSTED) {
            return;
        }
        inHead++;
        readState = READ_IDLE;
        rendezvousConsumed();
    }

    private void rendezvousConsumed() {
        acksToReturn++;
        peerDataInUse--;
        dataToReturn++;
        sendControlIfDue();
        flush();
    }

    /** The application is done with a {@link #DATA} slot: repost it and owe the peer a credit. */
    public void releaseReceive(int slot) {
        if (recv.givenBack(slot)) {
            recv.releaseIfUnused();
            return;
        }
        if (destroyed || failure != null || lost || closing) {
            return;
        }
        try {
            recv.post(qp, slot);
        } catch (RdmaException e) {
            fail(new RdmaException("reposting a receive failed: " + e.getMessage(), e));
            return;
        }
        peerDataInUse--;
        dataToReturn++;
        sendControlIfDue();
        flush();
    }

    // ------------------------------------------------------------------------------------------------ polling

    /**
     * Polls the completion queue until it is empty (or {@code rounds} full batches were taken), handles every
     * completion, returns due credits, and reports finished operations to the listener.
     *
     * @return {@code EVENT_*} bits of what happened
     */
    public int poll(WorkCompletions wc, int rounds) {
        if (destroyed) {
            events = 0;
            return 0;
        }
        // A failure may have come between two polls (a receive reposted when the application released its buffer):
        // every poll reports it until the connection is destroyed.
        events = failure != null ? EVENT_FAILED : 0;
        int n;
        do {
            n = cq.poll(wc);
            for (int i = 0; i < n; i++) {
                long wrId = wc.wrId(i);
                if ((wrId & ReceiveBuffers.RECV_TAG) != 0) {
                    received((int) (wrId & ~ReceiveBuffers.RECV_TAG), wc.status(i), wc.opcode(i),
                            wc.byteLength(i), wc.vendorError(i));
                } else {
                    sendCompleted(wrId, wc.status(i), wc.opcode(i), wc.vendorError(i));
                }
            }
        } while (n == wc.capacity() && --rounds > 0);
        if (lost && exposedCount > 0) {
            withdrawAll();
        }
        reportOps();
        sendControlIfDue();
        flush();
        return events;
    }

    private void received(int slot, int status, int opcode, int byteLength, int vendorError) {
        recv.completed(slot);
        if (status != WcStatus.SUCCESS) {
            lost = true;
            events |= EVENT_FAILED;
            // A flush follows a disconnect or an earlier error; only the cause itself is a failure.
            if (status != WcStatus.WR_FLUSH_ERR) {
                fail(new RdmaException("receive failed: " + WcStatus.name(status)
                        + (vendorError != 0 ? " (vendor error " + vendorError + ")" : "")));
            }
            return;
        }
        if (failure != null || slot >= recv.count()) {
            return;
        }
        // Any peer can post an RDMA WRITE with immediate (of 0 bytes it needs no rkey): it takes a receive whose
        // slot holds no frame of it. A device never reports more bytes than the slot holds; a provider that did
        // would have the frame read past it.
        if (opcode != WcOpcode.RECV) {
            protocolError("the peer consumed a receive with " + WcOpcode.name(opcode)
                    + " (expected: RECV; rdma-bridge peers send frames with SEND only)");
            return;
        }
        if (byteLength > recv.slotSize()) {
            fail(new RdmaException("the device reported a receive of " + byteLength + " bytes into a slot of "
                    + recv.slotSize() + " (expected: at most the slot's size; a provider or driver fault)"));
            return;
        }
        FrameHeader h = rxHeader.wrap(recv.littleEndianView(), recv.offset(slot));
        String malformed = h.validate(byteLength);
        if (malformed != null) {
            protocolError("malformed frame: " + malformed);
            return;
        }
        framesReceived++;
        byte type = h.type();
        boolean hello = peer == null;
        if (hello) {
            if (type != FrameHeader.HELLO) {
                protocolError("the first frame from the peer is " + FrameHeader.typeName(type)
                        + " (expected: HELLO; is the peer an rdma-bridge endpoint of the same version?)");
                return;
            }
            byte[] wire = new byte[Handshake.LENGTH];
            recv.littleEndianView().get(recv.offset(slot) + FrameHeader.HEADER_LENGTH, wire);
            try {
                peer = Handshake.decode(wire);
            } catch (Handshake.HandshakeException e) {
                fail(new RdmaException("handshake failed: " + e.getMessage() + "; closing the connection"));
                return;
            }
            // The HELLO this side sent took one of the peer's control receives; it comes back as a credit return.
            dataCredits = peer.dataCredits();
            controlCredits = peer.controlCredits() - 1;
            maxFramePayload = Math.min(peer.maxEagerPayload(), local.maxEagerPayload());
        } else if (type == FrameHeader.HELLO) {
            protocolError("a second HELLO frame (expected: one, the first frame)");
            return;
        }
        int data = h.dataCredits();
        int control = h.controlCredits();
        int acks = h.rendezvousAcks();
        if (data > peer.dataCredits() - dataCredits) {
            protocolError("peer returned " + data + " data credits but holds only " + (peer.dataCredits() - dataCredits));
            return;
        }
        if (control > peer.controlCredits() - controlCredits) {
            protocolError("peer returned " + control + " control credits but holds only "
                    + (peer.controlCredits() - controlCredits));
            return;
        }
        if (acks > rendezvousTail - rendezvousHead) {
            protocolError("peer acknowledged " + acks + " rendezvous but only " + (rendezvousTail - rendezvousHead)
                    + " are outstanding");
            return;
        }
        // Counts only grow and frames arrive in order, so the count is the last one plus less than the frames unseen.
        long newlyReceived = (h.framesReceived() - peerFramesReceived) & (FrameHeader.FRAMES_RECEIVED_MODULUS - 1);
        if (newlyReceived > framesSent - peerFramesReceived) {
            protocolError("peer counts " + newlyReceived + " more frames received but only "
                    + (framesSent - peerFramesReceived) + " were sent since its last count");
            return;
        }
        peerFramesReceived += newlyReceived;
        if (hello) {
            // Only once the HELLO's header holds too: a bad count fails the handshake, not an active channel.
            ready = true;
            events |= EVENT_READY;
        }
        if (data > 0 || control > 0) {
            events |= EVENT_CREDITS;
        }
        dataCredits += data;
        controlCredits += control;
        for (int k = 0; k < acks; k++) {
            long op = rendezvousOps[(int) (rendezvousHead++ & opMask)];
            opState[(int) (op & opMask)] |= OP_ACKED;
            // The peer has read it: from now on no queue pair may.
            withdraw((int) (op & opMask));
        }
        boolean dataFrame = type == FrameHeader.DATA || type == FrameHeader.RENDEZVOUS;
        if (dataFrame) {
            if (endOfStreamReceived) {
                protocolError(FrameHeader.typeName(type) + " frame after SHUTDOWN");
                return;
            }
            if (++peerDataInUse > local.dataCredits()) {
                protocolError("peer sent more data frames than it had credits: " + peerDataInUse
                        + " (expected: <= " + local.dataCredits() + ")");
                return;
            }
        }
        // A control frame holds its receive only while it is handled here (it is reposted below), so a peer that
        // sends more than its control credits can take nothing from this side: at most its own later frames find
        // no receive posted (RNR, the peer's stall). Only data frames, which the application holds, are counted.
        int body = (int) h.bodyLength();
        switch (type) {
            case FrameHeader.DATA:
                push(FrameHeader.DATA, slot, 0, body, 0);
                return;
            case FrameHeader.RENDEZVOUS:
                long length = h.rendezvousLength();
                if (length > local.maxMessageSize()) {
                    protocolError("rendezvous of " + length + " bytes (expected: <= " + local.maxMessageSize()
                            + ", the largest message this side accepts)");
                    return;
                }
                push(FrameHeader.RENDEZVOUS, slot, h.rendezvousAddress(), (int) length, h.rendezvousRkey());
                // The advertisement is copied out, so the buffer goes back at once; the credit only returns once
                // the rendezvous is read or dropped, so unread advertisements stay bounded by the data credits.
                repost(slot);
                return;
            case FrameHeader.SHUTDOWN:
                if (endOfStreamReceived) {
                    // Each would be one more end of stream for the application, and one more inbound entry.
                    protocolError("SHUTDOWN frame after SHUTDOWN");
                    return;
                }
                endOfStreamReceived = true;
                push(FrameHeader.SHUTDOWN, slot, 0, 0, 0);
                repost(slot);
                controlToReturn++;
                return;
            default:
                repost(slot);
                controlToReturn++;
        }
    }

    private void push(byte type, int slot, long address, int length, int rkey) {
        if (inTail - inHead > inMask) {
            // Unreachable while credits are honoured (checked above); never overwrite an undelivered frame.
            protocolError("more than " + (inMask + 1) + " frames undelivered");
            return;
        }
        int i = (int) (inTail++ & inMask);
        inType[i] = type;
        inSlot[i] = slot;
        inAddress[i] = address;
        inLength[i] = length;
        inRkey[i] = rkey;
        events |= EVENT_INBOUND;
    }

    private void repost(int slot) {
        if (lost || destroyed) {
            return;
        }
        try {
            recv.post(qp, slot);
        } catch (RdmaException e) {
            fail(new RdmaException("reposting a receive failed: " + e.getMessage(), e));
        }
    }

    private void sendCompleted(long seq, int status, int opcode, int vendorError) {
        if (seq < wrTail || seq >= wrNext) {
            return;
        }
        boolean ok = status == WcStatus.SUCCESS;
        for (long q = wrTail; q <= seq; q++) {
            int i = (int) (q & sqMask);
            // On RC a completion implies every earlier request completed, and successfully (errors complete
            // individually and in order).
            boolean success = ok || q < seq;
            switch (wrKind[i]) {
                case WR_DATA:
                    if (success) {
                        opState[(int) (wrOp[i] & opMask)] |= OP_SENT;
                    }
                    break;
                case WR_READ:
                    if (success) {
                        readState = READ_DONE;
                        events |= EVENT_INBOUND;
                    }
                    break;
                default:
                    break;
            }
        }
        wrTail = seq + 1;
        if (!ok) {
            lost = true;
            events |= EVENT_FAILED;
            if (status == WcStatus.RNR_RETRY_EXC_ERR) {
                receiverNotReady++;
            }
            if (status != WcStatus.WR_FLUSH_ERR) {
                fail(new RdmaException(WcOpcode.name(WrOpcode.completionOpcode(opcodeOf(seq))) + " failed: "
                        + WcStatus.name(status) + (vendorError != 0 ? " (vendor error " + vendorError + ")" : "")
                        + WcStatus.meaning(status)));
            }
        }
    }

    private int opcodeOf(long seq) {
        return wrKind[(int) (seq & sqMask)] == WR_READ ? WrOpcode.RDMA_READ : WrOpcode.SEND;
    }

    private void reportOps() {
        while (opDeliveredHead < opNext) {
            int i = (int) (opDeliveredHead & opMask);
            byte state = opState[i];
            boolean sent = (state & OP_SENT) != 0;
            boolean arrived = sent || opFrame[i] < peerFramesReceived;
            if (!arrived || (state & OP_NEEDS_ACK) != 0 && (state & OP_ACKED) == 0) {
                break;
            }
            events |= EVENT_SENT;
            listener.delivered(opDeliveredHead++, sent);
        }
        // A delivered rendezvous is acknowledged already, so only the completion is left to wait for.
        while (opHead < opDeliveredHead) {
            if ((opState[(int) (opHead & opMask)] & OP_SENT) == 0) {
                return;
            }
            events |= EVENT_SENT;
            listener.sendCompleted(opHead++);
        }
    }

    private void protocolError(String message) {
        fail(new RdmaException("protocol error: " + message + "; closing the connection"));
    }

    private void fail(RdmaException cause) {
        if (failure == null) {
            failure = cause;
        }
        events |= EVENT_FAILED;
        withdrawAll();
    }

    private void withdraw(int slot) {
        if (exposed[slot]) {
            exposed[slot] = false;
            exposedCount--;
            memory.withdraw(exposure[slot]);
        }
    }

    /**
     * Withdraws every advertised rendezvous region, so that no peer can READ it any longer: for a connection whose
     * queue pair moves no more bytes (lost, or disconnected by the peer), before the memory the regions cover is
     * freed.
     */
    public void withdrawExposures() {
        withdrawAll();
    }

    /** No rendezvous of a connection that failed, was lost or is destroyed will be read: expose none any longer. */
    private void withdrawAll() {
        for (int i = 0; exposedCount > 0 && i < exposed.length; i++) {
            withdraw(i);
        }
    }


    // ------------------------------------------------------------------------------------------------ teardown

    /** Operations posted and not yet reported complete. */
    public long operationsInFlight() {
        return opNext - opHead;
    }

    /** Whether every posted send work request has completed. */
    public boolean isSendQueueIdle() {
        return !pendingValid && wrTail == wrNext;
    }

    /** From now on flushed completions are expected (a disconnect is under way) and nothing more is posted. */
    public void closing() {
        flush();
        closing = true;
    }

    /** Whether the queue pair may be destroyed without losing a completion: no receive or send left posted. */
    public boolean isDrained() {
        return recv.posted() == 0 && isSendQueueIdle();
    }

    /**
     * Destroys the queue pair and gives back the send headers; the receive slab follows once the application has
     * released every slot it holds. The completion queue stays the caller's. Idempotent.
     */
    public void destroy() {
        if (destroyed) {
            return;
        }
        destroyed = true;
        closing = true;
        withdrawAll();
        qp.close();
        memory.deregister(headerMr);
        memory.protectionDomain().freeMemory(headerRing);
        recv.close();
    }

    public boolean isDestroyed() {
        return destroyed;
    }
}
