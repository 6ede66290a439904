package io.rdmabridge.verbs;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.StandardProtocolFamily;
import java.nio.ByteBuffer;
import java.nio.channels.DatagramChannel;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Consumer;

/**
 * The wake-up an event loop waits on: completion queues armed with {@link CompletionQueue#requestNotify()} and
 * connection-manager event channels signal it, and so may any thread that wants the loop to run (Netty's
 * {@code IoHandler.wakeup()}). It plays the role of {@code ibv_comp_channel} and the CM event fd under one epoll.
 *
 * <p>One thread waits ({@link #await(long)}); any thread signals. A signal that arrives while nobody waits is
 * remembered, so the standard "arm, poll once more, then wait" sequence never loses a wake-up. Signalling allocates
 * nothing and takes no lock while the waiter is awake.
 *
 * <h2>Wake-ups from other processes</h2>
 * A provider whose peers on this host can wake the loop directly (the soft provider's same-host rings) asks for
 * {@link #loopbackWakePort()}: from then on the waiter blocks in a {@link Selector} that also watches a UDP socket on
 * the loopback address, and any datagram sent to it wakes the waiter as {@link #signal()} does. The datagrams carry
 * no meaning (a wake-up is only a reason to poll), so whatever a local process sends costs the loop a poll, never
 * memory: each wake-up reads at most {@value #MAX_DATAGRAMS_PER_WAKE} of them into one fixed buffer and drops the
 * rest to the kernel's receive buffer. A signal to a sleeping waiter then goes through {@link Selector#wakeup()}, which
 * takes the selector's own lock, as Netty's NIO loop does. {@link #close()} releases the socket and the selector.
 */
public final class EventNotifier implements AutoCloseable {
    /** Datagrams one wake-up drains at most; more wait for the next. */
    static final int MAX_DATAGRAMS_PER_WAKE = 64;

    private static final int IDLE = 0;
    private static final int SIGNALLED = 1;
    private static final int WAITING = 2;

    private final AtomicInteger state = new AtomicInteger(IDLE);
    private volatile Thread waiter;
    // Wake socket, opened by the first loopbackWakePort() call; the waiter alone reads it.
    private volatile Selector selector;
    private DatagramChannel wakeChannel;
    private int wakePort;
    private boolean closed;
    private final ByteBuffer datagram = ByteBuffer.allocateDirect(64);
    private boolean woken;
    private final Consumer<SelectionKey> onWakeDatagram = k -> woken = true;

    /**
     * Waits until signalled or the timeout passes, then clears the signal.
     *
     * @param timeoutNanos how long to wait at most; {@code 0} returns at once, negative waits without limit
     * @return whether a signal or a wake-up datagram was consumed
     */
    public boolean await(long timeoutNanos) {
        if (state.compareAndSet(SIGNALLED, IDLE)) {
            return true;
        }
        Selector s = selector;
        if (timeoutNanos == 0) {
            return s != null && drainWakeDatagrams(s, 0);
        }
        waiter = Thread.currentThread();
        if (!state.compareAndSet(IDLE, WAITING)) {
            // Signalled between the two checks.
            waiter = null;
            state.set(IDLE);
            return true;
        }
        long deadline = timeoutNanos > 0 ? System.nanoTime() + timeoutNanos : 0;
        boolean datagrams = false;
        try {
            while (state.get() == WAITING) {
                long left = timeoutNanos < 0 ? -1 : deadline - System.nanoTime();
                if (timeoutNanos > 0 && left <= 0) {
                    break;
                }
                if (s != null) {
                    // Milliseconds rounded up, as a selector counts them: never earlier than asked.
                    long millis = left < 0 ? -1 : Math.max(1, TimeUnit.NANOSECONDS.toMillis(left + 999_999));
                    if (drainWakeDatagrams(s, millis)) {
                        datagrams = true;
                        break;
                    }
                } else if (left < 0) {
                    LockSupport.park(this);
                } else {
                    LockSupport.parkNanos(this, left);
                }
                if (Thread.interrupted()) {
                    Thread.currentThread().interrupt();
                    break;
                }
            }
        } finally {
            waiter = null;
        }
        // Either a signal moved us to SIGNALLED, or a datagram, a timeout or an interrupt ended the wait.
        return state.getAndSet(IDLE) == SIGNALLED || datagrams;
    }

    /**
     * Whether a thread waits in {@link #await(long)} now and nothing has signalled it since it began (diagnostics and
     * tests: whether an action woke the waiter). Any thread.
     */
    public boolean isWaiting() {
        return state.get() == WAITING;
    }

    /** Convenience for {@link #await(long)} with a unit. */
    public boolean await(long timeout, TimeUnit unit) {
        return await(unit.toNanos(timeout));
    }

    /** Wakes the waiter, or makes its next {@link #await(long)} return at once. Any thread; never blocks. */
    public void signal() {
        int previous = state.getAndSet(SIGNALLED);
        if (previous == WAITING) {
            Thread t = waiter;
            if (t != null) {
                LockSupport.unpark(t);
            }
            Selector s = selector;
            if (s != null) {
                // The waiter may have opened the selector after it started parking: both wake-ups are harmless.
                s.wakeup();
            }
        }
    }

    /**
     * The port of this notifier's wake socket on the loopback address, opened on the first call: a datagram sent to
     * it from any process on this host (in this network namespace) wakes the waiter.
     *
     * @return the port, or {@code 0} when the socket cannot be opened (the caller then wakes the loop another way)
     * @throws IllegalStateException once closed
     */
    public synchronized int loopbackWakePort() {
        if (closed) {
            throw new IllegalStateException("event notifier closed");
        }
        if (selector == null && wakePort == 0) {
            Selector s = null;
            DatagramChannel ch = null;
            try {
                s = Selector.open();
                ch = DatagramChannel.open(StandardProtocolFamily.INET);
                ch.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0));
                ch.configureBlocking(false);
                ch.register(s, SelectionKey.OP_READ);
                wakePort = ((InetSocketAddress) ch.getLocalAddress()).getPort();
                wakeChannel = ch;
                selector = s;
            } catch (IOException | RuntimeException e) {
                closeQuietly(ch);
                closeQuietly(s);
                wakePort = -1; // not again
            }
        }
        return Math.max(0, wakePort);
    }

    /** Releases the wake socket, if one was opened; the waiter parks again. Idempotent. */
    @Override
    public synchronized void close() {
        closed = true;
        Selector s = selector;
        selector = null;
        if (s != null) {
            s.wakeup();
            closeQuietly(wakeChannel);
            closeQuietly(s);
        }
    }

    /** Waits in the selector up to {@code millis} (0: not at all); whether wake-up datagrams came. Waiter only. */
    private boolean drainWakeDatagrams(Selector s, long millis) {
        woken = false;
        try {
            if (millis == 0) {
                s.selectNow(onWakeDatagram);
            } else {
                s.select(onWakeDatagram, Math.max(0, millis));
            }
            if (!woken) {
                return false;
            }
            DatagramChannel ch = wakeChannel;
            for (int i = 0; i < MAX_DATAGRAMS_PER_WAKE; i++) {
                datagram.clear();
                if (ch.receive(datagram) == null) {
                    break;
                }
            }
            return true;
        } catch (IOException | RuntimeException e) {
            // Closed under us (close() from another thread): a wake-up like any other.
            return true;
        }
    }

    private static void closeQuietly(AutoCloseable c) {
        if (c != null) {
            try {
                c.close();
            } catch (Exception ignored) {
                // Releasing a socket or selector; nothing is left to do with it.
            }
        }
    }
}
