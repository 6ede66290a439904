package io.rdmabridge.spark;

import java.io.InputStream;
import org.apache.spark.Aggregator;
import org.apache.spark.InterruptibleIterator;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.TaskContext;
import org.apache.spark.network.shuffle.BlockStoreClient;
import org.apache.spark.serializer.SerializerInstance;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.shuffle.ShuffleReader;
import org.apache.spark.storage.BlockId;
import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.storage.ShuffleBlockFetcherIterator;
import org.apache.spark.util.collection.ExternalSorter;
import scala.Option;
import scala.Product2;
import scala.Tuple2;
import scala.Tuple3;
import scala.collection.Iterator;
import scala.collection.Seq;

/**
 * Spark's reduce-side read, step for step as {@code BlockStoreShuffleReader.read()}, with one difference: its
 * {@link ShuffleBlockFetcherIterator} fetches remote blocks through the given {@link BlockStoreClient} (the RDMA
 * block client). Bytes and requests in flight, fetch failures as {@code FetchFailedException}, corruption detection,
 * local and host-local reads all stay Spark's. One instance per reduce task, used by that task's thread only.
 */
final class RdmaShuffleReader<K, C> implements ShuffleReader<K, C> {
    private final BaseShuffleHandle<K, ?, C> handle;
    private final Iterator<Tuple2<BlockManagerId, Seq<Tuple3<BlockId, Object, Object>>>> blocks;
    private final TaskContext context;
    private final ShuffleReadMetricsReporter readMetrics;
    private final BlockStoreClient client;
    private final boolean shouldBatchFetch;

    RdmaShuffleReader(BaseShuffleHandle<K, ?, C> handle,
                      Iterator<Tuple2<BlockManagerId, Seq<Tuple3<BlockId, Object, Object>>>> blocks,
                      TaskContext context, ShuffleReadMetricsReporter readMetrics, BlockStoreClient client,
                      boolean shouldBatchFetch) {
        this.handle = handle;
        this.blocks = blocks;
        this.context = context;
        this.readMetrics = readMetrics;
        this.client = client;
        this.shouldBatchFetch = shouldBatchFetch;
    }

    @Override
    @SuppressWarnings({"unchecked", "rawtypes"})
    public Iterator<Product2<K, C>> read() {
        ShuffleDependency<K, ?, C> dep = handle.dependency();
        ShuffleBlockFetcherIterator fetcher = SparkCompat.newFetcherIterator(context, client, blocks, readMetrics,
                dep, shouldBatchFetch);
        Iterator<Tuple2<BlockId, InputStream>> streams = fetcher.toCompletionIterator();
        SerializerInstance serializer = dep.serializer().newInstance();
        Iterator<Tuple2<Object, Object>> records = streams.flatMap(
                s -> serializer.deserializeStream(s._2()).asKeyValueIterator());
        Iterator<Tuple2<Object, Object>> counted = new CompletionIterator<>(records.map(r -> {
            readMetrics.incRecordsRead(1);
            return r;
        }), () -> context.taskMetrics().mergeShuffleReadMetrics());
        InterruptibleIterator<Tuple2<Object, Object>> interruptible = new InterruptibleIterator<>(context, counted);

        Iterator<Product2<K, C>> result;
        Option<Aggregator<K, ?, C>> aggregator = (Option) dep.aggregator();
        if (dep.keyOrdering().isDefined()) {
            Option agg;
            if (aggregator.isDefined() && dep.mapSideCombine()) {
                Aggregator<K, ?, C> a = aggregator.get();
                // Map outputs are already combined: merge combiners with combiners.
                agg = Option.apply(new Aggregator<K, C, C>(c -> c, a.mergeCombiners(), a.mergeCombiners()));
            } else {
                agg = aggregator;
            }
            ExternalSorter sorter = SparkCompat.newExternalSorter(context, agg, dep.keyOrdering().get(),
                    dep.serializer());
            result = sorter.insertAllAndUpdateMetrics((Iterator) interruptible);
        } else if (aggregator.isDefined()) {
            Aggregator a = aggregator.get();
            result = dep.mapSideCombine() ? a.combineCombinersByKey((Iterator) interruptible, context)
                    : a.combineValuesByKey((Iterator) interruptible, context);
        } else {
            result = (Iterator) interruptible;
        }
        // The aggregator or sorter may have drained the first interruptible iterator: wrap again for cancellation.
        return result instanceof InterruptibleIterator ? result : new InterruptibleIterator<>(context, result);
    }

    /** Runs {@code completion} once, when the iterator is exhausted (Spark's CompletionIterator, in Java). */
    private static final class CompletionIterator<A> extends scala.collection.AbstractIterator<A> {
        private final Iterator<A> delegate;
        private Runnable completion;

        CompletionIterator(Iterator<A> delegate, Runnable completion) {
            this.delegate = delegate;
            this.completion = completion;
        }

        @Override
        public boolean hasNext() {
            boolean more = delegate.hasNext();
            if (!more && completion != null) {
                Runnable r = completion;
                completion = null;
                r.run();
            }
            return more;
        }

        @Override
        public A next() {
            return delegate.next();
        }
    }
}
