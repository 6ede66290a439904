package io.rdmabridge.verbs.soft;

/**
 * A map from memory key to region, read without locks or allocation on every work request and rewritten (copy on
 * write) on registration and deregistration. Reads from any thread; writes serialised by the caller.
 */
final class MemoryKeyTable {
    private static final class Table {
        final int[] keys;
        final SoftMemoryRegion[] regions;
        final int size;

        Table(int capacity, int size) {
            keys = new int[capacity];
            regions = new SoftMemoryRegion[capacity];
            this.size = size;
        }
    }

    private volatile Table table = new Table(16, 0);

    private static int mix(int key) {
        int h = key * 0x9E3779B9;
        return h ^ (h >>> 16);
    }

    /** The live region with this key, or {@code null}; key 0 is never valid. */
    SoftMemoryRegion get(int key) {
        if (key == 0) {
            return null;
        }
        Table t = table;
        int mask = t.keys.length - 1;
        for (int i = mix(key) & mask;; i = (i + 1) & mask) {
            int k = t.keys[i];
            if (k == key) {
                return t.regions[i];
            }
            if (k == 0) {
                return null;
            }
        }
    }

    void put(int key, SoftMemoryRegion region) {
        Table old = table;
        table = rebuild(old, old.size + 1, key, region, 0);
    }

    void remove(int key) {
        Table old = table;
        table = rebuild(old, old.size - 1, 0, null, key);
    }

    private static Table rebuild(Table old, int size, int addKey, SoftMemoryRegion addRegion, int removeKey) {
        int capacity = 16;
        while (capacity < size * 2 + 2) {
            capacity <<= 1;
        }
        Table t = new Table(capacity, size);
        for (int i = 0; i < old.keys.length; i++) {
            int k = old.keys[i];
            if (k != 0 && k != removeKey) {
                insert(t, k, old.regions[i]);
            }
        }
        if (addKey != 0) {
            insert(t, addKey, addRegion);
        }
        return t;
    }

    private static void insert(Table t, int key, SoftMemoryRegion region) {
        int mask = t.keys.length - 1;
        int i = mix(key) & mask;
        while (t.keys[i] != 0) {
            i = (i + 1) & mask;
        }
        t.keys[i] = key;
        t.regions[i] = region;
    }
}
