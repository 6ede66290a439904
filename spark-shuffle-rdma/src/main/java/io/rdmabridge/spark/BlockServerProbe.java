package io.rdmabridge.spark;

import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;
import java.net.InetSocketAddress;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkConf;
import org.apache.spark.network.buffer.ManagedBuffer;
import org.apache.spark.network.shuffle.BlockFetchingListener;

/**
 * Asks one executor's block server for one block, as a reducer would: for operators checking that a server is
 * reachable and refuses peers without the application secret, and for tests.
 *
 * <pre>
 * RDMABRIDGE_SHUFFLE_SECRET=... java -cp spark-shuffle-rdma.jar:$SPARK_HOME/jars/* \
 *     io.rdmabridge.spark.BlockServerProbe HOST PORT EXECUTOR_ID BLOCK_ID [PROVIDER]
 * </pre>
 *
 * The executor id is the server's (the executor log line that names the address names it too): with
 * {@code spark.authenticate=true} the handshake binds it, and only that executor's server passes. The application
 * secret, if the server requires one, comes from the environment variable {@code RDMABRIDGE_SHUFFLE_SECRET}: on the
 * command line any user of the host could read it (/proc/PID/cmdline, ps).
 */
public final class BlockServerProbe {
    static final String SECRET_ENV = "RDMABRIDGE_SHUFFLE_SECRET";

    private BlockServerProbe() {
    }

    public static void main(String[] args) throws Exception {
        System.exit(run(args, System.getenv(), System.out, System.err));
    }

    /** {@link #main} without the exit: returns its status (0 fetched, 1 failed, 2 usage). */
    static int run(String[] args, Map<String, String> env, PrintStream out, PrintStream err)
            throws BlockTransport.UnavailableException, InterruptedException {
        if (args.length > 5) {
            // The old SECRET argument: refused rather than ignored, so that no script goes on exposing it.
            err.println("BlockServerProbe: the secret is not taken as an argument, where any user of this host can "
                    + "read it (/proc/PID/cmdline): set the environment variable " + SECRET_ENV + " instead");
            return 2;
        }
        if (args.length < 4) {
            err.println("usage: [" + SECRET_ENV + "=SECRET] BlockServerProbe HOST PORT EXECUTOR_ID BLOCK_ID [PROVIDER "
                    + "(default auto)]");
            return 2;
        }
        List<String> providers = List.of("auto", "disni", BlockTransport.SOFT);
        String provider = args.length > 4 ? args[4] : "auto";
        if (!providers.contains(provider)) {
            // Not echoed: it may be a secret passed the old way (HOST PORT BLOCK_ID PROVIDER SECRET).
            err.println("BlockServerProbe: PROVIDER must be auto, disni or soft (a secret is not taken as an "
                    + "argument, where any user of this host can read it: set the environment variable " + SECRET_ENV
                    + " instead)");
            return 2;
        }
        if (args[2].startsWith("shuffle_") || providers.contains(args[3])) {
            // The form before EXECUTOR_ID was added (HOST PORT BLOCK_ID [PROVIDER]): not reinterpreted.
            err.println("BlockServerProbe: EXECUTOR_ID comes before BLOCK_ID (the id of the executor whose server this"
                    + " is, which its log line names with the address): HOST PORT EXECUTOR_ID BLOCK_ID [PROVIDER]");
            return 2;
        }
        String secret = env.get(SECRET_ENV);
        String outcome = fetch(args[0], Integer.parseInt(args[1]), args[2], args[3], provider,
                secret == null || secret.isEmpty() ? null : secret);
        out.println(outcome);
        return outcome.startsWith("fetched ") ? 0 : 1;
    }

    /**
     * Fetches {@code blockId} from executor {@code executorId}'s block server at {@code host:port} over
     * {@code provider}, authenticating with {@code secret} ({@code null}: none).
     *
     * @return {@code "fetched N bytes"}, or {@code "failed: "} and the cause
     */
    public static String fetch(String host, int port, String executorId, String blockId, String provider,
                               String secret)
            throws BlockTransport.UnavailableException, InterruptedException {
        BlockTransport transport = BlockTransport.open(provider, 1, RdmaShuffleConf.DEFAULT_SEND_QUEUE_DEPTH,
                RdmaShuffleConf.DEFAULT_RECV_QUEUE_DEPTH, "rdma-shuffle-probe");
        CompletableFuture<String> outcome = new CompletableFuture<>();
        // Takes what a reducer with Spark's default settings would.
        RdmaShuffleConf defaults = new RdmaShuffleConf(new SparkConf(false));
        try (ShuffleBlockClient client = new ShuffleBlockClient(transport, new PeerAuthenticator(secret), 10_000,
                30_000, defaults::maxFetchedBlockLength, defaults.maxFetchedBytesPerConnection,
                new RdmaShuffleMetrics())) {
            BlockFetchingListener listener = new BlockFetchingListener() {
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
            };
            client.fetch(executorId, new InetSocketAddress(host, port), new String[] {blockId}, listener);
            return outcome.get(60, TimeUnit.SECONDS);
        } catch (java.util.concurrent.ExecutionException | java.util.concurrent.TimeoutException e) {
            return "failed: no answer within 60 s (" + e + ")";
        } finally {
            transport.close();
        }
    }
}
