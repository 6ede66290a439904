package io.rdmabridge.verbs;

import java.net.InetSocketAddress;
import java.util.HexFormat;
import java.util.List;

/**
 * The remote end of a conformance test: a passive RDMA endpoint that listens, accepts (or rejects) connections, owns
 * registered memory the test reaches with RDMA READ and WRITE, posts receives, sends, echoes, disconnects and, where
 * the mode allows it, dies. It runs on a thread (or in a process) of its own with its own event channel and
 * completion queues, so the local end under test sees a real peer.
 *
 * <p>Connections are numbered {@code 0, 1, ...} in the order their requests were accepted since the last
 * {@link #reset()}. Every method that names a connection waits (bounded) for it to be accepted. Thread-safe: one call
 * at a time.
 */
interface ConformancePeer extends AutoCloseable {

    /** Work-request id tag of the sends the peer posts with {@link #send}; the low bits are the message index. */
    long SEND_TAG = 1L << 40;

    /**
     * How the peer answers connection requests and lays out each connection's receive buffers.
     *
     * @param reject           reject every request (with {@code replyPrivateData}) instead of accepting
     * @param replyPrivateData private data sent with the accept or reject
     * @param recvSlots        receive buffers allocated per connection ({@code wrId} of a receive is its slot index)
     * @param prepost          receives posted before accepting (at most {@code recvSlots})
     * @param recvSize         bytes per receive buffer
     * @param recvSges         scatter entries per receive; they lie in reverse order with gaps, so a provider that
     *                         scatters contiguously delivers a wrong checksum
     * @param autoRepost       repost a receive as soon as its completion is recorded
     * @param echo             send every received message back on the same connection (same bytes, same immediate),
     *                         reposting the receive once that send completes
     * @param rnrRetryCount    the accept's {@link ConnectionParameters#rnrRetryCount()}: how often the connecting
     *                         side's SENDs are retried while the peer has no receive posted
     */
    record Config(boolean reject, byte[] replyPrivateData, int recvSlots, int prepost, int recvSize, int recvSges,
                  boolean autoRepost, boolean echo, int rnrRetryCount) {

        static Config accept(int recvSlots, int prepost, int recvSize) {
            return new Config(false, new byte[0], recvSlots, prepost, recvSize, 1, false, false,
                    ConnectionParameters.DEFAULT.rnrRetryCount());
        }

        Config withRnrRetryCount(int count) {
            return new Config(reject, replyPrivateData, recvSlots, prepost, recvSize, recvSges, autoRepost, echo,
                    count);
        }

        Config withReply(byte[] data) {
            return new Config(reject, data, recvSlots, prepost, recvSize, recvSges, autoRepost, echo,
                    rnrRetryCount);
        }

        Config rejecting(byte[] data) {
            return new Config(true, data, recvSlots, prepost, recvSize, recvSges, autoRepost, echo,
                    rnrRetryCount);
        }

        Config withRecvSges(int sges) {
            return new Config(reject, replyPrivateData, recvSlots, prepost, recvSize, sges, autoRepost, echo,
                    rnrRetryCount);
        }

        Config autoReposting() {
            return new Config(reject, replyPrivateData, recvSlots, prepost, recvSize, recvSges, true, echo,
                    rnrRetryCount);
        }

        Config echoing() {
            return new Config(reject, replyPrivateData, recvSlots, prepost, recvSize, recvSges, autoRepost, true,
                    rnrRetryCount);
        }

        String encode() {
            return reject + " " + hex(replyPrivateData) + " " + recvSlots + " " + prepost + " " + recvSize + " "
                    + recvSges + " " + autoRepost + " " + echo + " " + rnrRetryCount;
        }

        static Config decode(String[] f, int i) {
            return new Config(Boolean.parseBoolean(f[i]), unhex(f[i + 1]), Integer.parseInt(f[i + 2]),
                    Integer.parseInt(f[i + 3]), Integer.parseInt(f[i + 4]), Integer.parseInt(f[i + 5]),
                    Boolean.parseBoolean(f[i + 6]), Boolean.parseBoolean(f[i + 7]), Integer.parseInt(f[i + 8]));
        }
    }

    /**
     * A region the peer registered. Its buffer has {@code guard} extra bytes on each side that are not registered,
     * so tests can prove nothing was written outside the region.
     */
    record Region(int id, long address, int rkey, long length, int guard) {
        String encode() {
            return id + " " + address + " " + rkey + " " + length + " " + guard;
        }

        static Region decode(String[] f, int i) {
            return new Region(Integer.parseInt(f[i]), Long.parseLong(f[i + 1]), Integer.parseInt(f[i + 2]),
                    Long.parseLong(f[i + 3]), Integer.parseInt(f[i + 4]));
        }
    }

    /**
     * One completion the peer saw on a connection.
     *
     * @param recv  from the receive queue (else the send queue)
     * @param crc   for a successful {@link WcOpcode#RECV}: CRC-32 of the {@code byteLength} bytes received, gathered
     *              from the scatter entries in order; otherwise 0
     * @param head  for a successful {@link WcOpcode#RECV} of at least 8 bytes: its first 8 bytes, little-endian
     */
    record Completion(boolean recv, long wrId, int status, int opcode, int byteLength, boolean hasImm, int imm,
                      long crc, long head) {

        String encode() {
            return (recv ? "r" : "s") + " " + wrId + " " + status + " " + opcode + " " + byteLength + " " + hasImm
                    + " " + imm + " " + crc + " " + head;
        }

        static Completion decode(String[] f, int i) {
            return new Completion("r".equals(f[i]), Long.parseLong(f[i + 1]), Integer.parseInt(f[i + 2]),
                    Integer.parseInt(f[i + 3]), Integer.parseInt(f[i + 4]), Boolean.parseBoolean(f[i + 5]),
                    Integer.parseInt(f[i + 6]), Long.parseLong(f[i + 7]), Long.parseLong(f[i + 8]));
        }

        @Override
        public String toString() {
            return (recv ? "recv" : "send") + "{wrId=" + wrId + ", status=" + WcStatus.name(status) + ", opcode="
                    + WcOpcode.name(opcode) + ", byteLen=" + byteLength + (hasImm ? ", imm=0x"
                    + Integer.toHexString(imm) : "") + '}';
        }
    }

    /** The peer's resources after {@link #reset()}, from its own provider's {@link ResourceUsage}. */
    record Usage(boolean zero, String usage) {
    }

    /** Creates the peer's resources and listens on {@code host}, port 0. @return the port */
    int listen(String host, Config config) throws Exception;

    /** Changes how later requests are answered. */
    void configure(Config config) throws Exception;

    /** Private data of every connection request seen since {@link #listen}, in arrival order. */
    List<byte[]> connectRequests() throws Exception;

    /** Allocates {@code length + 2 * guard} bytes, zeroed, and registers the middle {@code length}. */
    Region register(long length, int access, int guard) throws Exception;

    /** Fills a region's whole buffer, guards included: buffer byte {@code i} = {@link TestPattern} byte {@code i}. */
    void fill(int region, long seed) throws Exception;

    /** CRC-32 of {@code [offset, offset + length)} relative to the region's first byte; offset may reach the guard. */
    long checksum(int region, long offset, long length) throws Exception;

    /** Deregisters a region (its buffer stays allocated until {@link #reset()}). */
    void deregister(int region) throws Exception;

    /** Posts {@code count} more receives on free slots of connection {@code conn}. */
    void postRecvs(int conn, int count) throws Exception;

    /**
     * Posts {@code count} signaled sends of {@code size} bytes; message {@code i} holds
     * {@link TestPattern} bytes {@code [0, size)} of {@code messageSeed(seed, i)} and has {@code wrId}
     * {@link #SEND_TAG}{@code + i}.
     *
     * @param opcode {@link WrOpcode#SEND} or {@link WrOpcode#SEND_WITH_IMM} (immediate {@code imm + i})
     */
    void send(int conn, int count, int size, long seed, int opcode, int imm) throws Exception;

    /**
     * Removes and returns the completions recorded on {@code conn}, waiting up to {@code timeoutMillis} until there are
     * at least {@code min}. On timeout returns what there is; callers assert the count.
     */
    List<Completion> takeCompletions(int conn, int min, long timeoutMillis) throws Exception;

    /** Waits up to {@code timeoutMillis} for DISCONNECTED on {@code conn}. @return whether it arrived */
    boolean awaitDisconnected(int conn, long timeoutMillis) throws Exception;

    /** The peer's address as connection {@code conn}'s id reports it ({@link RdmaCmId#remoteAddress()}). */
    InetSocketAddress remoteAddress(int conn) throws Exception;

    /** The state of connection {@code conn}'s queue pair. */
    QpState qpState(int conn) throws Exception;

    /** Starts a disconnect of {@code conn}. */
    void disconnect(int conn) throws Exception;

    /**
     * Destroys connection {@code conn}'s queue pair and id without a disconnect: what the kernel does with the
     * verbs and rdma_cm objects of a process that dies, so on a kernel RDMA stack the other end sees the peer's death.
     */
    void destroy(int conn) throws Exception;

    /** Destroys every resource the peer holds (queue pairs, ids, regions, queues, channel) and reports its usage. */
    Usage reset() throws Exception;

    /** Whether {@link #kill()} is supported: only a peer in a process of its own can die abruptly. */
    boolean canDie();

    /** Kills the peer without any goodbye (SIGKILL); it is unusable afterwards. */
    void kill() throws Exception;

    /** Whether the peer can still take commands. */
    boolean isAlive();

    /** Stops the peer, releasing whatever it holds. Never throws. */
    @Override
    void close();

    static String hex(byte[] data) {
        return data.length == 0 ? "-" : HexFormat.of().formatHex(data);
    }

    static byte[] unhex(String s) {
        return "-".equals(s) ? new byte[0] : HexFormat.of().parseHex(s);
    }
}
