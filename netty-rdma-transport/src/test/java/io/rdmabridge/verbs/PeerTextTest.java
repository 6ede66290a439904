package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

class PeerTextTest {
    @Test
    void shouldReplaceControlFormatAndLineSeparatorCharactersAndKeepTheRest() {
        assertEquals("a?b?c?d?e?f?g \u00e9\u4e2d",
                PeerText.printable("a\nb\u001bc\u0000d\u0085e\u2028f\u202eg \u00e9\u4e2d"));
    }
}
