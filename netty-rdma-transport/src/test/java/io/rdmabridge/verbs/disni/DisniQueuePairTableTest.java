package io.rdmabridge.verbs.disni;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;

import java.util.HashMap;
import java.util.Map;
import java.util.Random;
import org.junit.jupiter.api.Test;
import sun.misc.Unsafe;

/** The table that routes completions to queue pairs by number, checked against a HashMap. */
class DisniQueuePairTableTest {

    /** Stand-ins: the table only stores references, so instances without a constructor call are enough. */
    private static DisniQueuePair[] queuePairs(int n) throws Exception {
        java.lang.reflect.Field f = Unsafe.class.getDeclaredField("theUnsafe");
        f.setAccessible(true);
        Unsafe unsafe = (Unsafe) f.get(null);
        DisniQueuePair[] qps = new DisniQueuePair[n];
        for (int i = 0; i < n; i++) {
            qps[i] = (DisniQueuePair) unsafe.allocateInstance(DisniQueuePair.class);
        }
        return qps;
    }

    @Test
    void shouldBehaveLikeAMapUnderRandomPutsAndRemoves() throws Exception {
        DisniQueuePair[] qps = queuePairs(64);
        QueuePairTable table = new QueuePairTable();
        Map<Integer, DisniQueuePair> expected = new HashMap<>();
        Random random = new Random(42);
        for (int step = 0; step < 20_000; step++) {
            // A small key space forces collisions, growth and backward-shift deletions.
            int key = random.nextInt(200) * (random.nextBoolean() ? 1 : 0x10000);
            if (random.nextInt(3) == 0) {
                table.remove(key);
                expected.remove(key);
            } else {
                DisniQueuePair qp = qps[random.nextInt(qps.length)];
                table.put(key, qp);
                expected.put(key, qp);
            }
            if (step % 97 == 0) {
                for (int k = 0; k < 200; k++) {
                    assertSame(expected.get(k), table.get(k), "key " + k + " at step " + step);
                    assertSame(expected.get(k * 0x10000), table.get(k * 0x10000), "key " + k * 0x10000);
                }
            }
        }
        assertEquals(expected.size(), table.size());
    }

    @Test
    void shouldForgetARemovedQueuePair() throws Exception {
        DisniQueuePair[] qps = queuePairs(2);
        QueuePairTable table = new QueuePairTable();
        table.put(7, qps[0]);
        table.put(23, qps[1]);
        table.remove(7);
        assertNull(table.get(7));
        assertSame(qps[1], table.get(23));
        assertEquals(1, table.size());
    }
}
