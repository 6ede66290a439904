package io.rdmabridge.netty;

import io.netty.buffer.ByteBufAllocator;
import io.netty.channel.ChannelOption;
import io.netty.channel.DefaultChannelConfig;
import io.netty.channel.MessageSizeEstimator;
import io.netty.channel.RecvByteBufAllocator;
import io.netty.channel.ServerChannelRecvByteBufAllocator;
import io.netty.channel.WriteBufferWaterMark;
import io.netty.channel.socket.ServerSocketChannelConfig;
import io.netty.util.NetUtil;

import java.util.Map;

/**
 * Configuration of an {@link RdmaServerSocketChannel}. {@code SO_BACKLOG} bounds the connection requests waiting to
 * be accepted together with the accepted connections whose handshake has not completed (each holds a queue pair and
 * its receive buffers); {@code SO_RCVBUF} and {@code SO_REUSEADDR} are accepted without effect. Options of the accepted
 * channels are {@code childOption}s ({@link RdmaChannelConfig}). Options are volatile: set from any
 * thread, read on the listener's event loop.
 */
final class RdmaServerChannelConfig extends DefaultChannelConfig implements ServerSocketChannelConfig {
    private volatile int backlog = NetUtil.SOMAXCONN;
    private final SocketLevelOptions socketOptions = new SocketLevelOptions(Map.of(
            ChannelOption.SO_RCVBUF, 64 * 1024, ChannelOption.SO_REUSEADDR, true));

    private final RdmaServerSocketChannel serverChannel;

    RdmaServerChannelConfig(RdmaServerSocketChannel channel) {
        // As Netty's NIO and epoll server channels: up to MAX_MESSAGES_PER_READ accepted channels per read.
        super(channel, new ServerChannelRecvByteBufAllocator());
        serverChannel = channel;
    }

    /** As Netty's own server channels do: no accepted channel is handed up until the next read. */
    @Override
    protected void autoReadCleared() {
        serverChannel.clearReadPending();
    }

    @Override
    public Map<ChannelOption<?>, Object> getOptions() {
        return getOptions(socketOptions.addTo(super.getOptions()), ChannelOption.SO_BACKLOG);
    }

    @SuppressWarnings("unchecked")
    @Override
    public <T> T getOption(ChannelOption<T> option) {
        T socketOption = socketOptions.get(option);
        if (socketOption != null) {
            return socketOption;
        }
        if (option == ChannelOption.SO_BACKLOG) {
            return (T) Integer.valueOf(backlog);
        }
        return super.getOption(option);
    }

    @Override
    public <T> boolean setOption(ChannelOption<T> option, T value) {
        validate(option, value);
        if (socketOptions.set(option, value)) {
            return true;
        }
        if (option == ChannelOption.SO_BACKLOG) {
            setBacklog((Integer) value);
        } else {
            return super.setOption(option, value);
        }
        return true;
    }

    @Override
    public int getBacklog() {
        return backlog;
    }

    @Override
    public RdmaServerChannelConfig setBacklog(int backlog) {
        if (backlog < 0) {
            throw new IllegalArgumentException("backlog: " + backlog + " (expected: >= 0)");
        }
        this.backlog = backlog == 0 ? NetUtil.SOMAXCONN : backlog;
        return this;
    }

    @Override
    public boolean isReuseAddress() {
        return socketOptions.get(ChannelOption.SO_REUSEADDR);
    }

    @Override
    public RdmaServerChannelConfig setReuseAddress(boolean reuseAddress) {
        socketOptions.set(ChannelOption.SO_REUSEADDR, reuseAddress);
        return this;
    }

    @Override
    public int getReceiveBufferSize() {
        return socketOptions.get(ChannelOption.SO_RCVBUF);
    }

    @Override
    public RdmaServerChannelConfig setReceiveBufferSize(int receiveBufferSize) {
        socketOptions.set(ChannelOption.SO_RCVBUF, receiveBufferSize);
        return this;
    }

    @Override
    public RdmaServerChannelConfig setPerformancePreferences(int connectionTime, int latency, int bandwidth) {
        return this;
    }

    @Override
    public RdmaServerChannelConfig setConnectTimeoutMillis(int connectTimeoutMillis) {
        super.setConnectTimeoutMillis(connectTimeoutMillis);
        return this;
    }

    @Override
    @Deprecated
    public RdmaServerChannelConfig setMaxMessagesPerRead(int maxMessagesPerRead) {
        super.setMaxMessagesPerRead(maxMessagesPerRead);
        return this;
    }

    @Override
    public RdmaServerChannelConfig setWriteSpinCount(int writeSpinCount) {
        super.setWriteSpinCount(writeSpinCount);
        return this;
    }

    @Override
    public RdmaServerChannelConfig setAllocator(ByteBufAllocator allocator) {
        super.setAllocator(allocator);
        return this;
    }

    @Override
    public RdmaServerChannelConfig setRecvByteBufAllocator(RecvByteBufAllocator allocator) {
        super.setRecvByteBufAllocator(allocator);
        return this;
    }

    @Override
    public RdmaServerChannelConfig setAutoRead(boolean autoRead) {
        super.setAutoRead(autoRead);
        return this;
    }

    @Override
    public RdmaServerChannelConfig setWriteBufferHighWaterMark(int writeBufferHighWaterMark) {
        super.setWriteBufferHighWaterMark(writeBufferHighWaterMark);
        return this;
    }

    @Override
    public RdmaServerChannelConfig setWriteBufferLowWaterMark(int writeBufferLowWaterMark) {
        super.setWriteBufferLowWaterMark(writeBufferLowWaterMark);
        return this;
    }

    @Override
    public RdmaServerChannelConfig setWriteBufferWaterMark(WriteBufferWaterMark writeBufferWaterMark) {
        super.setWriteBufferWaterMark(writeBufferWaterMark);
        return this;
    }

    @Override
    public RdmaServerChannelConfig setMessageSizeEstimator(MessageSizeEstimator estimator) {
        super.setMessageSizeEstimator(estimator);
        return this;
    }
}
