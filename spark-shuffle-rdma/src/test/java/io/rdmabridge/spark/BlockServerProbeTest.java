package io.rdmabridge.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.network.buffer.NioManagedBuffer;
import org.junit.jupiter.api.Test;

/** The probe's command line: the secret comes from the environment, never from an argument. */
class BlockServerProbeTest {
    private final ByteArrayOutputStream out = new ByteArrayOutputStream();
    private final ByteArrayOutputStream err = new ByteArrayOutputStream();

    @Test
    void shouldRefuseTheSecretAsAnArgumentNamingTheEnvironmentVariable() throws Exception {
        assertEquals(2, run(Map.of(), "127.0.0.1", "1", "shuffle_0_0_0", BlockTransport.SOFT, "s3cret"));
        String error = err.toString(StandardCharsets.UTF_8);
        assertTrue(error.contains("set the environment variable RDMABRIDGE_SHUFFLE_SECRET instead"), error);
        assertFalse(error.contains("s3cret"), error);
        assertEquals("", out.toString(StandardCharsets.UTF_8), "nothing was fetched");
    }

    @Test
    void shouldRefuseTheFormerArgumentsWithoutAnExecutorIdInsteadOfReadingThemAnew() throws Exception {
        assertEquals(2, run(Map.of(), "127.0.0.1", "1", "shuffle_0_0_0", BlockTransport.SOFT));
        assertEquals(2, run(Map.of(), "127.0.0.1", "1", "shuffle_0_0_0"));
        String error = err.toString(StandardCharsets.UTF_8);
        assertTrue(error.contains("EXECUTOR_ID comes before BLOCK_ID"), error);
        assertEquals("", out.toString(StandardCharsets.UTF_8), "nothing was fetched");
    }

    @Test
    void shouldAuthenticateWithTheSecretFromTheEnvironment() throws Exception {
        BlockTransport transport = BlockTransport.open(BlockTransport.SOFT, 1, RdmaShuffleConf.DEFAULT_SEND_QUEUE_DEPTH,
                RdmaShuffleConf.DEFAULT_RECV_QUEUE_DEPTH, "test-probe-server");
        try (ShuffleBlockServer server = new ShuffleBlockServer(transport, "1", "127.0.0.1", 0,
                id -> new NioManagedBuffer(ByteBuffer.wrap(new byte[42])), new PeerAuthenticator("right"),
                new RdmaShuffleConf(new SparkConf(false)), new RdmaShuffleMetrics())) {
            String port = Integer.toString(server.localAddress().getPort());
            assertEquals(0, run(Map.of(BlockServerProbe.SECRET_ENV, "right"), "127.0.0.1", port, "1", "shuffle_0_0_0",
                    BlockTransport.SOFT));
            assertEquals("fetched 42 bytes", out.toString(StandardCharsets.UTF_8).strip());
            out.reset();
            assertEquals(1, run(Map.of(), "127.0.0.1", port, "1", "shuffle_0_0_0", BlockTransport.SOFT));
            String outcome = out.toString(StandardCharsets.UTF_8);
            assertTrue(outcome.startsWith("failed: ") && outcome.contains("requires authentication"), outcome);
        } finally {
            transport.close();
        }
    }

    private int run(Map<String, String> env, String... args) throws Exception {
        return BlockServerProbe.run(args, env, new PrintStream(out, true, StandardCharsets.UTF_8),
                new PrintStream(err, true, StandardCharsets.UTF_8));
    }
}
