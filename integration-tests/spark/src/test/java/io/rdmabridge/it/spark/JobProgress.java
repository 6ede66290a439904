package io.rdmabridge.it.spark;

import java.io.PrintStream;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerJobStart;
import org.apache.spark.scheduler.SparkListenerStageCompleted;
import org.apache.spark.scheduler.SparkListenerStageSubmitted;
import org.apache.spark.scheduler.SparkListenerTaskEnd;

/**
 * One progress line for the demo ({@code [2/4] job over RDMA: stage 2/3, tasks 5/8, 14 s}): rewritten in place about
 * once a second on a terminal, otherwise printed once per stage. Listener callbacks run on Spark's listener thread;
 * the ticker thread only reads the volatile fields.
 */
final class JobProgress extends SparkListener implements AutoCloseable {
    private final PrintStream out;
    private final boolean terminal;
    private final long startNanos = System.nanoTime();
    private final Thread ticker;
    private volatile String label;
    private volatile int stagesTotal;
    private volatile int stagesDone;
    private volatile int tasksTotal;
    private volatile int tasksDone;
    private volatile boolean closed;

    JobProgress(String label, PrintStream out) {
        this.label = label;
        this.out = out;
        terminal = System.console() != null;
        print();
        ticker = new Thread(() -> {
            while (!closed) {
                try {
                    Thread.sleep(1000);
                } catch (InterruptedException e) {
                    return;
                }
                if (terminal && !closed) {
                    print();
                }
            }
        }, "demo-progress");
        ticker.setDaemon(true);
        ticker.start();
    }

    /** Changes what the line says is happening ({@code [2/4] job over RDMA: warm-up}); stages count from here. */
    void label(String newLabel) {
        label = newLabel;
        stagesTotal = 0;
        stagesDone = 0;
        tasksTotal = 0;
        tasksDone = 0;
        print();
    }

    @Override
    public void onJobStart(SparkListenerJobStart start) {
        stagesTotal += start.stageInfos().size();
    }

    @Override
    public void onStageSubmitted(SparkListenerStageSubmitted submitted) {
        tasksTotal = submitted.stageInfo().numTasks();
        tasksDone = 0;
        if (!terminal) {
            print();
        }
    }

    @Override
    public void onTaskEnd(SparkListenerTaskEnd end) {
        tasksDone++;
    }

    @Override
    public void onStageCompleted(SparkListenerStageCompleted completed) {
        stagesDone++;
    }

    private synchronized void print() {
        long seconds = (System.nanoTime() - startNanos) / 1_000_000_000L;
        String line = label + (stagesTotal == 0 ? "" : ": stage " + Math.min(stagesDone + 1, stagesTotal) + "/"
                + stagesTotal + ", tasks " + tasksDone + "/" + tasksTotal) + ", " + seconds + " s";
        if (terminal) {
            out.print("\r" + String.format("%-78s", line));
        } else {
            out.println(line);
        }
        out.flush();
    }

    @Override
    public void close() {
        closed = true;
        ticker.interrupt();
        if (terminal) {
            print();
            out.println();
        }
    }
}
