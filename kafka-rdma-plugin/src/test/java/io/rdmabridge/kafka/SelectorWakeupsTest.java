package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.io.File;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The selector access the agent checks before it installs its provider. */
class SelectorWakeupsTest {

    /** The agent may be the first in a broker's JVM to touch NIO: its premain asks whether the selector is usable. */
    @Test
    void shouldBeUsableAsTheFirstNioClassOfAJvm() throws Exception {
        String out = ChildJvm.run(List.of(ChildJvm.java(), "-Xmx64m", "-XX:TieredStopAtLevel=1", "--add-exports",
                "java.base/sun.nio.ch=ALL-UNNAMED", "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED", "-cp",
                ChildJvm.location(SelectorWakeups.class) + File.pathSeparator + ChildJvm.location(FirstNioUse.class),
                FirstNioUse.class.getName()));
        assertEquals("usable", out);
    }

    /** Prints "usable" when the selector can be reached in a JVM where nothing has used NIO before, else the cause. */
    static final class FirstNioUse {
        public static void main(String[] args) {
            Throwable cause = SelectorWakeups.unavailabilityCause();
            System.out.println(cause == null ? "usable" : cause.toString());
        }
    }
}
