package io.rdmabridge.netty;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.channel.DefaultFileRegion;
import io.rdmabridge.connection.FileChunkCache;
import io.rdmabridge.connection.RegisteredMemory;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.soft.SoftProvider;
import java.io.File;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** What a file region leaves registered once it is sent. */
class RdmaFileWriterTest {
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

    /**
     * A region posted whole gives its chunks back as its sends complete: a connection left idle after a transfer
     * kept up to 8 chunks (32 MiB of the file) mapped and registered, until its next file region or its close.
     */
    @Test
    void shouldUnmapTheChunksOfARegionOnceItsSendsComplete(@TempDir File dir) throws Exception {
        byte[] content = new byte[3 * FileChunkCache.CHUNK_SIZE];
        new Random(3).nextBytes(content);
        File file = new File(dir, "segment");
        Files.write(file.toPath(), content);
        RdmaFileWriter writer = new RdmaFileWriter(memory);
        RecordingSink sink = new RecordingSink();
        DefaultFileRegion region = new DefaultFileRegion(file, 1000, content.length - 2000);
        try {
            assertTrue(writer.write(region, 0, sink, 64 * 1024), "posted whole");
            assertEquals(3, writer.mappedChunks(), "mapped while the sends are posted");
            sink.completeAll();
            assertEquals(0, writer.mappedChunks(), "mapped once every send completed");
            assertEquals(0, provider.resourceUsage().registeredBytes(), "registered once every send completed");
        } finally {
            sink.completeAll();
            writer.close();
            region.release();
        }
    }

    /** Holds each posted chunk until {@link #completeAll()}, as the send queue does until a completion. */
    private static final class RecordingSink implements RdmaFileWriter.Sink {
        private final List<FileChunkCache.Chunk> held = new ArrayList<>();

        @Override
        public boolean canSend() {
            return true;
        }

        @Override
        public void unspend() {
        }

        @Override
        public int maxFramePayload() {
            return 8192;
        }

        @Override
        public int maxRendezvousLength() {
            return 1 << 20;
        }

        @Override
        public void send(long address, int length, FileChunkCache.Chunk chunk, boolean rendezvous) {
            held.add(chunk);
        }

        void completeAll() {
            held.forEach(FileChunkCache.Chunk::release);
            held.clear();
        }
    }
}
