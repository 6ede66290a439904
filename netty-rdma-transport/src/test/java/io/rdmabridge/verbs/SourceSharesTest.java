package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.UnknownHostException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

class SourceSharesTest {
    private static InetAddress host(int n) throws UnknownHostException {
        return InetAddress.getByAddress(new byte[] {10, 0, 0, (byte) n});
    }

    @Test
    void shouldKeepEachAddressToHalfThePlacesBeforeCountingTheTotal() throws Exception {
        SourceShares shares = new SourceShares(4);
        assertEquals(2, shares.maxPerSource());
        assertNull(shares.admit(host(1)));
        assertNull(shares.admit(host(1)));
        assertEquals(SourceShares.Refusal.SHARE, shares.admit(host(1)));
        assertEquals(2, shares.held(), "a refused address takes no place of the total");
        assertNull(shares.admit(host(2)));
        assertNull(shares.admit(host(3)));
        assertEquals(SourceShares.Refusal.TOTAL, shares.admit(host(4)));
        assertEquals(4, shares.held());
        shares.release(host(1));
        assertNull(shares.admit(host(4)), "a place given back is taken again");
        for (int n : new int[] {1, 2, 3, 4}) {
            shares.release(host(n));
        }
        assertEquals(0, shares.held());
        assertNull(shares.admit(host(1)));
        assertNull(shares.admit(host(1)), "an address that left with its last place starts its share again");
    }

    @Test
    void shouldGiveOneAddressThePlaceWhenTheCapIsOne() throws Exception {
        SourceShares one = new SourceShares(1);
        assertEquals(1, one.maxPerSource());
        assertNull(one.admit(host(1)));
        assertEquals(SourceShares.Refusal.SHARE, one.admit(host(1)));
        assertEquals(SourceShares.Refusal.TOTAL, one.admit(host(2)));
        one.release(host(1));
        assertNull(one.admit(host(2)));
        assertThrows(IllegalArgumentException.class, () -> new SourceShares(0));
        assertThrows(IllegalStateException.class, () -> one.release(host(1)), "a release without its admit");
        assertEquals(1, one.held(), "a release without its admit gives away no place another address holds");
    }

    /**
     * IPv6 addresses count one by one, as IPv4 ones do: two addresses of one /64 take a share each, and the loopback
     * of each family is its own source. Peers whose address is not known share one share.
     */
    @Test
    void shouldCountIpv6AddressesOneByOneAndUnknownPeersAsOne() throws Exception {
        SourceShares shares = new SourceShares(4);
        InetAddress a = InetAddress.getByName("2001:db8::1");
        InetAddress b = InetAddress.getByName("2001:db8::2");
        assertNull(shares.admit(a));
        assertNull(shares.admit(a));
        assertEquals(SourceShares.Refusal.SHARE, shares.admit(a));
        assertNull(shares.admit(b), "another address of the same /64 has a share of its own");
        assertEquals(SourceShares.Refusal.SHARE, shares.admit(InetAddress.getByName("2001:db8:0:0:0:0:0:1")),
                "the same address however it is written");
        shares.release(a);
        shares.release(a);
        shares.release(b);

        assertEquals(SourceShares.UNKNOWN_SOURCE, SourceShares.sourceOf(null));
        assertEquals(SourceShares.UNKNOWN_SOURCE, SourceShares.sourceOf(InetSocketAddress.createUnresolved("h", 1)));
        assertEquals(host(7), SourceShares.sourceOf(new InetSocketAddress(host(7), 9)));
        assertNull(shares.admit(SourceShares.sourceOf(null)));
        assertNull(shares.admit(SourceShares.sourceOf(null)));
        assertEquals(SourceShares.Refusal.SHARE, shares.admit(SourceShares.sourceOf(null)));
        assertNull(shares.admit(InetAddress.getByName("::1")));
        assertNull(shares.admit(InetAddress.getByName("127.0.0.1")), "IPv4 loopback is not IPv6 loopback");
        assertEquals(4, shares.held());
    }

    /**
     * Three threads of each of four addresses admit and release at once, each address wanting more than its share and
     * all together more than the cap: the places they hold never exceed the cap or an address's share, and none is
     * left behind.
     */
    @Test
    void shouldNeverGiveMoreThanTheCapOrAShareUnderConcurrentAdmission() throws Exception {
        SourceShares shares = new SourceShares(8);
        AtomicInteger holding = new AtomicInteger();
        AtomicInteger[] holdingBySource = new AtomicInteger[4];
        for (int s = 0; s < holdingBySource.length; s++) {
            holdingBySource[s] = new AtomicInteger();
        }
        AtomicInteger over = new AtomicInteger();
        CountDownLatch start = new CountDownLatch(1);
        List<Thread> threads = new ArrayList<>();
        for (int t = 0; t < 12; t++) {
            int s = t % 4;
            InetAddress source = host(s);
            Thread thread = new Thread(() -> {
                try {
                    start.await();
                } catch (InterruptedException e) {
                    return;
                }
                List<Integer> mine = new ArrayList<>();
                for (int i = 0; i < 20_000; i++) {
                    SourceShares.Refusal r = shares.admit(source);
                    if (r == null) {
                        if (holding.incrementAndGet() > shares.max()
                                | holdingBySource[s].incrementAndGet() > shares.maxPerSource()) {
                            over.incrementAndGet();
                        }
                        mine.add(i);
                    }
                    // Each thread holds up to two places at a time: six an address, 24 in all.
                    if (mine.size() == 2 || r != null && !mine.isEmpty()) {
                        holdingBySource[s].decrementAndGet();
                        holding.decrementAndGet();
                        mine.remove(mine.size() - 1);
                        shares.release(source);
                    }
                }
                for (int k = 0; k < mine.size(); k++) {
                    holdingBySource[s].decrementAndGet();
                    holding.decrementAndGet();
                    shares.release(source);
                }
            });
            threads.add(thread);
        }
        threads.forEach(Thread::start);
        start.countDown();
        for (Thread thread : threads) {
            thread.join();
        }
        assertEquals(0, over.get(), "times a place beyond the cap or a share was given");
        assertEquals(0, shares.held());
        for (int n = 0; n < 4; n++) {
            assertNull(shares.admit(host(0)));
            shares.release(host(0));
        }
        for (int n = 0; n < 4; n++) {
            assertNull(shares.admit(host(0)), "no place of an address left behind");
        }
        assertEquals(SourceShares.Refusal.SHARE, shares.admit(host(0)));
    }
}
