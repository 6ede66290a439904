package io.rdmabridge.netty;

import io.netty.channel.AbstractChannel;
import io.netty.channel.Channel;
import io.netty.channel.ChannelMetadata;
import io.netty.channel.ChannelPromise;
import io.netty.channel.EventLoop;
import io.netty.channel.IoEventLoop;
import io.netty.channel.IoRegistration;

import java.net.InetSocketAddress;
import java.net.SocketAddress;

/**
 * What {@link RdmaSocketChannel} and {@link RdmaServerSocketChannel} share: registration of their unsafe, an
 * {@link RdmaIoHandle}, with the {@link RdmaIoHandler} of an {@link IoEventLoop}, and the local address of their
 * connection-manager id.
 *
 * <p>Threading: the event-loop thread registers, deregisters and writes every field here; other threads read the
 * volatile local address and first loop, and the handler only once registration has published it (the loop's
 * metrics). A channel stays with the loop it was first registered with: after {@code deregister()}, its tasks and its
 * close still run there.
 */
abstract class AbstractRdmaChannel extends AbstractChannel {
    private static final ChannelMetadata METADATA = new ChannelMetadata(false, 16);

    private IoRegistration registration;
    /** The loop this channel was first registered with; it keeps the channel after deregister(). */
    private volatile EventLoop firstLoop;
    /** The handler of this channel's loop, once registered. */
    RdmaIoHandler handler;
    /** The address the connection-manager id is bound to or listens on; {@code null} before. */
    volatile InetSocketAddress local;

    AbstractRdmaChannel(Channel parent) {
        super(parent);
    }

    @Override
    public ChannelMetadata metadata() {
        return METADATA;
    }

    @Override
    public InetSocketAddress localAddress() {
        return (InetSocketAddress) super.localAddress();
    }

    @Override
    protected SocketAddress localAddress0() {
        return local;
    }

    /**
     * The loop this channel was first registered with, from then on: its completion queue and connection-manager id
     * stay bound to that loop's handler, so a refused registration with another loop (Netty has switched to that loop
     * when it asks {@link #doRegister}) does not move the channel's tasks, nor the close that follows, there. Once that
     * loop has shut down, the loop Netty last registered it with: something must still run the close.
     */
    @Override
    public EventLoop eventLoop() {
        EventLoop loop = firstLoop;
        return loop != null && !loop.isShutdown() ? loop : super.eventLoop();
    }

    /** The loop this channel was first registered with; {@code null} before. Any thread. */
    EventLoop firstLoop() {
        return firstLoop;
    }

    @Override
    protected boolean isCompatible(EventLoop loop) {
        return loop instanceof IoEventLoop && ((IoEventLoop) loop).isCompatible(RdmaIoHandle.class);
    }

    @Override
    protected void doRegister(ChannelPromise promise) {
        if (registration != null) {
            // Its completion queue signals, and its connection-manager id reports to, the first loop's handler.
            promise.setFailure(new UnsupportedOperationException("an RDMA channel cannot be registered again after "
                    + "deregister(): its completion queue and connection-manager id stay bound to the event loop "
                    + "handler it was first registered with; close it and open a new channel"));
            return;
        }
        ((IoEventLoop) eventLoop()).register((RdmaIoHandle) unsafe()).addListener(f -> {
            if (f.isSuccess()) {
                firstLoop = super.eventLoop();
                registration = (IoRegistration) f.getNow();
                handler = registration.attachment();
                registered(promise);
            } else {
                promise.setFailure(f.cause());
            }
        });
    }

    /**
     * On the loop, once {@link #handler} is known: completes {@code promise}. Completing it runs the pipeline's
     * {@code handlerAdded} and {@code channelRegistered}, so what they may need is set up before, and what must see
     * the handlers' configuration comes after.
     */
    void registered(ChannelPromise promise) {
        promise.setSuccess();
    }

    /**
     * Runs {@code task} on this channel's event loop: at once when called there or when the channel has no loop (not
     * registered), otherwise as a task of the loop.
     */
    void runOnLoop(Runnable task) {
        if (isRegistered() && !eventLoop().inEventLoop()) {
            eventLoop().execute(task);
        } else {
            task.run();
        }
    }

    @Override
    protected void doDeregister() {
        IoRegistration r = registration;
        if (r != null) {
            r.cancel();
        }
    }

    /** The unsafe an {@link RdmaIoHandler} drives. */
    abstract class AbstractRdmaUnsafe extends AbstractUnsafe implements RdmaIoHandle {
        private boolean failedOnLoop;

        @Override
        public void failed(Throwable cause) {
            if (failedOnLoop || !isOpen()) {
                return;
            }
            failedOnLoop = true;
            pipeline().fireExceptionCaught(cause);
            abort();
        }

        /** Closes without waiting for the peer: after {@link #failed}, nothing this channel would still send counts. */
        void abort() {
            close(voidPromise());
        }

        @Override
        public void close() {
            if (isOpen()) {
                close(voidPromise());
            }
        }
    }
}
