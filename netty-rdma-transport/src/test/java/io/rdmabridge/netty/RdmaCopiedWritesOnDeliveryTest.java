package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * {@code -Drdmabridge.channel.completeCopiesOnPost=false}: a copied write completes on delivery, as one sent by
 * reference does. Set for this class's JVM (surefire forks one per test class) before any channel class is loaded; the
 * default is {@link RdmaCopiedWriteCompletionTest}'s.
 */
class RdmaCopiedWritesOnDeliveryTest extends AbstractSoftChannelTest {
    static {
        System.setProperty(RdmaChannelOutbound.COMPLETE_COPIES_ON_POST_PROPERTY, "false");
    }

    @Test
    @Timeout(60)
    void shouldCompleteACopiedWriteOnDeliveryWhenSwitchedOff() throws Exception {
        CompletableFuture<Void> echoed = new CompletableFuture<>();
        Channel ch = connectToEcho(echoed);
        ByteBuf heap = Unpooled.wrappedBuffer(new byte[100]);
        ChannelFuture copied = ch.eventLoop().submit(() -> {
            ChannelFuture f = ch.writeAndFlush(heap);
            // Still inside the flush's event-loop task: nothing from the peer has been polled yet.
            assertFalse(f.isDone(), "with the switch off a copied write completes on delivery");
            assertEquals(1, heap.refCnt(), "the channel keeps the copied buffer until delivery");
            return f;
        }).get(30, TimeUnit.SECONDS);
        echoed.get(30, TimeUnit.SECONDS);
        assertTrue(copied.await(30, TimeUnit.SECONDS) && copied.isSuccess(), "delivered: " + copied.cause());
        assertEquals(0, heap.refCnt(), "the copied buffer was released once delivered");
    }
}
