package io.rdmabridge.spark;

import java.net.InetSocketAddress;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.SparkConf;
import org.apache.spark.rpc.RpcCallContext;
import org.apache.spark.rpc.RpcEndpoint;
import org.apache.spark.rpc.RpcEndpointRef;
import org.apache.spark.rpc.RpcEnv;
import org.apache.spark.util.RpcUtils;
import scala.PartialFunction;
import scala.reflect.ClassTag$;
import scala.runtime.AbstractPartialFunction;
import scala.runtime.BoxedUnit;

/**
 * How reducers find each executor's block server with no per-node configuration: executors register their server's
 * address (or the reason they fall back) with an endpoint on the driver, reducers look an executor up once and cache
 * the answer until that server cannot be reached. The driver forgets the executors Spark removes, and keeps each
 * executor's latest counters, for tests and operators.
 *
 * <p>Messages are tab-separated strings, so the driver never needs this jar's classes to deserialize them.
 * Thread-safe.
 */
final class BlockServerDirectory {
    static final String ENDPOINT_NAME = "RdmaShuffleBlockServerDirectory";

    private static final String REGISTER = "register";
    private static final String FALLBACK = "fallback";
    private static final String LOOKUP = "lookup";
    private static final String METRICS = "metrics";
    /** How many removed executors the driver remembers, to refuse their late registrations; about 100 bytes each. */
    static final int REMEMBERED_REMOVALS = 10_000;

    private BlockServerDirectory() {
    }

    /** The driver's side: holds the table. */
    static final class Driver implements RpcEndpoint {
        private final RpcEnv rpcEnv;
        private final Map<String, InetSocketAddress> servers = new ConcurrentHashMap<>();
        private final Map<String, String> fallbacks = new ConcurrentHashMap<>();
        private final Map<String, Report> metrics = new ConcurrentHashMap<>();
        /**
         * Executors Spark removed, the latest {@value #REMEMBERED_REMOVALS}: a registration still in flight from one
         * (a lazy start on Spark 3.5 racing its removal) would otherwise list a server that is gone, which reducers
         * would then dial on every fetch of its blocks from the external shuffle service.
         */
        private final Set<String> removed = Collections.newSetFromMap(new LinkedHashMap<>() {
            @Override
            protected boolean removeEldestEntry(Map.Entry<String, Boolean> eldest) {
                return size() > REMEMBERED_REMOVALS;
            }
        });

        Driver(RpcEnv rpcEnv) {
            this.rpcEnv = rpcEnv;
        }

        static Driver start(RpcEnv rpcEnv) {
            Driver driver = new Driver(rpcEnv);
            rpcEnv.setupEndpoint(ENDPOINT_NAME, driver);
            return driver;
        }

        /**
         * Forgets executor {@code executorId}'s server and fallback once Spark has removed the executor, so that a
         * reducer's next lookup finds none (its blocks, kept by an external shuffle service, are fetched from there).
         * Its last counters stay, for operators.
         */
        void executorRemoved(String executorId) {
            synchronized (removed) {
                removed.add(executorId);
                servers.remove(executorId);
                fallbacks.remove(executorId);
            }
        }

        /** Executor id → block server address, for every executor that registered one. */
        Map<String, InetSocketAddress> servers() {
            return new TreeMap<>(servers);
        }

        /** Executor id → why it runs on Spark's transport. */
        Map<String, String> fallbacks() {
            return new TreeMap<>(fallbacks);
        }

        /** Executor id → its latest counters ({@code name=value ...}). */
        Map<String, String> metrics() {
            Map<String, String> latest = new TreeMap<>();
            metrics.forEach((id, report) -> latest.put(id, report.counters));
            return latest;
        }

        @Override
        public RpcEnv rpcEnv() {
            return rpcEnv;
        }

        @Override
        public PartialFunction<Object, BoxedUnit> receive() {
            return handler(null);
        }

        @Override
        public PartialFunction<Object, BoxedUnit> receiveAndReply(RpcCallContext context) {
            return handler(context);
        }

        private PartialFunction<Object, BoxedUnit> handler(RpcCallContext context) {
            return new AbstractPartialFunction<>() {
                @Override
                public boolean isDefinedAt(Object message) {
                    return message instanceof String s && s.indexOf('\t') > 0;
                }

                @Override
                public <A1, B1> B1 applyOrElse(A1 message, scala.Function1<A1, B1> otherwise) {
                    if (!isDefinedAt(message)) {
                        return otherwise.apply(message);
                    }
                    String reply = handle(((String) message).split("\t", -1));
                    if (context != null) {
                        context.reply(reply);
                    }
                    @SuppressWarnings("unchecked")
                    B1 unit = (B1) BoxedUnit.UNIT;
                    return unit;
                }
            };
        }

        String handle(String[] f) {
            switch (f[0]) {
                case REGISTER -> {
                    int port = f.length == 4 ? port(f[3]) : -1;
                    if (port < 0) {
                        return "malformed registration: expected register<TAB>executor<TAB>host<TAB>port (1-65535)";
                    }
                    synchronized (removed) {
                        if (removed.contains(f[1])) {
                            return "executor " + f[1] + " was removed by Spark (it registered after its removal)";
                        }
                        servers.put(f[1], InetSocketAddress.createUnresolved(f[2], port));
                        fallbacks.remove(f[1]);
                    }
                    return "";
                }
                case FALLBACK -> {
                    if (f.length != 3) {
                        return "malformed fallback report: expected fallback<TAB>executor<TAB>cause";
                    }
                    synchronized (removed) {
                        if (!removed.contains(f[1])) {
                            fallbacks.put(f[1], f[2]);
                        }
                    }
                    return "";
                }
                case LOOKUP -> {
                    InetSocketAddress a = servers.get(f[1]);
                    return a == null ? "" : a.getHostString() + "\t" + a.getPort();
                }
                case METRICS -> {
                    // Reports of one executor can arrive out of order (its reduce tasks send them from their own
                    // threads, and this endpoint's messages may be handled concurrently): keep the newest.
                    long seq;
                    try {
                        seq = f.length == 4 ? Long.parseLong(f[2]) : -1;
                    } catch (NumberFormatException e) {
                        seq = -1;
                    }
                    if (seq < 0) {
                        return "malformed metrics report: expected metrics<TAB>executor<TAB>sequence<TAB>counters";
                    }
                    metrics.merge(f[1], new Report(seq, f[3]), (held, got) -> got.seq > held.seq ? got : held);
                    return "";
                }
                default -> {
                    return "unknown message " + f[0];
                }
            }
        }
    }

    /** {@code text} as a TCP port, or -1 when it is none. */
    private static int port(String text) {
        try {
            int port = Integer.parseInt(text);
            return port > 0 && port <= 0xFFFF ? port : -1;
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    /** One executor's counters, numbered in the order the executor took them. */
    private record Report(long seq, String counters) {
    }

    /** An executor's side: registers its own server and resolves peers, caching answers. */
    static final class Executor implements RoutingBlockStoreClient.BlockServers {
        private static final InetSocketAddress NONE = InetSocketAddress.createUnresolved("none", 1);

        private final RpcEndpointRef driver;
        private final String executorId;
        private final Map<String, InetSocketAddress> cache = new ConcurrentHashMap<>();
        private long reports;

        Executor(SparkConf conf, RpcEnv rpcEnv, String executorId) {
            this.driver = RpcUtils.makeDriverRef(ENDPOINT_NAME, conf, rpcEnv);
            this.executorId = executorId;
        }

        void register(InetSocketAddress server) {
            String refusal = ask(REGISTER + "\t" + executorId + "\t" + server.getHostString() + "\t"
                    + server.getPort());
            if (!refusal.isEmpty()) {
                throw new IllegalStateException("the driver refused block server " + server + " of executor "
                        + executorId + ": " + refusal);
            }
        }

        void reportFallback(String cause) {
            driver.send(FALLBACK + "\t" + executorId + "\t" + cause.replace('\t', ' '));
        }

        /**
         * Sends the executor's counters to the driver, numbered so that the driver keeps the newest when reports
         * overtake each other. Called at the end of each reduce task: under the lock, a later number always goes
         * with a later snapshot.
         */
        synchronized void reportMetrics(RdmaShuffleMetrics counters) {
            driver.send(METRICS + "\t" + executorId + "\t" + ++reports + "\t" + counters.snapshot());
        }

        /**
         * The block server of {@code peer}, or {@code null} when it has none (it runs on Spark's transport). A peer
         * that holds map output has registered before its map task finished, so a negative answer is final too.
         */
        @Override
        public InetSocketAddress lookup(String peer) {
            InetSocketAddress a = cache.get(peer);
            if (a == null) {
                // Not computeIfAbsent: the ask may take spark.rpc.askTimeout, and forget() (on an event loop) would
                // wait on the map's bin lock for it. Two tasks asking at once both ask; the answers are the same.
                String[] f = ask(LOOKUP + "\t" + peer).split("\t");
                a = f.length == 2 ? new InetSocketAddress(f[0], Integer.parseInt(f[1])) : NONE;
                cache.putIfAbsent(peer, a);
            }
            return a == NONE ? null : a;
        }

        @Override
        public void forget(String peer) {
            cache.remove(peer);
        }

        private String ask(String message) {
            return (String) driver.askSync(message, ClassTag$.MODULE$.apply(String.class));
        }
    }
}
