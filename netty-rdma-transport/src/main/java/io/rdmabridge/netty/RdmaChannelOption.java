package io.rdmabridge.netty;

import io.netty.channel.ChannelOption;

/**
 * Options of RDMA channels, on top of Netty's {@link ChannelOption}s. Set them with {@code Bootstrap.option} or
 * {@code ServerBootstrap.childOption}. Those that size the queue pair or go into the connection's handshake are taken
 * when the channel creates its queue pair and cannot change after it ({@link RdmaChannelConfig} says which); the
 * others take effect at once. Constants; thread-safe.
 *
 * @param <T> the option's value type
 */
public final class RdmaChannelOption<T> extends ChannelOption<T> {

    /** Receive buffers posted for data frames: the credits the peer may spend before it waits (default 16). */
    public static final ChannelOption<Integer> RECEIVE_QUEUE_DEPTH = valueOf(RdmaChannelOption.class,
            "RECEIVE_QUEUE_DEPTH");
    /**
     * Bytes of each posted receive buffer, frame header included: the largest eager frame, 1 KiB to 16 MiB (default
     * 64 KiB). Frames this side sends are at most the smaller of its own and the peer's size, so a peer cannot make it
     * stage more; a peer announcing less than 1 KiB is refused at the handshake.
     */
    public static final ChannelOption<Integer> RECEIVE_BUFFER_SIZE = valueOf(RdmaChannelOption.class,
            "RECEIVE_BUFFER_SIZE");
    /**
     * Outstanding send work requests, a power of two from 8 to 65536 (default 128), capped by the device's work
     * requests per queue pair.
     */
    public static final ChannelOption<Integer> SEND_QUEUE_DEPTH = valueOf(RdmaChannelOption.class,
            "SEND_QUEUE_DEPTH");
    /** Bytes a SEND may carry inline, capped by the device's limit (default 256, 0 disables inline sends). */
    public static final ChannelOption<Integer> INLINE_THRESHOLD = valueOf(RdmaChannelOption.class,
            "INLINE_THRESHOLD");
    /**
     * Messages of at least this many bytes are sent by rendezvous (RDMA READ by the receiver; default 256 KiB).
     * Smaller writes go in eager frames of up to the peer's receive buffer size, several writes packed into one.
     */
    public static final ChannelOption<Integer> RENDEZVOUS_THRESHOLD = valueOf(RdmaChannelOption.class,
            "RENDEZVOUS_THRESHOLD");
    /**
     * Largest single message this side accepts from its peer, announced in the handshake (default 16 MiB). It bounds
     * the receive buffer one rendezvous can make this side allocate, whoever the peer is; the sender splits larger
     * writes into several messages, so the byte stream is unchanged. A peer that exceeds it is cut off with a
     * protocol error.
     */
    public static final ChannelOption<Integer> MAX_MESSAGE_SIZE = valueOf(RdmaChannelOption.class,
            "MAX_MESSAGE_SIZE");
    /** Completion moderation: one send in this many is signaled (default 16; 1 signals every send). */
    public static final ChannelOption<Integer> SIGNAL_INTERVAL = valueOf(RdmaChannelOption.class,
            "SIGNAL_INTERVAL");
    /**
     * Nanoseconds the event loop keeps polling its completion queues before it sleeps (default 0: sleep at once).
     * The loop uses the largest budget of its channels.
     */
    public static final ChannelOption<Long> BUSY_POLL_BUDGET_NANOS = valueOf(RdmaChannelOption.class,
            "BUSY_POLL_BUDGET_NANOS");
    /**
     * Nanoseconds after a write posts work during which the event loop, rather than sleep, keeps polling while a send
     * of this channel awaits its completion (default 50,000; 0: sleep at once). A send completes when the peer
     * acknowledges it: a device acknowledges within microseconds, and the software provider's same-host path holds
     * the acknowledgement until the peer's answer carries it, so a request-response exchange is usually served
     * without the loop sleeping and being woken (on the software provider's TCP path the acknowledgement comes first
     * and alone, so there it saves little). Unlike {@link #BUSY_POLL_BUDGET_NANOS} it costs nothing while no send of
     * the channel is in flight, and at most this long per write otherwise; a peer that never acknowledges costs its
     * own channel's writes that much, not other channels' of the loop.
     */
    public static final ChannelOption<Long> SEND_COMPLETION_POLL_NANOS = valueOf(RdmaChannelOption.class,
            "SEND_COMPLETION_POLL_NANOS");

    /**
     * Whether the channel allocates from its registered {@link RdmaByteBufAllocator} even when
     * {@code ChannelOption.ALLOCATOR} names another allocator (default {@code false}). For frameworks that set their
     * own allocator on every channel they create, as gRPC-Java does (its pooled allocator, whatever
     * {@code io.grpc.netty.useCustomAllocator} says): with this option their writes come from registered memory and
     * go out without a copy. Set it where the framework passes channel options through
     * ({@code NettyChannelBuilder.withOption}, {@code NettyServerBuilder.withChildOption}).
     */
    public static final ChannelOption<Boolean> REGISTERED_ALLOCATOR = valueOf(RdmaChannelOption.class,
            "REGISTERED_ALLOCATOR");

    @SuppressWarnings({"unused", "deprecation"})
    private RdmaChannelOption() {
        super(null);
    }
}
