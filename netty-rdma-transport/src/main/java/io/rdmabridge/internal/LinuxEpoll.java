package io.rdmabridge.internal;

import java.io.IOException;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;

/**
 * Linux epoll and eventfd for descriptors that are not Java channels (the completion channels of the verbs), through
 * the JDK's own classes {@code sun.nio.ch.EPoll} and {@code sun.nio.ch.EventFD}: no native library of this project's
 * own.
 *
 * <p>Usable where {@code sun.nio.ch} is open to this class's module ({@code --add-opens
 * java.base/sun.nio.ch=ALL-UNNAMED}, or an agent that opens it); elsewhere {@link #unavailabilityCause()} says why and
 * {@link WakeableSet#open} throws {@link IOException}. The methods are thin: each is one system call and reports failure
 * as the JDK does (an {@link IOException}, or an errno for {@code epoll_ctl}).
 */
public final class LinuxEpoll {
    public static final int EPOLLIN = 0x001;

    public static final int CTL_ADD = 1;
    public static final int CTL_DEL = 2;

    private static final MethodHandle EPOLL_CREATE;
    private static final MethodHandle EPOLL_CTL;
    private static final MethodHandle EPOLL_WAIT;
    private static final MethodHandle EPOLL_ALLOC;
    private static final MethodHandle EPOLL_FREE;
    private static final MethodHandle EPOLL_GET_EVENT;
    private static final MethodHandle EPOLL_GET_DESCRIPTOR;
    private static final MethodHandle EVENTFD_NEW;
    private static final MethodHandle EVENTFD_FD;
    private static final MethodHandle EVENTFD_SET;
    private static final MethodHandle EVENTFD_RESET;
    private static final MethodHandle EVENTFD_CLOSE;
    private static final MethodHandle CLOSE_INT_FD;
    private static final Throwable UNAVAILABILITY_CAUSE;

    static {
        MethodHandle[] h = new MethodHandle[13];
        Throwable cause = null;
        try {
            // EPoll's initializer calls a native method before it loads libnio itself; IOUtil's loads it. Needed
            // where this is the first class of the JVM to touch NIO (an agent's premain).
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
            h[7] = f.findConstructor(eventFd, MethodType.methodType(void.class)).asType(
                    MethodType.methodType(Object.class));
            h[8] = f.findVirtual(eventFd, "efd", MethodType.methodType(int.class)).asType(
                    MethodType.methodType(int.class, Object.class));
            h[9] = f.findVirtual(eventFd, "set", MethodType.methodType(void.class)).asType(
                    MethodType.methodType(void.class, Object.class));
            h[10] = f.findVirtual(eventFd, "reset", MethodType.methodType(void.class)).asType(
                    MethodType.methodType(void.class, Object.class));
            h[11] = f.findVirtual(eventFd, "close", MethodType.methodType(void.class)).asType(
                    MethodType.methodType(void.class, Object.class));
            h[12] = d.findStatic(dispatcher, "closeIntFD", MethodType.methodType(void.class, int.class));
        } catch (Throwable t) {
            cause = new IllegalStateException("the JDK's epoll classes (sun.nio.ch.EPoll, EventFD) are not usable ("
                    + t + "): they need a Linux JDK 17+ with java.base/sun.nio.ch opened to this class path, which the"
                    + " JVM option --add-opens java.base/sun.nio.ch=ALL-UNNAMED does", t);
        }
        EPOLL_CREATE = h[0];
        EPOLL_CTL = h[1];
        EPOLL_WAIT = h[2];
        EPOLL_ALLOC = h[3];
        EPOLL_FREE = h[4];
        EPOLL_GET_EVENT = h[5];
        EPOLL_GET_DESCRIPTOR = h[6];
        EVENTFD_NEW = h[7];
        EVENTFD_FD = h[8];
        EVENTFD_SET = h[9];
        EVENTFD_RESET = h[10];
        EVENTFD_CLOSE = h[11];
        CLOSE_INT_FD = h[12];
        UNAVAILABILITY_CAUSE = cause;
    }

    private LinuxEpoll() {
    }

    /** Why epoll cannot be used in this JVM (naming the fix), or {@code null} when it can. */
    public static Throwable unavailabilityCause() {
        return UNAVAILABILITY_CAUSE;
    }

    /**
     * An epoll set with an eventfd in it, by which any thread can wake its waiter, and the native array that {@code
     * epoll_wait} fills: made together and closed together, so that a failure part-way leaks no descriptor.
     *
     * <p>Not thread-safe: its owner calls {@link #wait}, the ready-entry readers and {@link #close()}; others may call
     * {@link #wake()} only while the owner guarantees the set is open (the eventfd's number is reused once closed).
     */
    public static final class WakeableSet implements AutoCloseable {
        private final int epfd;
        private final EventFd wake;
        private final long pollArray;
        private final int maxEvents;

        private WakeableSet(int epfd, EventFd wake, long pollArray, int maxEvents) {
            this.epfd = epfd;
            this.wake = wake;
            this.pollArray = pollArray;
            this.maxEvents = maxEvents;
        }

        /** A new set that reports at most {@code maxEvents} ready descriptors per {@link #wait}. */
        public static WakeableSet open(int maxEvents) throws IOException {
            checkAvailable();
            int ep = -1;
            EventFd fd = null;
            long array = 0;
            try {
                ep = (int) EPOLL_CREATE.invokeExact();
                fd = newEventFd();
                array = (long) EPOLL_ALLOC.invokeExact(maxEvents);
                int rc = (int) EPOLL_CTL.invokeExact(ep, CTL_ADD, fd.fd, EPOLLIN);
                if (rc != 0) {
                    throw new IOException("epoll_ctl(ADD) of an eventfd failed: errno " + rc);
                }
                return new WakeableSet(ep, fd, array, maxEvents);
            } catch (Throwable t) {
                if (array != 0) {
                    freePollArray(array);
                }
                if (fd != null) {
                    fd.close();
                }
                if (ep >= 0) {
                    closeQuietly(ep);
                }
                throw asIoException(t);
            }
        }

        /** {@code epoll_ctl} on this set: 0, or the errno it failed with. */
        public int ctl(int op, int fd, int events) throws IOException {
            try {
                return (int) EPOLL_CTL.invokeExact(epfd, op, fd, events);
            } catch (Throwable t) {
                throw asIoException(t);
            }
        }

        /** Takes {@code fd} out of the set, a failure ignored (it may have left already, by closing). */
        public void removeQuietly(int fd) {
            try {
                EPOLL_CTL.invoke(epfd, CTL_DEL, fd, 0); // invoke, not invokeExact: the errno is dropped
            } catch (Throwable ignored) {
                // As documented.
            }
        }

        /**
         * {@code epoll_wait}: how many descriptors are ready (read them with {@link #readyDescriptor}), or a negative
         * value when a signal interrupted the wait.
         *
         * @param timeoutMillis {@code -1} waits without limit, 0 not at all
         */
        public int wait(int timeoutMillis) throws IOException {
            try {
                return (int) EPOLL_WAIT.invokeExact(epfd, pollArray, maxEvents, timeoutMillis);
            } catch (Throwable t) {
                throw asIoException(t);
            }
        }

        /** The descriptor of the {@code i}-th ready entry of the last {@link #wait}. */
        public int readyDescriptor(int i) throws IOException {
            try {
                return (int) EPOLL_GET_DESCRIPTOR.invokeExact((long) EPOLL_GET_EVENT.invokeExact(pollArray, i));
            } catch (Throwable t) {
                throw asIoException(t);
            }
        }

        /** Whether {@code fd}, a ready descriptor, is this set's eventfd: then {@link #resetWake()}. */
        public boolean isWake(int fd) {
            return fd == wake.fd;
        }

        /** Makes the eventfd readable: the owner's {@link #wait} returns. */
        public void wake() throws IOException {
            wake.set();
        }

        /** Makes the eventfd unreadable again. */
        public void resetWake() throws IOException {
            wake.reset();
        }

        /** Closes the eventfd and the set and frees the array; failures are ignored (nothing is left to release). */
        @Override
        public void close() {
            wake.close();
            closeQuietly(epfd);
            freePollArray(pollArray);
        }
    }

    private static void freePollArray(long pollArray) {
        try {
            EPOLL_FREE.invokeExact(pollArray);
        } catch (Throwable ignored) {
            // Freeing native memory cannot fail in practice.
        }
    }

    private static void closeQuietly(int fd) {
        try {
            CLOSE_INT_FD.invokeExact(fd);
        } catch (Throwable ignored) {
            // Nothing is left to release.
        }
    }

    /** A new eventfd: readable while set, until reset. */
    public static EventFd newEventFd() throws IOException {
        checkAvailable();
        try {
            Object fd = (Object) EVENTFD_NEW.invokeExact();
            return new EventFd(fd, (int) EVENTFD_FD.invokeExact(fd));
        } catch (Throwable t) {
            throw asIoException(t);
        }
    }

    /** A Linux eventfd (the JDK's {@code sun.nio.ch.EventFD}). Not thread-safe: callers order set and close. */
    public static final class EventFd {
        private final Object eventFd;
        private final int fd;

        private EventFd(Object eventFd, int fd) {
            this.eventFd = eventFd;
            this.fd = fd;
        }

        /** Its descriptor. */
        public int fd() {
            return fd;
        }

        /** Makes it readable. Must not be called once {@link #close()} ran: the number may be another file's. */
        public void set() throws IOException {
            try {
                EVENTFD_SET.invokeExact(eventFd);
            } catch (Throwable t) {
                throw asIoException(t);
            }
        }

        /** Makes it unreadable again. */
        public void reset() throws IOException {
            try {
                EVENTFD_RESET.invokeExact(eventFd);
            } catch (Throwable t) {
                throw asIoException(t);
            }
        }

        /** Closes it; failures are ignored (nothing is left to release). */
        public void close() {
            try {
                EVENTFD_CLOSE.invokeExact(eventFd);
            } catch (Throwable ignored) {
                // As documented.
            }
        }
    }

    private static void checkAvailable() throws IOException {
        if (UNAVAILABILITY_CAUSE != null) {
            throw new IOException(UNAVAILABILITY_CAUSE.getMessage(), UNAVAILABILITY_CAUSE);
        }
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
}
