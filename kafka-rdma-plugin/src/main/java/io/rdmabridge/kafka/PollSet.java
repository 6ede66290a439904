package io.rdmabridge.kafka;

import io.rdmabridge.internal.LinuxEpoll;
import java.io.IOException;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * The file descriptor a {@link ReplicationSocketChannel} shows to Kafka's {@link java.nio.channels.Selector}: a
 * private epoll instance holding the connection's TCP socket and an eventfd. An epoll descriptor is itself pollable
 * (readable while one of its members is ready), so the selector wakes for TCP readiness and for RDMA stream events
 * alike, and the channel can swap what it watches (TCP interest, RDMA signals) without re-registering with Kafka's
 * selector, whose key caches the descriptor number for life.
 *
 * <p>Built on {@link LinuxEpoll}, the JDK's own Linux classes (the agent opens {@code sun.nio.ch} to this module).
 * {@link #signal()} may be called from any thread, also after {@link #close()} (then it does nothing); the rest by the
 * thread owning the channel.
 */
final class PollSet implements AutoCloseable {
    static final int POLLIN = LinuxEpoll.EPOLLIN;
    static final int POLLOUT = LinuxEpoll.EPOLLOUT;
    static final int POLLERR = LinuxEpoll.EPOLLERR;
    static final int POLLHUP = LinuxEpoll.EPOLLHUP;

    private static final int CTL_ADD = LinuxEpoll.CTL_ADD;
    private static final int CTL_DEL = LinuxEpoll.CTL_DEL;
    private static final int CTL_MOD = LinuxEpoll.CTL_MOD;

    private final LinuxEpoll.WakeableSet set;
    private final AtomicBoolean signalled = new AtomicBoolean();
    /** Makes {@link #signal()}'s eventfd write and {@link #close()} mutually exclusive. */
    private final Object eventFdLock = new Object();
    private int socketFd = -1;
    private int socketEvents = -1;
    /** Written under {@code eventFdLock}; read without it only by the owning thread, which is the one closing. */
    private boolean closed;

    /**
     * Why the JDK classes cannot be used here, or {@code null}. The agent opens {@code sun.nio.ch} before it asks;
     * without the agent nothing opens it.
     */
    static Throwable unavailabilityCause() {
        Throwable cause = LinuxEpoll.unavailabilityCause();
        return cause == null ? null : new IllegalStateException(cause.getMessage() + ". The RDMA replication agent "
                + "opens sun.nio.ch itself: start the broker with -javaagent", cause);
    }

    /** A new set watching nothing but its signal; a failure part-way leaks no descriptor. */
    PollSet() throws IOException {
        set = LinuxEpoll.WakeableSet.open(2);
    }

    /** The descriptor Kafka's selector polls. */
    int fd() {
        return set.fd();
    }

    /**
     * Watches {@code fd} (the TCP socket) for {@code events} (POLLIN/POLLOUT); 0 stops watching it; a new descriptor
     * replaces the previous one.
     */
    void watchSocket(int fd, int events) throws IOException {
        if (closed) {
            return;
        }
        if (fd != socketFd) {
            if (socketFd >= 0 && socketEvents > 0) {
                ctl(CTL_DEL, socketFd, 0);
            }
            socketFd = fd;
            socketEvents = 0;
        }
        if (events == socketEvents || fd < 0) {
            return;
        }
        if (socketEvents <= 0) {
            if (events != 0) {
                ctl(CTL_ADD, fd, events);
            }
        } else if (events == 0) {
            ctl(CTL_DEL, fd, 0);
        } else {
            ctl(CTL_MOD, fd, events);
        }
        socketEvents = events;
    }

    /** Wakes the selector: the channel has something to report that TCP does not show. Any thread. */
    void signal() {
        if (signalled.compareAndSet(false, true)) {
            // EventFD.set() writes to the descriptor number, which close() hands back to the process: once closed,
            // the number may be another file's or socket's, so never write after (or while) it is closed.
            synchronized (eventFdLock) {
                if (closed) {
                    return;
                }
                try {
                    set.wake();
                } catch (Throwable t) {
                    // An open eventfd takes the write; should it not, a later signal tries again.
                    signalled.set(false);
                }
            }
        }
    }

    /**
     * Collects what is ready without waiting: the TCP socket's events (POLLIN/POLLOUT/POLLERR/POLLHUP); the signal is
     * consumed and reported as the returned value's bit 31.
     */
    int poll() throws IOException {
        if (closed) {
            return 0;
        }
        int n = set.wait(0);
        int result = 0;
        for (int i = 0; i < n; i++) {
            int fd = set.readyDescriptor(i);
            if (set.isWake(fd)) {
                // Drain first, then allow new signals: a signal racing with this either finds the flag still set
                // (its state change is seen by the readiness check that follows this poll) or writes anew.
                set.resetWake();
                signalled.set(false);
                result |= 1 << 31;
            } else if (fd == socketFd) {
                result |= set.readyEvents(i);
            }
        }
        return result;
    }

    private void ctl(int op, int fd, int events) throws IOException {
        int rc = set.ctl(op, fd, events);
        // ENOENT after the socket closed itself (it leaves epoll on close) is harmless.
        if (rc != 0 && !(op == CTL_DEL)) {
            throw new IOException("epoll_ctl(op=" + op + ", fd=" + fd + ", events=0x" + Integer.toHexString(events)
                    + ") failed: errno " + rc);
        }
    }

    @Override
    public void close() {
        synchronized (eventFdLock) {
            if (closed) {
                return;
            }
            closed = true;
            set.close();
        }
    }
}
