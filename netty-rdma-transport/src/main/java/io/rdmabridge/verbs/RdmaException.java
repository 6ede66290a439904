package io.rdmabridge.verbs;

import java.io.IOException;

/**
 * A verbs operation failed immediately (as opposed to completing with an error status, which is reported through a
 * {@link WorkCompletions} entry). The message always names the cause and, where there is one, the fix.
 */
public class RdmaException extends IOException {
    private static final long serialVersionUID = 1L;

    public RdmaException(String message) {
        super(message);
    }

    public RdmaException(String message, Throwable cause) {
        super(message, cause);
    }
}
