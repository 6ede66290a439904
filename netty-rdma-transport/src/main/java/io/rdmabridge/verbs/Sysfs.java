package io.rdmabridge.verbs;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * Reading the kernel's {@code /sys} tree, as providers and tools describe RDMA devices from it: entries that do not
 * exist or refuse to be read (a GID entry without an interface answers EINVAL) read as empty or {@code null}, never
 * as an exception. Stateless; any thread.
 */
public final class Sysfs {
    private Sysfs() {
    }

    /** The entries of {@code dir}, sorted; empty when it does not exist or cannot be listed. */
    public static List<Path> list(Path dir) {
        List<Path> entries = new ArrayList<>();
        try (DirectoryStream<Path> stream = Files.newDirectoryStream(dir)) {
            for (Path p : stream) {
                entries.add(p);
            }
        } catch (IOException | RuntimeException e) {
            return entries; // no such directory: nothing listed
        }
        entries.sort(null);
        return entries;
    }

    /** The trimmed ASCII contents of {@code file}, or {@code null} when it cannot be read. */
    public static String read(Path file) {
        try {
            return new String(Files.readAllBytes(file), StandardCharsets.US_ASCII).trim();
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }
}
