package io.rdmabridge.connection;

import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * A bounded multi-producer multi-consumer queue of non-negative ints (D. Vyukov's array queue): free lists of
 * registered blocks, which any thread may take from and give back to. Lock-free; allocates nothing after
 * construction. Thread-safe.
 */
final class IndexQueue {
    private final AtomicLongArray sequence;
    private final int[] values;
    private final int mask;
    private final AtomicLong enqueuePosition = new AtomicLong();
    private final AtomicLong dequeuePosition = new AtomicLong();

    IndexQueue(int capacity) {
        int size = Integer.highestOneBit(Math.max(2, capacity - 1) << 1);
        sequence = new AtomicLongArray(size);
        values = new int[size];
        mask = size - 1;
        for (int i = 0; i < size; i++) {
            sequence.set(i, i);
        }
    }

    /** @return {@code false} when full */
    boolean offer(int value) {
        long pos = enqueuePosition.get();
        for (;;) {
            int idx = (int) (pos & mask);
            long dif = sequence.get(idx) - pos;
            if (dif == 0) {
                if (enqueuePosition.compareAndSet(pos, pos + 1)) {
                    values[idx] = value;
                    sequence.lazySet(idx, pos + 1);
                    return true;
                }
                pos = enqueuePosition.get();
            } else if (dif < 0) {
                return false;
            } else {
                pos = enqueuePosition.get();
            }
        }
    }

    /** @return the oldest value, or {@code -1} when empty */
    int poll() {
        long pos = dequeuePosition.get();
        for (;;) {
            int idx = (int) (pos & mask);
            long dif = sequence.get(idx) - (pos + 1);
            if (dif == 0) {
                if (dequeuePosition.compareAndSet(pos, pos + 1)) {
                    int value = values[idx];
                    sequence.lazySet(idx, pos + mask + 1);
                    return value;
                }
                pos = dequeuePosition.get();
            } else if (dif < 0) {
                return -1;
            } else {
                pos = dequeuePosition.get();
            }
        }
    }
}
