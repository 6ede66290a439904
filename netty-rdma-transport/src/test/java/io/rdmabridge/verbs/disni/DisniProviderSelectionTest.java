package io.rdmabridge.verbs.disni;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.rdmabridge.verbs.ProviderSelection;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.RdmaProviders;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** Selection through {@link RdmaProviders} (ServiceLoader) when DiSNI cannot run here. */
class DisniProviderSelectionTest {
    private static final String CAUSE_START = "libdisni not found on java.library.path="
            + System.getProperty("java.library.path") + ": install DiSNI's native library";

    @BeforeEach
    void assumeNoLibdisni() {
        assumeTrue(DisniProvider.findOnPath(System.getProperty("java.library.path"),
                        System.mapLibraryName("disni")) == null,
                "libdisni is installed on this machine; these cases prove the behaviour without it");
    }

    @Test
    void shouldBeRegisteredAsAService() {
        RdmaProvider provider = RdmaProviders.byName("disni");
        assertTrue(provider instanceof DisniProvider, String.valueOf(provider));
    }

    @Test
    void shouldChooseNothingWhenDisniIsRequested() {
        ProviderSelection selection = RdmaProviders.select("disni");
        assertFalse(selection.isAvailable());
        assertNull(selection.provider());
        assertTrue(selection.reason().startsWith("disni was requested (rdmabridge.provider=disni) but is unavailable: "
                + CAUSE_START), selection.reason());
        assertTrue(selection.rejected().get("disni").contains(CAUSE_START), selection.rejected().toString());
    }

    @Test
    void shouldNameDisnisCauseWhenAutoFindsNoHardware() {
        ProviderSelection selection = RdmaProviders.select("auto");
        assertNull(selection.provider());
        assertTrue(selection.reason().startsWith("auto: no RDMA hardware provider is usable; disni: "
                + CAUSE_START), selection.reason());
        assertTrue(selection.reason().endsWith("Fix the cause above, or set rdmabridge.provider=soft to use the"
                + " software RDMA provider"), selection.reason());
        assertEquals(RdmaProviders.byName("disni").unavailabilityCause().getMessage(),
                selection.rejected().get("disni"));
    }
}
