package io.rdmabridge.netty;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Netty's write order on the channel: a write's promise completes before any answer to the write can be read, even
 * when the send's completion arrives after the answer, as on a device that acknowledges lazily (the soft provider
 * holds its send completions back with {@code SoftFaults.delaySendCompletions}); and the memory of such a write is
 * still kept until its completion. {@link RdmaCrossProcessEchoTest} checks the same order across processes, where
 * the soft provider's TCP path itself raises the peer's receive before the sender's completion.
 */
class RdmaWriteOrderTest extends AbstractSoftChannelTest {
    /** Far longer than an in-JVM round trip however loaded the machine: every answer arrives first. */
    private static final long COMPLETION_DELAY_NANOS = TimeUnit.MILLISECONDS.toNanos(20);

    @AfterEach
    void resetFaults() {
        provider.faults().reset();
    }

    @Test
    @Timeout(120)
    void shouldCompleteEveryWritePromiseBeforeItsAnswerIsReadWhenCompletionsLag() throws Exception {
        provider.faults().delaySendCompletions(COMPLETION_DELAY_NANOS);
        Channel server = listen(new ServerBootstrap().childHandler(new Echo()));
        // Eager frames, then rendezvous (the default threshold is 256 KiB): both wait for the peer's count.
        for (int size : new int[] {64, 256 << 10}) {
            WriteOrderClient client = new WriteOrderClient(size, size < 1024 ? 1000 : 100);
            Channel ch = connect(new Bootstrap().handler(client), server);
            assertEquals(0, client.result.get(100, TimeUnit.SECONDS),
                    "round trips of " + size + " B whose echo was read before the request's write promise completed");
            assertEquals(0, ((RdmaSocketChannel) ch).metrics().copiedBytes(), "allocator buffers were copied");
        }
    }

    @Test
    @Timeout(60)
    void shouldKeepTheMemoryOfADeliveredWriteUntilItsCompletion() throws Exception {
        // Completions that never come while the test runs: the close's linger (2 s) gives up on them.
        provider.faults().delaySendCompletions(TimeUnit.MINUTES.toNanos(10));
        Channel server = listen(new ServerBootstrap().childHandler(new Echo()));
        CompletableFuture<Integer> echoed = new CompletableFuture<>();
        Channel ch = connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter() {
            @Override
            public void channelRead(ChannelHandlerContext ctx, Object msg) {
                echoed.complete(((ByteBuf) msg).readableBytes());
                ((ByteBuf) msg).release();
            }
        }), server);
        ByteBuf request = ch.alloc().directBuffer(100).writeZero(100);
        request.retain();
        ChannelFuture write = ch.writeAndFlush(request);
        assertEquals(100, echoed.get(30, TimeUnit.SECONDS));
        assertTrue(write.isSuccess(), "the write promise completed with " + write.cause());
        assertEquals(2, request.refCnt(), "the channel still holds the written buffer: its send has not completed");
        ch.close().sync();
        assertEquals(1, request.refCnt(), "the channel let the buffer go once its queue pair was destroyed");
        request.release();
    }

}
