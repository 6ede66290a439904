package io.rdmabridge.it.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;

/** With {@code spark.authenticate=true}, jobs run over the block transport and a peer without the secret gets nothing. */
class RdmaShuffleAuthTest {

    @Test
    void shouldServeOnlyPeersHoldingTheApplicationSecret() throws Exception {
        Map<String, String> settings = RdmaShuffleJobsTest.rdma();
        settings.put("spark.authenticate", "true");
        settings.put("spark.authenticate.secret", "it-secret-" + System.nanoTime());
        SparkSession spark = LocalCluster.start("auth", settings);
        try {
            JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
            String digest = ShuffleJobs.reduceByKey(sc, 10);

            InetSocketAddress server = ShuffleCounters.manager().blockServers().values().iterator().next();
            try (Socket socket = new Socket(server.getHostString(), server.getPort())) {
                socket.setSoTimeout(10_000);
                DataInputStream in = new DataInputStream(socket.getInputStream());
                DataOutputStream out = new DataOutputStream(socket.getOutputStream());
                assertEquals(1 + 1 + 32, in.readInt());
                assertEquals(1, in.readByte(), "CHALLENGE");
                assertEquals(1, in.readByte(), "authentication required");
                in.readFully(new byte[32]);

                // A wrong answer, then a request for a block that exists (map 0 of the job above wrote it).
                out.writeInt(1 + 32);
                out.writeByte(2);
                out.write(new byte[32]);
                byte[] id = "shuffle_0_0_0".getBytes(StandardCharsets.UTF_8);
                out.writeInt(1 + 8 + 2 + id.length);
                out.writeByte(3);
                out.writeLong(7);
                out.writeShort(id.length);
                out.write(id);
                out.flush();

                int length = in.readInt();
                assertEquals(5, in.readByte(), "FAILURE, never BLOCK");
                assertEquals(-1L, in.readLong(), "the connection is refused, not one request");
                byte[] message = new byte[length - 9];
                in.readFully(message);
                assertTrue(new String(message, StandardCharsets.UTF_8).startsWith("authentication failed"),
                        new String(message, StandardCharsets.UTF_8));
                assertEquals(-1, readOrEof(in), "the server closed the connection");
            }

            // The authenticated executors still shuffle over the block transport.
            assertEquals(digest, ShuffleJobs.reduceByKey(sc, 10));
            long deadline = System.nanoTime() + 20_000_000_000L;
            while (ShuffleCounters.rdmaCounter("authFailures") < 1 && System.nanoTime() < deadline) {
                Thread.sleep(100);
            }
            assertEquals(1, ShuffleCounters.rdmaCounter("authFailures"));
            assertTrue(ShuffleCounters.rdmaCounter("bytesFetched") > 0);
            assertEquals(0, ShuffleCounters.rdmaCounter("blocksFetchedByFallback"));
        } finally {
            spark.stop();
        }
    }

    private static int readOrEof(DataInputStream in) throws java.io.IOException {
        try {
            return in.read();
        } catch (EOFException e) {
            return -1;
        }
    }
}
