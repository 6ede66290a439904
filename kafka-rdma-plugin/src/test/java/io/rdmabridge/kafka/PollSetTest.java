package io.rdmabridge.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

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
}
