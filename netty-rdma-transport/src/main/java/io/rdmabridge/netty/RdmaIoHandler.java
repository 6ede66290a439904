package io.rdmabridge.netty;

import io.netty.channel.IoHandle;
import io.netty.channel.IoHandler;
import io.netty.channel.IoHandlerContext;
import io.netty.channel.IoHandlerFactory;
import io.netty.channel.IoOps;
import io.netty.channel.IoRegistration;
import io.netty.util.concurrent.SingleThreadEventExecutor;
import io.netty.util.concurrent.ThreadAwareExecutor;
import io.netty.util.internal.logging.InternalLogger;
import io.netty.util.internal.logging.InternalLoggerFactory;
import io.rdmabridge.connection.RegisteredMemory;
import io.rdmabridge.verbs.CmEvent;
import io.rdmabridge.verbs.CmEventType;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.RateLimitedWarning;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.WorkCompletions;

import java.io.IOException;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.Objects;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.LoggerFactory;

/**
 * The {@link IoHandler} of RDMA event loops:
 * <pre>
 * EventLoopGroup group = new MultiThreadIoEventLoopGroup(RdmaIoHandler.newFactory());
 * </pre>
 * Each loop polls the completion queues of its channels and one connection-manager event channel. When idle it
 * busy-polls for the largest {@link RdmaChannelOption#BUSY_POLL_BUDGET_NANOS} of its channels (longer, up to
 * {@link RdmaChannelOption#SEND_COMPLETION_POLL_NANOS} after a channel's last write, while that channel's send awaits
 * its completion: the peer's answer often comes with that acknowledgement, sooner than a sleep and a wake-up), then
 * arms every completion queue, polls once more (a completion may have landed before the arm), and waits on the
 * provider's {@link EventNotifier} until the next scheduled task is due; {@link #wakeup()} signals that notifier.
 * Before it sleeps, it returns registered memory that has been idle for a while ({@link RegisteredMemory#trimIdle}).
 *
 * <p>Threading: everything but {@link #wakeup()} runs on the loop's thread, which owns the queue pairs, completion
 * queues and event channel of its channels. Polling completions (the hot path) allocates nothing and takes no
 * locks; a connection-manager event (connection setup and teardown) is copied once for the channel it concerns.
 */
public final class RdmaIoHandler implements IoHandler {
    /**
     * System property: bytes of rendezvous READ targets one event loop commits at once, for all its channels
     * (default 64 MiB). Memory is granted, never taken: a peer's advertisement waits, unread, until the budget
     * allows (one message larger than the budget is read alone); its credits are not returned meanwhile, so the
     * peer is slowed, not served faster. Each channel reads one rendezvous at a time, of at most its
     * {@link RdmaChannelOption#MAX_MESSAGE_SIZE}. A message that lands while its application does not read
     * ({@code autoRead} off) moves to the loop's {@linkplain #RENDEZVOUS_PARKED_PROPERTY parked} allowance while that
     * has room, so that paused channels do not stall the others; past it, it keeps its share until read.
     */
    public static final String RENDEZVOUS_BUDGET_PROPERTY = "rdmabridge.rendezvousBudgetBytes";
    static final long DEFAULT_RENDEZVOUS_BUDGET = 64L * 1024 * 1024;
    /**
     * System property: bytes of landed rendezvous messages one event loop keeps for applications that do not read
     * ({@code autoRead} off), outside {@link #RENDEZVOUS_BUDGET_PROPERTY} (default 128 MiB). Each such channel holds
     * one message and reads no other meanwhile. A peer can make some applications pause (Kafka stops reading a
     * connection whose response the peer does not take): without the allowance, paused channels could hold the whole
     * budget and stall every other rendezvous of the loop; with it, a loop commits at most budget plus allowance.
     * Past the allowance a landed message keeps its share of the budget, and while other channels wait for budget its
     * channel fails once the message has gone unread for {@link #RENDEZVOUS_READ_TIMEOUT_PROPERTY}.
     */
    public static final String RENDEZVOUS_PARKED_PROPERTY = "rdmabridge.rendezvousParkedBytes";
    static final long DEFAULT_RENDEZVOUS_PARKED = 128L * 1024 * 1024;
    /**
     * System property: bytes of receive buffers one event loop commits to accepted channels whose handshake has not
     * completed (default 64 MiB; a child with the default options takes about 1.5 MiB). An accepted channel posts its
     * receive buffers before it accepts, and a peer that connects and never sends its handshake holds them until
     * {@code CONNECT_TIMEOUT_MILLIS} at no cost to itself: without a bound, enough such peers (each within
     * {@code SO_BACKLOG}) exhausted direct memory and stalled every loop in the JDK's wait for it. Past the budget an
     * accepted connection is rejected and closed, naming it; one is always allowed.
     */
    public static final String HANDSHAKE_MEMORY_PROPERTY = "rdmabridge.handshakeMemoryBytes";
    /** {@value #HANDSHAKE_MEMORY_PROPERTY}'s default. */
    public static final long DEFAULT_HANDSHAKE_MEMORY = 64L * 1024 * 1024;
    /** Connection-manager events one round of the loop handles; the rest wait for the next round. */
    static final int MAX_CM_EVENTS_PER_ROUND = 64;
    /**
     * System property: milliseconds a posted rendezvous READ may go unanswered while it holds its share of the
     * budget before its channel fails (default 30000). A device gives up on an unanswered READ after its transport
     * retries; this bounds a peer that stalls its answers (a user-space peer can) so that it cannot hold the loop's
     * budget for ever.
     */
    public static final String RENDEZVOUS_READ_TIMEOUT_PROPERTY = "rdmabridge.rendezvousReadTimeoutMillis";

    private static final InternalLogger logger = InternalLoggerFactory.getInstance(RdmaIoHandler.class);
    /** A failing device can fail the same call on every turn of the loop: one line per 10 s says so. */
    private static final RateLimitedWarning LOOP_FAULTS =
            new RateLimitedWarning(LoggerFactory.getLogger(RdmaIoHandler.class), 10_000);
    private static final RdmaIoHandle[] NO_HANDLES = new RdmaIoHandle[0];

    private final ThreadAwareExecutor executor;
    private final Factory factory;
    private final RdmaDomain domain;
    private final EventNotifier notifier = new EventNotifier();
    private final RdmaEventChannel eventChannel;
    // This loop, and each registered accepted channel whose id lives on the event channel. Closing the event channel
    // closes its ids and their queue pairs, so it waits for the last: a listener's loop that shuts down first (a boss
    // group, or the first loop of a group to finish) must not destroy queue pairs other loops' connections are using.
    private final AtomicInteger eventChannelUsers = new AtomicInteger(1);
    private final WorkCompletions completions = new WorkCompletions(32);
    private final CmEvent cmEvent = new CmEvent();
    private final RdmaChannelMetrics metrics = new RdmaChannelMetrics();
    private RdmaIoHandle[] handles = NO_HANDLES;
    private final Runnable closeOnShutdown = this::closeAll;
    private boolean closeOnShutdownAdded;
    private long busyPollBudgetNanos;
    // The latest end of its channels' send-completion polling windows (valid while sendPolling): before it, the loop
    // asks them whether a send awaits its completion.
    private long sendPollDeadline;
    private boolean sendPolling;
    // Times the loop waited on its notifier: tests compare them with the exchanges served.
    private long sleeps;
    private boolean shuttingDown;
    private final long rendezvousBudget = positiveProperty(RENDEZVOUS_BUDGET_PROPERTY, DEFAULT_RENDEZVOUS_BUDGET);
    private volatile long rendezvousCommitted;
    private final long parkedAllowance = positiveProperty(RENDEZVOUS_PARKED_PROPERTY, DEFAULT_RENDEZVOUS_PARKED);
    private final long handshakeMemory;
    private volatile long handshakeCommitted;
    private volatile long rendezvousParked;
    private final ArrayDeque<RdmaChannelInbound> budgetWaiters = new ArrayDeque<>();
    // The waiter being retried: the only reservation that may go ahead of the queue.
    private RdmaChannelInbound retrying;
    private boolean budgetReleased;
    // Channels holding budget for a READ, oldest first; swept for READs that outlived the timeout.
    private final ArrayDeque<RdmaChannelInbound> budgetHolders = new ArrayDeque<>();
    // Channels whose landed message, unread, holds budget because the parked allowance was full; oldest first.
    private final ArrayDeque<RdmaChannelInbound> unreadHolders = new ArrayDeque<>();
    private final long readTimeoutNanos = Long.getLong(RENDEZVOUS_READ_TIMEOUT_PROPERTY, 30_000L) * 1_000_000L;
    // When stalled READs were last looked for: a loop too busy to sleep looks at most every SWEEP_INTERVAL_NANOS.
    private long lastSweep = System.nanoTime();
    private static final long SWEEP_INTERVAL_NANOS = 100_000_000L;

    private RdmaIoHandler(Factory factory, ThreadAwareExecutor executor) throws RdmaException {
        this.executor = Objects.requireNonNull(executor, "executor");
        this.factory = factory;
        handshakeMemory = factory.handshakeMemory > 0 ? factory.handshakeMemory
                : positiveProperty(HANDSHAKE_MEMORY_PROPERTY, DEFAULT_HANDSHAKE_MEMORY);
        domain = factory.acquire();
        try {
            eventChannel = domain.provider.createEventChannel(notifier);
        } catch (RdmaException | RuntimeException e) {
            factory.release();
            throw e;
        }
    }

    /** A factory using the provider chosen by {@link Rdma} ({@code rdmabridge.provider}). */
    public static IoHandlerFactory newFactory() {
        return new Factory(null, 0);
    }

    /** A factory using {@code provider}, which must be available. */
    public static IoHandlerFactory newFactory(RdmaProvider provider) {
        return newFactory(provider, 0);
    }

    /**
     * A factory using {@code provider}, which must be available, whose loops each commit up to
     * {@code handshakeMemoryBytes} to accepted channels whose handshake has not completed, in place of
     * {@value #HANDSHAKE_MEMORY_PROPERTY}: for an application that bounds its handshakes in progress itself and must
     * fit them all (0: the property).
     */
    public static IoHandlerFactory newFactory(RdmaProvider provider, long handshakeMemoryBytes) {
        Objects.requireNonNull(provider, "provider");
        if (handshakeMemoryBytes < 0) {
            throw new IllegalArgumentException("handshakeMemoryBytes: " + handshakeMemoryBytes
                    + " (expected: >= 0, 0 for " + HANDSHAKE_MEMORY_PROPERTY + ")");
        }
        if (!provider.isAvailable()) {
            throw new IllegalArgumentException("provider: " + provider.name() + " is unavailable ("
                    + provider.unavailabilityCause() + ")");
        }
        return new Factory(provider, handshakeMemoryBytes);
    }

    RdmaDomain domain() {
        return domain;
    }

    EventNotifier notifier() {
        return notifier;
    }

    RdmaEventChannel eventChannel() {
        return eventChannel;
    }

    WorkCompletions completions() {
        return completions;
    }

    RdmaChannelMetrics metrics() {
        return metrics;
    }

    boolean isShuttingDown() {
        return shuttingDown;
    }

    @Override
    public int run(IoHandlerContext context) {
        if (!budgetHolders.isEmpty() || !unreadHolders.isEmpty()) {
            // Also while the loop never gets to sleep (below): other channels' traffic must not postpone the timeout.
            long now = System.nanoTime();
            if (now - lastSweep >= SWEEP_INTERVAL_NANOS) {
                sweepStalledReads(now);
            }
        }
        int handled = pollOnce();
        if (handled > 0 || !context.canBlock()) {
            return handled;
        }
        long now = System.nanoTime();
        long end = now + busyPollBudgetNanos;
        if (sendPolling) {
            if (sendPollDeadline - now <= 0) {
                sendPolling = false;
            } else if (sendPollDeadline - end > 0) {
                for (RdmaIoHandle h : handles) {
                    long d = h.sendCompletionPollDeadline(now);
                    if (d - end > 0) {
                        end = d;
                    }
                }
            }
        }
        if (end - now > 0) {
            do {
                handled = pollOnce();
                if (handled > 0) {
                    return handled;
                }
            } while (context.canBlock() && System.nanoTime() - end < 0);
            if (!context.canBlock()) {
                return 0;
            }
        }
        RdmaIoHandle[] hs = handles;
        for (RdmaIoHandle h : hs) {
            try {
                h.arm();
            } catch (Throwable t) {
                // A queue the device no longer arms (ibv_req_notify_cq failing): that channel fails, the loop goes on.
                failed(h, t);
            }
        }
        handled = pollOnce();
        if (handled > 0) {
            return handled;
        }
        now = System.nanoTime();
        try {
            domain.memory.trimIdle(now);
        } catch (Throwable t) {
            // A deregistration the device refused: the memory stays registered, and this loop serves on.
            LOOP_FAULTS.warn("Returning idle registered memory on {} failed", Thread.currentThread().getName(), t);
        }
        sweepStalledReads(now);
        // Sleep no longer than until registered memory may be idle long enough to return, or a READ may time out
        // (nobody else wakes us for those).
        long sleep = Math.min(context.delayNanos(now),
                Math.min(domain.memory.nanosUntilTrim(now), nanosUntilReadTimeout(now)));
        sleeps++;
        notifier.await(Math.max(0, sleep));
        return pollOnce();
    }

    /**
     * A channel of this loop posted a write whose {@link RdmaChannelOption#SEND_COMPLETION_POLL_NANOS} window ends at
     * {@code deadline}: until then the loop asks its channels before it sleeps.
     */
    void sendPollUntil(long deadline) {
        if (!sendPolling || deadline - sendPollDeadline > 0) {
            sendPollDeadline = deadline;
            sendPolling = true;
        }
    }

    /** Times this loop has slept on its notifier. Loop thread, or tests once the loop is idle. */
    long sleeps() {
        return sleeps;
    }

    private static long positiveProperty(String name, long defaultValue) {
        long value = Long.getLong(name, defaultValue);
        if (value <= 0) {
            throw new IllegalArgumentException(name + ": " + value + " (expected: > 0)");
        }
        return value;
    }

    /**
     * Commits {@code bytes} of this loop's handshake memory to an accepted channel's receive buffers, if the budget
     * allows (one channel always may). Loop thread.
     *
     * @return {@code null} when committed, to be given back with {@link #releaseHandshake}; otherwise why not
     */
    String reserveHandshake(long bytes) {
        long committed = handshakeCommitted;
        if (committed > 0 && committed + bytes > handshakeMemory) {
            return committed + " of the " + handshakeMemory + " bytes of receive buffers this event loop gives"
                    + " accepted connections that have not completed their handshake are taken (peers that connect"
                    + " and never send theirs hold them until CONNECT_TIMEOUT_MILLIS); for bursts of connections"
                    + " raise " + (factory.handshakeMemory > 0 ? "the handshakeMemoryBytes of this loop group's"
                    + " RdmaIoHandler.newFactory" : HANDSHAKE_MEMORY_PROPERTY) + ", or lower the child's"
                    + " RECEIVE_QUEUE_DEPTH or"
                    + " RECEIVE_BUFFER_SIZE";
        }
        handshakeCommitted = committed + bytes;
        return null;
    }

    /** Gives back what {@link #reserveHandshake} committed. Loop thread. */
    void releaseHandshake(long bytes) {
        handshakeCommitted -= bytes;
    }

    /** Bytes of handshake memory committed now (tests). */
    long handshakeCommitted() {
        return handshakeCommitted;
    }

    /**
     * Commits {@code length} bytes of this loop's rendezvous budget to a READ target, if the budget allows (one READ
     * may always run, whatever its size) and no earlier advertisement waits for it: first come, first served, so that
     * a large message is never overtaken for good by smaller ones that keep coming. Loop thread.
     */
    boolean reserveRendezvous(RdmaChannelInbound holder, int length) {
        long committed = rendezvousCommitted;
        if (committed > 0 && committed + length > rendezvousBudget
                || holder != retrying && !budgetWaiters.isEmpty()) {
            return false;
        }
        rendezvousCommitted = committed + length;
        budgetHolders.add(holder);
        return true;
    }

    /** Gives back what {@link #reserveRendezvous} granted; waiting channels retry once this poll is done. */
    void releaseRendezvous(RdmaChannelInbound holder, int length) {
        rendezvousCommitted -= length;
        budgetHolders.remove(holder);
        if (!unreadHolders.isEmpty()) {
            unreadHolders.remove(holder);
        }
        if (!budgetWaiters.isEmpty()) {
            budgetReleased = true;
        }
    }

    /**
     * Moves {@code length} bytes that {@code holder}'s landed, unread message holds from the budget to the parked
     * allowance, if that has room. Loop thread.
     */
    boolean parkRendezvous(RdmaChannelInbound holder, int length) {
        long parked = rendezvousParked;
        if (parked + length > parkedAllowance) {
            return false;
        }
        rendezvousParked = parked + length;
        releaseRendezvous(holder, length);
        return true;
    }

    /**
     * {@code holder}'s landed, unread message keeps its share of the budget: the parked allowance was full. Swept
     * while others wait for budget. Loop thread.
     */
    void holdUnread(RdmaChannelInbound holder) {
        unreadHolders.add(holder);
    }

    /** Gives back what {@link #parkRendezvous} moved. Loop thread. */
    void unparkRendezvous(int length) {
        rendezvousParked -= length;
    }

    /** Bytes of landed, unread messages parked now (tests; any thread, a snapshot). */
    long rendezvousParked() {
        return rendezvousParked;
    }

    /** {@code inbound} could not reserve budget: it is asked to retry when some comes back. */
    void awaitRendezvousBudget(RdmaChannelInbound inbound) {
        budgetWaiters.add(inbound);
    }

    /** Bytes of rendezvous targets committed now (tests; any thread, a snapshot). */
    long rendezvousCommitted() {
        return rendezvousCommitted;
    }

    private int retryBudgetWaiters() {
        budgetReleased = false;
        // In arrival order, until one still does not fit: it stays first, and nobody behind it goes ahead.
        int n = 0;
        RdmaChannelInbound waiter;
        while ((waiter = budgetWaiters.poll()) != null) {
            n++;
            retrying = waiter;
            try {
                waiter.budgetMayBeAvailable();
            } catch (Throwable t) {
                failed(waiter.ioHandle(), t);
            } finally {
                retrying = null;
            }
            if (waiter.isAwaitingBudget()) {
                // It queued itself again, at the end.
                budgetWaiters.removeLastOccurrence(waiter);
                budgetWaiters.addFirst(waiter);
                break;
            }
        }
        return n;
    }

    /**
     * Fails the channels whose READ has held budget longer than the timeout without completing. One whose READ has
     * landed only leaves the sweep: the message goes up with the next read, or moves to the parked allowance when it
     * landed with no read pending ({@link RdmaChannelInbound#arrivedWithoutRead}). Past the allowance it keeps its
     * share, and its channel fails once the message has gone unread for the timeout while others wait for budget:
     * channels whose application does not read (a peer can make some pause) must not stall the loop's other
     * rendezvous for ever.
     */
    private void sweepStalledReads(long now) {
        lastSweep = now;
        RdmaChannelInbound oldest;
        while ((oldest = budgetHolders.peek()) != null && now - oldest.budgetSince() > readTimeoutNanos) {
            budgetHolders.poll();
            if (!oldest.isReadOutstanding()) {
                continue;
            }
            failed(oldest.ioHandle(), new IOException("the peer did not answer an RDMA READ of "
                    + oldest.budgetBytes() + " bytes within " + readTimeoutNanos / 1_000_000 + " ms ("
                    + RENDEZVOUS_READ_TIMEOUT_PROPERTY + "): closing the connection so that it releases its share of"
                    + " the event loop's rendezvous budget"));
        }
        RdmaChannelInbound unread;
        while (!budgetWaiters.isEmpty() && (unread = unreadHolders.peek()) != null
                && now - unread.unreadSince() > readTimeoutNanos) {
            unreadHolders.poll();
            failed(unread.ioHandle(), new IOException("the application did not read a landed message of "
                    + unread.budgetBytes() + " bytes within " + readTimeoutNanos / 1_000_000 + " ms ("
                    + RENDEZVOUS_READ_TIMEOUT_PROPERTY + ") while other connections waited for the event loop's "
                    + "rendezvous budget, and the loop's allowance for unread messages (" + RENDEZVOUS_PARKED_PROPERTY
                    + ") was full: closing the connection so that it releases its share (read sooner, or raise "
                    + RENDEZVOUS_PARKED_PROPERTY + ")"));
        }
    }

    private long nanosUntilReadTimeout(long now) {
        RdmaChannelInbound oldest = budgetHolders.peek();
        long nanos = oldest == null ? Long.MAX_VALUE : Math.max(0, oldest.budgetSince() + readTimeoutNanos - now);
        RdmaChannelInbound unread = unreadHolders.peek();
        if (unread != null && !budgetWaiters.isEmpty()) {
            nanos = Math.min(nanos, Math.max(0, unread.unreadSince() + readTimeoutNanos - now));
        }
        return nanos;
    }

    private int pollOnce() {
        int handled = 0;
        try {
            // At most a round's worth, as a listener reads at most maxMessagesPerRead a turn: a flood of connect
            // requests waits for later rounds instead of starving the loop's completions and tasks.
            while (handled < MAX_CM_EVENTS_PER_ROUND && eventChannel.poll(cmEvent)) {
                handled++;
                dispatch(cmEvent);
            }
        } catch (Throwable t) {
            // The event channel itself failed: connection events stop, but established channels still move bytes.
            LOOP_FAULTS.warn("Polling connection-manager events on {} failed", Thread.currentThread().getName(), t);
        }
        RdmaIoHandle[] hs = handles;
        for (RdmaIoHandle h : hs) {
            try {
                handled += h.poll(this);
            } catch (Throwable t) {
                // One channel's failure (a hostile peer, an exhausted budget, a bug) must never end the loop: its
                // thread serves the listener and every other channel registered here.
                handled++;
                failed(h, t);
            }
        }
        if (budgetReleased) {
            handled += retryBudgetWaiters();
        }
        return handled;
    }

    private static void failed(RdmaIoHandle h, Throwable cause) {
        try {
            h.failed(cause);
        } catch (Throwable t) {
            t.addSuppressed(cause);
            logger.warn("Failing an RDMA channel after an error on its event loop failed too", t);
        }
    }

    private void dispatch(CmEvent event) {
        Object target = event.type() == CmEventType.CONNECT_REQUEST && event.listenId() != null
                ? event.listenId().attachment() : event.id() == null ? null : event.id().attachment();
        if (target instanceof RdmaIoHandle) {
            RdmaIoHandle handle = (RdmaIoHandle) target;
            // The handle (e.g. an accepted child on another loop) hops to its own thread if needed.
            try {
                handle.handle(null, RdmaCmIoEvent.copyOf(event));
            } catch (Throwable t) {
                failed(handle, t);
            }
        } else if (event.type() == CmEventType.CONNECT_REQUEST && event.id() != null) {
            // Nobody listens any more: refuse instead of leaving the peer waiting.
            try {
                event.id().reject(null);
            } catch (RdmaException | RuntimeException e) {
                logger.debug("Rejecting a connection request for a closed listener failed", e);
            } finally {
                event.id().close();
            }
        } else {
            logger.debug("Dropping connection-manager event for a closed channel: {}", event);
        }
    }

    @Override
    public void prepareToDestroy() {
        closeAll();
    }

    /**
     * Closes every channel of the loop at once (no linger: nothing would poll the completions it waits for). Netty
     * calls {@link #prepareToDestroy()} only from a round of its loop that began after the shutdown, and a loop shut
     * down without a quiet period while it ran its tasks has no such round; {@link #closeOnShutdown}, a shutdown hook,
     * closes them then. Netty runs hooks only in a round that ran no task: usually before the loop stops taking
     * tasks, else just after, and not at all when tasks still came in its last round; {@link #destroy()} closes what
     * is left then. After the loop stops taking tasks the pipelines' {@code channelInactive} cannot be scheduled, and
     * Netty logs that, but the close still releases what the outbound buffers held and completes the close futures.
     */
    private void closeAll() {
        shuttingDown = true;
        for (RdmaIoHandle h : handles) {
            try {
                h.close();
            } catch (Exception e) {
                logger.warn("Failed to close an RDMA channel while its event loop shuts down", e);
            }
        }
    }

    @Override
    public void destroy() {
        closeAll();
        for (RdmaIoHandle h : handles) {
            h.destroyNow();
        }
        handles = NO_HANDLES;
        releaseEventChannel();
        notifier.close();
        factory.release();
    }

    @Override
    public IoRegistration register(IoHandle handle) {
        if (!closeOnShutdownAdded && executor instanceof SingleThreadEventExecutor loop) {
            // On the loop, so the hook is added at once (from another thread, adding it would start the loop).
            closeOnShutdownAdded = true;
            loop.addShutdownHook(closeOnShutdown);
        }
        RdmaIoHandle h = (RdmaIoHandle) handle;
        RdmaIoHandle[] hs = Arrays.copyOf(handles, handles.length + 1);
        hs[hs.length - 1] = h;
        handles = hs;
        updateBusyPoll();
        h.registered();
        return new Registration(h);
    }

    /** How long the loop polls before it sleeps: the largest busy-poll budget of its channels. Loop thread. */
    long busyPollBudgetNanos() {
        return busyPollBudgetNanos;
    }

    /** Takes the largest busy-poll budget of its channels again. Loop thread. */
    void updateBusyPoll() {
        long budget = 0;
        for (RdmaIoHandle h : handles) {
            budget = Math.max(budget, h.busyPollBudgetNanos());
        }
        busyPollBudgetNanos = budget;
    }

    private void deregister(RdmaIoHandle h) {
        RdmaIoHandle[] hs = handles;
        for (int i = 0; i < hs.length; i++) {
            if (hs[i] == h) {
                RdmaIoHandle[] copy = new RdmaIoHandle[hs.length - 1];
                System.arraycopy(hs, 0, copy, 0, i);
                System.arraycopy(hs, i + 1, copy, i, hs.length - i - 1);
                handles = copy;
                updateBusyPoll();
                h.unregistered();
                return;
            }
        }
    }

    @Override
    public void wakeup() {
        if (!executor.isExecutorThread(Thread.currentThread())) {
            notifier.signal();
        }
    }

    @Override
    public boolean isCompatible(Class<? extends IoHandle> handleType) {
        return RdmaIoHandle.class.isAssignableFrom(handleType);
    }

    /**
     * An accepted channel registered with its loop keeps this loop's event channel, where its id lives, open until
     * {@link #releaseEventChannel()}: the event channel outlives this loop while another loop's connection still uses
     * an id on it. Any thread.
     *
     * @return {@code false} if the event channel is already closed (and the id with it)
     */
    boolean retainEventChannel() {
        int users;
        do {
            users = eventChannelUsers.get();
            if (users == 0) {
                return false;
            }
        } while (!eventChannelUsers.compareAndSet(users, users + 1));
        return true;
    }

    /** This loop, or an accepted channel that closed its id, is done with the event channel; the last closes it. */
    void releaseEventChannel() {
        if (eventChannelUsers.decrementAndGet() == 0) {
            eventChannel.close();
        }
    }

    boolean inLoop() {
        return executor.isExecutorThread(Thread.currentThread());
    }

    void execute(Runnable task) {
        executor.execute(task);
    }

    private final class Registration implements IoRegistration {
        private final RdmaIoHandle handle;
        private volatile boolean valid = true;

        Registration(RdmaIoHandle handle) {
            this.handle = handle;
        }

        @SuppressWarnings("unchecked")
        @Override
        public <T> T attachment() {
            return (T) RdmaIoHandler.this;
        }

        @Override
        public long submit(IoOps ops) {
            throw new UnsupportedOperationException("RDMA channels post work requests themselves");
        }

        @Override
        public boolean isValid() {
            return valid;
        }

        @Override
        public boolean cancel() {
            if (!valid) {
                return false;
            }
            valid = false;
            if (executor.isExecutorThread(Thread.currentThread())) {
                deregister(handle);
            } else {
                executor.execute(() -> deregister(handle));
            }
            return true;
        }
    }

    /** Creates handlers that share one {@link RdmaDomain}, opened with the first and closed with the last. */
    static final class Factory implements IoHandlerFactory {
        private final RdmaProvider provider;
        /** Each loop's handshake memory; 0: {@value #HANDSHAKE_MEMORY_PROPERTY}. */
        private final long handshakeMemory;
        private RdmaDomain domain;
        private int handlers;

        Factory(RdmaProvider provider, long handshakeMemory) {
            this.provider = provider;
            this.handshakeMemory = handshakeMemory;
        }

        @Override
        public IoHandler newHandler(ThreadAwareExecutor ioExecutor) {
            try {
                return new RdmaIoHandler(this, ioExecutor);
            } catch (RdmaException e) {
                throw new IllegalStateException("cannot create an RDMA event loop: " + e.getMessage(), e);
            }
        }

        synchronized RdmaDomain acquire() throws RdmaException {
            if (domain == null) {
                domain = RdmaDomain.open(provider != null ? provider : Rdma.provider());
            }
            handlers++;
            return domain;
        }

        synchronized void release() {
            if (--handlers == 0) {
                domain.close();
                domain = null;
            }
        }
    }
}
