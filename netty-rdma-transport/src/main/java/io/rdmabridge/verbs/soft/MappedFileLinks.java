package io.rdmabridge.verbs.soft;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;

/**
 * Read-only file mappings registered in this process ({@link io.rdmabridge.verbs.ProtectionDomain#registerFileMapping}:
 * the chunks a file region is sent from), offered to same-host peers as the file itself. The first time a range
 * inside one is registered for remote read, the file behind it is looked up in {@code /proc/self/maps} and a
 * symbolic link to it is made in the shared-memory directory, named like our shared files; the range is published
 * with that link's number, the offset in the file, and the file's device and inode. A peer then reads the file's
 * bytes itself ({@link SharedPeer}, one copy out of the page cache, no work here), as a NIC reads the page cache pages
 * the registration pinned. The link goes with the mapping's registration.
 *
 * <p>What is not offered, and stays on the TCP path: a mapping whose file was deleted or replaced since it was mapped
 * (its path now names other bytes), a mapping that {@code /proc/self/maps} does not show as one file range, and any
 * range while the same-host path is off. A peer checks that the link leads to the published device and inode, so a
 * file replaced under its path later (renamed over) is not read one-sided either.
 *
 * <p>Threading: {@link #registered}, {@link #deregistered} and {@link #find} run under the engine's key lock; the
 * lookup in {@code /proc/self/maps} (a fraction of a millisecond) happens once per mapping, at its first remote-read
 * registration. {@link #deleteAll} may run on any thread (the exit hook).
 */
final class MappedFileLinks {
    /**
     * System property: {@code false} keeps mappings registered from now on off this path (peers then read them
     * through this process, as before); read at each mapping's first remote-read registration.
     */
    static final String PROPERTY = "rdmabridge.soft.fileLinks";

    /** One registered file mapping; resolved on first use. */
    static final class Entry {
        final int key;
        final long base;
        final long length;
        /** 0 until resolved; -1 when the mapping cannot be offered. */
        long number;
        long fileOffset;
        long device;
        long inode;
        volatile Path link;

        Entry(int key, long base, long length) {
            this.key = key;
            this.base = base;
            this.length = length;
        }
    }

    private final SharedMemoryFiles files;
    private volatile Entry[] entries = new Entry[0];

    MappedFileLinks(SharedMemoryFiles files) {
        this.files = files;
    }

    /** The region of {@code key} maps {@code [base, base + length)} of a file read-only. Key lock held. */
    void registered(int key, long base, long length) {
        Entry[] e = entries;
        Entry[] grown = Arrays.copyOf(e, e.length + 1);
        grown[e.length] = new Entry(key, base, length);
        entries = grown;
    }

    /** The region of {@code key} is deregistered: its link, if it has one, goes. Key lock held; cheap when none. */
    void deregistered(int key) {
        Entry[] e = entries;
        for (int i = 0; i < e.length; i++) {
            if (e[i].key == key) {
                Entry gone = e[i];
                Entry[] shrunk = Arrays.copyOf(e, e.length - 1);
                if (i < shrunk.length) {
                    shrunk[i] = e[e.length - 1];
                }
                entries = shrunk;
                Path link = gone.link;
                if (link != null) {
                    gone.link = null;
                    SharedMemoryFiles.deleteQuietly(link);
                }
                return;
            }
        }
    }

    /**
     * The registered file mapping holding {@code [address, address + length)}, its link made now if need be, or
     * {@code null} when no such mapping is registered or its file cannot be offered. Key lock held.
     */
    Entry find(long address, long length) {
        for (Entry e : entries) {
            if (address >= e.base && length <= e.length && address - e.base <= e.length - length) {
                if (e.number == 0) {
                    if ("false".equalsIgnoreCase(System.getProperty(PROPERTY, "true").trim())) {
                        e.number = -1;
                    } else {
                        resolve(e);
                    }
                }
                return e.number > 0 ? e : null;
            }
        }
        return null;
    }

    private void resolve(Entry e) {
        e.number = -1;
        String[] found = mappingOf(e.base, e.length);
        if (found == null) {
            return;
        }
        Path file = Paths.get(found[2]);
        long inode = Long.parseLong(found[1]);
        try {
            // The path must still name the mapped file: Spark, for one, renames finished files over older ones.
            if (((Number) Files.getAttribute(file, "unix:ino", LinkOption.NOFOLLOW_LINKS)).longValue() != inode
                    || !Files.isRegularFile(file, LinkOption.NOFOLLOW_LINKS)) {
                return;
            }
            long device = ((Number) Files.getAttribute(file, "unix:dev", LinkOption.NOFOLLOW_LINKS)).longValue();
            long number = files.nextFileNumber();
            Path link = files.directory.resolve(SharedMemoryFiles.filePrefix(files.pid()) + number);
            Files.createSymbolicLink(link, file);
            e.link = link;
            e.fileOffset = Long.parseLong(found[0], 16) + (e.base - Long.parseUnsignedLong(found[3], 16));
            e.device = device;
            e.inode = inode;
            e.number = number;
        } catch (IOException | RuntimeException ex) {
            SoftEngine.logger.debug("soft0: mapped file {} is not offered to same-host peers ({}): they read it "
                    + "through this process", file, ex.toString());
        }
    }

    /**
     * From {@code /proc/self/maps}, the one mapping that holds {@code [base, base + length)} whole, if it maps a file
     * that still exists: its offset in the file (hex), inode (decimal), path and start (hex); else {@code null}.
     */
    private static String[] mappingOf(long base, long length) {
        String maps;
        try {
            maps = new String(Files.readAllBytes(Paths.get("/proc/self/maps")), StandardCharsets.UTF_8);
        } catch (IOException | RuntimeException e) {
            return null;
        }
        for (String line : maps.split("\n")) {
            // start-end perms offset dev inode path (the path may hold spaces; a deleted file ends in " (deleted)")
            String[] f = line.split("\\s+", 6);
            int dash = f[0].indexOf('-');
            if (f.length < 6 || dash < 0) {
                continue;
            }
            long start = Long.parseUnsignedLong(f[0], 0, dash, 16);
            long end = Long.parseUnsignedLong(f[0], dash + 1, f[0].length(), 16);
            if (Long.compareUnsigned(base, start) < 0 || Long.compareUnsigned(base, end) >= 0) {
                continue;
            }
            String path = f[5].trim();
            if (Long.compareUnsigned(base + length, end) > 0 || !path.startsWith("/") || path.endsWith(" (deleted)")
                    || "0".equals(f[4])) {
                return null;
            }
            return new String[] {f[2], f[4], path, f[0].substring(0, dash)};
        }
        return null;
    }

    /** Deletes every link; at exit. */
    void deleteAll() {
        for (Entry e : entries) {
            Path link = e.link;
            if (link != null) {
                SharedMemoryFiles.deleteQuietly(link);
            }
        }
    }
}
