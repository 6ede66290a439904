package io.rdmabridge.netty;

import io.netty.buffer.ByteBuf;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;

import java.util.concurrent.CompletableFuture;

/**
 * A ping-pong client that checks Netty's write order on every round trip: it writes a request of
 * {@code requestSize} bytes to an echo peer, and when the echo has been read in full it records whether the
 * request's write promise was complete by the time the first byte of the echo was read (it must be: the peer could
 * only answer what it had received), then writes the next. {@link #result} completes with the number of round trips
 * whose echo overtook the write promise once all are done, or exceptionally on a failed write or a closed channel.
 * Runs on the channel's event loop.
 */
final class WriteOrderClient extends ChannelInboundHandlerAdapter {
    final CompletableFuture<Integer> result = new CompletableFuture<>();
    private final int requestSize;
    private final int roundTrips;
    private int done;
    private int overtaken;
    private long echoed;
    private ChannelFuture write;

    WriteOrderClient(int requestSize, int roundTrips) {
        this.requestSize = requestSize;
        this.roundTrips = roundTrips;
    }

    @Override
    public void channelActive(ChannelHandlerContext ctx) {
        writeRequest(ctx);
        ctx.fireChannelActive();
    }

    private void writeRequest(ChannelHandlerContext ctx) {
        // From the channel's allocator (registered memory): written by reference, so its memory must outlive the
        // send's completion even when the promise completes first.
        ByteBuf request = ctx.alloc().directBuffer(requestSize);
        request.writerIndex(requestSize);
        request.setInt(0, done);
        write = ctx.writeAndFlush(request);
        write.addListener(f -> {
            if (!f.isSuccess()) {
                result.completeExceptionally(f.cause());
            }
        });
    }

    @Override
    public void channelRead(ChannelHandlerContext ctx, Object msg) {
        ByteBuf buf = (ByteBuf) msg;
        try {
            if (echoed == 0 && !write.isDone()) {
                overtaken++;
            }
            echoed += buf.readableBytes();
        } finally {
            buf.release();
        }
        if (echoed < requestSize) {
            return;
        }
        if (echoed > requestSize) {
            result.completeExceptionally(new AssertionError("echoed " + echoed + " bytes for a request of "
                    + requestSize));
            return;
        }
        echoed = 0;
        if (++done == roundTrips) {
            result.complete(overtaken);
        } else {
            writeRequest(ctx);
        }
    }

    @Override
    public void channelInactive(ChannelHandlerContext ctx) {
        result.completeExceptionally(new AssertionError("channel closed after " + done + " round trips"));
        ctx.fireChannelInactive();
    }

    @Override
    public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
        result.completeExceptionally(cause);
        ctx.close();
    }
}
