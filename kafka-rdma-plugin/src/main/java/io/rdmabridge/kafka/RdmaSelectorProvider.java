package io.rdmabridge.kafka;

import java.io.IOException;
import java.net.ProtocolFamily;
import java.nio.channels.DatagramChannel;
import java.nio.channels.Pipe;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.channels.spi.AbstractSelector;
import java.nio.channels.spi.SelectorProvider;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The JVM's NIO provider while the RDMA replication agent is installed ({@link RdmaAgent} names this class in
 * {@code java.nio.channels.spi.SelectorProvider}). It hands back the JDK's own selectors, pipes, datagram channels
 * and socket channels, with two exceptions:
 * <ul>
 *   <li>a {@link SocketChannel} opened by one of Kafka's replica fetcher threads while RDMA replication is active
 *       becomes a {@link ReplicationSocketChannel} that negotiates with the leader when it connects;</li>
 *   <li>server socket channels are thin wrappers ({@link ReplicationServerSocketChannel}) whose {@code accept()}
 *       returns the JDK's own channel except on the inter-broker listener's port of an active broker.</li>
 * </ul>
 * Thread-safe.
 */
public final class RdmaSelectorProvider extends SelectorProvider {
    private static final Logger LOG = LoggerFactory.getLogger(RdmaSelectorProvider.class);
    private static final String FETCHER_THREAD_PREFIX = "ReplicaFetcherThread-";

    private final SelectorProvider jdk;

    /** Called by {@link SelectorProvider#provider()} through the system property. */
    public RdmaSelectorProvider() {
        this(sun.nio.ch.DefaultSelectorProvider.get());
    }

    RdmaSelectorProvider(SelectorProvider jdk) {
        this.jdk = jdk;
    }

    /** The JDK's own provider, which does all the real work. */
    SelectorProvider jdk() {
        return jdk;
    }

    @Override
    public DatagramChannel openDatagramChannel() throws IOException {
        return jdk.openDatagramChannel();
    }

    @Override
    public DatagramChannel openDatagramChannel(ProtocolFamily family) throws IOException {
        return jdk.openDatagramChannel(family);
    }

    @Override
    public Pipe openPipe() throws IOException {
        return jdk.openPipe();
    }

    @Override
    public AbstractSelector openSelector() throws IOException {
        return jdk.openSelector();
    }

    @Override
    public ServerSocketChannel openServerSocketChannel() throws IOException {
        ServerSocketChannel ch = jdk.openServerSocketChannel();
        // Kafka may open its listeners before the plugin is configured: wrap until the plugin is known to be off.
        if (RdmaReplication.get().isKnownInactive()) {
            return ch;
        }
        return new ReplicationServerSocketChannel(this, ch);
    }

    @Override
    public SocketChannel openSocketChannel() throws IOException {
        SocketChannel ch = jdk.openSocketChannel();
        RdmaReplication replication = RdmaReplication.get();
        if (!replication.isActive()) {
            return ch;
        }
        // Kafka names each replica fetcher thread "ReplicaFetcherThread-<fetcherId>-<leaderId>" and opens the
        // connection to that leader's inter-broker listener on it (BrokerBlockingSender.sendRequest).
        String thread = Thread.currentThread().getName();
        if (!thread.startsWith(FETCHER_THREAD_PREFIX)) {
            return ch;
        }
        String leaderId = thread.substring(thread.lastIndexOf('-') + 1);
        try {
            return ReplicationSocketChannel.forFollower(this, replication, ch, leaderId);
        } catch (IOException | RuntimeException e) {
            LOG.warn("Replication connection to leader {} stays on a plain JDK channel: {}", leaderId, e.toString());
            return ch;
        }
    }

    @Override
    public SocketChannel openSocketChannel(ProtocolFamily family) throws IOException {
        return jdk.openSocketChannel(family);
    }

    @Override
    public ServerSocketChannel openServerSocketChannel(ProtocolFamily family) throws IOException {
        return jdk.openServerSocketChannel(family);
    }
}
