package io.rdmabridge.netty;

/**
 * Whether a channel's pipeline asked for a read ({@code doBeginRead}) that has not been delivered yet: an accepted
 * channel for a listener, a message for a connected channel.
 *
 * <p>Threading: the event loop sets it and clears it when it delivers a read; {@link #cancel} clears it from any
 * thread. {@code autoRead} turned off must hold from the moment {@code setAutoRead(false)} returns, and a Netty 4.2
 * loop handles I/O before its tasks, so a clearing task alone would let the loop accept or read once more. The flag is
 * cleared at once by the caller and again on the loop, after a read the loop had begun before it saw the change.
 */
final class ReadPending {
    private final AbstractRdmaChannel channel;
    private volatile boolean pending;
    private final Runnable clearTask = () -> pending = false;

    ReadPending(AbstractRdmaChannel channel) {
        this.channel = channel;
    }

    boolean isPending() {
        return pending;
    }

    /** {@code doBeginRead}. Loop thread. */
    void set() {
        pending = true;
    }

    /** A read was delivered to the pipeline. Loop thread. */
    void delivered() {
        pending = false;
    }

    /** {@code autoRead} was turned off. Any thread. */
    void cancel() {
        pending = false;
        channel.runOnLoop(clearTask);
    }
}
