package io.rdmabridge.verbs.disni;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.rdmabridge.verbs.RdmaException;
import java.io.IOException;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The provider on a machine without libdisni (this build machine and CI): every class loads and initializes, the
 * provider is constructed, and the probe explains what is missing without touching DiSNI's native code.
 */
class DisniProviderTest {
    private static final String LIBRARY_PATH = System.getProperty("java.library.path");

    private static void assumeNoLibdisni() {
        assumeTrue(DisniProvider.findOnPath(LIBRARY_PATH, System.mapLibraryName("disni")) == null,
                "libdisni is installed on this machine; these cases prove the behaviour without it");
    }

    @Test
    void shouldLoadEveryClassWithoutTheNativeLibrary() throws Exception {
        assumeNoLibdisni();
        Path dir = Paths.get(DisniProvider.class.getProtectionDomain().getCodeSource().getLocation().toURI())
                .resolve("io/rdmabridge/verbs/disni");
        List<String> names;
        try (Stream<Path> files = Files.list(dir)) {
            names = files.map(p -> p.getFileName().toString())
                    .filter(n -> n.endsWith(".class"))
                    .map(n -> "io.rdmabridge.verbs.disni." + n.substring(0, n.length() - ".class".length()))
                    .sorted()
                    .collect(Collectors.toList());
        }
        assertTrue(names.containsAll(List.of("io.rdmabridge.verbs.disni.DisniProvider",
                "io.rdmabridge.verbs.disni.DisniEventChannel", "io.rdmabridge.verbs.disni.DisniCmId",
                "io.rdmabridge.verbs.disni.DisniQueuePair", "io.rdmabridge.verbs.disni.DisniCompletionQueue",
                "io.rdmabridge.verbs.disni.DisniDevice", "io.rdmabridge.verbs.disni.DisniProtectionDomain",
                "io.rdmabridge.verbs.disni.DisniMemoryRegion")), names.toString());
        ClassLoader loader = DisniProvider.class.getClassLoader();
        for (String name : names) {
            assertEquals(name, Class.forName(name, true, loader).getName());
        }

        DisniProvider provider = new DisniProvider();
        assertEquals("disni", provider.name());
        assertTrue(provider.isHardware());
        assertEquals(10, provider.priority());
        assertFalse(provider.deliversPrivateData());
        assertFalse(provider.isAvailable());

        // Neither loading our classes nor probing touched DiSNI's native dispatcher: its static initializer,
        // which calls System.loadLibrary("disni"), runs here for the first time and fails with the loader's error
        // (a second attempt would fail with NoClassDefFoundError instead).
        assertThrows(UnsatisfiedLinkError.class,
                () -> Class.forName("com.ibm.disni.verbs.impl.NativeDispatcher", true, loader));
    }

    @Test
    void shouldNameTheLibraryPathAndTheFixInTheCause() {
        assumeNoLibdisni();
        DisniProvider provider = new DisniProvider();
        Throwable cause = provider.unavailabilityCause();
        assertTrue(cause instanceof RdmaException, String.valueOf(cause));
        String message = cause.getMessage();
        assertTrue(message.startsWith("libdisni not found on java.library.path=" + LIBRARY_PATH
                + ": install DiSNI's native library (libdisni.so, built from github.com/zrlio/disni), or add its"
                + " directory to java.library.path, or use the software provider (soft) instead"), message);
        assertSame(cause, provider.unavailabilityCause(), "the probe runs once and remembers its result");
    }

    @Test
    void shouldNameTheMissingExportWhenItIsMissing() {
        assumeNoLibdisni();
        boolean exported = Object.class.getModule().isExported("sun.nio.ch",
                com.ibm.disni.util.MemoryUtils.class.getModule());
        assumeTrue(!exported, "this JVM runs with --add-exports java.base/sun.nio.ch=ALL-UNNAMED");
        String message = new DisniProvider().unavailabilityCause().getMessage();
        assertTrue(message.contains("; sun.nio.ch is not exported to DiSNI (it casts buffers to"
                + " sun.nio.ch.DirectBuffer): add the JVM option --add-opens java.base/sun.nio.ch=ALL-UNNAMED (which"
                + " also gives all completion queues one event thread; --add-exports is the minimum), or use the"
                + " software provider (soft) instead"), message);
    }

    @Test
    void shouldRefuseEveryOperationWithTheCause() {
        assumeNoLibdisni();
        DisniProvider provider = new DisniProvider();
        RdmaException channel = assertThrows(RdmaException.class, () -> provider.createEventChannel(null));
        assertTrue(channel.getMessage().startsWith("the disni provider is unavailable: libdisni not found on"
                + " java.library.path=" + LIBRARY_PATH), channel.getMessage());
        assertSame(provider.unavailabilityCause(), channel.getCause());
        RdmaException devices = assertThrows(RdmaException.class, provider::devices);
        assertSame(provider.unavailabilityCause(), devices.getCause());
        assertTrue(provider.resourceUsage().isZero(), provider.resourceUsage().toString());
    }

    @Test
    void shouldFindTheLibraryInAnyDirectoryOfThePath(@TempDir Path tmp) throws IOException, URISyntaxException {
        Path empty = Files.createDirectory(tmp.resolve("empty"));
        Path lib = Files.createDirectory(tmp.resolve("lib"));
        Path file = Files.createFile(lib.resolve("libdisni.so"));
        String path = empty + java.io.File.pathSeparator + java.io.File.pathSeparator + lib;
        assertEquals(file, DisniProvider.findOnPath(path, "libdisni.so"));
        assertNull(DisniProvider.findOnPath(empty.toString(), "libdisni.so"));
        assertNull(DisniProvider.findOnPath("", "libdisni.so"));
    }

    @Test
    void shouldExplainAFailedRegistrationByTheMemlockLimit() {
        String text = DisniErrors.registration(
                new IOException("j2c::regMr: ibv_reg_mr failed: Cannot allocate memory\n"));
        assertEquals("j2c::regMr: ibv_reg_mr failed: Cannot allocate memory (the locked-memory limit is probably too"
                + " low: raise it with `ulimit -l unlimited`, LimitMEMLOCK=infinity for systemd services, or"
                + " --ulimit memlock=-1 for containers)", text);
    }
}
