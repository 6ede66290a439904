package io.rdmabridge.verbs.soft;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.NetworkInterface;
import java.net.SocketException;
import java.net.UnknownHostException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;

/**
 * Who holds the other end of a TCP connection on this host, from the kernel's socket tables
 * ({@code /proc/net/tcp} and {@code /proc/net/tcp6}): the same-host path's proof that a peer claiming to share our
 * host and user does. The handshake's token only says which host, directory, user and pid namespace the peer claims;
 * anyone who has seen ours (it is sent in every handshake) can repeat it. A socket whose other end is not in this
 * host's tables (a remote peer, whatever it claims) or belongs to another user (a local process of another user that
 * computed or replayed the token) is not same-host. A process of our own user could open our files anyway, so the
 * pid it names is taken as said.
 *
 * <p>Reads the tables once per call (one line per socket on the host): handshakes only, never a per-message path;
 * and only for a peer whose address is one of this host's, so that a remote peer repeating our token cannot make the
 * engine thread read them for every connection it opens.
 */
final class PeerSockets {
    private static final Path TCP = Paths.get("/proc/net/tcp");
    private static final Path TCP6 = Paths.get("/proc/net/tcp6");
    private static final int LOCAL_ADDRESS = 1;
    private static final int REMOTE_ADDRESS = 2;
    private static final int UID = 7;

    private PeerSockets() {
    }

    /**
     * Whether the other end of {@code ch} is a socket of this host owned by our effective user (the one that owns the
     * files we create); false when it cannot be told.
     */
    static boolean otherEndIsOurUser(SocketChannel ch) {
        try {
            return SharedMemoryFiles.EFFECTIVE_UID >= 0 && otherEndOwner(TCP, TCP6,
                    (InetSocketAddress) ch.getLocalAddress(), (InetSocketAddress) ch.getRemoteAddress())
                    == SharedMemoryFiles.EFFECTIVE_UID;
        } catch (IOException | RuntimeException e) {
            return false;
        }
    }

    /** The owner's uid of the socket whose own address is {@code remote} and peer {@code local}, or -1. */
    static long otherEndOwner(Path tcp, Path tcp6, InetSocketAddress local, InetSocketAddress remote) {
        if (local == null || remote == null || local.getAddress() == null || remote.getAddress() == null) {
            return -1;
        }
        if (!isAddressOfThisHost(remote.getAddress())) {
            // A remote peer that repeats our token: no table read (a line per socket on the host) on its say-so.
            return -1;
        }
        for (Path table : new Path[] {tcp, tcp6}) {
            List<String> lines;
            try {
                lines = Files.readAllLines(table);
            } catch (IOException | RuntimeException e) {
                continue; // no IPv6, say: the other table may still have it
            }
            for (int i = 1; i < lines.size(); i++) {
                String[] f = lines.get(i).trim().split("\\s+");
                if (f.length <= UID) {
                    continue;
                }
                // The other end's socket: its own address is our remote one, its peer our local one.
                if (matches(f[LOCAL_ADDRESS], remote) && matches(f[REMOTE_ADDRESS], local)) {
                    try {
                        return Long.parseLong(f[UID]);
                    } catch (NumberFormatException e) {
                        return -1;
                    }
                }
            }
        }
        return -1;
    }

    /** Whether a socket of this host can have {@code a} as its own address: loopback, or an interface's address. */
    static boolean isAddressOfThisHost(InetAddress a) {
        if (a.isLoopbackAddress()) {
            return true;
        }
        try {
            return NetworkInterface.getByInetAddress(a) != null;
        } catch (SocketException e) {
            return false;
        }
    }

    /** Whether a table's {@code ADDRESS:PORT} (hex, the address in 32-bit words of host byte order) is {@code a}. */
    private static boolean matches(String field, InetSocketAddress a) {
        int colon = field.indexOf(':');
        if (colon < 0 || colon % 8 != 0 || colon == 0 || colon > 32) {
            return false;
        }
        try {
            if (Integer.parseInt(field.substring(colon + 1), 16) != a.getPort()) {
                return false;
            }
            ByteBuffer bytes = ByteBuffer.allocate(colon / 2).order(ByteOrder.nativeOrder());
            for (int w = 0; w < colon; w += 8) {
                bytes.putInt(Integer.parseUnsignedInt(field.substring(w, w + 8), 16));
            }
            // An IPv4-mapped IPv6 address comes back as the IPv4 one, as the JDK reports such a connection's ends.
            return InetAddress.getByAddress(bytes.array()).equals(a.getAddress());
        } catch (NumberFormatException | UnknownHostException e) {
            return false;
        }
    }
}
