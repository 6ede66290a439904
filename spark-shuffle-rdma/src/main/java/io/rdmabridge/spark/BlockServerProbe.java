package io.rdmabridge.spark;

import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.spark.network.buffer.ManagedBuffer;
import org.apache.spark.network.shuffle.BlockFetchingListener;

/**
 * Asks one executor's block server for one block, as a reducer would: for operators checking that a server is
 * reachable and refuses peers without the application secret, and for tests.
 *
 * <pre>
 * java -cp spark-shuffle-rdma.jar:$SPARK_HOME/jars/* io.rdmabridge.spark.BlockServerProbe \
 *     HOST PORT BLOCK_ID [PROVIDER [SECRET]]
 * </pre>
 */
public final class BlockServerProbe {
    private BlockServerProbe() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: BlockServerProbe HOST PORT BLOCK_ID [PROVIDER (default auto) [SECRET]]");
            System.exit(2);
        }
        String outcome = fetch(args[0], Integer.parseInt(args[1]), args[2], args.length > 3 ? args[3] : "auto",
                args.length > 4 ? args[4] : null);
        System.out.println(outcome);
        System.exit(outcome.startsWith("fetched ") ? 0 : 1);
    }

    /**
     * Fetches {@code blockId} from the block server at {@code host:port} over {@code provider}, authenticating with
     * {@code secret} ({@code null}: none).
     *
     * @return {@code "fetched N bytes"}, or {@code "failed: "} and the cause
     */
    public static String fetch(String host, int port, String blockId, String provider, String secret)
            throws BlockTransport.UnavailableException, InterruptedException {
        BlockTransport transport = BlockTransport.open(provider, 1, RdmaShuffleConf.DEFAULT_SEND_QUEUE_DEPTH,
                RdmaShuffleConf.DEFAULT_RECV_QUEUE_DEPTH, "rdma-shuffle-probe");
        CompletableFuture<String> outcome = new CompletableFuture<>();
        try (ShuffleBlockClient client = new ShuffleBlockClient(transport, new PeerAuthenticator(secret), 10_000,
                30_000, new RdmaShuffleMetrics())) {
            client.fetch(new InetSocketAddress(host, port), new String[] {blockId}, new BlockFetchingListener() {
                @Override
                public void onBlockFetchSuccess(String id, ManagedBuffer data) {
                    try (InputStream in = data.createInputStream()) {
                        outcome.complete("fetched " + in.readAllBytes().length + " bytes");
                    } catch (IOException e) {
                        outcome.complete("failed: " + e.getMessage());
                    }
                }

                @Override
                public void onBlockFetchFailure(String id, Throwable cause) {
                    outcome.complete("failed: " + cause.getMessage());
                }
            });
            return outcome.get(60, TimeUnit.SECONDS);
        } catch (java.util.concurrent.ExecutionException | java.util.concurrent.TimeoutException e) {
            return "failed: no answer within 60 s (" + e + ")";
        } finally {
            transport.close();
        }
    }
}
