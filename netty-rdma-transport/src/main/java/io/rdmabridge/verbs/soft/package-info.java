/**
 * The software RDMA provider ({@code rdmabridge.provider=soft}): a user-space RC device, {@code soft0}, for tests,
 * demos and machines without RDMA hardware.
 *
 * <h2>Design</h2>
 * <ul>
 *   <li>{@link io.rdmabridge.verbs.soft.SoftEngine}: the JVM-wide device, memory-key tables (random, non-zero keys
 *       from {@link java.security.SecureRandom}, read without locks), the in-JVM listener registry, the engine thread
 *       (one NIO selector for all TCP sockets) and the timer thread.</li>
 *   <li>{@link io.rdmabridge.verbs.soft.SoftQueuePair}: preallocated send and receive rings; completions in posting
 *       order; errors move the queue pair to ERROR before they become visible, then flush.</li>
 *   <li>{@link io.rdmabridge.verbs.soft.DirectLink}: in-JVM peers; the posting thread executes the work request
 *       against the peer's memory and receive queue itself.</li>
 *   <li>{@link io.rdmabridge.verbs.soft.TcpLink}: one TCP connection per queue pair, the
 *       {@link io.rdmabridge.verbs.soft.SoftHandshake} then {@link io.rdmabridge.verbs.soft.SoftFrame}s, validated
 *       field by field; bounded buffers; cumulative ACKs; RNR NAK with go-back retransmission.</li>
 *   <li>{@link io.rdmabridge.verbs.soft.SoftCompletionQueue}: lock-free many-producer, single-consumer ring.</li>
 * </ul>
 *
 * <h2>Modes</h2>
 * <ul>
 *   <li>{@code rdmabridge.soft.privateData} = {@code deliver} (default) or {@code none}: in {@code none} the provider
 *       behaves like DiSNI 2.1 and delivers no connection-manager private data ({@code deliversPrivateData()} is
 *       false, events carry none, accept with private data is refused, reject sends none), so that protocols above
 *       the SPI are tested as they run on DiSNI. Read when a {@link io.rdmabridge.verbs.soft.SoftProvider} is
 *       created with its zero-argument constructor (the {@link java.util.ServiceLoader} path); tests that need both
 *       modes in one JVM construct {@code new SoftProvider(SoftProvider.PrivateDataMode.NONE)} instead.</li>
 *   <li>{@code rdmabridge.soft.loopback} = {@code direct} (default) or {@code tcp}: the TCP wire path even between
 *       queue pairs of one JVM.</li>
 * </ul>
 */
package io.rdmabridge.verbs.soft;
