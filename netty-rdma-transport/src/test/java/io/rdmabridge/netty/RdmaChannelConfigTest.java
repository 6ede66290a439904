package io.rdmabridge.netty;

import io.netty.channel.ChannelOption;
import io.netty.channel.socket.ServerSocketChannelConfig;
import io.netty.util.NetUtil;
import org.junit.jupiter.api.Test;

import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The socket-level options both RDMA channel configs accept: defaults, round trips, and the ones they refuse. */
class RdmaChannelConfigTest {

    @Test
    void shouldReportSocketOptionDefaults() {
        RdmaChannelConfig config = new RdmaSocketChannel().config();
        Map<ChannelOption<?>, Object> options = config.getOptions();
        assertEquals(64 * 1024, options.get(ChannelOption.SO_RCVBUF));
        assertEquals(64 * 1024, options.get(ChannelOption.SO_SNDBUF));
        assertEquals(true, options.get(ChannelOption.TCP_NODELAY));
        assertEquals(false, options.get(ChannelOption.SO_KEEPALIVE));
        assertEquals(false, options.get(ChannelOption.SO_REUSEADDR));
        assertEquals(-1, options.get(ChannelOption.SO_LINGER));
        assertEquals(0, options.get(ChannelOption.IP_TOS));
        assertEquals(false, options.get(ChannelOption.ALLOW_HALF_CLOSURE));
        assertTrue(options.containsKey(RdmaChannelOption.MAX_MESSAGE_SIZE));

        ServerSocketChannelConfig server = new RdmaServerSocketChannel().config();
        Map<ChannelOption<?>, Object> serverOptions = server.getOptions();
        assertEquals(64 * 1024, serverOptions.get(ChannelOption.SO_RCVBUF));
        assertEquals(true, serverOptions.get(ChannelOption.SO_REUSEADDR));
        assertEquals(NetUtil.SOMAXCONN, serverOptions.get(ChannelOption.SO_BACKLOG));
        assertFalse(serverOptions.containsKey(ChannelOption.SO_SNDBUF));
        assertFalse(serverOptions.containsKey(ChannelOption.TCP_NODELAY));
    }

    @Test
    void shouldRoundTripSocketOptionsThroughSetOptionAndSetters() {
        RdmaChannelConfig config = new RdmaSocketChannel().config();
        assertTrue(config.setOption(ChannelOption.SO_RCVBUF, 1000));
        assertTrue(config.setOption(ChannelOption.SO_SNDBUF, 2000));
        assertTrue(config.setOption(ChannelOption.TCP_NODELAY, false));
        assertTrue(config.setOption(ChannelOption.SO_KEEPALIVE, true));
        assertTrue(config.setOption(ChannelOption.SO_REUSEADDR, true));
        assertTrue(config.setOption(ChannelOption.SO_LINGER, 0));
        assertTrue(config.setOption(ChannelOption.IP_TOS, 0x10));
        assertEquals(1000, config.getReceiveBufferSize());
        assertEquals(2000, config.getSendBufferSize());
        assertFalse(config.isTcpNoDelay());
        assertTrue(config.isKeepAlive());
        assertTrue(config.isReuseAddress());
        assertEquals(0, config.getSoLinger());
        assertEquals(0x10, config.getTrafficClass());

        assertSame(config, config.setReceiveBufferSize(3000).setSoLinger(5).setTcpNoDelay(true));
        assertEquals(3000, config.getOption(ChannelOption.SO_RCVBUF));
        assertEquals(5, config.getOption(ChannelOption.SO_LINGER));
        assertEquals(true, config.getOption(ChannelOption.TCP_NODELAY));

        ServerSocketChannelConfig server = new RdmaServerSocketChannel().config();
        assertTrue(server.setOption(ChannelOption.SO_RCVBUF, 4000));
        assertTrue(server.setOption(ChannelOption.SO_REUSEADDR, false));
        assertTrue(server.setOption(ChannelOption.SO_BACKLOG, 7));
        assertEquals(4000, server.getReceiveBufferSize());
        assertFalse(server.isReuseAddress());
        assertEquals(7, server.getBacklog());
        server.setReceiveBufferSize(5000).setReuseAddress(true);
        assertEquals(5000, server.getOption(ChannelOption.SO_RCVBUF));
        assertEquals(true, server.getOption(ChannelOption.SO_REUSEADDR));
    }

    @Test
    void shouldLeaveOptionsItDoesNotTakeToNetty() {
        ServerSocketChannelConfig server = new RdmaServerSocketChannel().config();
        assertFalse(server.setOption(ChannelOption.SO_SNDBUF, 1000));
        assertFalse(server.setOption(ChannelOption.TCP_NODELAY, true));
        assertNull(server.getOption(ChannelOption.SO_LINGER));

        RdmaChannelConfig config = new RdmaSocketChannel().config();
        assertFalse(config.setOption(ChannelOption.SO_BACKLOG, 10));
        assertNull(config.getOption(ChannelOption.SO_BACKLOG));
    }

    /** As Netty's NIO and epoll server channels: up to MAX_MESSAGES_PER_READ accepted channels per read. */
    @Test
    void shouldAcceptWithNettysServerChannelAllocatorByDefault() {
        ServerSocketChannelConfig server = new RdmaServerSocketChannel().config();
        assertTrue(server.getRecvByteBufAllocator() instanceof io.netty.channel.ServerChannelRecvByteBufAllocator,
                () -> String.valueOf(server.getRecvByteBufAllocator()));
        assertEquals(16, server.getMaxMessagesPerRead(), "Netty's default for server channels");
    }

    /** The channel sizes arrays by the depth per connection: a huge power of two is refused, naming the range. */
    @Test
    void shouldBoundTheSendQueueDepth() {
        RdmaChannelConfig config = new RdmaSocketChannel().config();
        assertTrue(config.setOption(RdmaChannelOption.SEND_QUEUE_DEPTH, 1 << 16));
        IllegalArgumentException huge = assertThrows(IllegalArgumentException.class,
                () -> config.setOption(RdmaChannelOption.SEND_QUEUE_DEPTH, 1 << 30));
        assertEquals("SEND_QUEUE_DEPTH: 1073741824 (expected: a power of 2, 8-65536; a device with fewer work "
                + "requests per queue pair caps it)", huge.getMessage());
        assertEquals(1 << 16, config.getOption(RdmaChannelOption.SEND_QUEUE_DEPTH), "unchanged by the refusal");
        assertEquals(1 << 10, config.connectionConfig(1 << 10).sendQueueDepth(), "capped by the device");
    }

    @Test
    void shouldPollForASendsCompletionFor50MicrosecondsByDefaultAndAtMostOneMillisecond() {
        RdmaChannelConfig config = new RdmaSocketChannel().config();
        assertEquals(50_000L, config.getOption(RdmaChannelOption.SEND_COMPLETION_POLL_NANOS));
        assertTrue(config.getOptions().containsKey(RdmaChannelOption.SEND_COMPLETION_POLL_NANOS), "listed option");
        assertTrue(config.setOption(RdmaChannelOption.SEND_COMPLETION_POLL_NANOS, 0L));
        assertEquals(0L, config.sendCompletionPollNanos());
        IllegalArgumentException busy = assertThrows(IllegalArgumentException.class,
                () -> config.setOption(RdmaChannelOption.SEND_COMPLETION_POLL_NANOS, 1_000_001L));
        assertEquals("SEND_COMPLETION_POLL_NANOS: 1000001 (expected: 0..1000000; for longer polling use "
                + "BUSY_POLL_BUDGET_NANOS)", busy.getMessage());
        assertThrows(IllegalArgumentException.class,
                () -> config.setOption(RdmaChannelOption.SEND_COMPLETION_POLL_NANOS, -1L));
        assertEquals(0L, config.sendCompletionPollNanos(), "unchanged by the refusals");
    }
}
