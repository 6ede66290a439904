package io.rdmabridge.netty;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * Options set on a connected channel: those its queue pair and handshake were built from are refused with the cause
 * and the fix, rather than accepted and ignored; the others take effect.
 */
class RdmaChannelOptionsAfterConnectTest extends AbstractSoftChannelTest {

    @Test
    void shouldRefuseTheOptionsOfTheQueuePairAndTheHandshakeOnceConnected() throws Exception {
        RdmaSocketChannel ch = connectToEcho(new CompletableFuture<>());
        RdmaChannelConfig config = ch.config();
        List<ChannelOption<Integer>> fixed = List.of(RdmaChannelOption.RECEIVE_QUEUE_DEPTH,
                RdmaChannelOption.RECEIVE_BUFFER_SIZE, RdmaChannelOption.SEND_QUEUE_DEPTH,
                RdmaChannelOption.SIGNAL_INTERVAL, RdmaChannelOption.MAX_MESSAGE_SIZE,
                RdmaChannelOption.INLINE_THRESHOLD);
        for (ChannelOption<Integer> option : fixed) {
            Integer before = config.getOption(option);
            IllegalStateException e = assertThrows(IllegalStateException.class,
                    () -> config.setOption(option, before), option.name());
            assertTrue(e.getMessage().startsWith(option.name() + " can only be set before the channel creates its "
                    + "queue pair"), e.getMessage());
            assertTrue(e.getMessage().contains("set it on the Bootstrap"), e.getMessage());
            assertEquals(before, config.getOption(option), option.name());
        }

        // The rest apply to what comes next.
        assertTrue(config.setOption(RdmaChannelOption.RENDEZVOUS_THRESHOLD, 1 << 20));
        assertEquals(1 << 20, config.rendezvousThreshold());
        assertTrue(config.setOption(RdmaChannelOption.SEND_COMPLETION_POLL_NANOS, 0L));
        assertEquals(0L, config.sendCompletionPollNanos());
    }

    @Test
    void shouldTakeChildOptionsAndRefuseThemOnceTheAcceptedChannelHasItsQueuePair() throws Exception {
        CompletableFuture<Object> seen = new CompletableFuture<>();
        Channel server = listen(new ServerBootstrap()
                .childOption(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, 7)
                .childHandler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public void channelActive(ChannelHandlerContext ctx) {
                        RdmaChannelConfig config = (RdmaChannelConfig) ctx.channel().config();
                        try {
                            config.setOption(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, 8);
                            seen.complete("accepted after the queue pair was made");
                        } catch (IllegalStateException e) {
                            seen.complete(config.getOption(RdmaChannelOption.RECEIVE_QUEUE_DEPTH));
                        }
                        ctx.fireChannelActive();
                    }
                }));
        connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter()), server);
        // The childOption reached the child (a refused one would only have been logged), and a later change is refused.
        assertEquals(7, seen.get(10, TimeUnit.SECONDS));
    }

    @Test
    void shouldBusyPollForTheBudgetSetAfterConnecting() throws Exception {
        RdmaSocketChannel ch = connectToEcho(new CompletableFuture<>());
        assertEquals(0L, loopBudget(ch));
        ch.config().setOption(RdmaChannelOption.BUSY_POLL_BUDGET_NANOS, 200_000L);
        assertEquals(200_000L, loopBudget(ch), "the loop's budget after the option was set from another thread");
        ch.eventLoop().submit(() -> ch.config().setOption(RdmaChannelOption.BUSY_POLL_BUDGET_NANOS, 0L))
                .get(10, TimeUnit.SECONDS);
        assertEquals(0L, loopBudget(ch), "the loop's budget after the option was set on the loop");
    }

    /** The budget the channel's loop polls for before it sleeps, read on the loop. */
    private static long loopBudget(RdmaSocketChannel ch) throws Exception {
        return ch.eventLoop().submit(() -> ch.handler.busyPollBudgetNanos()).get(10, TimeUnit.SECONDS);
    }
}
