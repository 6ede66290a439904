package io.rdmabridge.it.spark;

import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskFailedReason;
import org.apache.spark.executor.TaskMetrics;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerExecutorRemoved;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.apache.spark.sql.SparkSession;

/** Spark's own view of a session's shuffles (task metrics), and the RDMA shuffle manager's counters on the driver. */
final class ShuffleCounters extends SparkListener {
    final AtomicLong remoteBytesRead = new AtomicLong();
    /** Spark's shuffle fetch wait time summed over reduce tasks: how long tasks sat blocked waiting for blocks. */
    final AtomicLong fetchWaitMillis = new AtomicLong();
    final AtomicLong diskBytesSpilled = new AtomicLong();
    final AtomicInteger fetchFailures = new AtomicInteger();
    final AtomicInteger executorsRemoved = new AtomicInteger();

    static ShuffleCounters install(SparkSession spark) {
        ShuffleCounters counters = new ShuffleCounters();
        spark.sparkContext().addSparkListener(counters);
        return counters;
    }

    @Override
    public void onTaskEnd(SparkListenerTaskEnd end) {
        TaskMetrics m = end.taskMetrics();
        if (m != null) {
            remoteBytesRead.addAndGet(m.shuffleReadMetrics().remoteBytesRead());
            fetchWaitMillis.addAndGet(m.shuffleReadMetrics().fetchWaitTime());
            diskBytesSpilled.addAndGet(m.diskBytesSpilled());
        }
        if (end.reason() instanceof TaskFailedReason r && r.toErrorString().startsWith("FetchFailed")) {
            fetchFailures.incrementAndGet();
        }
    }

    @Override
    public void onExecutorRemoved(SparkListenerExecutorRemoved removed) {
        executorsRemoved.incrementAndGet();
    }

    /** Waits until every event posted so far has reached this listener. */
    static void drain(SparkSession spark) {
        try {
            spark.sparkContext().listenerBus().waitUntilEmpty();
        } catch (java.util.concurrent.TimeoutException e) {
            throw new IllegalStateException("listener bus did not drain", e);
        }
    }

    /** The sum over executors of one counter the RDMA shuffle manager's executors reported to the driver. */
    static long rdmaCounter(String name) {
        long total = 0;
        for (String snapshot : rdmaMetrics().values()) {
            for (String pair : snapshot.split(" ")) {
                if (pair.startsWith(name + "=")) {
                    total += Long.parseLong(pair.substring(name.length() + 1));
                }
            }
        }
        return total;
    }

    static Map<String, String> rdmaMetrics() {
        return manager().executorMetrics();
    }

    static io.rdmabridge.spark.RdmaShuffleManager manager() {
        return (io.rdmabridge.spark.RdmaShuffleManager) SparkEnv.get().shuffleManager();
    }
}
