package io.rdmabridge.connection;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.soft.SoftProvider;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * File chunks are registered mappings of the file where the kernel allows it, and registered copies where it refuses
 * (Linux before 6.2 refuses to register a read-only shared mapping: EFAULT, seen on rxe with Linux 6.1); either way
 * the chunk holds the file's bytes and every registration is returned.
 */
class FileChunkCacheTest {
    private static final int SIZE = FileChunkCache.CHUNK_SIZE + 123_457;

    private final SoftProvider provider = new SoftProvider();
    private ProtectionDomain pd;
    private RegisteredMemory memory;
    private byte[] content;
    private Path file;

    @BeforeEach
    void setUp(@TempDir Path dir) throws Exception {
        pd = provider.devices().get(0).allocProtectionDomain();
        memory = new RegisteredMemory(pd);
        content = new byte[SIZE];
        new Random(7).nextBytes(content);
        file = dir.resolve("shuffle.data");
        Files.write(file, content);
    }

    @AfterEach
    void tearDown() {
        memory.close();
        pd.close();
        assertTrue(provider.resourceUsage().isZero(), "leaked: " + provider.resourceUsage());
    }

    @Test
    void shouldMapWhereTheKernelRegistersFileMappings() throws Exception {
        try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ);
             FileChunkCache cache = new FileChunkCache(memory, 2)) {
            assertChunks(cache, channel, false);
        }
    }

    @Test
    void shouldReadChunksIntoRegisteredMemoryWhereTheKernelRefusesTheMapping() throws Exception {
        try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ);
             FileChunkCache cache = new FileChunkCache(memory, 2)) {
            // What ibv_reg_mr answers for a read-only shared mapping on Linux before 6.2.
            provider.faults().failRegistrations(1);
            assertChunks(cache, channel, true);
            assertTrue(cache.isCopying(), "the refusal is remembered: later chunks are read, not mapped");
        }
    }

    @Test
    void shouldNotServeANewRegionFromACopyOfTheFileAsItWas() throws Exception {
        try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE);
             FileChunkCache cache = new FileChunkCache(memory, 2)) {
            provider.faults().failRegistrations(1);
            FileChunkCache.Chunk first = cache.acquire(channel, 0, SIZE);
            assertTrue(first.isCopy());
            first.release();
            byte[] rewritten = new byte[4096];
            new Random(8).nextBytes(rewritten);
            channel.write(java.nio.ByteBuffer.wrap(rewritten), 0);
            cache.retireChunks();
            FileChunkCache.Chunk second = cache.acquire(channel, 0, SIZE);
            byte[] bytes = new byte[rewritten.length];
            DirectMemory.copyToArray(second.address(), bytes, 0, bytes.length);
            assertArrayEquals(rewritten, bytes, "a region written after the file was rewritten sent its old bytes");
            second.release();
            assertEquals(1, cache.size(), "the first region's copy is released");
        }
    }

    /**
     * Registering pins every page (and reads it from disk if it is not cached): a small region gets the pages it
     * lies in, not its whole 4 MiB piece of the file.
     */
    @Test
    void shouldMapOnlyThePagesOfTheRegionWithinItsPiece() throws Exception {
        try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ);
             FileChunkCache cache = new FileChunkCache(memory, 4)) {
            long before = provider.resourceUsage().registeredBytes();
            FileChunkCache.Chunk small = cache.acquire(channel, 100_000, 100_100);
            assertEquals(98_304, small.fileOffset(), "the region's page");
            assertEquals(4096, small.length());
            assertEquals(before + 4096, provider.resourceUsage().registeredBytes(), "registered for 100 bytes");
            byte[] bytes = new byte[100];
            DirectMemory.copyToArray(small.address() + 100_000 - 98_304, bytes, 0, bytes.length);
            assertArrayEquals(Arrays.copyOfRange(content, 100_000, 100_100), bytes);

            FileChunkCache.Chunk across = cache.acquire(channel, 4000 + 2 * 4096, 4200 + 2 * 4096);
            assertEquals(2 * 4096, across.fileOffset());
            assertEquals(2 * 4096, across.length(), "a region across a page boundary gets both pages");

            long last = FileChunkCache.CHUNK_SIZE + 5;
            FileChunkCache.Chunk tail = cache.acquire(channel, last, SIZE + 1000);
            assertEquals(FileChunkCache.CHUNK_SIZE, tail.fileOffset());
            assertEquals(SIZE - FileChunkCache.CHUNK_SIZE, tail.length(), "up to the end of the file");
            small.release();
            across.release();
            tail.release();
        }
    }

    private void assertChunks(FileChunkCache cache, FileChannel channel, boolean copies) throws Exception {
        for (long offset : new long[] {0, FileChunkCache.CHUNK_SIZE + 5}) {
            FileChunkCache.Chunk chunk = cache.acquire(channel, offset, SIZE);
            assertEquals(copies, chunk.isCopy(), "chunk at " + offset + " read into registered memory");
            byte[] bytes = new byte[chunk.length()];
            DirectMemory.copyToArray(chunk.address(), bytes, 0, bytes.length);
            int from = (int) chunk.fileOffset();
            assertArrayEquals(Arrays.copyOfRange(content, from, from + chunk.length()), bytes,
                    "bytes of the chunk at " + from);
            long lkeyAddress = chunk.memoryRegion().address();
            assertTrue(chunk.address() >= lkeyAddress && chunk.address() + chunk.length()
                    <= lkeyAddress + chunk.memoryRegion().length(), "the chunk lies inside its registered region");
            chunk.release();
        }
        assertEquals(2, cache.size());
        assertFalse(provider.resourceUsage().isZero(), "chunks stay registered while cached");
    }
}
