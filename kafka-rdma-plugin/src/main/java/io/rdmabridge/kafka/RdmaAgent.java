package io.rdmabridge.kafka;

import io.rdmabridge.internal.LinuxEpoll;
import java.lang.instrument.Instrumentation;
import java.nio.channels.spi.SelectorProvider;
import java.util.Map;
import java.util.Set;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The java agent of the plugin jar ({@code -javaagent:kafka-rdma-plugin.jar} in {@code KAFKA_OPTS}). Before Kafka's
 * main method runs, it opens the JDK's {@code sun.nio.ch} package to this jar (whose channel takes part in the JDK's
 * selector) and makes {@link RdmaSelectorProvider} the JVM's NIO provider. It never stops the JVM from starting: a
 * failure leaves the JDK's provider in place, and the plugin's status line names the cause.
 */
public final class RdmaAgent {
    static final String PROVIDER_PROPERTY = "java.nio.channels.spi.SelectorProvider";

    private RdmaAgent() {
    }

    /** Entry point of {@code -javaagent}. */
    public static void premain(String args, Instrumentation inst) {
        install(inst);
    }

    /** Entry point of a late attach; works only if nothing has used NIO yet, which is rarely true in a broker. */
    public static void agentmain(String args, Instrumentation inst) {
        install(inst);
    }

    private static void install(Instrumentation inst) {
        Logger log = LoggerFactory.getLogger(RdmaAgent.class);
        try {
            // The plugin's selector channels use sun.nio.ch, and so does LinuxEpoll, the transport's, for DiSNI's
            // completion channels. LinuxEpoll shares the agent's module where both are on the class path, as in the
            // plugin's jar; it may not where a class loader of its own loads the transport.
            Module self = RdmaAgent.class.getModule();
            Module epollModule = LinuxEpoll.class.getModule();
            Set<Module> users = self == epollModule ? Set.of(self) : Set.of(self, epollModule);
            inst.redefineModule(Object.class.getModule(), Set.of(), Map.of("sun.nio.ch", users),
                    Map.of("sun.nio.ch", users), Set.of(), Map.of());
            String existing = System.getProperty(PROVIDER_PROPERTY);
            if (existing != null && !existing.equals(RdmaSelectorProvider.class.getName())) {
                fail(log, PROVIDER_PROPERTY + " is already set to " + existing + "; remove it, the agent sets it");
                return;
            }
            Throwable selector = SelectorWakeups.unavailabilityCause();
            if (selector != null) {
                fail(log, selector.getMessage());
                return;
            }
            System.setProperty(PROVIDER_PROPERTY, RdmaSelectorProvider.class.getName());
            SelectorProvider provider = SelectorProvider.provider();
            if (!(provider instanceof RdmaSelectorProvider)) {
                fail(log, "the JVM chose its NIO provider (" + provider.getClass().getName() + ") before the agent "
                        + "ran; put -javaagent first among the JVM options");
                return;
            }
            RdmaReplication.get().agentInstalled();
            log.info("RDMA replication agent installed its NIO provider; waiting for "
                    + RdmaReplicationPlugin.class.getName() + " in metric.reporters");
        } catch (Throwable t) {
            fail(log, t.toString());
        }
    }

    private static void fail(Logger log, String why) {
        RdmaReplication.get().agentFailed(why);
        log.warn("RDMA replication agent not installed, every connection stays on the JDK's TCP: {}", why);
    }
}
