package io.rdmabridge.benchmarks.perf;

import java.lang.management.ManagementFactory;
import java.lang.management.OperatingSystemMXBean;
import java.lang.management.ThreadInfo;
import java.lang.management.ThreadMXBean;

/** CPU time of this process, for CPU-per-GB figures. Thread-safe. */
public final class CpuClock {
    /**
     * Name of the soft provider's engine thread: the work a NIC does in hardware (moving bytes between the queue pairs,
     * generating completions), which the soft provider does on the host's CPU.
     */
    public static final String SOFT_ENGINE_THREAD = "soft-rdma-engine";

    private static final com.sun.management.OperatingSystemMXBean OS = osBean();

    private CpuClock() {
    }

    private static com.sun.management.OperatingSystemMXBean osBean() {
        OperatingSystemMXBean bean = ManagementFactory.getOperatingSystemMXBean();
        return bean instanceof com.sun.management.OperatingSystemMXBean
                ? (com.sun.management.OperatingSystemMXBean) bean : null;
    }

    /** Process CPU nanoseconds (all threads, user + system), or -1 where the JVM cannot tell. */
    public static long processNanos() {
        return OS == null ? -1 : OS.getProcessCpuTime();
    }

    /**
     * CPU nanoseconds of this process's live threads named {@code name} (user + system), 0 where there is none, -1
     * where the JVM does not measure thread CPU time. A thread that has ended no longer counts: take both readings
     * while it lives.
     */
    public static long threadNanos(String name) {
        ThreadMXBean threads = ManagementFactory.getThreadMXBean();
        if (!threads.isThreadCpuTimeSupported() || !threads.isThreadCpuTimeEnabled()) {
            return -1;
        }
        long sum = 0;
        for (ThreadInfo t : threads.getThreadInfo(threads.getAllThreadIds(), 0)) {
            if (t != null && t.getThreadName().equals(name)) {
                long n = threads.getThreadCpuTime(t.getThreadId());
                if (n > 0) {
                    sum += n;
                }
            }
        }
        return sum;
    }
}
