package io.rdmabridge.benchmarks;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import io.netty.channel.EventLoopGroup;
import io.netty.util.internal.logging.InternalLogger;
import io.netty.util.internal.logging.InternalLoggerFactory;
import io.rdmabridge.verbs.RdmaProvider;

import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.channels.ClosedChannelException;
import java.util.concurrent.TimeUnit;

/**
 * The server end of the channel benchmarks and of {@code rdma-perf --api netty}: each connection starts with a
 * {@link PerfHeader} and then is echoed or sunk (with acknowledgements). Runs in the benchmark's JVM (in-JVM
 * benchmarks, loopback mode) or as a child process ({@link #main}). Thread-safe: handlers run on the event loops.
 */
public final class PerfServer implements AutoCloseable {
    private static final InternalLogger logger = InternalLoggerFactory.getInstance(PerfServer.class);
    /** The line a child server prints once it listens: {@code LISTENING host:port} ({@link ChildServer} waits for it). */
    public static final String LISTENING = "LISTENING ";

    private final EventLoopGroup group;
    private final Channel channel;

    private PerfServer(EventLoopGroup group, Channel channel) {
        this.group = group;
        this.channel = channel;
    }

    /**
     * Starts a server of {@code transport} on its own event loop.
     *
     * @param provider the RDMA provider for {@link Transport#RDMA}; ignored otherwise
     */
    public static PerfServer start(Transport transport, RdmaProvider provider, SocketAddress bind)
            throws InterruptedException {
        EventLoopGroup group = transport.newGroup(1, provider);
        try {
            ServerBootstrap b = new ServerBootstrap().group(group).channel(transport.serverChannelClass())
                    .childHandler(new ChannelInitializer<Channel>() {
                        @Override
                        protected void initChannel(Channel child) {
                            child.pipeline().addLast(new ConnectionHandler());
                        }
                    });
            if (transport == Transport.EPOLL || transport == Transport.NIO) {
                b.childOption(ChannelOption.TCP_NODELAY, true);
            } else if (transport == Transport.RDMA) {
                RdmaTuning.apply(b);
            }
            Channel ch = b.bind(bind).sync().channel();
            return new PerfServer(group, ch);
        } catch (InterruptedException | RuntimeException e) {
            group.shutdownGracefully(0, 0, TimeUnit.SECONDS);
            throw e;
        }
    }

    /** The bound address. */
    public SocketAddress localAddress() {
        return channel.localAddress();
    }

    @Override
    public void close() {
        channel.close().syncUninterruptibly();
        group.shutdownGracefully(0, 5, TimeUnit.SECONDS).syncUninterruptibly();
    }

    /**
     * Child-process entry: {@code PerfServer TRANSPORT [HOST [PORT]]}. Prints {@value #LISTENING}host:port once bound,
     * then serves until its standard input closes (the parent exited or closed the pipe).
     */
    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: PerfServer rdma|epoll|nio [host [port]]");
            System.exit(2);
        }
        Transport transport = Transport.of(args[0]);
        String host = args.length > 1 ? args[1] : "127.0.0.1";
        int port = args.length > 2 ? Integer.parseInt(args[2]) : 0;
        RdmaProvider provider = transport == Transport.RDMA ? Transport.provider(
                System.getProperty("rdmabridge.provider", "soft")) : null;
        try (PerfServer server = start(transport, provider, transport.bindAddress(host, port))) {
            InetSocketAddress bound = (InetSocketAddress) server.localAddress();
            System.out.println(LISTENING + bound.getAddress().getHostAddress() + ":" + bound.getPort());
            System.out.flush();
            InputStream in = System.in;
            try {
                while (in.read() >= 0) {
                    // Parent keeps the pipe open while it wants us.
                }
            } catch (IOException e) {
                // Pipe broken: the parent is gone.
            }
        }
    }

    /** Reads the header, then echoes or sinks. One per connection; event loop only. */
    private static final class ConnectionHandler extends ChannelInboundHandlerAdapter {
        private final byte[] header = new byte[PerfHeader.LENGTH];
        private int headerRead;
        private int mode;
        private long ackUnit;
        private long sinceAck;
        private boolean echoed;

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            ByteBuf buf = (ByteBuf) msg;
            if (headerRead < PerfHeader.LENGTH) {
                int n = Math.min(buf.readableBytes(), PerfHeader.LENGTH - headerRead);
                buf.readBytes(header, headerRead, n);
                headerRead += n;
                if (headerRead == PerfHeader.LENGTH && !parseHeader(ctx)) {
                    buf.release();
                    return;
                }
                if (!buf.isReadable()) {
                    buf.release();
                    return;
                }
            }
            if (mode == PerfHeader.MODE_ECHO) {
                // The received buffer goes straight back: on the RDMA channel a registered receive buffer, no copy.
                ctx.write(buf, ctx.voidPromise());
                echoed = true;
                return;
            }
            int n = buf.readableBytes();
            buf.release();
            sinceAck += n;
            if (sinceAck >= ackUnit) {
                int acks = (int) (sinceAck / ackUnit);
                sinceAck -= acks * ackUnit;
                ByteBuf ack = ctx.alloc().buffer(acks).writeZero(acks);
                ctx.writeAndFlush(ack, ctx.voidPromise());
            }
        }

        private boolean parseHeader(ChannelHandlerContext ctx) {
            ByteBuf h = ctx.alloc().heapBuffer(PerfHeader.LENGTH).writeBytes(header);
            int magic;
            try {
                magic = h.readInt();
                mode = h.readInt();
                ackUnit = h.readLong();
            } finally {
                h.release();
            }
            boolean valid = magic == PerfHeader.MAGIC
                    && (mode == PerfHeader.MODE_ECHO || mode == PerfHeader.MODE_SINK && ackUnit > 0);
            if (!valid) {
                logger.warn("benchmark connection {}: bad header (magic=0x{}, mode={}, ackUnit={}); closing it",
                        ctx.channel(), Integer.toHexString(magic), mode, ackUnit);
                ctx.close();
            }
            return valid;
        }

        @Override
        public void channelReadComplete(ChannelHandlerContext ctx) {
            if (echoed) {
                echoed = false;
                ctx.flush();
            }
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            // A client that closes while acknowledgements are on their way is the normal end of a benchmark: over
            // TCP its kernel answers them with a reset (unread bytes at close).
            if (cause instanceof ClosedChannelException || cause instanceof IOException && cause.getMessage() != null
                    && cause.getMessage().contains("Connection reset by peer")) {
                logger.debug("benchmark connection {} ended by the client", ctx.channel(), cause);
            } else {
                logger.warn("benchmark connection {} failed; closing it", ctx.channel(), cause);
            }
            ctx.close();
        }
    }
}
