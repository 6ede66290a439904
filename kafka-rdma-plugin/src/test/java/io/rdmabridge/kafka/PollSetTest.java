package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.internal.LinuxEpoll;
import java.io.File;
import java.io.IOException;
import java.nio.channels.DatagramChannel;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import sun.nio.ch.SelChImpl;

/** The channel's private epoll set; needs {@code sun.nio.ch} opened, as the surefire configuration does. */
class PollSetTest {
    @TempDir
    Path dir;

    @Test
    void shouldNotWriteToTheDescriptorNumberOfItsClosedEventFd() throws Exception {
        PollSet pollSet = new PollSet();
        pollSet.close();
        // The process reuses the lowest free descriptor numbers: the eventfd's and the epoll set's, just closed.
        try (FileChannel a = FileChannel.open(dir.resolve("a"), StandardOpenOption.CREATE_NEW,
                StandardOpenOption.WRITE);
             FileChannel b = FileChannel.open(dir.resolve("b"), StandardOpenOption.CREATE_NEW,
                     StandardOpenOption.WRITE)) {
            // What a stream's event loop does when it reports its close after the channel closed.
            pollSet.signal();
            assertEquals(0, a.size(), "a signal after close wrote into a file that reuses the descriptor number");
            assertEquals(0, b.size(), "a signal after close wrote into a file that reuses the descriptor number");
        }
    }

    /**
     * A PollSet whose eventfd cannot be made closes the epoll set it made first: with one descriptor left, the epoll
     * set takes it and the eventfd fails. Run in a JVM of its own with a small descriptor limit
     * ({@link OutOfDescriptors}): exhausting this one's would fail whatever else runs in it meanwhile.
     */
    @Test
    void shouldCloseItsEpollSetWhenItsEventFdCannotBeMade() throws Exception {
        String out = runAlone(OutOfDescriptors.class);
        assertTrue(out.matches("PollSet failed: .*; its descriptor \\d+ afterwards: closed"), out);
    }

    /**
     * The agent may be the first in a broker's JVM to touch NIO (its premain asks whether a PollSet can be made); the
     * JDK's EPoll class cannot load before something has loaded libnio.
     */
    @Test
    void shouldBeUsableAsTheFirstNioClassOfAJvm() throws Exception {
        assertEquals("usable", runAlone(FirstNioUse.class));
    }

    /**
     * Runs {@code main} in a JVM of its own, with a small descriptor limit and {@code sun.nio.ch} opened, as the agent
     * opens it; returns what it printed.
     */
    private static String runAlone(Class<?> main) throws Exception {
        String classpath = ChildJvm.location(PollSet.class) + File.pathSeparator + ChildJvm.location(main)
                + File.pathSeparator + ChildJvm.location(LinuxEpoll.class);
        return ChildJvm.run(List.of("sh", "-c", "ulimit -n 1024 && exec \"$@\"", "sh", ChildJvm.java(), "-Xmx64m",
                "-XX:TieredStopAtLevel=1", "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED", "--add-opens",
                "java.base/sun.nio.ch=ALL-UNNAMED", "-cp", classpath, main.getName()));
    }

    /**
     * Takes every descriptor but one, makes a PollSet, and prints whether it failed and what the descriptor left free
     * holds afterwards ("closed", or the link /proc shows, such as {@code anon_inode:[eventpoll]} for a leaked set).
     */
    static final class OutOfDescriptors {
        public static void main(String[] args) throws Exception {
            // Loads and links what follows while descriptors are left to read the class files with.
            new PollSet().close();
            target(0);
            List<DatagramChannel> fillers = new ArrayList<>(2048);
            try {
                while (true) {
                    fillers.add(DatagramChannel.open());
                }
            } catch (IOException tooManyOpenFiles) {
                // The limit: every descriptor is taken.
            }
            DatagramChannel last = fillers.remove(fillers.size() - 1);
            int free = ((SelChImpl) last).getFDVal();
            last.close();
            String made;
            try {
                new PollSet().close();
                made = "PollSet made";
            } catch (IOException e) {
                made = "PollSet failed: " + e.getMessage();
            }
            // The lowest free number goes to the next descriptor made: the epoll set's was this one.
            String left = target(free);
            for (DatagramChannel c : fillers) {
                c.close();
            }
            System.out.println(made + "; its descriptor " + free + " afterwards: " + left);
        }

        private static String target(int fd) throws IOException {
            try {
                return Files.readSymbolicLink(Path.of("/proc/self/fd/" + fd)).toString();
            } catch (NoSuchFileException e) {
                return "closed";
            }
        }
    }

    /** Prints "usable" when a PollSet can be made in a JVM where nothing has used NIO before, else the cause. */
    static final class FirstNioUse {
        public static void main(String[] args) throws Exception {
            Throwable cause = PollSet.unavailabilityCause();
            if (cause != null) {
                System.out.println(cause);
                return;
            }
            new PollSet().close();
            System.out.println("usable");
        }
    }
}
