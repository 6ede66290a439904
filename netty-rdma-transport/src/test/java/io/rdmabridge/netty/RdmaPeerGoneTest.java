package io.rdmabridge.netty;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import io.rdmabridge.connection.FrameHeader;
import io.rdmabridge.connection.Handshake;
import io.rdmabridge.verbs.WcStatus;
import org.junit.jupiter.api.Test;

import java.net.InetSocketAddress;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * A peer that goes away while the channel still holds something of it never pins the channel: the channel closes,
 * reports the reset, and its queue pair, completion queue, id and registered memory go back.
 */
class RdmaPeerGoneTest extends AbstractSoftChannelTest {

    @Test
    void shouldCloseWhenThePeerDisconnectsAfterAdvertisingARendezvousThatWasNeverRead() throws Exception {
        ChildRecorder recorder = new ChildRecorder();
        LinkedBlockingQueue<Channel> children = recorder.children;
        LinkedBlockingQueue<Throwable> failures = recorder.failures;
        // autoRead off: the advertisement waits unread, as behind a slow application.
        Channel server = listen(new ServerBootstrap()
                .childOption(ChannelOption.AUTO_READ, false)
                .childHandler(recorder));
        Channel child;
        try (RawVerbsPeer raw = RawVerbsPeer.connect(provider, (InetSocketAddress) server.localAddress())) {
            assertEquals(WcStatus.SUCCESS, raw.sendFrame(FrameHeader.HELLO,
                    new Handshake(4096, 4, 4, 1 << 20).encode()));
            child = children.poll(10, TimeUnit.SECONDS);
            assertNotNull(child, "the server never activated the connection");
            // Acknowledged by the server's queue pair: the advertisement has landed when this returns.
            assertEquals(WcStatus.SUCCESS, raw.sendRendezvous(0x1000, 64 * 1024, 0x1234));
        }
        // The raw peer disconnected without end of stream: the rendezvous can never be read.
        assertTrue(child.closeFuture().await(10, TimeUnit.SECONDS),
                "the channel stayed open after its peer disconnected with an unread rendezvous");
        Throwable reset = failures.poll(10, TimeUnit.SECONDS);
        assertNotNull(reset, "no reset reported");
        assertTrue(reset.getMessage().startsWith("connection reset by peer"), reset.getMessage());
    }

    @Test
    void shouldReleaseEverythingAndRefuseThePeerWhenAcceptingFails() throws Exception {
        LinkedBlockingQueue<Throwable> failures = new LinkedBlockingQueue<>();
        Channel server = listen(new ServerBootstrap().childHandler(new ChannelInboundHandlerAdapter() {
            @Override
            public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
                failures.add(cause);
            }

            @Override
            public boolean isSharable() {
                return true;
            }
        }));
        // The peer is set up; then the accepted channel's receive buffers cannot be registered: accepting fails
        // half-way, after the child exists and has its completion queue.
        try (RawVerbsPeer raw = RawVerbsPeer.attempt(provider, (InetSocketAddress) server.localAddress(),
                () -> provider.faults().failRegistrations(1))) {
            assertEquals(io.rdmabridge.verbs.CmEventType.REJECTED, raw.outcome(), "the peer was not refused");
        } finally {
            provider.faults().reset();
        }
        Throwable cause = failures.poll(10, TimeUnit.SECONDS);
        assertNotNull(cause, "the accepted channel reported nothing");
        assertTrue(cause.getMessage().contains("injected fault"), cause.getMessage());
        // The listener still serves, and the after-test check finds every resource back at zero.
        RdmaSocketChannel good = connect(new io.netty.bootstrap.Bootstrap().handler(new ChannelInboundHandlerAdapter()),
                server);
        assertTrue(good.isActive());
    }
}
