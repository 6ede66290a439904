package io.rdmabridge.kafka;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.Socket;
import java.net.SocketAddress;
import java.net.SocketException;
import java.net.SocketImpl;
import java.net.SocketOption;
import java.nio.channels.Channels;
import java.nio.channels.IllegalBlockingModeException;
import java.nio.channels.SocketChannel;
import java.util.Set;

/**
 * {@link ReplicationSocketChannel#socket()}: the TCP socket's addresses and options, while closing, shutting down,
 * connecting and streams go through the channel. Kafka closes a connection by closing this socket first
 * ({@code PlaintextTransportLayer.close}); the JDK's own socket of the TCP channel would close the descriptor Kafka's
 * selector still polls, whose number the next socket may take before the selector drops it.
 */
final class ReplicationSocket extends Socket {
    private final ReplicationSocketChannel channel;

    ReplicationSocket(ReplicationSocketChannel channel) throws SocketException {
        super((SocketImpl) null);
        this.channel = channel;
    }

    /** The current TCP socket (a follower's connect may replace it). */
    private Socket tcp() {
        return channel.tcpSocket();
    }

    @Override
    public SocketChannel getChannel() {
        return channel;
    }

    @Override
    public void connect(SocketAddress endpoint) throws IOException {
        connect(endpoint, 0);
    }

    /**
     * The channel's {@link ReplicationSocketChannel#connect connect}, as the JDK's socket of a channel does, for a
     * blocking channel only; {@code timeout} is not applied (a follower's upgrade bounds its own steps).
     */
    @Override
    public void connect(SocketAddress endpoint, int timeout) throws IOException {
        if (timeout < 0) {
            throw new IllegalArgumentException("connect timeout " + timeout + " is negative (expected: 0 or more)");
        }
        if (!channel.isBlocking()) {
            throw new IllegalBlockingModeException();
        }
        channel.connect(endpoint);
    }

    @Override
    public void bind(SocketAddress bindpoint) throws IOException {
        channel.bind(bindpoint);
    }

    @Override
    public InputStream getInputStream() throws IOException {
        return Channels.newInputStream(channel);
    }

    @Override
    public OutputStream getOutputStream() throws IOException {
        return Channels.newOutputStream(channel);
    }

    @Override
    public void close() throws IOException {
        channel.close();
    }

    @Override
    public boolean isClosed() {
        return !channel.isOpen();
    }

    @Override
    public void shutdownInput() throws IOException {
        channel.shutdownInput();
    }

    @Override
    public void shutdownOutput() throws IOException {
        channel.shutdownOutput();
    }

    @Override
    public boolean isInputShutdown() {
        return tcp().isInputShutdown();
    }

    @Override
    public boolean isOutputShutdown() {
        return tcp().isOutputShutdown();
    }

    @Override
    public boolean isConnected() {
        return channel.isConnected();
    }

    @Override
    public boolean isBound() {
        return tcp().isBound();
    }

    @Override
    public InetAddress getInetAddress() {
        return tcp().getInetAddress();
    }

    @Override
    public InetAddress getLocalAddress() {
        return tcp().getLocalAddress();
    }

    @Override
    public int getPort() {
        return tcp().getPort();
    }

    @Override
    public int getLocalPort() {
        return tcp().getLocalPort();
    }

    @Override
    public SocketAddress getRemoteSocketAddress() {
        return tcp().getRemoteSocketAddress();
    }

    @Override
    public SocketAddress getLocalSocketAddress() {
        return tcp().getLocalSocketAddress();
    }

    @Override
    public void setTcpNoDelay(boolean on) throws SocketException {
        tcp().setTcpNoDelay(on);
    }

    @Override
    public boolean getTcpNoDelay() throws SocketException {
        return tcp().getTcpNoDelay();
    }

    @Override
    public void setSoLinger(boolean on, int linger) throws SocketException {
        tcp().setSoLinger(on, linger);
    }

    @Override
    public int getSoLinger() throws SocketException {
        return tcp().getSoLinger();
    }

    @Override
    public void sendUrgentData(int data) throws IOException {
        tcp().sendUrgentData(data);
    }

    @Override
    public void setOOBInline(boolean on) throws SocketException {
        tcp().setOOBInline(on);
    }

    @Override
    public boolean getOOBInline() throws SocketException {
        return tcp().getOOBInline();
    }

    @Override
    public void setSoTimeout(int timeout) throws SocketException {
        tcp().setSoTimeout(timeout);
    }

    @Override
    public int getSoTimeout() throws SocketException {
        return tcp().getSoTimeout();
    }

    @Override
    public void setSendBufferSize(int size) throws SocketException {
        tcp().setSendBufferSize(size);
    }

    @Override
    public int getSendBufferSize() throws SocketException {
        return tcp().getSendBufferSize();
    }

    @Override
    public void setReceiveBufferSize(int size) throws SocketException {
        tcp().setReceiveBufferSize(size);
    }

    @Override
    public int getReceiveBufferSize() throws SocketException {
        return tcp().getReceiveBufferSize();
    }

    @Override
    public void setKeepAlive(boolean on) throws SocketException {
        tcp().setKeepAlive(on);
    }

    @Override
    public boolean getKeepAlive() throws SocketException {
        return tcp().getKeepAlive();
    }

    @Override
    public void setTrafficClass(int tc) throws SocketException {
        tcp().setTrafficClass(tc);
    }

    @Override
    public int getTrafficClass() throws SocketException {
        return tcp().getTrafficClass();
    }

    @Override
    public void setReuseAddress(boolean on) throws SocketException {
        tcp().setReuseAddress(on);
    }

    @Override
    public boolean getReuseAddress() throws SocketException {
        return tcp().getReuseAddress();
    }

    @Override
    public void setPerformancePreferences(int connectionTime, int latency, int bandwidth) {
        tcp().setPerformancePreferences(connectionTime, latency, bandwidth);
    }

    @Override
    public <T> Socket setOption(SocketOption<T> name, T value) throws IOException {
        tcp().setOption(name, value);
        return this;
    }

    @Override
    public <T> T getOption(SocketOption<T> name) throws IOException {
        return tcp().getOption(name);
    }

    @Override
    public Set<SocketOption<?>> supportedOptions() {
        return tcp().supportedOptions();
    }

    @Override
    public String toString() {
        return "ReplicationSocket[" + tcp() + "]";
    }
}
