package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

import io.rdmabridge.verbs.RdmaProviders;
import org.junit.jupiter.api.Test;

/** What an executor logs when the block transport cannot start: the Spark key to change, never another one. */
class BlockTransportTest {

    @Test
    void shouldNameSparksOwnProviderKeyInTheCauseOfAnUnknownProvider() {
        BlockTransport.UnavailableException e = assertThrows(BlockTransport.UnavailableException.class,
                () -> BlockTransport.open("sof", 1, 16, 16, "test-block-transport"));
        assertTrue(e.getMessage().endsWith("set spark.shuffle.rdma.provider accordingly)"), e::getMessage);
        assertFalse(e.getMessage().contains(RdmaProviders.PROVIDER_PROPERTY), e::getMessage);
    }

    @Test
    void shouldNameSparksOwnProviderKeyWhenNoHardwareIsUsable() {
        assumeFalse(RdmaProviders.byName("disni").isAvailable(), "this host has usable RDMA hardware and libdisni");
        BlockTransport.UnavailableException auto = assertThrows(BlockTransport.UnavailableException.class,
                () -> BlockTransport.open("auto", 1, 16, 16, "test-block-transport"));
        assertTrue(auto.getMessage().endsWith("or set spark.shuffle.rdma.provider=soft to use the software RDMA "
                + "provider"), auto::getMessage);
        BlockTransport.UnavailableException disni = assertThrows(BlockTransport.UnavailableException.class,
                () -> BlockTransport.open("disni", 1, 16, 16, "test-block-transport"));
        assertTrue(disni.getMessage().startsWith("disni was requested (spark.shuffle.rdma.provider=disni) but is "
                + "unavailable: "), disni::getMessage);
        for (BlockTransport.UnavailableException e : new BlockTransport.UnavailableException[] {auto, disni}) {
            assertFalse(e.getMessage().contains(RdmaProviders.PROVIDER_PROPERTY), e::getMessage);
        }
    }
}
