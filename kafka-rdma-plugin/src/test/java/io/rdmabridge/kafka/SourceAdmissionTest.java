package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import io.rdmabridge.verbs.SourceShares;
import java.net.InetAddress;
import java.net.UnknownHostException;
import org.junit.jupiter.api.Test;

/** The reasons a refusal gives, naming the key and the fix; the counting itself is {@code SourceSharesTest}'s. */
class SourceAdmissionTest {
    private static InetAddress host(int n) throws UnknownHostException {
        return InetAddress.getByAddress(new byte[] {10, 0, 0, (byte) n});
    }

    @Test
    void shouldNameTheShareOrTheTotalThatRefusedAPlaceAndTheFix() throws Exception {
        SourceAdmission admission = SourceAdmission.handshakes(4, "RDMA handshakes in progress");
        assertNull(admission.admit(host(1)));
        assertNull(admission.admit(host(1)));
        assertEquals("more than 2 RDMA handshakes in progress from 10.0.0.1 (one address may hold 2 of "
                + "rdma.handshake.max.in.progress=4; raise it if that host runs many brokers, or allow only the "
                + "brokers' hosts to reach the port)", admission.admit(host(1)));
        assertNull(admission.admit(host(2)));
        assertNull(admission.admit(host(3)));
        assertEquals("more than 4 RDMA handshakes in progress (rdma.handshake.max.in.progress; raise it if this many "
                + "brokers reconnect at once, or allow only the brokers' hosts to reach the port)",
                admission.admit(host(4)));
        for (int n : new int[] {1, 1, 2, 3}) {
            admission.release(host(n));
        }
        assertEquals(0, admission.held());
    }

    @Test
    void shouldNameTheShareItsSizeAndPeersWithoutAnAddressSo() throws Exception {
        SourceAdmission one = SourceAdmission.connections(1);
        assertNull(one.admit(SourceShares.UNKNOWN_SOURCE));
        assertEquals("more than 1 RDMA connections open from peers whose address is not known (one address may "
                + "hold 1 of rdma.max.connections=1; raise it to at least twice num.replica.fetchers times the brokers "
                + "on that host, or allow only the brokers' hosts to reach the port)",
                one.admit(SourceShares.UNKNOWN_SOURCE),
                "the share names its size, not half");
        one.release(SourceShares.UNKNOWN_SOURCE);
    }
}
