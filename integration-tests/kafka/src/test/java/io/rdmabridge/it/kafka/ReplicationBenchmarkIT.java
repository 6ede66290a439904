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
 * 3 and {@code min.insync.replicas=2}, on two clusters started one after the other from the same jars and settings:
 * <ol>
 *   <li>{@code on}: all three brokers with the agent, {@code rdma.replication.enable=true} and the soft provider, so
 *       every follower fetch crosses the RDMA channel;</li>
 *   <li>{@code off}: plain Kafka, the plugin jar present as a reporter but the flag off and no agent (the
 *       configuration of {@link StockClusterIT}).</li>
 * </ol>
 * On each: a warm-up of unthrottled records, then the measured throughput phase ({@code records} unthrottled; the
 * producer's rate from the first send to the last acknowledgement, and the end-to-end latency of those records under
 * that load), then a latency phase of records sent one at a time, each after the consumer received the one before
 * (as Kafka's {@code EndToEndLatency} tool does). End-to-end latency is the producer's {@code System.nanoTime()} at
 * {@code send()}, carried in the record, to the consumer's receipt in the same JVM; a consumer only sees a record once
 * the high watermark passed it, that is once the in-sync followers fetched it, so replication is on that path.
 *
 * <p>Runs only with {@code -Dit.benchmark=true} (from {@code bin/run-benchmarks --kafka}); not part of
 * {@code mvn verify}: two cluster starts alone cost about a minute on two cores. Speed figures are written to
 * {@code it.benchmark.out} (a properties file, default {@code target/kafka-benchmark.properties}), never asserted.
 * Asserted are observable facts: every record read back once and intact, RDMA bytes carried between the brokers in
 * {@code on} and no replication byte over TCP there, no RDMA counter at all in {@code off}, whose brokers say why the
 * plugin is inactive.
 *
 * <p>Sizes: {@code -Dit.benchmark.records} (default 2,000), {@code .warmup} (1,000), {@code .latencyRecords} (200),
 * {@code .recordSize} (1024 bytes), {@code .partitions} (3); {@code .order} ({@code on,off}: which cluster runs first).
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
        Map<String, String> result = new TreeMap<>();
        put(result, "records", records);
        put(result, "warmup", warmup);
        put(result, "latency.records", latencyRecords);
        put(result, "record.size", recordSize);
        put(result, "partitions", partitions);
        put(result, "cores", Runtime.getRuntime().availableProcessors());
        put(result, "load.average.start", ManagementFactory.getOperatingSystemMXBean().getSystemLoadAverage());
        result.put("order", String.join(",", order));
        for (String mode : order) {
            long start = System.nanoTime();
            try (KafkaCluster cluster = new KafkaCluster(dir.resolve(mode), 3)) {
                if (mode.equals("on")) {
                    for (int id = 1; id <= 3; id++) {
                        cluster.rdma(id, Map.of("rdma.provider", "soft"));
                    }
                }
                cluster.start();
                put(result, mode + ".cluster.start_s", (System.nanoTime() - start) / 1e9);
                measure(cluster, mode, result);
            }
            System.out.println("kafka benchmark, plugin " + mode + ": " + result);
        }
        put(result, "load.average.end", ManagementFactory.getOperatingSystemMXBean().getSystemLoadAverage());
        Files.createDirectories(out.toAbsolutePath().getParent());
        try (Writer w = Files.newBufferedWriter(out)) {
            Properties p = new Properties();
            p.putAll(result);
            p.store(w, "ReplicationBenchmarkIT: Kafka acks=all RF=3, plugin on vs off");
        }
        System.out.println("kafka benchmark results written to " + out.toAbsolutePath());
    }

    private void measure(KafkaCluster cluster, String mode, Map<String, String> result) throws Exception {
        int total = warmup + records + latencyRecords;
        try (Admin admin = cluster.admin()) {
            Records.createTopic(admin, TOPIC, partitions);
            Records.awaitIsr(admin, TOPIC, 3, Duration.ofSeconds(60));
        }
        Receiver receiver = new Receiver(cluster.bootstrap(), total);
        Thread consumer = new Thread(receiver, "benchmark-consumer");
        consumer.start();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerConfig(cluster.bootstrap()))) {
            receiver.awaitAssigned();
            int seq = 0;
            // Warm-up: JIT in the brokers and this JVM, connections (and their RDMA upgrade) established.
            seq = sendUnthrottled(producer, seq, warmup);
            receiver.awaitCount(seq, Duration.ofSeconds(120));

            long cpuBefore = brokerCpuNanos(cluster);
            long t0 = System.nanoTime();
            seq = sendUnthrottled(producer, seq, records);
            long t1 = System.nanoTime();
            long cpu = brokerCpuNanos(cluster) - cpuBefore;
            receiver.awaitCount(seq, Duration.ofSeconds(120));
            double seconds = (t1 - t0) / 1e9;
            put(result, mode + ".throughput.seconds", seconds);
            put(result, mode + ".throughput.records_per_s", records / seconds);
            put(result, mode + ".throughput.mb_per_s", (double) records * recordSize / seconds / 1e6);
            put(result, mode + ".broker.cpu_s_per_gb", cpu / 1e9 / ((double) records * recordSize / 1e9));
            percentiles(result, mode + ".loaded", receiver.latencies(warmup, warmup + records));

            // One at a time: the next record leaves only when the consumer received the one before.
            for (int i = 0; i < latencyRecords; i++) {
                producer.send(record(seq++));
                receiver.awaitCount(seq, Duration.ofSeconds(30));
            }
            percentiles(result, mode + ".serial", receiver.latencies(warmup + records, total));
        } finally {
            receiver.stop();
            consumer.join(TimeUnit.SECONDS.toMillis(30));
        }
        receiver.rethrow();
        assertEquals(total, receiver.count(), "records read back (plugin " + mode + ")");
        assertEquals(total, receiver.distinct(), "distinct sequence numbers read back (plugin " + mode + ")");
        assertEquals(0, receiver.duplicates(), "records read twice (plugin " + mode + ")");
        put(result, mode + ".read.records", receiver.count());
        replicationCounters(cluster, mode, result);
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
