package io.rdmabridge.verbs.soft;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Reading the owner of a connection's other end from the kernel's socket tables, in their own format. */
class PeerSocketsTest {
    private static final String HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
            + "   uid  timeout inode\n";
    private static final InetSocketAddress OURS = new InetSocketAddress("127.0.0.1", 40000);
    private static final InetSocketAddress THEIRS = new InetSocketAddress("127.0.0.1", 8080);

    @TempDir
    Path dir;

    /** One table line: a socket whose own address is {@code local} and peer {@code remote}, owned by {@code uid}. */
    private static String line(String local, String remote, long uid) {
        return "   0: " + local + " " + remote + " 01 00000000:00000000 00:00000000 00000000  " + uid
                + "        0 4242 1 0000000000000000 20 4 30 10 -1\n";
    }

    /** 127.0.0.1 as the kernel prints it: one 32-bit word in host byte order. */
    private static String loopback4() {
        return ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN ? "0100007F" : "7F000001";
    }

    /** ::ffff:127.0.0.1 as the kernel prints it: four 32-bit words in host byte order. */
    private static String mappedLoopback6() {
        return ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN ? "0000000000000000FFFF00000100007F"
                : "00000000000000000000FFFF7F000001";
    }

    private long owner(String tcp, String tcp6) throws Exception {
        Path t = Files.writeString(dir.resolve("tcp"), HEADER + tcp);
        Path t6 = Files.writeString(dir.resolve("tcp6"), HEADER + tcp6);
        return PeerSockets.otherEndOwner(t, t6, OURS, THEIRS);
    }

    @Test
    void shouldFindTheOtherEndOfAnIpv4Connection() throws Exception {
        String ourEnd = line(loopback4() + ":9C40", loopback4() + ":1F90", 0);
        String theirEnd = line(loopback4() + ":1F90", loopback4() + ":9C40", 1000);
        assertEquals(1000, owner(ourEnd + theirEnd, ""));
    }

    @Test
    void shouldFindAnIpv4MappedOtherEndInTheIpv6Table() throws Exception {
        assertEquals(65534, owner("", line(mappedLoopback6() + ":1F90", mappedLoopback6() + ":9C40", 65534)));
    }

    @Test
    void shouldFindNothingWhenOnlyOurEndIsOnThisHost() throws Exception {
        // A remote peer: our socket is in the table, its is not.
        assertEquals(-1, owner(line(loopback4() + ":9C40", loopback4() + ":1F90", 0), ""));
        // Same ports, other addresses.
        assertEquals(-1, owner(line("0200007F:1F90", loopback4() + ":9C40", 0), ""));
    }

    @Test
    void shouldFindNothingInUnreadableOrMalformedTables() throws Exception {
        assertEquals(-1, PeerSockets.otherEndOwner(dir.resolve("missing"), dir.resolve("missing6"), OURS, THEIRS));
        assertEquals(-1, owner("   0: garbage\n   1: 12:34 56:78 01\n", "   0: ZZZZZZZZ:1F90 x y z w v u\n"));
    }

    /**
     * A peer whose address is not one of this host's is remote, whatever a table says: the tables (a line per socket
     * on the host) are not read for it, so a remote peer repeating our token cannot make every handshake read them.
     */
    @Test
    void shouldNotReadTheTablesForAPeerWhoseAddressIsNotOfThisHost() throws Exception {
        // 192.0.2.1 (TEST-NET-1, RFC 5737) is no host's address; the table lists a socket of it, owned by uid 1000,
        // connected to our end.
        InetSocketAddress remote = new InetSocketAddress("192.0.2.1", 8080);
        String testNet = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN ? "010200C0" : "C0000201";
        Path t = Files.writeString(dir.resolve("tcp"), HEADER + line(testNet + ":1F90", loopback4() + ":9C40", 1000));
        Path t6 = Files.writeString(dir.resolve("tcp6"), HEADER);
        assertFalse(PeerSockets.isAddressOfThisHost(remote.getAddress()));
        assertEquals(-1, PeerSockets.otherEndOwner(t, t6, OURS, remote));
        assertTrue(PeerSockets.isAddressOfThisHost(InetAddress.getLoopbackAddress()));
    }
}
