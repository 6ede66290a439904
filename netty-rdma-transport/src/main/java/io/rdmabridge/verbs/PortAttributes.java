package io.rdmabridge.verbs;

/**
 * One port of a device ({@code ibv_port_attr}).
 *
 * @param portNumber 1-based port number
 * @param state      e.g. {@code ACTIVE}, {@code DOWN}
 * @param linkLayer  {@code InfiniBand}, {@code Ethernet} or {@code software}
 * @param activeMtu  active MTU in bytes
 * @param address    the IP address the port is reachable at, or {@code null} when unknown
 */
public record PortAttributes(int portNumber, String state, String linkLayer, int activeMtu, String address) {
}
