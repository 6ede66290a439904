package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

class RdmaProvidersTest {
    private static final String SELECTED_BY = RdmaProviders.PROVIDER_PROPERTY;

    private final FakeProvider disniMissing =
            new FakeProvider("disni", true, 10, new UnsatisfiedLinkError("libdisni not found"));
    private final FakeProvider hardwareOk = new FakeProvider("hw", true, 5, null);
    private final FakeProvider soft = new FakeProvider("soft", false, 0, null);

    @Test
    void shouldPickAvailableHardwareProviderUnderAuto() {
        ProviderSelection s = RdmaProviders.select("auto", SELECTED_BY,
                List.of(disniMissing, hardwareOk, soft));

        assertSame(hardwareOk, s.provider());
        assertEquals("libdisni not found", s.rejected().get("disni").replace("java.lang.UnsatisfiedLinkError: ", ""));
        assertTrue(s.rejected().get("soft").contains("chosen only when asked for"), s.rejected().toString());
    }

    @Test
    void shouldNeverPickSoftProviderSilentlyUnderAuto() throws Exception {
        ProviderSelection s = RdmaProviders.select(null, SELECTED_BY,
                List.of(disniMissing, soft));

        assertFalse(s.isAvailable());
        assertNull(s.provider());
        assertTrue(s.reason().contains("disni: java.lang.UnsatisfiedLinkError: libdisni not found"), s.reason());
        assertTrue(s.reason().contains("rdmabridge.provider=soft"), s.reason());
        RdmaException e = assertThrows(RdmaException.class, s::orElseThrow);
        assertEquals(s.reason(), e.getMessage());
    }

    @Test
    void shouldSayWhenNoHardwareProviderIsOnTheClassPath() {
        ProviderSelection s = RdmaProviders.select("auto", SELECTED_BY,
                List.of(soft));

        assertTrue(s.reason().contains("no hardware provider is on the class path"), s.reason());
    }

    @Test
    void shouldPickProviderByNameCaseInsensitively() {
        ProviderSelection s = RdmaProviders.select(" SOFT ", SELECTED_BY,
                List.of(disniMissing, soft));

        assertSame(soft, s.provider());
        assertEquals("soft", s.requested());
        assertTrue(s.rejected().get("disni").contains("not requested"), s.rejected().toString());
    }

    @Test
    void shouldReportCauseWhenNamedProviderIsUnavailable() {
        ProviderSelection s = RdmaProviders.select("disni", SELECTED_BY,
                List.of(disniMissing, soft));

        assertNull(s.provider());
        assertEquals("disni was requested (rdmabridge.provider=disni) but is unavailable: "
                + "java.lang.UnsatisfiedLinkError: libdisni not found", s.reason());
    }

    @Test
    void shouldListKnownProvidersForAnUnknownName() {
        ProviderSelection s = RdmaProviders.select("ucx", SELECTED_BY,
                List.of(disniMissing, soft));

        assertNull(s.provider());
        assertEquals("unknown RDMA provider 'ucx' (expected: auto or one of [disni, soft];"
                + " set rdmabridge.provider accordingly)", s.reason());
    }

    @Test
    void shouldNameTheFrameworksOwnSettingInEveryReason() {
        String key = "spark.shuffle.rdma.provider";
        ProviderSelection none = RdmaProviders.select("auto", key, List.of(disniMissing, soft));
        ProviderSelection unavailable = RdmaProviders.select("disni", key, List.of(disniMissing, soft));
        ProviderSelection unknown = RdmaProviders.select("sof", key, List.of(disniMissing, soft));
        ProviderSelection chosen = RdmaProviders.select("soft", key, List.of(disniMissing, soft));

        assertTrue(none.reason().endsWith("or set spark.shuffle.rdma.provider=soft to use the software RDMA provider"),
                none.reason());
        assertTrue(unavailable.reason().startsWith("disni was requested (spark.shuffle.rdma.provider=disni)"),
                unavailable.reason());
        assertTrue(unknown.reason().endsWith("set spark.shuffle.rdma.provider accordingly)"), unknown.reason());
        assertEquals("not requested (spark.shuffle.rdma.provider=soft)", chosen.rejected().get("disni"));
        for (ProviderSelection s : List.of(none, unavailable, unknown, chosen)) {
            assertFalse(s.toString().contains(RdmaProviders.PROVIDER_PROPERTY), s::toString);
        }
    }

    private static final class FakeProvider implements RdmaProvider {
        private final String name;
        private final boolean hardware;
        private final int priority;
        private final Throwable cause;

        FakeProvider(String name, boolean hardware, int priority, Throwable cause) {
            this.name = name;
            this.hardware = hardware;
            this.priority = priority;
            this.cause = cause;
        }

        @Override
        public String name() {
            return name;
        }

        @Override
        public boolean isHardware() {
            return hardware;
        }

        @Override
        public int priority() {
            return priority;
        }

        @Override
        public boolean isAvailable() {
            return cause == null;
        }

        @Override
        public Throwable unavailabilityCause() {
            return cause;
        }

        @Override
        public List<RdmaDevice> devices() {
            throw new UnsupportedOperationException("not needed by selection");
        }

        @Override
        public RdmaEventChannel createEventChannel(EventNotifier notifier) {
            throw new UnsupportedOperationException("not needed by selection");
        }

        @Override
        public ResourceUsage resourceUsage() {
            return new ResourceUsage();
        }
    }
}
