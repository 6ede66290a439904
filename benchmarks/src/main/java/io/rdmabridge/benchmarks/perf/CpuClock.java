package io.rdmabridge.benchmarks.perf;

import java.lang.management.ManagementFactory;
import java.lang.management.OperatingSystemMXBean;

/** CPU time of this process, for CPU-per-GB figures. Thread-safe. */
public final class CpuClock {
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
}
