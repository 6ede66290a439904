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

    /**
     * {@code page} with the rows of its "## Targets" table that start with {@code prefix} replaced by {@code rows}
     * (lines ending in a newline), in the place of the first of them or at the end of that table; the page as it was
     * when it has no such table.
     */
    static String replaceTargetRows(String page, String prefix, String rows) {
        int table = page.indexOf(RunBenchmarks.TARGETS);
        int start = table < 0 ? -1 : page.indexOf("\n|", table);
        int end = start < 0 ? -1 : page.indexOf("\n\n", start + 1);
        if (end < 0) {
            return page;
        }
        start++;
        end++;
        StringBuilder kept = new StringBuilder();
        int insert = -1;
        for (String line : page.substring(start, end).split("\n")) {
            if (line.startsWith(prefix)) {
                insert = insert < 0 ? kept.length() : insert;
            } else {
                kept.append(line).append('\n');
            }
        }
        kept.insert(insert < 0 ? kept.length() : insert, rows);
        return page.substring(0, start) + kept + page.substring(end);
    }
}
