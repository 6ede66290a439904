package io.rdmabridge.netty.testsuite;

import io.netty.bootstrap.Bootstrap;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.testsuite.transport.TestsuitePermutation.BootstrapComboFactory;
import io.netty.testsuite.transport.TestsuitePermutation.BootstrapFactory;
import io.netty.testsuite.transport.socket.SocketTestPermutation;
import io.netty.util.concurrent.DefaultThreadFactory;
import io.rdmabridge.netty.DeviceUnderTest;
import io.rdmabridge.netty.RdmaIoHandler;
import io.rdmabridge.netty.RdmaServerSocketChannel;
import io.rdmabridge.netty.RdmaSocketChannel;

import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.util.Collections;
import java.util.List;

/**
 * Runs Netty's shared socket testsuite ({@code io.netty:netty-testsuite}) with RDMA on both ends: RDMA server x
 * RDMA client, on the provider chosen by {@code rdmabridge.provider} (soft in CI). Every test runs with all
 * allocators of {@code TestsuitePermutation.allocator()} (pooled and adaptive in Netty 4.2.17).
 *
 * <h2>Stream-socket tests of the testsuite that do not apply</h2>
 * <table>
 *   <caption>Excluded testsuite classes</caption>
 *   <tr><th>test</th><th>why</th></tr>
 *   <tr><td>{@code SocketShutdownOutputByPeerTest}</td><td>its peer is a {@code java.net.Socket}: a TCP endpoint
 *       cannot talk to an RDMA queue pair. Its cases run with an RDMA peer in
 *       {@code RdmaSocketShutdownOutputByPeerTest} (Netty's generic {@code AbstractSocketShutdownOutputByPeerTest},
 *       the peer an {@code RdmaSocketChannel})</td></tr>
 *   <tr><td>{@code SocketShutdownOutputBySelfTest}</td><td>its server is a {@code java.net.ServerSocket}, with no
 *       hook to replace it: same reason. {@code io.rdmabridge.netty.RdmaShutdownOutputBySelfTest} checks its
 *       behaviours RDMA x RDMA</td></tr>
 *   <tr><td>{@code SocketAddressesTest}, {@code AbstractSocketReuseFdTest}</td><td>Unix domain socket addresses and
 *       file-descriptor reuse; an RDMA channel has neither</td></tr>
 *   <tr><td>{@code ServerSocketSuspendTest}</td><td>its clients are {@code java.net.Socket}s (and Netty disables
 *       its one method itself). Suspending and resuming accept with the server's {@code autoRead} is checked RDMA x
 *       RDMA by {@code RdmaChannelBehaviourTest.shouldAcceptAConnectionWhenTheServerChannelReadsIt}</td></tr>
 *   <tr><td>{@code SocketSslClientRenegotiateTest}</td><td>it needs an OpenSSL that renegotiates
 *       ({@code OpenSsl.isRenegotiationSupported()}); BoringSSL, the tcnative flavour published on Maven Central,
 *       does not, so Netty skips it by assumption there too. Client- and server-initiated renegotiation over RDMA
 *       run in {@code SocketSslEchoTest}'s renegotiation permutations (JDK engine)</td></tr>
 *   <tr><td>{@code SocketSslLargeCertificateTest}</td><td>not a permutation test: it runs on NIO only</td></tr>
 *   <tr><td>{@code Datagram*Test}</td><td>datagram channels; this transport is stream (RC) only</td></tr>
 * </table>
 *
 * <h2>Methods disabled in the subclasses (each with its reason beside it)</h2>
 * <table>
 *   <caption>Disabled testsuite methods</caption>
 *   <tr><th>test</th><th>why</th></tr>
 *   <tr><td>{@code SocketDataReadInitialStateTest.testAutoReadOffNoDataReadUntilReadCalled}</td><td>does not apply
 *       to rdma_cm: no kernel completes the handshake into a backlog; a connection is established by the server's
 *       {@code rdma_accept}, which this channel issues when the server channel reads the connect request (its
 *       queue pair is sized by the child options, known only then, and created on the child's loop). With the
 *       server's {@code autoRead} off, the client's {@code connect()} therefore completes after
 *       {@code serverChannel.read()}, not before as the test expects of TCP; accepting earlier would pin queue
 *       pairs and receive buffers for connections the application has not taken.
 *       {@code RdmaChannelBehaviourTest.shouldAcceptAConnectionWhenTheServerChannelReadsIt} pins this behaviour;
 *       the test's other method passes.</td></tr>
 *   <tr><td>{@code SocketChannelNotYetConnectedTest.readMustBePendingUntilChannelIsActive}</td><td>its server is a
 *       NIO {@code ServerSocketChannel}: a TCP endpoint cannot talk to an RDMA queue pair</td></tr>
 * </table>
 * Netty's connection-attempt cases that aim at an unroutable outside host are pointed at a silent loopback
 * listener instead ({@code RdmaSocketConnectionAttemptTest}): tests only ever talk to loopback. The SSL cases run
 * with the JDK's engine and with OpenSSL (netty-tcnative-boringssl-static on the test class path).
 *
 * <h2>TCP semantics mapped onto the queue pair</h2>
 * A graceful close sends end of stream (as TCP's FIN) and destroys the queue pair once it has completed; the peer
 * sees {@code ChannelInputShutdownEvent} with {@code ALLOW_HALF_CLOSURE}, or a clean close. An abortive close
 * ({@code SO_LINGER=0}) disconnects without end of stream, and so does a peer that dies: the other side sees an
 * {@code IOException} "connection reset by peer" and then {@code channelInactive}.
 *
 * <h2>On a real RDMA device</h2>
 * The classes tagged {@value #DEVICE} also run on a kernel RDMA stack (the rxe stage of CI:
 * {@code -Pdisni,rxe -Dgroups=device}): their servers listen on {@link #deviceAddress()}, the address of the RDMA
 * interface, since a device serves no loopback address. Chosen are the cases whose outcome depends on what the device
 * does, run in a guest about ten times slower than the host:
 * <table>
 *   <caption>The device subset</caption>
 *   <tr><th>test</th><th>in or out, and why</th></tr>
 *   <tr><td>{@code SocketEchoTest}</td><td>in: the stream both ways through eager sends and rendezvous reads, with
 *       autoRead off, an extra executor and void promises</td></tr>
 *   <tr><td>{@code SocketHalfClosedTest}, {@code SocketRstTest}, {@code SocketCloseForciblyTest}</td><td>in: end of
 *       stream, abortive close and a reset peer map onto the device's disconnect and flush completions</td></tr>
 *   <tr><td>{@code SocketAutoReadTest}</td><td>in: with autoRead off the receive queue empties and the sender runs
 *       out of credits on real queue pairs</td></tr>
 *   <tr><td>{@code SocketGatheringWriteTest}, {@code CompositeBufferGatheringWriteTest}</td><td>in: scatter/gather
 *       lists within the device's own limit on entries per work request</td></tr>
 *   <tr><td>{@code SocketFileRegionTest}</td><td>in: file regions are memory regions over mapped file chunks,
 *       registered with the kernel</td></tr>
 *   <tr><td>{@code SocketSslEchoTest}</td><td>in, with the JDK engine only (the rxe profile sets
 *       {@code io.netty.handler.ssl.noOpenSsl}): many small records on a real stack; OpenSSL adds no transport
 *       case</td></tr>
 *   <tr><td>{@code SocketConnectTest}</td><td>out: limits of 3 s per case cannot hold ten times slower, and local
 *       and remote addresses are asserted by the channel's own tests</td></tr>
 *   <tr><td>{@code SocketConnectionAttemptTest}</td><td>out: its silent peer is a loopback TCP listener, which a
 *       device cannot dial</td></tr>
 *   <tr><td>{@code SocketMultipleConnectTest}, {@code WriteBeforeRegisteredTest}</td><td>out: they dial
 *       {@code NetUtil.LOCALHOST} themselves</td></tr>
 *   <tr><td>string, object, SPDY and fixed-length echo; SSL greeting, StartTLS, session reuse; buffer release,
 *       read pending, cancel write, exception handling, conditional writability, initial read state, not yet
 *       connected; traffic shaping</td><td>out: codecs and pipeline logic over the same stream, whose outcome does not
 *       depend on the provider (the soft provider runs them in every build); traffic shaping measures time, which a
 *       slow guest distorts</td></tr>
 * </table>
 */
public final class RdmaSocketTestPermutation extends SocketTestPermutation {
    public static final RdmaSocketTestPermutation INSTANCE = new RdmaSocketTestPermutation();
    /** JUnit tag of the testsuite classes that also run on a real RDMA device. */
    public static final String DEVICE = "device";

    static final EventLoopGroup RDMA_GROUP = new MultiThreadIoEventLoopGroup(NUM_THREADS,
            new DefaultThreadFactory("testsuite-rdma", true), RdmaIoHandler.newFactory());

    private RdmaSocketTestPermutation() {
    }

    /** Where the tagged classes' servers listen: the address under test, any port ({@link DeviceUnderTest}). */
    static SocketAddress deviceAddress() {
        return new InetSocketAddress(DeviceUnderTest.address(), 0);
    }

    @Override
    public List<BootstrapComboFactory<ServerBootstrap, Bootstrap>> socket() {
        return combo(serverSocket(), clientSocket());
    }

    @Override
    public List<BootstrapComboFactory<ServerBootstrap, Bootstrap>> socketWithFastOpen() {
        return socket();
    }

    @Override
    public List<BootstrapFactory<ServerBootstrap>> serverSocket() {
        return Collections.singletonList(
                () -> new ServerBootstrap().group(RDMA_GROUP).channel(RdmaServerSocketChannel.class));
    }

    @Override
    public List<BootstrapFactory<Bootstrap>> clientSocket() {
        return Collections.singletonList(() -> new Bootstrap().group(RDMA_GROUP).channel(RdmaSocketChannel.class));
    }

    @Override
    public List<BootstrapFactory<Bootstrap>> clientSocketWithFastOpen() {
        return clientSocket();
    }
}
