package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.channel.ChannelConfig;
import io.netty.channel.DefaultMaxMessagesRecvByteBufAllocator;
import io.netty.channel.RecvByteBufAllocator;
import io.rdmabridge.connection.ConnectionConfig;

/**
 * The default {@link RecvByteBufAllocator} of {@link RdmaSocketChannel}: each read hands up one received message
 * whole, as the buffer it landed in, and a read loop hands up at most {@code maxMessagesPerRead} messages (16 unless
 * set).
 *
 * <p>An RDMA channel does not allocate before it reads: the device has already put the bytes into a registered
 * receive buffer (or a rendezvous READ into a registered buffer). The channel honours {@link Handle#guess()} as the
 * most it may hand up in one read, as a stream socket does, so an allocator that guesses small (Netty's
 * {@code AdaptiveRecvByteBufAllocator} grows to 64 KiB at most) makes it hand a large message up in slices. This
 * one guesses the channel's {@link RdmaChannelOption#MAX_MESSAGE_SIZE}, the largest message a peer may send, so no
 * message is ever cut. {@link Handle#allocate} is not used by the channel; it allocates a buffer of the default
 * size for callers that want one.
 *
 * <p>Thread-safe; each channel gets its own {@link Handle}, used on its event loop only.
 */
public final class RdmaRecvByteBufAllocator extends DefaultMaxMessagesRecvByteBufAllocator {

    /** Reads of up to 16 messages. */
    public RdmaRecvByteBufAllocator() {
        // The channel knows exactly when nothing more has arrived; "maybe more data" guesses are not needed.
        respectMaybeMoreData(false);
    }

    @Override
    public Handle newHandle() {
        return new RdmaHandle();
    }

    private final class RdmaHandle extends MaxMessageHandle {
        private int maxMessageSize = ConnectionConfig.DEFAULT.maxMessageSize();

        @Override
        public void reset(ChannelConfig config) {
            super.reset(config);
            if (config instanceof RdmaChannelConfig) {
                maxMessageSize = ((RdmaChannelConfig) config).maxMessageSize();
            }
        }

        @Override
        public ByteBuf allocate(ByteBufAllocator alloc) {
            return alloc.ioBuffer();
        }

        @Override
        public int guess() {
            return maxMessageSize;
        }
    }
}
