package io.rdmabridge.netty;

import io.netty.channel.ChannelOption;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The socket-level options ({@code SO_RCVBUF}, {@code SO_REUSEADDR}, {@code TCP_NODELAY}, ...) one kind of RDMA
 * channel accepts and reports back, so that code written for Netty's socket channels runs unchanged; the channel
 * reads the few that mean something on RDMA (such as {@code SO_LINGER}) through its config's getters. Each config
 * names the options it accepts with their defaults; any other option is not this class's to answer. Thread-safe:
 * set from any thread, read on the event loop.
 */
final class SocketLevelOptions {
    private final Map<ChannelOption<?>, Object> values;

    SocketLevelOptions(Map<? extends ChannelOption<?>, ?> defaults) {
        values = new ConcurrentHashMap<>(defaults);
    }

    /** The option's value, or {@code null} when this channel kind does not take it as a socket-level option. */
    @SuppressWarnings("unchecked")
    <T> T get(ChannelOption<T> option) {
        return (T) values.get(option);
    }

    /**
     * Stores a value already validated by {@code ChannelOption.validate}.
     *
     * @return whether the option is one of this channel kind's socket-level options
     */
    <T> boolean set(ChannelOption<T> option, T value) {
        return values.replace(option, value) != null;
    }

    /** Adds every option with its value, for {@code ChannelConfig.getOptions()}. */
    Map<ChannelOption<?>, Object> addTo(Map<ChannelOption<?>, Object> options) {
        options.putAll(values);
        return options;
    }
}
