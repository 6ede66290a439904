package io.rdmabridge.it.kafka;

import java.time.Duration;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.zip.CRC32;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Produces numbered records with {@code acks=all} and reads a topic back, checking that every acknowledged record is
 * there exactly once with its content intact (count, sequence numbers and a checksum of all keys and values).
 */
final class Records {
    static final int VALUE_SIZE = 200;

    /** What was acknowledged: the sequence numbers and the sum of their records' CRC32s. */
    static final class Acked {
        final BitSet sequences = new BitSet();
        long checksum;
        int count;
    }

    private Records() {
    }

    static void createTopic(Admin admin, String topic, int partitions) throws Exception {
        createTopic(admin, topic, partitions, 3);
    }

    static void createTopic(Admin admin, String topic, int partitions, int replicas) throws Exception {
        admin.createTopics(List.of(new NewTopic(topic, partitions, (short) replicas)
                .configs(Map.of("min.insync.replicas", "2")))).all().get(60, TimeUnit.SECONDS);
    }

    static byte[] value(int seq) {
        byte[] v = new byte[VALUE_SIZE];
        for (int i = 0; i < v.length; i++) {
            v[i] = (byte) (seq * 31 + i * 7);
        }
        return v;
    }

    static byte[] key(int seq) {
        return Integer.toString(seq).getBytes(java.nio.charset.StandardCharsets.US_ASCII);
    }

    static long crc(byte[] key, byte[] value) {
        CRC32 c = new CRC32();
        c.update(key);
        c.update(value);
        return c.getValue();
    }

    /** Sends sequences [from, from + count) and waits for every acknowledgement; all must succeed. */
    static void produce(String bootstrap, String topic, int from, int count, Acked acked) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "65536");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "120000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        List<Future<RecordMetadata>> sent = new ArrayList<>(count);
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            for (int seq = from; seq < from + count; seq++) {
                sent.add(producer.send(new ProducerRecord<>(topic, key(seq), value(seq))));
            }
            producer.flush();
            for (int i = 0; i < sent.size(); i++) {
                sent.get(i).get(120, TimeUnit.SECONDS);
                int seq = from + i;
                acked.sequences.set(seq);
                acked.checksum += crc(key(seq), value(seq));
                acked.count++;
            }
        }
    }

    /** Reads the whole topic from the beginning until {@code expected.count} records arrived (or 120 s, scaled). */
    static Acked consumeAll(String bootstrap, String topic, int partitions, int expectedCount) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        Acked read = new Acked();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int i = 0; i < partitions; i++) {
                tps.add(new TopicPartition(topic, i));
            }
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            long deadline = System.nanoTime() + KafkaCluster.scaled(Duration.ofSeconds(120)).toNanos();
            while (read.count < expectedCount && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
                    int seq = Integer.parseInt(new String(r.key(), java.nio.charset.StandardCharsets.US_ASCII));
                    if (read.sequences.get(seq)) {
                        throw new AssertionError("record " + seq + " read twice (partition " + r.partition()
                                + ", offset " + r.offset() + ")");
                    }
                    read.sequences.set(seq);
                    read.checksum += crc(r.key(), r.value());
                    read.count++;
                }
            }
            // One more poll proves nothing beyond the expected records is there.
            for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(1000))) {
                read.count++;
                read.sequences.set(Integer.parseInt(new String(r.key(), java.nio.charset.StandardCharsets.US_ASCII)));
            }
        }
        return read;
    }

    /** Waits until every partition of {@code topic} has {@code size} in-sync replicas. */
    static void awaitIsr(Admin admin, String topic, int size, Duration timeout) throws InterruptedException {
        KafkaCluster.await(timeout, "ISR of " + topic + " = " + size, () -> {
            try {
                TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(10, TimeUnit.SECONDS)
                        .get(topic);
                return d.partitions().stream().allMatch(pi -> pi.isr().size() == size);
            } catch (Exception e) {
                return false;
            }
        });
    }

    static int minIsr(Admin admin, String topic) throws Exception {
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(10, TimeUnit.SECONDS).get(topic);
        return d.partitions().stream().mapToInt(pi -> pi.isr().size()).min().orElse(0);
    }
}
