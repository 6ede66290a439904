package io.rdmabridge.benchmarks.report;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

/** Replacing one {@code ## } section of an existing results page, for the steps that can run alone. */
final class PageSections {
    private PageSections() {
    }

    /**
     * Puts {@code section} (starting with {@code title}) into {@code results} in place of the section of that title,
     * or before the command list when there is none.
     */
    static void splice(Path results, String title, String section) throws IOException {
        String md = Files.exists(results) ? Files.readString(results) : "";
        int start = md.indexOf(title);
        if (start >= 0) {
            int end = md.indexOf("\n## ", start + title.length());
            md = md.substring(0, start) + section + (end < 0 ? "" : md.substring(end + 1));
        } else {
            int commands = md.indexOf("## Commands");
            md = commands < 0 ? md + section : md.substring(0, commands) + section + md.substring(commands);
        }
        Files.writeString(results, md);
    }
}
