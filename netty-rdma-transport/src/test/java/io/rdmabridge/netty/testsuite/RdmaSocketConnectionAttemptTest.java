package io.rdmabridge.netty.testsuite;

import io.netty.bootstrap.Bootstrap;
import io.netty.testsuite.transport.TestsuitePermutation.BootstrapFactory;
import io.netty.testsuite.transport.socket.SocketConnectionAttemptTest;
import io.netty.testsuite.transport.socket.SocketTestPermutation;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.reflect.Field;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.util.List;

import org.junit.jupiter.api.AfterAll;

/**
 * Netty's connection-attempt tests against the RDMA channel.
 *
 * <p>Netty aims its timeout and cancellation cases at an unroutable outside host ({@code io.netty.testsuite.badHost},
 * default 198.51.100.254). Tests here talk to loopback only, so the "host that never answers" is a loopback listener
 * that accepts TCP but never speaks: the RDMA handshake gets no reply and the connect must time out. The properties
 * are set before Netty's {@code SocketTestPermutation} reads them; {@link #SILENT_PEER} fails the class if they were
 * read earlier, rather than let a test dial out.
 */
public class RdmaSocketConnectionAttemptTest extends SocketConnectionAttemptTest {
    private static final ServerSocket SILENT_PEER = silentPeer();

    private static ServerSocket silentPeer() {
        try {
            ServerSocket socket = new ServerSocket(0, 64, InetAddress.getLoopbackAddress());
            System.setProperty("io.netty.testsuite.badHost", socket.getInetAddress().getHostAddress());
            System.setProperty("io.netty.testsuite.badPort", Integer.toString(socket.getLocalPort()));
            if (!socket.getInetAddress().getHostAddress().equals(nettyBadHost())) {
                socket.close();
                throw new IllegalStateException("Netty's testsuite read io.netty.testsuite.badHost before this class"
                        + " set it to loopback: run this class in a JVM of its own (surefire reuseForks=false)");
            }
            return socket;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** The host Netty's testsuite will dial: its package-private {@code SocketTestPermutation.BAD_HOST}. */
    private static String nettyBadHost() {
        try {
            Field field = SocketTestPermutation.class.getDeclaredField("BAD_HOST");
            field.setAccessible(true);
            return (String) field.get(null);
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException("cannot read SocketTestPermutation.BAD_HOST of this Netty testsuite: " + e
                    + "; check that the testsuite version still aims its timeout cases at it", e);
        }
    }

    @AfterAll
    static void closeSilentPeer() throws IOException {
        SILENT_PEER.close();
    }

    @Override
    protected List<BootstrapFactory<Bootstrap>> newFactories() {
        return RdmaSocketTestPermutation.INSTANCE.clientSocket();
    }
}
