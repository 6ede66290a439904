package io.rdmabridge.benchmarks;

import io.netty.buffer.ByteBuf;

/**
 * The 16 bytes a benchmark client sends first on every connection, telling the {@link PerfServer} what to do with the
 * bytes that follow.
 *
 * <pre>
 *  0                   1                   2                   3
 *  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
 * +---------------------------------------------------------------+
 * |                     magic 0x52504552 ("RPER")                 |
 * +---------------------------------------------------------------+
 * |                     mode (1 = echo, 2 = sink)                 |
 * +---------------------------------------------------------------+
 * |                 ack unit in bytes (sink only), 64 bits        |
 * +                                                               +
 * |                                                               |
 * +---------------------------------------------------------------+
 * </pre>
 * Big-endian. In echo mode the server writes back every byte it reads; in sink mode it discards them and writes one
 * byte back each time another {@code ack unit} bytes have arrived.
 */
final class PerfHeader {
    static final int LENGTH = 16;
    static final int MAGIC = 0x52504552;
    static final int MODE_ECHO = 1;
    static final int MODE_SINK = 2;

    private PerfHeader() {
    }

    static ByteBuf write(ByteBuf out, int mode, long ackUnit) {
        return out.writeInt(MAGIC).writeInt(mode).writeLong(ackUnit);
    }
}
