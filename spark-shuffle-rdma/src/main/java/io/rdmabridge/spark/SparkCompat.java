package io.rdmabridge.spark;

import java.lang.reflect.Array;
import java.lang.reflect.Constructor;
import java.lang.reflect.InvocationTargetException;
import org.apache.spark.Aggregator;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.internal.config.package$;
import org.apache.spark.io.CompressionCodec;
import org.apache.spark.io.CompressionCodec$;
import org.apache.spark.network.shuffle.BlockStoreClient;
import org.apache.spark.serializer.Serializer;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.storage.ShuffleBlockFetcherIterator;
import org.apache.spark.util.collection.ExternalSorter;
import scala.Option;
import scala.math.Ordering;

/**
 * Every difference between the Spark lines these sources serve (3.5, 4.0, 4.1, 4.2; one jar for Scala 2.13, one built
 * for 3.5 on Scala 2.12) lives here, each commented with the versions it covers. The {@code ShuffleManager} trait, the
 * {@code ShuffleBlockFetcherIterator} constructor, {@code MapOutputTracker.getMapSizesByExecutorId} and the
 * {@code BlockStoreClient} methods used here are identical across them (javap on 3.5.9 for both Scala lines, 4.1.3
 * and 4.2.0; every line runs integration-tests' jobs); the reduce side's {@code ExternalSorter} and the moment Spark
 * builds the shuffle manager are not. {@code ManagedBuffer.convertToNettyForSsl} (4.0 and later) is handled in
 * {@link FetchedBlockBuffer}.
 */
final class SparkCompat {
    /**
     * {@code ExternalSorter}'s constructor: 5 parameters in 3.5.x and 4.0.x; 4.1 appended {@code rowBasedChecksums}
     * (an array, passed empty as Spark's reader does). Looked up once by parameter count.
     */
    private static final Constructor<?> EXTERNAL_SORTER = externalSorterConstructor();

    private SparkCompat() {
    }

    /**
     * Whether Spark builds the shuffle manager before {@code SparkEnv.get()} returns its environment: 3.5.x does,
     * inside {@code SparkEnv.create} (and an executor's block manager is initialized later still), so the manager must
     * start its transport on its first shuffle call. 4.0 and later build it in
     * {@code SparkEnv.initializeShuffleManager}, with the environment set (on executors, once the block manager is
     * initialized): it starts at once.
     */
    static boolean createsShuffleManagerBeforeEnv() {
        try {
            SparkEnv.class.getMethod("initializeShuffleManager");
            return false;
        } catch (NoSuchMethodException e) {
            return true;
        }
    }

    /**
     * Spark's fetch iterator over {@code client}, configured exactly as {@code BlockStoreShuffleReader.read()} does
     * (3.5.x to 4.2.x: same 18-parameter constructor, same keys).
     */
    static ShuffleBlockFetcherIterator newFetcherIterator(TaskContext context, BlockStoreClient client,
            scala.collection.Iterator<scala.Tuple2<org.apache.spark.storage.BlockManagerId,
                    scala.collection.Seq<scala.Tuple3<org.apache.spark.storage.BlockId, Object, Object>>>> blocks,
            ShuffleReadMetricsReporter readMetrics, ShuffleDependency<?, ?, ?> dep, boolean shouldBatchFetch) {
        SparkEnv env = SparkEnv.get();
        SparkConf conf = env.conf();
        package$ c = package$.MODULE$;
        return new ShuffleBlockFetcherIterator(
                context,
                client,
                env.blockManager(),
                env.mapOutputTracker(),
                blocks,
                (blockId, in) -> env.serializerManager().wrapStream(blockId, in),
                (Long) conf.get(c.REDUCER_MAX_SIZE_IN_FLIGHT()) * 1024 * 1024,
                (Integer) conf.get(c.REDUCER_MAX_REQS_IN_FLIGHT()),
                (Integer) conf.get(c.REDUCER_MAX_BLOCKS_IN_FLIGHT_PER_ADDRESS()),
                (Long) conf.get(c.MAX_REMOTE_BLOCK_SIZE_FETCH_TO_MEM()),
                (Integer) conf.get(c.SHUFFLE_MAX_ATTEMPTS_ON_NETTY_OOM()),
                (Boolean) conf.get(c.SHUFFLE_DETECT_CORRUPT()),
                (Boolean) conf.get(c.SHUFFLE_DETECT_CORRUPT_MEMORY()),
                (Boolean) conf.get(c.SHUFFLE_CHECKSUM_ENABLED()),
                (String) conf.get(c.SHUFFLE_CHECKSUM_ALGORITHM()),
                readMetrics,
                shouldBatchFetch && canFetchContinuousBlocksInBatch(conf, dep),
                new org.apache.spark.util.SystemClock());
    }

    /** The conditions of {@code BlockStoreShuffleReader.fetchContinuousBlocksInBatch} (3.5.x to 4.2.x). */
    private static boolean canFetchContinuousBlocksInBatch(SparkConf conf, ShuffleDependency<?, ?, ?> dep) {
        package$ c = package$.MODULE$;
        boolean compressed = (Boolean) conf.get(c.SHUFFLE_COMPRESS());
        boolean codecConcatenation = !compressed || CompressionCodec$.MODULE$
                .supportsConcatenationOfSerializedStreams(CompressionCodec.createCodec(conf));
        return dep.serializer().supportsRelocationOfSerializedObjects() && codecConcatenation
                && !(Boolean) conf.get(c.SHUFFLE_USE_OLD_FETCH_PROTOCOL())
                && !(Boolean) conf.get(c.IO_ENCRYPTION_ENABLED());
    }

    /** {@code new ExternalSorter(context, aggregator, None, Some(ordering), serializer[, Array.empty])}. */
    @SuppressWarnings("unchecked")
    static <K, V, C> ExternalSorter<K, V, C> newExternalSorter(TaskContext context, Option<Aggregator<K, V, C>> agg,
                                                               Ordering<K> ordering, Serializer serializer) {
        Class<?>[] types = EXTERNAL_SORTER.getParameterTypes();
        Object[] args = new Object[types.length];
        args[0] = context;
        args[1] = agg;
        args[2] = Option.empty();
        args[3] = Option.apply(ordering);
        args[4] = serializer;
        if (types.length == 6) {
            args[5] = Array.newInstance(types[5].getComponentType(), 0);
        }
        try {
            return (ExternalSorter<K, V, C>) EXTERNAL_SORTER.newInstance(args);
        } catch (InvocationTargetException e) {
            throw e.getCause() instanceof RuntimeException r ? r : new IllegalStateException(e.getCause());
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException("cannot construct " + EXTERNAL_SORTER, e);
        }
    }

    private static Constructor<?> externalSorterConstructor() {
        for (Constructor<?> ctor : ExternalSorter.class.getConstructors()) {
            Class<?>[] types = ctor.getParameterTypes();
            if ((types.length == 5 || types.length == 6 && types[5].isArray())
                    && types[0] == TaskContext.class && types[4] == Serializer.class) {
                return ctor;
            }
        }
        throw new IllegalStateException("this Spark's ExternalSorter has no constructor (TaskContext, Option, Option, "
                + "Option, Serializer[, Array]): spark-shuffle-rdma supports Spark 3.5 to 4.2");
    }
}
