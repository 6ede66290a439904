package io.rdmabridge.verbs;

import static org.junit.jupiter.api.Assertions.assertFalse;

import io.rdmabridge.verbs.soft.SoftProvider;
import io.rdmabridge.verbs.soft.SoftProvider.PrivateDataMode;
import org.junit.jupiter.api.Test;

/**
 * The conformance suite on the soft provider in the mode that behaves like DiSNI 2.1 and delivers no
 * connection-manager private data ({@value SoftProvider#PRIVATE_DATA_PROPERTY}=none), peer in this JVM. The suite
 * skips its private-data cases here, naming why, and runs {@code shouldDeliverNoPrivateDataWhereNoneIsDeclared}
 * instead: what DiSNI's users see, on every CI run.
 */
class SoftInJvmNoPrivateDataConformanceTest extends SoftInJvmConformanceTest {

    @Override
    protected RdmaProvider newProvider() {
        return new SoftProvider(PrivateDataMode.NONE);
    }

    @Test
    public void shouldDeclareThatItDeliversNoPrivateData() {
        assertFalse(provider.deliversPrivateData(), "deliversPrivateData() of " + provider);
    }
}
