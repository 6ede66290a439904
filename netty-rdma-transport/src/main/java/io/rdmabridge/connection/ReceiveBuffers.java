package io.rdmabridge.connection;

import io.rdmabridge.verbs.MemoryRegion;
import io.rdmabridge.verbs.QueuePair;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RecvWorkRequest;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * The receive buffers of one connection: one registered slab cut into equal slots, each posted as a receive. A slot
 * that carried stream data is handed up to the application (without a copy) and reposted when the application is
 * done with it; this is what returns a credit to the peer.
 *
 * <p>Owned by the connection's event-loop thread, which owns the queue pair: posting and reposting reuse one work
 * request, allocate nothing and take no locks. The slab stays registered until the connection is closed and the
 * application has given back every slot it still holds.
 */
public final class ReceiveBuffers {
    /** {@code wr_id} tag of receives: this bit set, the slot index in the low bits. */
    static final long RECV_TAG = 1L << 62;

    // Life of a slot: FREE -> POSTED -> LANDED (completed) -> HELD (handed up) -> FREE (given back) -> POSTED ...
    private static final byte FREE = 0;
    private static final byte POSTED = 1;
    private static final byte LANDED = 2;
    private static final byte HELD = 3;
    private static final String[] STATE_NAMES = {"free", "posted", "landed", "held by the application"};

    private final RegisteredMemory memory;
    private final ByteBuffer slab;
    private final ByteBuffer view;
    private final MemoryRegion mr;
    private final int slotSize;
    private final int count;
    private final long baseAddress;
    private final RecvWorkRequest wr = new RecvWorkRequest(1);
    // Checked on every transition: a slot posted while the application still reads it would be overwritten.
    private final byte[] state;
    private int posted;
    private int held;
    private boolean closed;
    private boolean released;

    /**
     * @param slotSize bytes per receive, header included
     * @param count    receives to post: data credits plus control credits
     */
    public ReceiveBuffers(RegisteredMemory memory, int slotSize, int count) throws RdmaException {
        if (slotSize < Handshake.MIN_RECEIVE_BUFFER_SIZE) {
            throw new IllegalArgumentException("slotSize: " + slotSize + " (expected: >= "
                    + Handshake.MIN_RECEIVE_BUFFER_SIZE + ")");
        }
        if (count < 1) {
            throw new IllegalArgumentException("count: " + count + " (expected: > 0)");
        }
        long bytes = (long) slotSize * count;
        if (bytes > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("receive buffers: " + count + " x " + slotSize + " bytes (expected: < 2 GiB;"
                    + " lower the receive queue depth or the receive buffer size)");
        }
        this.memory = memory;
        this.slotSize = slotSize;
        this.count = count;
        state = new byte[count];
        slab = memory.protectionDomain().allocateMemory((int) bytes);
        try {
            mr = memory.register(slab);
        } catch (RdmaException | RuntimeException e) {
            memory.protectionDomain().freeMemory(slab);
            throw e;
        }
        view = slab.duplicate().order(ByteOrder.LITTLE_ENDIAN);
        baseAddress = mr.address();
    }

    public int slotSize() {
        return slotSize;
    }

    public int count() {
        return count;
    }

    /** Native address of a slot's first byte (its frame header). */
    public long address(int slot) {
        return baseAddress + (long) slot * slotSize;
    }

    /** Offset of a slot in {@link #littleEndianView()}. */
    public int offset(int slot) {
        return slot * slotSize;
    }

    /** The whole slab, little-endian, for reading frame headers. Do not change its position or limit. */
    public ByteBuffer littleEndianView() {
        return view;
    }

    /** A new big-endian buffer over a slot's payload area {@code [header end, slot end)}; create once per slot. */
    public ByteBuffer payloadView(int slot) {
        int start = offset(slot) + FrameHeader.HEADER_LENGTH;
        return slab.duplicate().position(start).limit(offset(slot) + slotSize).slice();
    }

    /** Receives currently posted. */
    public int posted() {
        return posted;
    }

    /** Slots handed up and not yet given back. */
    public int held() {
        return held;
    }

    void postAll(QueuePair qp) throws RdmaException {
        for (int slot = 0; slot < count; slot++) {
            post(qp, slot);
        }
    }

    void post(QueuePair qp, int slot) throws RdmaException {
        if (state[slot] == POSTED || state[slot] == HELD) {
            throw new RdmaException("receive slot " + slot + " reposted while " + STATE_NAMES[state[slot]]
                    + " (expected: free or landed); its bytes would be overwritten, so the connection closes");
        }
        state[slot] = POSTED;
        wr.reset().wrId(RECV_TAG | slot).addSge(address(slot), slotSize, mr.lkey());
        qp.postRecv(wr);
        posted++;
    }

    /** A posted receive completed (with data or flushed). */
    void completed(int slot) {
        posted--;
        if (slot >= 0 && slot < count) {
            state[slot] = LANDED;
        }
    }

    void handedUp(int slot) {
        checkState(slot, LANDED, "handed up");
        state[slot] = HELD;
        held++;
    }

    /** @return whether the slab should now be released (connection closed and nothing held) */
    boolean givenBack(int slot) {
        checkState(slot, HELD, "given back");
        state[slot] = FREE;
        held--;
        return closed && held == 0;
    }

    private void checkState(int slot, byte expected, String transition) {
        if (state[slot] != expected) {
            throw new IllegalStateException("receive slot " + slot + " " + transition + " while "
                    + STATE_NAMES[state[slot]] + " (expected: " + STATE_NAMES[expected] + "; a received buffer was"
                    + " released twice or reused while still referenced)");
        }
    }

    /**
     * The connection is gone: the slab is deregistered now if the application holds no slot, otherwise when it
     * gives back the last one ({@link #releaseIfUnused()}).
     */
    public void close() {
        closed = true;
        releaseIfUnused();
    }

    public boolean isClosed() {
        return closed;
    }

    public void releaseIfUnused() {
        if (closed && held == 0 && !released) {
            released = true;
            memory.deregister(mr);
            memory.protectionDomain().freeMemory(slab);
        }
    }
}
