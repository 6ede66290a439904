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
 * registered; the default {@link RecvByteBufAllocator} is {@link RdmaRecvByteBufAllocator} (whole messages per
 * read). Not thread-safe beyond what {@link DefaultChannelConfig} offers; set options before connecting.
 */
public final class RdmaChannelConfig extends DefaultChannelConfig implements SocketChannelConfig {
    private final RdmaSocketChannel channel;
    private volatile boolean allowHalfClosure;
    private volatile boolean allocatorSet;
    private volatile boolean tcpNoDelay = true;
    private volatile boolean keepAlive;
    private volatile boolean reuseAddress;
    private volatile int soLinger = -1;
    private volatile int sendBufferSize = 64 * 1024;
    private volatile int receiveBufferSize = 64 * 1024;
    private volatile int trafficClass;

    private volatile int receiveQueueDepth = ConnectionConfig.DEFAULT.receiveQueueDepth();
    private volatile int rdmaReceiveBufferSize = ConnectionConfig.DEFAULT.receiveBufferSize();
    private volatile int sendQueueDepth = ConnectionConfig.DEFAULT.sendQueueDepth();
    private volatile int inlineThreshold = 256;
    private volatile int rendezvousThreshold = ConnectionConfig.DEFAULT.rendezvousThreshold();
    private volatile int maxMessageSize = ConnectionConfig.DEFAULT.maxMessageSize();
    private volatile int signalInterval = ConnectionConfig.DEFAULT.signalInterval();
    private volatile long busyPollBudgetNanos;

    RdmaChannelConfig(RdmaSocketChannel channel) {
        super(channel, new RdmaRecvByteBufAllocator());
        this.channel = channel;
    }

    @Override
    public Map<ChannelOption<?>, Object> getOptions() {
        return getOptions(super.getOptions(), ChannelOption.SO_RCVBUF, ChannelOption.SO_SNDBUF,
                ChannelOption.TCP_NODELAY, ChannelOption.SO_KEEPALIVE, ChannelOption.SO_REUSEADDR,
                ChannelOption.SO_LINGER, ChannelOption.IP_TOS, ChannelOption.ALLOW_HALF_CLOSURE,
                RdmaChannelOption.RECEIVE_QUEUE_DEPTH, RdmaChannelOption.RECEIVE_BUFFER_SIZE,
                RdmaChannelOption.SEND_QUEUE_DEPTH, RdmaChannelOption.INLINE_THRESHOLD,
                RdmaChannelOption.RENDEZVOUS_THRESHOLD, RdmaChannelOption.MAX_MESSAGE_SIZE,
                RdmaChannelOption.SIGNAL_INTERVAL,
                RdmaChannelOption.BUSY_POLL_BUDGET_NANOS);
    }

    @SuppressWarnings("unchecked")
    @Override
    public <T> T getOption(ChannelOption<T> option) {
        if (option == ChannelOption.SO_RCVBUF) {
            return (T) Integer.valueOf(getReceiveBufferSize());
        }
        if (option == ChannelOption.SO_SNDBUF) {
            return (T) Integer.valueOf(getSendBufferSize());
        }
        if (option == ChannelOption.TCP_NODELAY) {
            return (T) Boolean.valueOf(isTcpNoDelay());
        }
        if (option == ChannelOption.SO_KEEPALIVE) {
            return (T) Boolean.valueOf(isKeepAlive());
        }
        if (option == ChannelOption.SO_REUSEADDR) {
            return (T) Boolean.valueOf(isReuseAddress());
        }
        if (option == ChannelOption.SO_LINGER) {
            return (T) Integer.valueOf(getSoLinger());
        }
        if (option == ChannelOption.IP_TOS) {
            return (T) Integer.valueOf(getTrafficClass());
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
        return super.getOption(option);
    }

    @Override
    public <T> boolean setOption(ChannelOption<T> option, T value) {
        validate(option, value);
        if (option == ChannelOption.SO_RCVBUF) {
            setReceiveBufferSize((Integer) value);
        } else if (option == ChannelOption.SO_SNDBUF) {
            setSendBufferSize((Integer) value);
        } else if (option == ChannelOption.TCP_NODELAY) {
            setTcpNoDelay((Boolean) value);
        } else if (option == ChannelOption.SO_KEEPALIVE) {
            setKeepAlive((Boolean) value);
        } else if (option == ChannelOption.SO_REUSEADDR) {
            setReuseAddress((Boolean) value);
        } else if (option == ChannelOption.SO_LINGER) {
            setSoLinger((Integer) value);
        } else if (option == ChannelOption.IP_TOS) {
            setTrafficClass((Integer) value);
        } else if (option == ChannelOption.ALLOW_HALF_CLOSURE) {
            setAllowHalfClosure((Boolean) value);
        } else if (option == RdmaChannelOption.RECEIVE_QUEUE_DEPTH) {
            receiveQueueDepth = checkRange("RECEIVE_QUEUE_DEPTH", (Integer) value, 1, 0xFFFF);
        } else if (option == RdmaChannelOption.RECEIVE_BUFFER_SIZE) {
            rdmaReceiveBufferSize = checkRange("RECEIVE_BUFFER_SIZE", (Integer) value,
                    Handshake.MIN_RECEIVE_BUFFER_SIZE, Handshake.MAX_RECEIVE_BUFFER_SIZE);
        } else if (option == RdmaChannelOption.SEND_QUEUE_DEPTH) {
            int depth = (Integer) value;
            if (depth < 8 || Integer.bitCount(depth) != 1) {
                throw new IllegalArgumentException("SEND_QUEUE_DEPTH: " + depth + " (expected: a power of 2, >= 8)");
            }
            sendQueueDepth = depth;
        } else if (option == RdmaChannelOption.INLINE_THRESHOLD) {
            inlineThreshold = checkRange("INLINE_THRESHOLD", (Integer) value, 0, 1 << 16);
        } else if (option == RdmaChannelOption.RENDEZVOUS_THRESHOLD) {
            rendezvousThreshold = checkRange("RENDEZVOUS_THRESHOLD", (Integer) value, 1, Integer.MAX_VALUE);
        } else if (option == RdmaChannelOption.MAX_MESSAGE_SIZE) {
            maxMessageSize = checkRange("MAX_MESSAGE_SIZE", (Integer) value, 4096, Integer.MAX_VALUE);
        } else if (option == RdmaChannelOption.SIGNAL_INTERVAL) {
            signalInterval = checkRange("SIGNAL_INTERVAL", (Integer) value, 1, 1 << 15);
        } else if (option == RdmaChannelOption.BUSY_POLL_BUDGET_NANOS) {
            long budget = (Long) value;
            if (budget < 0) {
                throw new IllegalArgumentException("BUSY_POLL_BUDGET_NANOS: " + budget + " (expected: >= 0)");
            }
            busyPollBudgetNanos = budget;
        } else {
            return super.setOption(option, value);
        }
        return true;
    }

    private static int checkRange(String name, int value, int min, int max) {
        if (value < min || value > max) {
            throw new IllegalArgumentException(name + ": " + value + " (expected: " + min + ".." + max + ")");
        }
        return value;
    }

    /** The connection parameters these options describe; the signal interval is fitted to the send queue. */
    ConnectionConfig connectionConfig() {
        int depth = sendQueueDepth;
        return new ConnectionConfig(rdmaReceiveBufferSize, receiveQueueDepth, 8, depth,
                Math.max(1, Math.min(signalInterval, depth / 2)), rendezvousThreshold, maxMessageSize);
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

    @Override
    public ByteBufAllocator getAllocator() {
        if (!allocatorSet) {
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
        return receiveBufferSize;
    }

    @Override
    public int getSendBufferSize() {
        return sendBufferSize;
    }

    @Override
    public int getSoLinger() {
        return soLinger;
    }

    @Override
    public int getTrafficClass() {
        return trafficClass;
    }

    @Override
    public boolean isKeepAlive() {
        return keepAlive;
    }

    @Override
    public boolean isReuseAddress() {
        return reuseAddress;
    }

    @Override
    public boolean isTcpNoDelay() {
        return tcpNoDelay;
    }

    @Override
    public RdmaChannelConfig setKeepAlive(boolean keepAlive) {
        this.keepAlive = keepAlive;
        return this;
    }

    @Override
    public RdmaChannelConfig setPerformancePreferences(int connectionTime, int latency, int bandwidth) {
        return this;
    }

    @Override
    public RdmaChannelConfig setReceiveBufferSize(int receiveBufferSize) {
        this.receiveBufferSize = receiveBufferSize;
        return this;
    }

    @Override
    public RdmaChannelConfig setReuseAddress(boolean reuseAddress) {
        this.reuseAddress = reuseAddress;
        return this;
    }

    @Override
    public RdmaChannelConfig setSendBufferSize(int sendBufferSize) {
        this.sendBufferSize = sendBufferSize;
        return this;
    }

    @Override
    public RdmaChannelConfig setSoLinger(int soLinger) {
        this.soLinger = soLinger;
        return this;
    }

    @Override
    public RdmaChannelConfig setTcpNoDelay(boolean tcpNoDelay) {
        this.tcpNoDelay = tcpNoDelay;
        return this;
    }

    @Override
    public RdmaChannelConfig setTrafficClass(int trafficClass) {
        this.trafficClass = trafficClass;
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
