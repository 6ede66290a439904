package io.rdmabridge.kafka;

import java.io.Closeable;
import java.io.IOException;
import java.nio.ByteBuffer;

/**
 * The RDMA byte stream of an upgraded replication connection: the one seam between the Kafka adapter and the RDMA
 * connection core, which owns credits, eager and rendezvous transfers, framing and half-close.
 *
 * <p>Non-blocking like a {@link java.nio.channels.SocketChannel}: {@link #read} and {@link #write} never wait. The
 * stream calls its {@linkplain #readinessListener(Runnable) readiness listener} (from any thread) whenever
 * {@link #isReadable()} or {@link #isWritable()} may have become true; the channel turns that into a selector wake-up.
 * {@code read}/{@code write} are called by one thread at a time (Kafka's network thread owning the connection).
 */
interface RdmaStream extends Closeable {

    /** Copies received bytes into {@code dst}: the count, 0 when none is waiting, -1 at end of stream. */
    int read(ByteBuffer dst) throws IOException;

    /** Takes bytes from {@code src} for sending: the count, 0 when no send capacity (credit, buffer) is free. */
    int write(ByteBuffer src) throws IOException;

    /** True when {@link #read} would return data, end of stream or an error. */
    boolean isReadable();

    /** True when {@link #write} would take at least one byte or report an error. */
    boolean isWritable();

    /** Sets the callback run when readability or writability may have changed; at most one. */
    void readinessListener(Runnable listener);

    /** Bytes the CPU copied while receiving (into the caller's buffers) and sending (into registered memory). */
    long copiedBytesReceived();

    long copiedBytesSent();

    /** Half-close: the peer reads end of stream after the bytes already written. */
    void shutdownOutput() throws IOException;

    /**
     * Runs {@code action} once the connection under the stream is closed and its resources (queue pair, registered
     * memory) are released, which may be a while after {@link #close()} returned: a close first delivers what
     * {@link #write} took. At once, on the calling thread, when that has happened already. Any thread.
     */
    void whenClosed(Runnable action);

    /** A short description for logs: provider and queue pair. */
    String describe();
}
