package io.rdmabridge.netty;

import io.netty.channel.IoHandle;

/**
 * What an {@link RdmaIoHandler} drives: a channel's completion queue and connection-manager events. Connection
 * manager events arrive through {@link IoHandle#handle} as {@link RdmaCmIoEvent}s. Called on the handler's thread.
 */
interface RdmaIoHandle extends IoHandle {

    /** Polls completions and does what they allow. @return how much work was done (0: nothing) */
    int poll(RdmaIoHandler handler);

    /** Arms the completion queue before the loop sleeps. */
    void arm();

    /** The loop is going away: release verbs resources now, without waiting for the peer. */
    void destroyNow();

    /** Nanoseconds this handle wants the loop to busy-poll before sleeping. */
    long busyPollBudgetNanos();

    /**
     * Until when the loop should poll for this handle rather than sleep: the end of its
     * {@link RdmaChannelOption#SEND_COMPLETION_POLL_NANOS} window while a send it posted awaits its completion, else
     * {@code now}.
     */
    long sendCompletionPollDeadline(long now);

    /**
     * Polling this handle, or handling one of its events, threw (an {@link Error} included, such as running out of
     * direct memory): fail this channel alone, abortively, so the loop and its other channels carry on. Reported to
     * the channel's pipeline once; must not throw.
     */
    void failed(Throwable cause);
}
