package io.rdmabridge.it.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.Writer;
import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.BitSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.condition.EnabledIfSystemProperty;
import org.junit.jupiter.api.io.TempDir;

/**
 * The Kafka framework benchmark: producer throughput and end-to-end latency with {@code acks=all}, replication factor
 * 3 and {@code min.insync.replicas=2}, on two clusters started from the same jars and settings and run side by side:
 * <ol>
 *   <li>{@code on}: all three brokers with the agent, {@code rdma.replication.enable=true} and the soft provider, so
 *       every follower fetch crosses the RDMA channel;</li>
 *   <li>{@code off}: plain Kafka, the plugin jar present as a reporter but the flag off and no agent (the
 *       configuration of {@link StockClusterIT}).</li>
 * </ol>
 * On each: a warm-up of unthrottled records; then measured rounds, alternating between the clusters in pairs whose
 * order flips each time (on, off, off, on, ...), so that a drift of the machine's speed over the run weighs on both
 * alike, while the other cluster idles. A round is a throughput phase ({@code records} unthrottled; the producer's
 * rate from the first send to the last acknowledgement, and the end-to-end latency of those records under that load)
 * and a latency phase of records sent one at a time, each after the consumer received the one before (as Kafka's
 * {@code EndToEndLatency} tool does). End-to-end latency is the producer's {@code System.nanoTime()} at {@code send()},
 * carried in the record, to the consumer's receipt in the same JVM; a consumer only sees a record once the high
 * watermark passed it, that is once the in-sync followers fetched it, so replication is on that path.
 *
 * <p>Written per mode: the median throughput of its rounds (and the slowest and fastest), latency percentiles over
 * all its rounds' samples, broker CPU over all its throughput phases; per pair of adjacent rounds, the on / off
 * ratios of throughput and of the median latencies (their lowest, median and highest), which show how far the
 * machine's noise reaches; and the rounds' order ({@code schedule}), which the report prints rather than re-derives.
 *
 * <p>Runs only with {@code -Dit.benchmark=true} (from {@code bin/run-benchmarks --kafka}); not part of
 * {@code mvn verify}: two cluster starts alone cost about a minute on two cores. Speed figures are written to
 * {@code it.benchmark.out} (a properties file, default {@code target/kafka-benchmark.properties}), never asserted.
 * Asserted are observable facts: every record read back once and intact, RDMA bytes carried between the brokers in
 * {@code on} and no replication byte over TCP there, no RDMA counter at all in {@code off}, whose brokers say why the
 * plugin is inactive.
 *
 * <p>Sizes, smoke by default ({@code mvn verify}; {@code bin/run-benchmarks} passes the page's):
 * {@code -Dit.benchmark.records} (2,000 per round), {@code .warmup} (1,000), {@code .latencyRecords} (200 per round),
 * {@code .rounds} (2: one pair; even), {@code .recordSize} (1024 bytes), {@code .partitions} (3); {@code .order}
 * ({@code on,off}: which cluster the first pair measures first).
 */
@EnabledIfSystemProperty(named = "it.benchmark", matches = "true",
        disabledReason = "a benchmark: run it with -Dit.benchmark=true (bin/run-benchmarks --kafka)")
class ReplicationBenchmarkIT {
    private static final String TOPIC = "bench";
    /** Value layout: sequence number (int), send time (long, System.nanoTime), filler, sequence number again. */
    private static final int HEADER = 12;
    private static final int TRAILER = 4;

    private final int records = Integer.getInteger("it.benchmark.records", 2_000);
    private final int warmup = Integer.getInteger("it.benchmark.warmup", 1_000);
    private final int latencyRecords = Integer.getInteger("it.benchmark.latencyRecords", 200);
    private final int rounds = Integer.getInteger("it.benchmark.rounds", 2);
    private final int recordSize = Integer.getInteger("it.benchmark.recordSize", 1024);
    private final int partitions = Integer.getInteger("it.benchmark.partitions", 3);
    private final List<String> order = List.of(System.getProperty("it.benchmark.order", "on,off").split(","));
    private final Path out = Path.of(System.getProperty("it.benchmark.out", "target/kafka-benchmark.properties"));

    @Test
    void shouldMeasureReplicationWithThePluginOnAndOff(@TempDir Path dir) throws Exception {
        assertTrue(order.size() == 2 && order.containsAll(List.of("on", "off")), "it.benchmark.order: "
                + String.join(",", order) + " (expected: on,off or off,on)");
        assertTrue(recordSize >= HEADER + TRAILER, "it.benchmark.recordSize: " + recordSize + " (expected: >= "
                + (HEADER + TRAILER) + ")");
        assertTrue(rounds >= 2 && rounds % 2 == 0, "it.benchmark.rounds: " + rounds + " (expected: even, >= 2)");
        Map<String, String> result = new TreeMap<>();
        put(result, "records", records);
        put(result, "warmup", warmup);
        put(result, "latency.records", latencyRecords);
        put(result, "rounds", rounds);
        put(result, "record.size", recordSize);
        put(result, "partitions", partitions);
        put(result, "cores", Runtime.getRuntime().availableProcessors());
        put(result, "load.average.start", ManagementFactory.getOperatingSystemMXBean().getSystemLoadAverage());
        result.put("order", String.join(",", order));
        Map<String, KafkaCluster> clusters = new TreeMap<>();
        Map<String, Bench> benches = new TreeMap<>();
        try {
            for (String mode : order) {
                long start = System.nanoTime();
                KafkaCluster cluster = new KafkaCluster(dir.resolve(mode), 3);
                clusters.put(mode, cluster);
                if (mode.equals("on")) {
                    for (int id = 1; id <= 3; id++) {
                        cluster.rdma(id, Map.of("rdma.provider", "soft"));
                    }
                }
                cluster.start();
                put(result, mode + ".cluster.start_s", (System.nanoTime() - start) / 1e9);
            }
            for (String mode : order) {
                benches.put(mode, new Bench(clusters.get(mode), mode));
            }
            // Pairs in alternating order: first, second, second, first, ...
            List<String> schedule = new ArrayList<>();
            for (int r = 0; r < rounds; r++) {
                int pair = r / 2;
                boolean firstOfPair = r % 2 == 0;
                String mode = order.get((pair % 2 == 0) == firstOfPair ? 0 : 1);
                benches.get(mode).round(pair);
                schedule.add(mode);
            }
            result.put("schedule", String.join(",", schedule));
            for (String mode : order) {
                benches.get(mode).finish(result);
                replicationCounters(clusters.get(mode), mode, result);
            }
            pairRatios(benches.get("on"), benches.get("off"), result);
        } finally {
            for (Bench b : benches.values()) {
                b.close();
            }
            for (KafkaCluster c : clusters.values()) {
                c.close();
            }
        }
        System.out.println("kafka benchmark, plugin on and off: " + result);
        put(result, "load.average.end", ManagementFactory.getOperatingSystemMXBean().getSystemLoadAverage());
        Files.createDirectories(out.toAbsolutePath().getParent());
        try (Writer w = Files.newBufferedWriter(out)) {
            Properties p = new Properties();
            p.putAll(result);
            p.store(w, "ReplicationBenchmarkIT: Kafka acks=all RF=3, plugin on vs off");
        }
        System.out.println("kafka benchmark results written to " + out.toAbsolutePath());
    }

    /** One cluster's producer and consumer, kept across its rounds; the producer thread is the test's. */
    private final class Bench {
        private final KafkaCluster cluster;
        private final String mode;
        private final int total;
        private final Receiver receiver;
        private final Thread consumer;
        private final KafkaProducer<byte[], byte[]> producer;
        private final double[] rate = new double[rounds / 2];
        private final long[][] loaded = new long[rounds / 2][];
        private final long[][] serial = new long[rounds / 2][];
        private int seq;
        private long cpuNanos;
        private double seconds;

        Bench(KafkaCluster cluster, String mode) throws Exception {
            this.cluster = cluster;
            this.mode = mode;
            total = warmup + rounds / 2 * (records + latencyRecords);
            try (Admin admin = cluster.admin()) {
                Records.createTopic(admin, TOPIC, partitions);
                Records.awaitIsr(admin, TOPIC, 3, Duration.ofSeconds(60));
            }
            receiver = new Receiver(cluster.bootstrap(), total);
            consumer = new Thread(receiver, "benchmark-consumer-" + mode);
            consumer.start();
            producer = new KafkaProducer<>(producerConfig(cluster.bootstrap()));
            receiver.awaitAssigned();
            // Warm-up: JIT in the brokers and this JVM, connections (and their RDMA upgrade) established.
            seq = sendUnthrottled(producer, seq, warmup);
            receiver.awaitCount(seq, Duration.ofSeconds(120));
        }

        /** This cluster's round of pair {@code pair}: the throughput phase, then the one-at-a-time phase. */
        void round(int pair) throws Exception {
            int from = seq;
            long cpuBefore = brokerCpuNanos(cluster);
            long t0 = System.nanoTime();
            seq = sendUnthrottled(producer, seq, records);
            long t1 = System.nanoTime();
            cpuNanos += brokerCpuNanos(cluster) - cpuBefore;
            receiver.awaitCount(seq, Duration.ofSeconds(120));
            seconds += (t1 - t0) / 1e9;
            rate[pair] = records / ((t1 - t0) / 1e9);
            loaded[pair] = receiver.latencies(from, seq);
            from = seq;
            for (int i = 0; i < latencyRecords; i++) {
                producer.send(record(seq++));
                receiver.awaitCount(seq, Duration.ofSeconds(30));
            }
            serial[pair] = receiver.latencies(from, seq);
        }

        /** Checks what was read back and writes this mode's figures. */
        void finish(Map<String, String> result) throws Exception {
            close();
            receiver.rethrow();
            assertEquals(total, receiver.count(), "records read back (plugin " + mode + ")");
            assertEquals(total, receiver.distinct(), "distinct sequence numbers read back (plugin " + mode + ")");
            assertEquals(0, receiver.duplicates(), "records read twice (plugin " + mode + ")");
            put(result, mode + ".read.records", receiver.count());
            double[] sorted = rate.clone();
            Arrays.sort(sorted);
            put(result, mode + ".throughput.seconds", seconds);
            put(result, mode + ".throughput.records_per_s", median(sorted));
            put(result, mode + ".throughput.records_per_s.min", sorted[0]);
            put(result, mode + ".throughput.records_per_s.max", sorted[sorted.length - 1]);
            put(result, mode + ".throughput.mb_per_s", median(sorted) * recordSize / 1e6);
            result.put(mode + ".throughput.rounds", Arrays.stream(rate)
                    .mapToObj(r -> String.format(Locale.ROOT, "%.0f", r)).collect(Collectors.joining(",")));
            double bytes = (double) rate.length * records * recordSize;
            put(result, mode + ".broker.cpu_s_per_gb", cpuNanos / 1e9 / (bytes / 1e9));
            percentiles(result, mode + ".loaded", concat(loaded));
            percentiles(result, mode + ".serial", concat(serial));
        }

        /** Stops the producer and the consumer; idempotent, so it also runs after {@link #finish}. */
        void close() throws InterruptedException {
            producer.close(Duration.ofSeconds(10));
            receiver.stop();
            consumer.join(TimeUnit.SECONDS.toMillis(30));
        }
    }

    /** On / off per pair of adjacent rounds: throughput and the median latencies; lowest, median, highest. */
    private static void pairRatios(Bench on, Bench off, Map<String, String> result) {
        int pairs = on.rate.length;
        double[] throughput = new double[pairs];
        double[] loadedP50 = new double[pairs];
        double[] serialP50 = new double[pairs];
        for (int i = 0; i < pairs; i++) {
            throughput[i] = on.rate[i] / off.rate[i];
            loadedP50[i] = p50(on.loaded[i]) / p50(off.loaded[i]);
            serialP50[i] = p50(on.serial[i]) / p50(off.serial[i]);
        }
        spread(result, "pairs.throughput.records_per_s", throughput);
        spread(result, "pairs.loaded.p50_ms", loadedP50);
        spread(result, "pairs.serial.p50_ms", serialP50);
    }

    private static void spread(Map<String, String> result, String key, double[] values) {
        double[] sorted = values.clone();
        Arrays.sort(sorted);
        put(result, key + ".ratio.min", sorted[0]);
        put(result, key + ".ratio.median", median(sorted));
        put(result, key + ".ratio.max", sorted[sorted.length - 1]);
    }

    private static double median(double[] sorted) {
        int n = sorted.length;
        return n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    }

    private static double p50(long[] nanos) {
        long[] sorted = nanos.clone();
        Arrays.sort(sorted);
        return percentile(sorted, 50);
    }

    private static long[] concat(long[][] parts) {
        return Arrays.stream(parts).flatMapToLong(Arrays::stream).toArray();
    }

    /** Sums the plugin's per-peer JMX counters of every broker; asserts which path carried replication. */
    private static void replicationCounters(KafkaCluster cluster, String mode, Map<String, String> result)
            throws Exception {
        double rdma = 0;
        double tcp = 0;
        double copied = 0;
        int beans = 0;
        for (KafkaCluster.Node n : cluster.brokers()) {
            Map<String, Map<String, Double>> m = cluster.rdmaMetrics(n.id);
            beans += m.size();
            for (Map.Entry<String, Map<String, Double>> peer : m.entrySet()) {
                if (peer.getKey().equals("all")) {
                    continue;
                }
                // A follower counts what it fetched from each leader: each replicated byte once.
                rdma += peer.getValue().getOrDefault("rdma-bytes-received-total", 0.0);
                tcp += peer.getValue().getOrDefault("tcp-bytes-received-total", 0.0);
                copied += peer.getValue().getOrDefault("rdma-copied-bytes-received-total", 0.0)
                        + peer.getValue().getOrDefault("rdma-copied-bytes-sent-total", 0.0);
            }
        }
        put(result, mode + ".replication.rdma_bytes", rdma);
        put(result, mode + ".replication.tcp_bytes", tcp);
        put(result, mode + ".replication.rdma_copied_bytes", copied);
        put(result, mode + ".replication.beans", beans);
        if (mode.equals("on")) {
            assertTrue(rdma > 0, "followers fetched over RDMA with the plugin on: " + result);
            assertEquals(0.0, tcp, "no follower fetched over TCP when every broker has the plugin on: " + result);
        } else {
            assertEquals(0.0, rdma, "no RDMA byte with the plugin off: " + result);
            assertEquals(0, beans, "no rdma-replication MBean with the plugin off: " + result);
            for (KafkaCluster.Node n : cluster.brokers()) {
                String log = cluster.log(n.id);
                assertTrue(log.contains("RDMA replication inactive: rdma.replication.enable is not true"),
                        "broker " + n.id + " names why the plugin is inactive; log:\n" + StockClusterIT.tail(log));
            }
        }
    }

    private Properties producerConfig(String bootstrap) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "65536");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "120000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return p;
    }

    /** Sends {@code count} records without waiting, then waits for every acknowledgement; any failure is thrown. */
    private int sendUnthrottled(KafkaProducer<byte[], byte[]> producer, int from, int count) throws Exception {
        AtomicReference<Exception> failure = new AtomicReference<>();
        for (int seq = from; seq < from + count; seq++) {
            producer.send(record(seq), (md, e) -> {
                if (e != null) {
                    failure.compareAndSet(null, e);
                }
            });
        }
        // flush() returns once every record sent so far completed, acknowledged or failed.
        producer.flush();
        if (failure.get() != null) {
            throw new AssertionError("a record was not acknowledged", failure.get());
        }
        return from + count;
    }

    private ProducerRecord<byte[], byte[]> record(int seq) {
        ByteBuffer v = ByteBuffer.allocate(recordSize);
        v.putInt(seq).putLong(System.nanoTime());
        while (v.remaining() > TRAILER) {
            v.put((byte) (seq + v.position()));
        }
        v.putInt(seq);
        return new ProducerRecord<>(TOPIC, v.array());
    }

    private static long brokerCpuNanos(KafkaCluster cluster) {
        long sum = 0;
        for (KafkaCluster.Node n : cluster.brokers()) {
            sum += n.process.info().totalCpuDuration().map(Duration::toNanos).orElse(0L);
        }
        return sum;
    }

    private static void percentiles(Map<String, String> result, String key, long[] nanos) {
        Arrays.sort(nanos);
        put(result, key + ".p50_ms", percentile(nanos, 50) / 1e6);
        put(result, key + ".p99_ms", percentile(nanos, 99) / 1e6);
        put(result, key + ".p999_ms", percentile(nanos, 99.9) / 1e6);
        put(result, key + ".max_ms", nanos.length == 0 ? Double.NaN : nanos[nanos.length - 1] / 1e6);
        put(result, key + ".samples", nanos.length);
    }

    /** Nearest rank of a sorted array; NaN when empty. */
    private static double percentile(long[] sorted, double p) {
        if (sorted.length == 0) {
            return Double.NaN;
        }
        int rank = (int) Math.ceil(p / 100 * sorted.length);
        return sorted[Math.max(0, Math.min(sorted.length - 1, rank - 1))];
    }

    private static void put(Map<String, String> result, String key, double value) {
        result.put(key, String.format(Locale.ROOT, value == Math.rint(value) && Math.abs(value) < 1e15 ? "%.0f"
                : "%.4f", value));
    }

    /**
     * The consumer thread: reads the topic from the beginning, checks each record's layout, and stores its end-to-end
     * latency by sequence number. Fields read by the test thread are volatile or read after {@link #stop()} and join.
     */
    private final class Receiver implements Runnable {
        private final String bootstrap;
        private final long[] latency;
        private final BitSet seen = new BitSet();
        private volatile int count;
        private volatile int duplicates;
        private volatile boolean assigned;
        private volatile boolean running = true;
        private volatile Throwable failure;

        Receiver(String bootstrap, int expected) {
            this.bootstrap = bootstrap;
            this.latency = new long[expected];
        }

        @Override
        public void run() {
            Properties p = new Properties();
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
            p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
            p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
            try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
                List<TopicPartition> tps = new ArrayList<>();
                for (int i = 0; i < partitions; i++) {
                    tps.add(new TopicPartition(TOPIC, i));
                }
                consumer.assign(tps);
                consumer.seekToBeginning(tps);
                for (TopicPartition tp : tps) {
                    consumer.position(tp, Duration.ofSeconds(60));
                }
                assigned = true;
                while (running) {
                    for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(100))) {
                        receive(r);
                    }
                }
            } catch (Throwable t) {
                failure = t;
            }
        }

        private void receive(ConsumerRecord<byte[], byte[]> r) {
            long now = System.nanoTime();
            ByteBuffer v = ByteBuffer.wrap(r.value());
            int seq = v.getInt(0);
            if (r.value().length != recordSize || seq < 0 || seq >= latency.length
                    || v.getInt(recordSize - TRAILER) != seq) {
                throw new AssertionError("malformed record at partition " + r.partition() + ", offset " + r.offset()
                        + ": length " + r.value().length + ", sequence " + seq);
            }
            if (seen.get(seq)) {
                duplicates++;
                return;
            }
            seen.set(seq);
            latency[seq] = now - v.getLong(4);
            count++;
        }

        void awaitAssigned() throws InterruptedException {
            KafkaCluster.await(Duration.ofSeconds(60), "the consumer's positions", () -> assigned || failure != null);
            rethrow();
        }

        void awaitCount(int n, Duration timeout) throws InterruptedException {
            long deadline = System.nanoTime() + timeout.toNanos();
            while (count < n && failure == null) {
                if (System.nanoTime() > deadline) {
                    throw new AssertionError("timed out after " + timeout.toSeconds() + " s: the consumer received "
                            + count + " of " + n + " records");
                }
                Thread.onSpinWait();
                if (count < n) {
                    // Sub-millisecond naps: the one-at-a-time phase measures milliseconds.
                    TimeUnit.MICROSECONDS.sleep(50);
                }
            }
            rethrow();
        }

        /** Latencies of sequence numbers [from, to); call once those arrived (count is volatile: happens-before). */
        long[] latencies(int from, int to) {
            return Arrays.copyOfRange(latency, from, to);
        }

        int count() {
            return count;
        }

        int distinct() {
            return seen.cardinality();
        }

        int duplicates() {
            return duplicates;
        }

        void stop() {
            running = false;
        }

        void rethrow() {
            if (failure != null) {
                throw new AssertionError("consumer failed", failure);
            }
        }
    }
}
