package io.rdmabridge.connection;

import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.soft.SoftProvider;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * A block freed twice would be handed to two owners, whose bytes (maybe two connections') then mix: the second free
 * throws, and the block goes out once.
 */
class RegisteredMemoryBlockTest {
    private final SoftProvider provider = new SoftProvider();
    private ProtectionDomain pd;
    private RegisteredMemory memory;

    @BeforeEach
    void setUp() throws Exception {
        pd = provider.devices().get(0).allocProtectionDomain();
        memory = new RegisteredMemory(pd);
    }

    @AfterEach
    void tearDown() {
        memory.close();
        pd.close();
        assertTrue(provider.resourceUsage().isZero(), "leaked: " + provider.resourceUsage());
    }

    @ParameterizedTest(name = "size={0}")
    @ValueSource(ints = {4096, 4 * 1024 * 1024})
    void shouldRefuseASecondFreeAndHandTheBlockOutOnce(int size) throws Exception {
        RegisteredMemory.Block block = memory.allocate(size);
        block.free();
        IllegalStateException e = assertThrows(IllegalStateException.class, block::free);
        assertTrue(e.getMessage().contains("freed twice"), e::getMessage);
        RegisteredMemory.Block a = memory.allocate(size);
        RegisteredMemory.Block b = memory.allocate(size);
        assertNotEquals(a.address(), b.address(), "one block handed to two owners");
        a.free();
        b.free();
    }
}
