package io.rdmabridge.verbs.disni;

/**
 * The queue pairs attached to one completion queue, by queue pair number: an open-addressing table with linear
 * probing, so that routing a completion to its queue pair allocates nothing (no boxed keys). Owned by the thread that
 * owns the completion queue; not thread-safe.
 */
final class QueuePairTable {
    private int[] keys = new int[16];
    private DisniQueuePair[] values = new DisniQueuePair[16];
    private int size;

    int size() {
        return size;
    }

    DisniQueuePair get(int qpNumber) {
        int mask = keys.length - 1;
        for (int i = mix(qpNumber) & mask; values[i] != null; i = (i + 1) & mask) {
            if (keys[i] == qpNumber) {
                return values[i];
            }
        }
        return null;
    }

    void put(int qpNumber, DisniQueuePair qp) {
        if ((size + 1) * 2 > keys.length) {
            grow();
        }
        int mask = keys.length - 1;
        int i = mix(qpNumber) & mask;
        while (values[i] != null) {
            if (keys[i] == qpNumber) {
                values[i] = qp;
                return;
            }
            i = (i + 1) & mask;
        }
        keys[i] = qpNumber;
        values[i] = qp;
        size++;
    }

    void remove(int qpNumber) {
        int mask = keys.length - 1;
        int i = mix(qpNumber) & mask;
        while (values[i] != null && keys[i] != qpNumber) {
            i = (i + 1) & mask;
        }
        if (values[i] == null) {
            return;
        }
        values[i] = null;
        size--;
        // Backward-shift deletion: re-insert the rest of the probe run so that lookups never stop at the hole.
        for (int j = (i + 1) & mask; values[j] != null; j = (j + 1) & mask) {
            int key = keys[j];
            DisniQueuePair value = values[j];
            values[j] = null;
            size--;
            put(key, value);
        }
    }

    private void grow() {
        int[] oldKeys = keys;
        DisniQueuePair[] oldValues = values;
        keys = new int[oldKeys.length * 2];
        values = new DisniQueuePair[oldValues.length * 2];
        size = 0;
        for (int i = 0; i < oldKeys.length; i++) {
            if (oldValues[i] != null) {
                put(oldKeys[i], oldValues[i]);
            }
        }
    }

    private static int mix(int key) {
        int h = key * 0x9E3779B9;
        return h ^ (h >>> 16);
    }
}
