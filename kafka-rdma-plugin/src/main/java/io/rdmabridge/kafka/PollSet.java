package io.rdmabridge.kafka;

import java.io.IOException;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * The file descriptor a {@link ReplicationSocketChannel} shows to Kafka's {@link java.nio.channels.Selector}: a
 * private epoll instance holding the connection's TCP socket and an eventfd. An epoll descriptor is itself pollable
 * (readable while one of its members is ready), so the selector wakes for TCP readiness and for RDMA stream events
 * alike, and the channel can swap what it watches (TCP interest, RDMA signals) without re-registering with Kafka's
 * selector, whose key caches the descriptor number for life.
 *
 * <p>Built on the JDK's own Linux classes {@code sun.nio.ch.EPoll} and {@code sun.nio.ch.EventFD} (the agent opens
 * {@code sun.nio.ch} to this module). {@link #signal()} may be called from any thread, also after {@link #close()}
 * (then it does nothing); the rest by the thread owning the channel.
 */
final class PollSet implements AutoCloseable {
    static final int POLLIN = 0x001;
    static final int POLLOUT = 0x004;
    static final int POLLERR = 0x008;
    static final int POLLHUP = 0x010;

    private static final int CTL_ADD = 1;
    private static final int CTL_DEL = 2;
    private static final int CTL_MOD = 3;

    private static final MethodHandle EPOLL_CREATE;
    private static final MethodHandle EPOLL_CTL;
    private static final MethodHandle EPOLL_WAIT;
    private static final MethodHandle EPOLL_ALLOC;
    private static final MethodHandle EPOLL_FREE;
    private static final MethodHandle EPOLL_GET_EVENT;
    private static final MethodHandle EPOLL_GET_DESCRIPTOR;
    private static final MethodHandle EPOLL_GET_EVENTS;
    private static final MethodHandle EVENTFD_NEW;
    private static final MethodHandle EVENTFD_FD;
    private static final MethodHandle EVENTFD_SET;
    private static final MethodHandle EVENTFD_RESET;
    private static final MethodHandle EVENTFD_CLOSE;
    private static final MethodHandle CLOSE_INT_FD;
    private static final Throwable UNAVAILABILITY_CAUSE;

    static {
        MethodHandle[] h = new MethodHandle[14];
        Throwable cause = null;
        try {
            // EPoll's initializer calls a native method before it loads libnio itself; IOUtil's loads it. Needed
            // where the agent is the first to touch NIO in the JVM.
            Class.forName("sun.nio.ch.IOUtil");
            Class<?> epoll = Class.forName("sun.nio.ch.EPoll");
            Class<?> eventFd = Class.forName("sun.nio.ch.EventFD");
            Class<?> dispatcher = Class.forName("sun.nio.ch.FileDispatcherImpl");
            MethodHandles.Lookup e = MethodHandles.privateLookupIn(epoll, MethodHandles.lookup());
            MethodHandles.Lookup f = MethodHandles.privateLookupIn(eventFd, MethodHandles.lookup());
            MethodHandles.Lookup d = MethodHandles.privateLookupIn(dispatcher, MethodHandles.lookup());
            h[0] = e.findStatic(epoll, "create", MethodType.methodType(int.class));
            h[1] = e.findStatic(epoll, "ctl", MethodType.methodType(int.class, int.class, int.class, int.class,
                    int.class));
            h[2] = e.findStatic(epoll, "wait", MethodType.methodType(int.class, int.class, long.class, int.class,
                    int.class));
            h[3] = e.findStatic(epoll, "allocatePollArray", MethodType.methodType(long.class, int.class));
            h[4] = e.findStatic(epoll, "freePollArray", MethodType.methodType(void.class, long.class));
            h[5] = e.findStatic(epoll, "getEvent", MethodType.methodType(long.class, long.class, int.class));
            h[6] = e.findStatic(epoll, "getDescriptor", MethodType.methodType(int.class, long.class));
            h[7] = e.findStatic(epoll, "getEvents", MethodType.methodType(int.class, long.class));
            h[8] = f.findConstructor(eventFd, MethodType.methodType(void.class)).asType(
                    MethodType.methodType(Object.class));
            h[9] = f.findVirtual(eventFd, "efd", MethodType.methodType(int.class)).asType(
                    MethodType.methodType(int.class, Object.class));
            h[10] = f.findVirtual(eventFd, "set", MethodType.methodType(void.class)).asType(
                    MethodType.methodType(void.class, Object.class));
            h[11] = f.findVirtual(eventFd, "reset", MethodType.methodType(void.class)).asType(
                    MethodType.methodType(void.class, Object.class));
            h[12] = f.findVirtual(eventFd, "close", MethodType.methodType(void.class)).asType(
                    MethodType.methodType(void.class, Object.class));
            h[13] = d.findStatic(dispatcher, "closeIntFD", MethodType.methodType(void.class, int.class));
        } catch (Throwable t) {
            cause = new IllegalStateException("the JDK's epoll classes (sun.nio.ch.EPoll, EventFD) are not usable: "
                    + t + ". The RDMA replication agent needs a Linux JDK 17+ and must be started with -javaagent so "
                    + "that it can open sun.nio.ch to itself", t);
        }
        EPOLL_CREATE = h[0];
        EPOLL_CTL = h[1];
        EPOLL_WAIT = h[2];
        EPOLL_ALLOC = h[3];
        EPOLL_FREE = h[4];
        EPOLL_GET_EVENT = h[5];
        EPOLL_GET_DESCRIPTOR = h[6];
        EPOLL_GET_EVENTS = h[7];
        EVENTFD_NEW = h[8];
        EVENTFD_FD = h[9];
        EVENTFD_SET = h[10];
        EVENTFD_RESET = h[11];
        EVENTFD_CLOSE = h[12];
        CLOSE_INT_FD = h[13];
        UNAVAILABILITY_CAUSE = cause;
    }

    private final int epfd;
    private final Object eventFd;
    private final int efd;
    private final long pollArray;
    private final AtomicBoolean signalled = new AtomicBoolean();
    /** Makes {@link #signal()}'s eventfd write and {@link #close()} mutually exclusive. */
    private final Object eventFdLock = new Object();
    private int socketFd = -1;
    private int socketEvents = -1;
    /** Written under {@code eventFdLock}; read without it only by the owning thread, which is the one closing. */
    private boolean closed;

    /** Why the JDK classes cannot be used here, or {@code null}. */
    static Throwable unavailabilityCause() {
        return UNAVAILABILITY_CAUSE;
    }

    PollSet() throws IOException {
        if (UNAVAILABILITY_CAUSE != null) {
            throw new IOException(UNAVAILABILITY_CAUSE.getMessage(), UNAVAILABILITY_CAUSE);
        }
        int ep;
        try {
            ep = (int) EPOLL_CREATE.invokeExact();
        } catch (Throwable t) {
            throw asIoException(t);
        }
        Object fd = null;
        long array = 0;
        int e;
        try {
            fd = (Object) EVENTFD_NEW.invokeExact();
            e = (int) EVENTFD_FD.invokeExact(fd);
            array = (long) EPOLL_ALLOC.invokeExact(2);
            int rc = (int) EPOLL_CTL.invokeExact(ep, CTL_ADD, e, POLLIN);
            if (rc != 0) {
                throw new IOException("epoll_ctl(op=" + CTL_ADD + ", eventfd " + e + ") failed: errno " + rc);
            }
        } catch (Throwable t) {
            // Whatever was made before the failure goes with it: a connection that fails here leaks no descriptor.
            releaseQuietly(ep, fd, array);
            throw asIoException(t);
        }
        epfd = ep;
        eventFd = fd;
        efd = e;
        pollArray = array;
    }

    /** Rethrows an unchecked throwable as it is; wraps anything checked in an {@link IOException}. */
    private static IOException asIoException(Throwable t) {
        if (t instanceof RuntimeException r) {
            throw r;
        }
        if (t instanceof Error err) {
            throw err;
        }
        return t instanceof IOException io ? io : new IOException(t);
    }

    private static void releaseQuietly(int ep, Object fd, long array) {
        try {
            if (array != 0) {
                EPOLL_FREE.invokeExact(array);
            }
        } catch (Throwable ignored) {
            // Native memory free cannot fail in practice.
        }
        try {
            if (fd != null) {
                EVENTFD_CLOSE.invokeExact(fd);
            }
        } catch (Throwable ignored) {
            // Nothing left to release.
        }
        try {
            CLOSE_INT_FD.invokeExact(ep);
        } catch (Throwable ignored) {
            // As above.
        }
    }

    /** The descriptor Kafka's selector polls. */
    int fd() {
        return epfd;
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
                    EVENTFD_SET.invokeExact(eventFd);
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
        int n;
        try {
            n = (int) EPOLL_WAIT.invokeExact(epfd, pollArray, 2, 0);
        } catch (IOException | RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new IOException(t);
        }
        int result = 0;
        for (int i = 0; i < n; i++) {
            try {
                long event = (long) EPOLL_GET_EVENT.invokeExact(pollArray, i);
                int fd = (int) EPOLL_GET_DESCRIPTOR.invokeExact(event);
                int events = (int) EPOLL_GET_EVENTS.invokeExact(event);
                if (fd == efd) {
                    // Drain first, then allow new signals: a signal racing with this either finds the flag still
                    // set (its state change is seen by the readiness check that follows this poll) or writes anew.
                    EVENTFD_RESET.invokeExact(eventFd);
                    signalled.set(false);
                    result |= 1 << 31;
                } else if (fd == socketFd) {
                    result |= events;
                }
            } catch (IOException | RuntimeException | Error e) {
                throw e;
            } catch (Throwable t) {
                throw new IOException(t);
            }
        }
        return result;
    }

    private void ctl(int op, int fd, int events) throws IOException {
        int rc;
        try {
            rc = (int) EPOLL_CTL.invokeExact(epfd, op, fd, events);
        } catch (Throwable t) {
            throw new IOException(t);
        }
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
            try {
                EVENTFD_CLOSE.invokeExact(eventFd);
            } catch (Throwable ignored) {
                // Closing after an I/O error: nothing left to release.
            }
        }
        try {
            CLOSE_INT_FD.invokeExact(epfd);
        } catch (Throwable ignored) {
            // As above.
        }
        try {
            EPOLL_FREE.invokeExact(pollArray);
        } catch (Throwable ignored) {
            // Native memory free cannot fail in practice.
        }
    }
}
