package io.rdmabridge.kafka;

import java.io.FileDescriptor;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.SocketAddress;
import java.net.SocketOption;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.util.Set;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import sun.nio.ch.SelChImpl;
import sun.nio.ch.SelectionKeyImpl;

/**
 * A JDK server socket channel seen through the delegating provider: registration, readiness and options are the JDK
 * channel's own; {@link #accept()} wraps connections on the inter-broker listener's port into leader-side
 * {@link ReplicationSocketChannel}s and returns every other connection untouched. Thread-safe as the JDK channel.
 */
final class ReplicationServerSocketChannel extends ServerSocketChannel implements SelChImpl {
    private static final Logger LOG = LoggerFactory.getLogger(ReplicationServerSocketChannel.class);

    private final RdmaSelectorProvider provider;
    private final ServerSocketChannel jdk;
    private final SelChImpl jdkSel;

    ReplicationServerSocketChannel(RdmaSelectorProvider provider, ServerSocketChannel jdk) {
        super(provider);
        this.provider = provider;
        this.jdk = jdk;
        this.jdkSel = (SelChImpl) jdk;
    }

    @Override
    public SocketChannel accept() throws IOException {
        SocketChannel ch = jdk.accept();
        if (ch == null) {
            return null;
        }
        RdmaReplication replication = RdmaReplication.get();
        SocketAddress local = jdk.getLocalAddress();
        if (!replication.isActive() || !(local instanceof InetSocketAddress)
                || ((InetSocketAddress) local).getPort() != replication.interBrokerPort()) {
            return ch;
        }
        try {
            return ReplicationSocketChannel.forLeader(provider, replication, ch);
        } catch (IOException | RuntimeException e) {
            LOG.warn("Connection from {} stays on a plain JDK channel: {}", ch.getRemoteAddress(), e.toString());
            return ch;
        }
    }

    @Override
    public ServerSocketChannel bind(SocketAddress local, int backlog) throws IOException {
        jdk.bind(local, backlog);
        return this;
    }

    @Override
    public <T> ServerSocketChannel setOption(SocketOption<T> name, T value) throws IOException {
        jdk.setOption(name, value);
        return this;
    }

    @Override
    public <T> T getOption(SocketOption<T> name) throws IOException {
        return jdk.getOption(name);
    }

    @Override
    public Set<SocketOption<?>> supportedOptions() {
        return jdk.supportedOptions();
    }

    @Override
    public ServerSocket socket() {
        return jdk.socket();
    }

    @Override
    public SocketAddress getLocalAddress() throws IOException {
        return jdk.getLocalAddress();
    }

    @Override
    protected void implConfigureBlocking(boolean block) throws IOException {
        jdk.configureBlocking(block);
    }

    @Override
    protected void implCloseSelectableChannel() throws IOException {
        // While registered, the selector still polls the descriptor: it is closed in kill(), after deregistration.
        if (!isRegistered()) {
            jdk.close();
        }
    }

    @Override
    public FileDescriptor getFD() {
        return jdkSel.getFD();
    }

    @Override
    public int getFDVal() {
        return jdkSel.getFDVal();
    }

    @Override
    public boolean translateAndUpdateReadyOps(int ops, SelectionKeyImpl ski) {
        return jdkSel.translateAndUpdateReadyOps(ops, ski);
    }

    @Override
    public boolean translateAndSetReadyOps(int ops, SelectionKeyImpl ski) {
        return jdkSel.translateAndSetReadyOps(ops, ski);
    }

    @Override
    public int translateInterestOps(int ops) {
        return jdkSel.translateInterestOps(ops);
    }

    @Override
    public void kill() throws IOException {
        jdk.close();
    }

    @Override
    public String toString() {
        return "ReplicationServerSocketChannel[" + jdk + "]";
    }
}
