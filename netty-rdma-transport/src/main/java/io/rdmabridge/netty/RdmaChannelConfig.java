package io.rdmabridge.netty;

import io.netty.buffer.ByteBufAllocator;
import io.netty.channel.ChannelOption;
import io.netty.channel.DefaultChannelConfig;
import io.netty.channel.MessageSizeEstimator;
import io.netty.channel.RecvByteBufAllocator;
import io.netty.channel.WriteBufferWaterMark;
import io.netty.channel.socket.SocketChannelConfig;
import io.rdmabridge.connection.ConnectionConfig;
import io.rdmabridge.connection.Handshake;

import java.util.Map;

/**
 * Configuration of an {@link RdmaSocketChannel}: Netty's socket options plus {@link RdmaChannelOption}s. TCP-level
 * options ({@code TCP_NODELAY}, {@code SO_SNDBUF}, ...) are accepted and reported back but have no effect on an
 * RDMA connection. The default allocator is the event loop group's {@link RdmaByteBufAllocator} once the channel is
 * registered (also when another is set, with {@link RdmaChannelOption#REGISTERED_ALLOCATOR}); the default {@link RecvByteBufAllocator} is {@link RdmaRecvByteBufAllocator} (whole messages per
 * read). Not thread-safe beyond what {@link DefaultChannelConfig} offers.
 *
 * <p>Options that size the queue pair or go into the connection's handshake ({@code RECEIVE_QUEUE_DEPTH},
 * {@code RECEIVE_BUFFER_SIZE}, {@code SEND_QUEUE_DEPTH}, {@code SIGNAL_INTERVAL}, {@code MAX_MESSAGE_SIZE},
 * {@code INLINE_THRESHOLD}) can only be set until the channel creates its queue pair (as it connects, or is accepted);
 * later, setting one throws {@link IllegalStateException} naming the option, rather than being accepted and ignored.
 * The others take effect at once: {@code BUSY_POLL_BUDGET_NANOS} at the loop's next wake-up,
 * {@code SEND_COMPLETION_POLL_NANOS} and {@code RENDEZVOUS_THRESHOLD} from the next write.
 */
public final class RdmaChannelConfig extends DefaultChannelConfig implements SocketChannelConfig {
    private final RdmaSocketChannel channel;
    private volatile boolean allowHalfClosure;
    private volatile boolean allocatorSet;
    private volatile boolean registeredAllocator;
    private final SocketLevelOptions socketOptions = new SocketLevelOptions(Map.of(
            ChannelOption.SO_RCVBUF, 64 * 1024, ChannelOption.SO_SNDBUF, 64 * 1024, ChannelOption.TCP_NODELAY, true,
            ChannelOption.SO_KEEPALIVE, false, ChannelOption.SO_REUSEADDR, false, ChannelOption.SO_LINGER, -1,
            ChannelOption.IP_TOS, 0));

    private volatile int receiveQueueDepth = ConnectionConfig.DEFAULT.receiveQueueDepth();
    private volatile int rdmaReceiveBufferSize = ConnectionConfig.DEFAULT.receiveBufferSize();
    /** The largest {@link RdmaChannelOption#SEND_QUEUE_DEPTH}: the channel sizes arrays by it per connection. */
    static final int MAX_SEND_QUEUE_DEPTH = 1 << 16;
    /**
     * The default {@link RdmaChannelOption#SEND_COMPLETION_POLL_NANOS}: a same-host round trip through the software
     * provider with the peer's loop asleep (its wake-up included) takes about 30-50 us on a loaded 2-core machine; a
     * device's acknowledgement comes within a few microseconds.
     */
    static final long DEFAULT_SEND_COMPLETION_POLL_NANOS = 50_000;
    /** Polling longer than this after each write is busy polling: that is what BUSY_POLL_BUDGET_NANOS is for. */
    static final long MAX_SEND_COMPLETION_POLL_NANOS = 1_000_000;
    private volatile int sendQueueDepth = ConnectionConfig.DEFAULT.sendQueueDepth();
    private volatile int inlineThreshold = 256;
    private volatile int rendezvousThreshold = ConnectionConfig.DEFAULT.rendezvousThreshold();
    private volatile int maxMessageSize = ConnectionConfig.DEFAULT.maxMessageSize();
    private volatile int signalInterval = ConnectionConfig.DEFAULT.signalInterval();
    private volatile long busyPollBudgetNanos;
    private volatile long sendCompletionPollNanos = DEFAULT_SEND_COMPLETION_POLL_NANOS;
    /** Set once {@link #connectionConfig} took the connection's parameters: the queue pair is being sized by them. */
    private boolean connectionParametersTaken;
    private final Object connectionParametersLock = new Object();

    RdmaChannelConfig(RdmaSocketChannel channel) {
        super(channel, new RdmaRecvByteBufAllocator());
        this.channel = channel;
    }

    @Override
    public Map<ChannelOption<?>, Object> getOptions() {
        return getOptions(socketOptions.addTo(super.getOptions()), ChannelOption.ALLOW_HALF_CLOSURE,
                RdmaChannelOption.RECEIVE_QUEUE_DEPTH, RdmaChannelOption.RECEIVE_BUFFER_SIZE,
                RdmaChannelOption.SEND_QUEUE_DEPTH, RdmaChannelOption.INLINE_THRESHOLD,
                RdmaChannelOption.RENDEZVOUS_THRESHOLD, RdmaChannelOption.MAX_MESSAGE_SIZE,
                RdmaChannelOption.SIGNAL_INTERVAL,
                RdmaChannelOption.BUSY_POLL_BUDGET_NANOS, RdmaChannelOption.SEND_COMPLETION_POLL_NANOS,
                RdmaChannelOption.REGISTERED_ALLOCATOR);
    }

    @SuppressWarnings("unchecked")
    @Override
    public <T> T getOption(ChannelOption<T> option) {
        T socketOption = socketOptions.get(option);
        if (socketOption != null) {
            return socketOption;
        }
        if (option == ChannelOption.ALLOW_HALF_CLOSURE) {
            return (T) Boolean.valueOf(isAllowHalfClosure());
        }
        if (option == RdmaChannelOption.RECEIVE_QUEUE_DEPTH) {
            return (T) Integer.valueOf(receiveQueueDepth);
        }
        if (option == RdmaChannelOption.RECEIVE_BUFFER_SIZE) {
            return (T) Integer.valueOf(rdmaReceiveBufferSize);
        }
        if (option == RdmaChannelOption.SEND_QUEUE_DEPTH) {
            return (T) Integer.valueOf(sendQueueDepth);
        }
        if (option == RdmaChannelOption.INLINE_THRESHOLD) {
            return (T) Integer.valueOf(inlineThreshold);
        }
        if (option == RdmaChannelOption.RENDEZVOUS_THRESHOLD) {
            return (T) Integer.valueOf(rendezvousThreshold);
        }
        if (option == RdmaChannelOption.MAX_MESSAGE_SIZE) {
            return (T) Integer.valueOf(maxMessageSize);
        }
        if (option == RdmaChannelOption.SIGNAL_INTERVAL) {
            return (T) Integer.valueOf(signalInterval);
        }
        if (option == RdmaChannelOption.BUSY_POLL_BUDGET_NANOS) {
            return (T) Long.valueOf(busyPollBudgetNanos);
        }
        if (option == RdmaChannelOption.SEND_COMPLETION_POLL_NANOS) {
            return (T) Long.valueOf(sendCompletionPollNanos);
        }
        if (option == RdmaChannelOption.REGISTERED_ALLOCATOR) {
            return (T) Boolean.valueOf(registeredAllocator);
        }
        return super.getOption(option);
    }

    @Override
    public <T> boolean setOption(ChannelOption<T> option, T value) {
        validate(option, value);
        if (socketOptions.set(option, value)) {
            return true;
        }
        if (isConnectionParameter(option)) {
            // connectionConfig() takes the same lock: a value set from another thread is either taken or refused.
            synchronized (connectionParametersLock) {
                if (connectionParametersTaken) {
                    throw new IllegalStateException(option.name() + " can only be set before the channel creates its "
                            + "queue pair (it sizes the queue pair or goes into the connection's handshake); channel "
                            + channel + " already has one: set it on the Bootstrap, or as a childOption of the "
                            + "ServerBootstrap");
                }
                return setOption0(option, value);
            }
        }
        return setOption0(option, value);
    }

    private <T> boolean setOption0(ChannelOption<T> option, T value) {
        if (option == ChannelOption.ALLOW_HALF_CLOSURE) {
            setAllowHalfClosure((Boolean) value);
        } else if (option == RdmaChannelOption.RECEIVE_QUEUE_DEPTH) {
            // The control buffers are posted too, and the whole receive queue must fit the header's frame count.
            receiveQueueDepth = checkRange("RECEIVE_QUEUE_DEPTH", (Integer) value, 1,
                    Handshake.MAX_RECEIVE_QUEUE_DEPTH - RdmaChannelSetup.CONTROL_CREDITS);
        } else if (option == RdmaChannelOption.RECEIVE_BUFFER_SIZE) {
            rdmaReceiveBufferSize = checkRange("RECEIVE_BUFFER_SIZE", (Integer) value,
                    Handshake.MIN_RECEIVE_BUFFER_SIZE, Handshake.MAX_RECEIVE_BUFFER_SIZE);
        } else if (option == RdmaChannelOption.SEND_QUEUE_DEPTH) {
            int depth = (Integer) value;
            if (depth < 8 || depth > MAX_SEND_QUEUE_DEPTH || Integer.bitCount(depth) != 1) {
                throw new IllegalArgumentException("SEND_QUEUE_DEPTH: " + depth + " (expected: a power of 2, 8-"
                        + MAX_SEND_QUEUE_DEPTH + "; a device with fewer work requests per queue pair caps it)");
            }
            sendQueueDepth = depth;
        } else if (option == RdmaChannelOption.INLINE_THRESHOLD) {
            inlineThreshold = checkRange("INLINE_THRESHOLD", (Integer) value, 0, 1 << 16);
        } else if (option == RdmaChannelOption.RENDEZVOUS_THRESHOLD) {
            rendezvousThreshold = checkRange("RENDEZVOUS_THRESHOLD", (Integer) value, 1, Integer.MAX_VALUE);
        } else if (option == RdmaChannelOption.MAX_MESSAGE_SIZE) {
            maxMessageSize = checkRange("MAX_MESSAGE_SIZE", (Integer) value, Handshake.MIN_MAX_MESSAGE_SIZE,
                    Integer.MAX_VALUE);
        } else if (option == RdmaChannelOption.SIGNAL_INTERVAL) {
            signalInterval = checkRange("SIGNAL_INTERVAL", (Integer) value, 1, 1 << 15);
        } else if (option == RdmaChannelOption.BUSY_POLL_BUDGET_NANOS) {
            long budget = (Long) value;
            if (budget < 0) {
                throw new IllegalArgumentException("BUSY_POLL_BUDGET_NANOS: " + budget + " (expected: >= 0)");
            }
            busyPollBudgetNanos = budget;
            channel.busyPollBudgetChanged();
        } else if (option == RdmaChannelOption.SEND_COMPLETION_POLL_NANOS) {
            long window = (Long) value;
            if (window < 0 || window > MAX_SEND_COMPLETION_POLL_NANOS) {
                throw new IllegalArgumentException("SEND_COMPLETION_POLL_NANOS: " + window + " (expected: 0.."
                        + MAX_SEND_COMPLETION_POLL_NANOS + "; for longer polling use BUSY_POLL_BUDGET_NANOS)");
            }
            sendCompletionPollNanos = window;
        } else if (option == RdmaChannelOption.REGISTERED_ALLOCATOR) {
            registeredAllocator = (Boolean) value;
        } else {
            return super.setOption(option, value);
        }
        return true;
    }

    private static boolean isConnectionParameter(ChannelOption<?> option) {
        return option == RdmaChannelOption.RECEIVE_QUEUE_DEPTH || option == RdmaChannelOption.RECEIVE_BUFFER_SIZE
                || option == RdmaChannelOption.SEND_QUEUE_DEPTH || option == RdmaChannelOption.SIGNAL_INTERVAL
                || option == RdmaChannelOption.MAX_MESSAGE_SIZE || option == RdmaChannelOption.INLINE_THRESHOLD;
    }

    private static int checkRange(String name, int value, int min, int max) {
        if (value < min || value > max) {
            throw new IllegalArgumentException(name + ": " + value + " (expected: " + min + ".." + max + ")");
        }
        return value;
    }

    /**
     * The connection parameters these options describe, the send queue depth capped at {@code deviceSendDepth} (a
     * power of two) and the signal interval fitted to it.
     */
    ConnectionConfig connectionConfig(int deviceSendDepth) {
        synchronized (connectionParametersLock) {
            connectionParametersTaken = true;
            int depth = Math.min(sendQueueDepth, deviceSendDepth);
            return new ConnectionConfig(rdmaReceiveBufferSize, receiveQueueDepth, 8, depth,
                    Math.max(1, Math.min(signalInterval, depth / 2)), rendezvousThreshold, maxMessageSize);
        }
    }

    int inlineThreshold() {
        return inlineThreshold;
    }

    int maxMessageSize() {
        return maxMessageSize;
    }

    int rendezvousThreshold() {
        return rendezvousThreshold;
    }

    long busyPollBudgetNanos() {
        return busyPollBudgetNanos;
    }

    long sendCompletionPollNanos() {
        return sendCompletionPollNanos;
    }

    @Override
    public ByteBufAllocator getAllocator() {
        // The order of ALLOCATOR and REGISTERED_ALLOCATOR does not matter: frameworks set options in their own order.
        if (!allocatorSet || registeredAllocator) {
            RdmaByteBufAllocator registered = channel.registeredAllocator();
            if (registered != null) {
                return registered;
            }
        }
        return super.getAllocator();
    }

    @Override
    public RdmaChannelConfig setAllocator(ByteBufAllocator allocator) {
        super.setAllocator(allocator);
        allocatorSet = true;
        return this;
    }

    @Override
    public int getReceiveBufferSize() {
        return socketOptions.get(ChannelOption.SO_RCVBUF);
    }

    @Override
    public int getSendBufferSize() {
        return socketOptions.get(ChannelOption.SO_SNDBUF);
    }

    @Override
    public int getSoLinger() {
        return socketOptions.get(ChannelOption.SO_LINGER);
    }

    @Override
    public int getTrafficClass() {
        return socketOptions.get(ChannelOption.IP_TOS);
    }

    @Override
    public boolean isKeepAlive() {
        return socketOptions.get(ChannelOption.SO_KEEPALIVE);
    }

    @Override
    public boolean isReuseAddress() {
        return socketOptions.get(ChannelOption.SO_REUSEADDR);
    }

    @Override
    public boolean isTcpNoDelay() {
        return socketOptions.get(ChannelOption.TCP_NODELAY);
    }

    @Override
    public RdmaChannelConfig setKeepAlive(boolean keepAlive) {
        socketOptions.set(ChannelOption.SO_KEEPALIVE, keepAlive);
        return this;
    }

    @Override
    public RdmaChannelConfig setPerformancePreferences(int connectionTime, int latency, int bandwidth) {
        return this;
    }

    @Override
    public RdmaChannelConfig setReceiveBufferSize(int receiveBufferSize) {
        socketOptions.set(ChannelOption.SO_RCVBUF, receiveBufferSize);
        return this;
    }

    @Override
    public RdmaChannelConfig setReuseAddress(boolean reuseAddress) {
        socketOptions.set(ChannelOption.SO_REUSEADDR, reuseAddress);
        return this;
    }

    @Override
    public RdmaChannelConfig setSendBufferSize(int sendBufferSize) {
        socketOptions.set(ChannelOption.SO_SNDBUF, sendBufferSize);
        return this;
    }

    @Override
    public RdmaChannelConfig setSoLinger(int soLinger) {
        socketOptions.set(ChannelOption.SO_LINGER, soLinger);
        return this;
    }

    @Override
    public RdmaChannelConfig setTcpNoDelay(boolean tcpNoDelay) {
        socketOptions.set(ChannelOption.TCP_NODELAY, tcpNoDelay);
        return this;
    }

    @Override
    public RdmaChannelConfig setTrafficClass(int trafficClass) {
        socketOptions.set(ChannelOption.IP_TOS, trafficClass);
        return this;
    }

    @Override
    public boolean isAllowHalfClosure() {
        return allowHalfClosure;
    }

    @Override
    public RdmaChannelConfig setAllowHalfClosure(boolean allowHalfClosure) {
        this.allowHalfClosure = allowHalfClosure;
        return this;
    }

    @Override
    public RdmaChannelConfig setConnectTimeoutMillis(int connectTimeoutMillis) {
        super.setConnectTimeoutMillis(connectTimeoutMillis);
        return this;
    }

    @Override
    @Deprecated
    public RdmaChannelConfig setMaxMessagesPerRead(int maxMessagesPerRead) {
        super.setMaxMessagesPerRead(maxMessagesPerRead);
        return this;
    }

    @Override
    public RdmaChannelConfig setWriteSpinCount(int writeSpinCount) {
        super.setWriteSpinCount(writeSpinCount);
        return this;
    }

    @Override
    public RdmaChannelConfig setRecvByteBufAllocator(RecvByteBufAllocator allocator) {
        super.setRecvByteBufAllocator(allocator);
        return this;
    }

    @Override
    public RdmaChannelConfig setAutoRead(boolean autoRead) {
        super.setAutoRead(autoRead);
        return this;
    }

    @Override
    public RdmaChannelConfig setAutoClose(boolean autoClose) {
        super.setAutoClose(autoClose);
        return this;
    }

    @Override
    public RdmaChannelConfig setWriteBufferHighWaterMark(int writeBufferHighWaterMark) {
        super.setWriteBufferHighWaterMark(writeBufferHighWaterMark);
        return this;
    }

    @Override
    public RdmaChannelConfig setWriteBufferLowWaterMark(int writeBufferLowWaterMark) {
        super.setWriteBufferLowWaterMark(writeBufferLowWaterMark);
        return this;
    }

    @Override
    public RdmaChannelConfig setWriteBufferWaterMark(WriteBufferWaterMark writeBufferWaterMark) {
        super.setWriteBufferWaterMark(writeBufferWaterMark);
        return this;
    }

    @Override
    public RdmaChannelConfig setMessageSizeEstimator(MessageSizeEstimator estimator) {
        super.setMessageSizeEstimator(estimator);
        return this;
    }

    @Override
    protected void autoReadCleared() {
        channel.clearReadPending();
    }
}
