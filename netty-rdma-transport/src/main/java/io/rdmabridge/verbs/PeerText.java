package io.rdmabridge.verbs;

import java.util.regex.Pattern;

/**
 * Text a peer chose (a message it sent, the name of a file it registered), made fit for an exception or a log line:
 * each control or format character (a newline, an escape, a right-to-left override) and line separator becomes
 * {@code ?}, as it would otherwise forge log lines, drive a terminal or make a line read other than it is.
 */
public final class PeerText {
    private static final Pattern UNPRINTABLE = Pattern.compile("[\\p{Cc}\\p{Cf}\\p{Zl}\\p{Zp}]");

    private PeerText() {
    }

    /** {@code text} with each control, format and line-separator character replaced by {@code ?}. */
    public static String printable(CharSequence text) {
        return UNPRINTABLE.matcher(text).replaceAll("?");
    }
}
