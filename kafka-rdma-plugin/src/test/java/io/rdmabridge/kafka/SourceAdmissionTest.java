package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.UnknownHostException;
import org.junit.jupiter.api.Test;

class SourceAdmissionTest {
    private final SourceAdmission admission = SourceAdmission.handshakes(4, "RDMA handshakes in progress");

    private static InetAddress host(int n) throws UnknownHostException {
        return InetAddress.getByAddress(new byte[] {10, 0, 0, (byte) n});
    }

    @Test
    void shouldKeepEachAddressToHalfThePlacesAndNameWhatRefusedIt() throws Exception {
        assertNull(admission.admit(host(1)));
        assertNull(admission.admit(host(1)));
        String refused = admission.admit(host(1));
        assertEquals("more than 2 RDMA handshakes in progress from 10.0.0.1 (one address may hold 2 of "
                + "rdma.handshake.max.in.progress=4; raise it if that host runs many brokers, or allow only the brokers' "
                + "hosts to reach the port)", refused);
        assertEquals(2, admission.held(), "a refused address takes no place of the total");
        assertNull(admission.admit(host(2)));
        assertNull(admission.admit(host(3)));
        refused = admission.admit(host(4));
        assertTrue(refused != null && refused.startsWith("more than 4 RDMA handshakes in progress "
                + "(rdma.handshake.max.in.progress;"), refused);
        admission.release(host(1));
        assertNull(admission.admit(host(4)), "a place given back is taken again");
        for (int n : new int[] {1, 2, 3, 4}) {
            admission.release(host(n));
        }
        assertEquals(0, admission.held());
        assertNull(admission.admit(host(1)));
        assertNull(admission.admit(host(1)), "an address that left the map starts its share again");
    }

    @Test
    void shouldGiveOneAddressOnePlaceWhenTheKeyAllowsOne() throws Exception {
        SourceAdmission one = SourceAdmission.handshakes(1, "RDMA handshakes in progress");
        assertNull(one.admit(host(1)));
        assertEquals("more than 1 RDMA handshakes in progress from 10.0.0.1 (one address may hold 1 of "
                + "rdma.handshake.max.in.progress=1; raise it if that host runs many brokers, or allow only the brokers' "
                + "hosts to reach the port)", one.admit(host(1)), "the share names its size, not half");
        assertTrue(one.admit(host(2)) != null, "the only place is taken");
        one.release(host(1));
        assertNull(one.admit(host(2)));
    }
}
