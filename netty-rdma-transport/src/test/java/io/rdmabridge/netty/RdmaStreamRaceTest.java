package io.rdmabridge.netty;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.CompositeByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.util.ReferenceCountUtil;
import java.time.Duration;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;
import org.junitpioneer.jupiter.RestoreSystemProperties;

/**
 * The byte stream under a sender that runs ahead and a receiver that stops and starts: writes of random sizes (packed
 * small ones, eager ones, rendezvous ones of up to 1 MiB), from registered, foreign direct, heap and composite
 * buffers, flushed at random from a thread outside the loop while the receiver turns {@code autoRead} off and on at
 * random moments, so credits run out and come back mid-transfer. Every byte must arrive once, in order, and the
 * stream must end cleanly, and every verbs resource return to zero. On the soft provider in one JVM ({@code direct})
 * and over its TCP link ({@code tcp}), which takes the same-host rings in the default surefire run and plain TCP in the
 * {@code soft-tcp-path} one; in the rxe stage on DiSNI over Soft-RoCE ({@link DeviceUnderTest}), a tenth of the bytes.
 */
@Tag("device")
class RdmaStreamRaceTest extends AbstractChannelTest {
    RdmaStreamRaceTest() {
        super(DeviceUnderTest.provider());
    }

    /** The soft provider's two links in one JVM; on a device, the device. */
    static List<String> links() {
        return DeviceUnderTest.providerName().equals("soft") ? List.of("direct", "tcp") : List.of("device");
    }

    /** The stream's byte at {@code offset}: position-dependent, so a lost, repeated or reordered byte shows. */
    static byte expected(long offset) {
        long x = offset * 0x9E3779B97F4A7C15L;
        return (byte) (x >>> 56 ^ offset);
    }

    @ParameterizedTest
    @MethodSource("links")
    @Timeout(120)
    @RestoreSystemProperties
    void shouldDeliverEveryByteInOrderWhileTheReceiverStopsAndStartsReading(String link) throws Exception {
        long seed = System.nanoTime();
        Random random = new Random(seed);
        Checker checker = new Checker(seed);
        boolean soft = !link.equals("device");
        if (soft) {
            System.setProperty("rdmabridge.soft.loopback", link);
        }
        // A credit window (4 receives of 16 KiB) far below the sender's high water mark, so credits run out.
        Channel server = listen(new ServerBootstrap().childHandler(checker)
                .childOption(RdmaChannelOption.RECEIVE_QUEUE_DEPTH, 4)
                .childOption(RdmaChannelOption.RECEIVE_BUFFER_SIZE, 16 * 1024));
        RdmaSocketChannel client = connect(new Bootstrap().handler(new ChannelInboundHandlerAdapter()), server);

        long total = 0;
        long deadline = System.nanoTime() + DeviceUnderTest.scaled(Duration.ofSeconds(90)).toNanos();
        int writes = soft ? 1500 : 150; // Soft-RoCE in a TCG guest moves about 25 MB/s
        for (int k = 0; k < writes; k++) {
            int size = switch (random.nextInt(3)) {
                case 0 -> 1 + random.nextInt(256);
                case 1 -> 257 + random.nextInt(64 * 1024);
                default -> 64 * 1024 + random.nextInt(960 * 1024);
            };
            ByteBuf buf = buffer(client, random.nextInt(4), total, size);
            total += size;
            client.write(buf);
            if (random.nextInt(4) == 0) {
                client.flush();
            }
            // As a well-behaved Netty writer: stop while the channel is above its high water mark.
            while (!client.isWritable()) {
                client.flush();
                assertTrue(client.isActive() && System.nanoTime() < deadline,
                        "stuck at " + total + " bytes written (seed " + seed + "): " + checker.failure);
                Thread.sleep(0, 200_000);
            }
        }
        client.writeAndFlush(Unpooled.EMPTY_BUFFER).sync();
        RdmaChannelMetrics m = client.metrics();
        client.close().sync();

        assertEquals(total, checker.ended.get(DeviceUnderTest.scaled(Duration.ofSeconds(60)).toSeconds(),
                TimeUnit.SECONDS), "bytes received (seed " + seed + ")");
        assertNull(checker.failure, "seed " + seed);
        // What the run went through: pauses, credits spent to the last, every way of sending a buffer.
        assertTrue(checker.pauses.get() > 0, "the receiver never paused");
        assertTrue(m.creditStalls() > 0 && m.eagerBytes() > 0 && m.rendezvousBytes() > 0 && m.copiedBytes() > 0,
                "sender: " + m);
    }

    /** {@code size} bytes of the stream from {@code offset}, in a buffer of the given kind. */
    private static ByteBuf buffer(Channel ch, int kind, long offset, int size) {
        return switch (kind) {
            case 0 -> fill(ch.alloc().directBuffer(size), offset, size); // the channel's registered allocator
            case 1 -> fill(Unpooled.directBuffer(size), offset, size); // foreign direct memory: copied
            case 2 -> fill(Unpooled.buffer(size), offset, size); // heap: copied
            default -> {
                int head = size / 3;
                CompositeByteBuf c = ch.alloc().compositeDirectBuffer(2);
                c.addComponent(true, fill(ch.alloc().directBuffer(head), offset, head));
                c.addComponent(true, fill(Unpooled.buffer(size - head), offset + head, size - head));
                yield c;
            }
        };
    }

    private static ByteBuf fill(ByteBuf b, long offset, int size) {
        // One bulk write: the leak detector (PARANOID in tests) records a stack trace per buffer access.
        byte[] bytes = new byte[size];
        for (int i = 0; i < size; i++) {
            bytes[i] = expected(offset + i);
        }
        return b.writeBytes(bytes);
    }

    /** The receiving end: checks each byte against the stream and turns reading off and on at random. */
    private static final class Checker extends ChannelInboundHandlerAdapter {
        final CompletableFuture<Long> ended = new CompletableFuture<>();
        final AtomicLong pauses = new AtomicLong();
        private final Random random;
        private long offset;
        volatile String failure;

        Checker(long seed) {
            random = new Random(seed + 1);
        }

        @Override
        public boolean isSharable() {
            return true;
        }

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ByteBuf b = (ByteBuf) msg;
            try {
                byte[] bytes = new byte[b.readableBytes()];
                b.getBytes(b.readerIndex(), bytes);
                for (int i = 0; i < bytes.length && failure == null; i++) {
                    if (bytes[i] != expected(offset + i)) {
                        failure = "byte " + (offset + i) + " is " + bytes[i] + " (expected: " + expected(offset + i) + ")";
                    }
                }
                offset += bytes.length;
            } finally {
                ReferenceCountUtil.release(msg);
            }
            if (random.nextInt(16) == 0) {
                // Stop reading for up to 2 ms: the sender's credits run out, then come back.
                pauses.incrementAndGet();
                ctx.channel().config().setAutoRead(false);
                ctx.executor().schedule(() -> {
                    ctx.channel().config().setAutoRead(true);
                }, random.nextInt(2000), TimeUnit.MICROSECONDS);
            }
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            failure = "exception: " + cause;
            ctx.close();
        }

        @Override
        public void channelInactive(ChannelHandlerContext ctx) {
            ended.complete(offset);
        }
    }
}
