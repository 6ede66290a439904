package io.rdmabridge.netty;

import io.netty.channel.Channel;
import io.netty.channel.ChannelHandler;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;

import java.util.concurrent.LinkedBlockingQueue;

/** A server's child handler for tests: records each child that becomes active and each failure reported to it. */
@ChannelHandler.Sharable
final class ChildRecorder extends ChannelInboundHandlerAdapter {
    final LinkedBlockingQueue<Channel> children = new LinkedBlockingQueue<>();
    final LinkedBlockingQueue<Throwable> failures = new LinkedBlockingQueue<>();

    @Override
    public void channelActive(ChannelHandlerContext ctx) {
        children.add(ctx.channel());
    }

    @Override
    public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
        failures.add(cause);
    }
}
