package io.rdmabridge.verbs.soft;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Read-only file mappings registered in this process ({@link io.rdmabridge.verbs.ProtectionDomain#registerFileMapping}:
 * the chunks a file region is sent from), offered to same-host peers as the file itself. The first time a range
 * inside one is registered for remote read, the file behind it is looked up (the mapping's entry in
 * {@code /proc/self/map_files}, a few system calls; where that does not name it, the mapping's line in
 * {@code /proc/self/maps}, which takes a millisecond in a JVM of a few hundred threads) and a symbolic link to it is
 * made in the shared-memory directory, named like our shared files; the range is published with that link's
 * number, the offset in the file, and the file's device and inode. A peer then reads the file's
 * bytes itself ({@link SharedPeer}, one copy out of the page cache, no work here), as a NIC reads the page cache pages
 * the registration pinned. One link per file (device and inode) serves all its mappings, so a peer opens a file
 * once however many regions are sent from it; the link goes with the last mapping's registration.
 *
 * <p>What is not offered, and stays on the TCP path: a mapping whose file was deleted or replaced since it was mapped
 * (its path now names other bytes), a mapping that {@code /proc/self/maps} does not show as one file range, and any
 * range while the same-host path is off. A peer checks that the link leads to the published device and inode, so a
 * file replaced under its path later (renamed over) is not read one-sided either.
 *
 * <p>Threading: {@link #registered}, {@link #deregistered} and {@link #find} run under the engine's key lock; the
 * lookup happens once per mapping, at its first remote-read registration. {@link #deleteAll} may run on any thread
 * (the exit hook).
 */
final class MappedFileLinks {
    /**
     * System property: {@code false} keeps mappings registered from now on off this path (peers then read them
     * through this process, as before); read at each mapping's first remote-read registration.
     */
    static final String PROPERTY = "rdmabridge.soft.fileLinks";

    /** The link to one file (device and inode), shared by every registered mapping of it. */
    static final class Link {
        final long number;
        final long device;
        final long inode;
        final Path path;
        int mappings;

        Link(long number, long device, long inode, Path path) {
            this.number = number;
            this.device = device;
            this.inode = inode;
            this.path = path;
        }
    }

    /** One registered file mapping; resolved on first use. */
    static final class Entry {
        final int key;
        final long base;
        final long length;
        /** Where in the file the mapping starts, as its registrant says; then as found. */
        long fileOffset;
        boolean resolved;
        /** The file's link, or {@code null} (not resolved yet, or not offered). */
        Link link;

        Entry(int key, long base, long length, long fileOffset) {
            this.key = key;
            this.base = base;
            this.length = length;
            this.fileOffset = fileOffset;
        }
    }

    /** The page size the kernel rounds a mapping's end to (4 KiB on x86-64; elsewhere the lookup falls back). */
    private static final long PAGE = 4096;

    private final SharedMemoryFiles files;
    private final ArrayList<Entry> entries = new ArrayList<>();
    /** Live links by file; read by the exit hook. */
    private final ConcurrentHashMap<List<Long>, Link> links = new ConcurrentHashMap<>();

    MappedFileLinks(SharedMemoryFiles files) {
        this.files = files;
    }

    /**
     * The region of {@code key} is {@code [base, base + length)}, a read-only mapping of a file from
     * {@code fileOffset}. Key lock held.
     */
    void registered(int key, long base, long length, long fileOffset) {
        entries.add(new Entry(key, base, length, fileOffset));
    }

    /**
     * The region of {@code key} is deregistered: the file's link goes with its last mapping. Key lock held; allocates
     * nothing, and is a look at an empty list where no file is mapped.
     */
    void deregistered(int key) {
        for (int i = entries.size() - 1; i >= 0; i--) {
            Entry e = entries.get(i);
            if (e.key == key) {
                entries.set(i, entries.get(entries.size() - 1));
                entries.remove(entries.size() - 1);
                Link l = e.link;
                if (l != null && --l.mappings == 0) {
                    links.remove(List.of(l.device, l.inode));
                    SharedMemoryFiles.deleteQuietly(l.path);
                }
                return;
            }
        }
    }

    /**
     * The registered file mapping holding {@code [address, address + length)}, with its file's link (made now if need
     * be), or {@code null} when no such mapping is registered or its file cannot be offered. Key lock held.
     */
    Entry find(long address, long length) {
        for (int i = 0; i < entries.size(); i++) {
            Entry e = entries.get(i);
            if (address >= e.base && length <= e.length && address - e.base <= e.length - length) {
                if (!e.resolved) {
                    e.resolved = true;
                    if (!"false".equalsIgnoreCase(System.getProperty(PROPERTY, "true").trim())) {
                        resolve(e);
                    }
                }
                return e.link != null ? e : null;
            }
        }
        return null;
    }

    private void resolve(Entry e) {
        Path file = null;
        try {
            long[] identity = new long[2];
            file = fromMapFiles(e, identity);
            if (file == null) {
                file = fromMaps(e, identity);
                if (file == null) {
                    return;
                }
            }
            List<Long> id = List.of(identity[0], identity[1]);
            Link l = links.get(id);
            if (l == null) {
                long number = files.nextFileNumber();
                Path path = files.directory.resolve(SharedMemoryFiles.filePrefix(files.pid()) + number);
                Files.createSymbolicLink(path, file);
                l = new Link(number, identity[0], identity[1], path);
                links.put(id, l);
            }
            l.mappings++;
            e.link = l;
        } catch (IOException | RuntimeException ex) {
            SoftEngine.logger.debug("soft0: mapped file {} is not offered to same-host peers ({}): they read it "
                    + "through this process", file, ex.toString());
        }
    }

    /**
     * The mapped file's path from its entry in {@code /proc/self/map_files} (named by the mapping's exact bounds; none
     * when the kernel merged it with a neighbour), with its device and inode in {@code identity}, or {@code null}. The
     * entry names the mapped file wherever it is now, " (deleted)" once it is gone (renamed over, say); read again
     * after the path's inode, it vouches that the inode was the mapped file's.
     */
    private static Path fromMapFiles(Entry e, long[] identity) throws IOException {
        long end = e.base + ((e.length + PAGE - 1) & -PAGE);
        Path entry = Paths.get("/proc/self/map_files/" + Long.toHexString(e.base) + "-" + Long.toHexString(end));
        Path file;
        try {
            file = Files.readSymbolicLink(entry);
        } catch (IOException | UnsupportedOperationException ex) {
            return null;
        }
        if (!file.isAbsolute() || file.toString().endsWith(" (deleted)") || !identify(file, identity)) {
            return null;
        }
        return file.equals(Files.readSymbolicLink(entry)) ? file : null;
    }

    /**
     * The mapped file's path from the mapping's line in {@code /proc/self/maps}, which also holds its inode and where
     * in the file it starts, with its device and inode in {@code identity}, or {@code null}.
     */
    private static Path fromMaps(Entry e, long[] identity) throws IOException {
        String[] found = mappingOf(e.base, e.length);
        if (found == null) {
            return null;
        }
        Path file = Paths.get(found[2]);
        // The path must still name the mapped file: Spark, for one, renames finished files over older ones.
        if (!identify(file, identity) || identity[1] != Long.parseLong(found[1])) {
            return null;
        }
        e.fileOffset = Long.parseLong(found[0], 16) + (e.base - Long.parseUnsignedLong(found[3], 16));
        return file;
    }

    /** Whether {@code file} is a regular file (not a link); its device and inode go to {@code identity}. */
    private static boolean identify(Path file, long[] identity) throws IOException {
        Map<String, Object> a = Files.readAttributes(file, "unix:mode,dev,ino", LinkOption.NOFOLLOW_LINKS);
        identity[0] = ((Number) a.get("dev")).longValue();
        identity[1] = ((Number) a.get("ino")).longValue();
        return (((Number) a.get("mode")).intValue() & S_IFMT) == S_IFREG;
    }

    private static final int S_IFMT = 0170000;
    private static final int S_IFREG = 0100000;

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
        for (Link l : links.values()) {
            SharedMemoryFiles.deleteQuietly(l.path);
        }
    }
}
