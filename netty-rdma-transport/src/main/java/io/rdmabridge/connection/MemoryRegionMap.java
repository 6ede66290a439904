package io.rdmabridge.connection;

import io.rdmabridge.verbs.MemoryRegion;

import java.util.Arrays;

/**
 * Finds the memory region that covers an address range: how a registered buffer's lkey and rkey are found from its
 * address alone. Lookups, on every write's hot path, read an immutable snapshot (no lock, no allocation, binary
 * search); adding and removing regions is rare (a slab, a receive slab, a large buffer) and copies the snapshot under
 * a lock. Thread-safe.
 */
public final class MemoryRegionMap {
    private static final Snapshot EMPTY = new Snapshot(new long[0], new MemoryRegion[0]);

    private volatile Snapshot snapshot = EMPTY;

    private static final class Snapshot {
        final long[] starts;
        final MemoryRegion[] regions;

        Snapshot(long[] starts, MemoryRegion[] regions) {
            this.starts = starts;
            this.regions = regions;
        }
    }

    /** The region containing {@code [address, address + length)}, or {@code null}. */
    public MemoryRegion find(long address, long length) {
        Snapshot s = snapshot;
        long[] starts = s.starts;
        int lo = 0;
        int hi = starts.length - 1;
        int found = -1;
        while (lo <= hi) {
            int mid = (lo + hi) >>> 1;
            if (starts[mid] <= address) {
                found = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        // Regions cover distinct allocations and never overlap, so only the nearest start below can match.
        if (found >= 0) {
            MemoryRegion mr = s.regions[found];
            if (mr.contains(address, length)) {
                return mr;
            }
        }
        return null;
    }

    public synchronized void add(MemoryRegion mr) {
        Snapshot s = snapshot;
        int n = s.starts.length;
        int at = Arrays.binarySearch(s.starts, mr.address());
        at = at < 0 ? -at - 1 : at;
        long[] starts = new long[n + 1];
        MemoryRegion[] regions = new MemoryRegion[n + 1];
        System.arraycopy(s.starts, 0, starts, 0, at);
        System.arraycopy(s.regions, 0, regions, 0, at);
        starts[at] = mr.address();
        regions[at] = mr;
        System.arraycopy(s.starts, at, starts, at + 1, n - at);
        System.arraycopy(s.regions, at, regions, at + 1, n - at);
        snapshot = new Snapshot(starts, regions);
    }

    public synchronized boolean remove(MemoryRegion mr) {
        Snapshot s = snapshot;
        int n = s.starts.length;
        for (int i = 0; i < n; i++) {
            if (s.regions[i] == mr) {
                long[] starts = new long[n - 1];
                MemoryRegion[] regions = new MemoryRegion[n - 1];
                System.arraycopy(s.starts, 0, starts, 0, i);
                System.arraycopy(s.regions, 0, regions, 0, i);
                System.arraycopy(s.starts, i + 1, starts, i, n - i - 1);
                System.arraycopy(s.regions, i + 1, regions, i, n - i - 1);
                snapshot = new Snapshot(starts, regions);
                return true;
            }
        }
        return false;
    }

    public int size() {
        return snapshot.starts.length;
    }
}
