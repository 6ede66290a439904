package io.rdmabridge.verbs.disni;

/**
 * Turns DiSNI's exception texts (e.g. {@code "j2c::regMr: ibv_reg_mr failed: Cannot allocate memory\n"}) into one
 * clean clause and adds the fix where the cause is known. Thread-safe (stateless).
 */
final class DisniErrors {
    private DisniErrors() {
    }

    /** The exception's message without DiSNI's trailing newline; the exception itself when it has none. */
    static String clean(Throwable t) {
        String message = t.getMessage();
        return message == null ? t.toString() : message.trim();
    }

    /** {@link #clean} plus the usual cause of a failed registration. */
    static String registration(Throwable t) {
        String message = clean(t);
        if (message.contains("Cannot allocate memory")) {
            return message + " (the locked-memory limit is probably too low: raise it with `ulimit -l unlimited`,"
                    + " LimitMEMLOCK=infinity for systemd services, or --ulimit memlock=-1 for containers)";
        }
        if (message.contains("Bad address")) {
            return message + " (the range is not mapped memory of this process)";
        }
        return message;
    }
}
