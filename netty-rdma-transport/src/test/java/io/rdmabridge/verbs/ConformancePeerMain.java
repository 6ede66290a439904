package io.rdmabridge.verbs;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * The cross-process conformance peer: an {@link InJvmConformancePeer} in a JVM of its own, driven over a line
 * protocol on stdin/stdout by {@link ProcessConformancePeer}.
 *
 * <pre>
 * request:  command arg...          (one line, space-separated; byte arrays in hex, "-" when empty)
 * response: ok value...             (one line)
 *           ok n, then n lines      (for lists)
 *           err message             (one line)
 * </pre>
 * The process exits when stdin closes, so it never outlives the test JVM that started it.
 * Usage: {@code java -cp <test classpath> io.rdmabridge.verbs.ConformancePeerMain <provider>}.
 */
public final class ConformancePeerMain {

    private ConformancePeerMain() {
    }

    public static void main(String[] args) throws Exception {
        // stdout carries the protocol only: anything else that prints goes to stderr.
        PrintStream protocol = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        System.setOut(System.err);
        RdmaProvider provider = RdmaProviders.select(args.length > 0 ? args[0] : "soft").orElseThrow();
        InJvmConformancePeer peer = new InJvmConformancePeer(provider);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        protocol.println("ok ready " + ProcessHandle.current().pid());
        protocol.flush();
        String line;
        while ((line = in.readLine()) != null) {
            String response;
            try {
                response = dispatch(peer, line.trim().split(" "));
            } catch (Throwable t) {
                response = "err " + String.valueOf(t).replace('\n', ' ').replace('\r', ' ');
            }
            protocol.println(response);
            protocol.flush();
            if (line.startsWith("quit")) {
                break;
            }
        }
        peer.close();
        System.exit(0);
    }

    private static String dispatch(ConformancePeer peer, String[] f) throws Exception {
        switch (f[0]) {
            case "listen":
                return "ok " + peer.listen(f[1], ConformancePeer.Config.decode(f, 2));
            case "configure":
                peer.configure(ConformancePeer.Config.decode(f, 1));
                return "ok";
            case "requests": {
                List<byte[]> requests = peer.connectRequests();
                StringBuilder sb = new StringBuilder("ok ").append(requests.size());
                for (byte[] r : requests) {
                    sb.append('\n').append(ConformancePeer.hex(r));
                }
                return sb.toString();
            }
            case "register":
                return "ok " + peer.register(Long.parseLong(f[1]), Integer.parseInt(f[2]), Integer.parseInt(f[3]))
                        .encode();
            case "fill":
                peer.fill(Integer.parseInt(f[1]), Long.parseLong(f[2]));
                return "ok";
            case "checksum":
                return "ok " + peer.checksum(Integer.parseInt(f[1]), Long.parseLong(f[2]), Long.parseLong(f[3]));
            case "deregister":
                peer.deregister(Integer.parseInt(f[1]));
                return "ok";
            case "postRecvs":
                peer.postRecvs(Integer.parseInt(f[1]), Integer.parseInt(f[2]));
                return "ok";
            case "send":
                peer.send(Integer.parseInt(f[1]), Integer.parseInt(f[2]), Integer.parseInt(f[3]),
                        Long.parseLong(f[4]), Integer.parseInt(f[5]), Integer.parseInt(f[6]));
                return "ok";
            case "take": {
                List<ConformancePeer.Completion> list = peer.takeCompletions(Integer.parseInt(f[1]),
                        Integer.parseInt(f[2]), Long.parseLong(f[3]));
                StringBuilder sb = new StringBuilder(16 + list.size() * 64).append("ok ").append(list.size());
                for (ConformancePeer.Completion c : list) {
                    sb.append('\n').append(c.encode());
                }
                return sb.toString();
            }
            case "awaitDisconnected":
                return "ok " + peer.awaitDisconnected(Integer.parseInt(f[1]), Long.parseLong(f[2]));
            case "remoteAddress": {
                InetSocketAddress a = peer.remoteAddress(Integer.parseInt(f[1]));
                return "ok " + a.getAddress().getHostAddress() + " " + a.getPort();
            }
            case "qpState":
                return "ok " + peer.qpState(Integer.parseInt(f[1])).name();
            case "disconnect":
                peer.disconnect(Integer.parseInt(f[1]));
                return "ok";
            case "destroy":
                peer.destroy(Integer.parseInt(f[1]));
                return "ok";
            case "reset": {
                ConformancePeer.Usage usage = peer.reset();
                return "ok " + usage.zero() + " " + usage.usage().replace(' ', '_');
            }
            case "quit":
                return "ok";
            default:
                throw new IllegalArgumentException("unknown command: " + f[0]);
        }
    }
}
