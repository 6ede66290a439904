package io.rdmabridge.it.kafka;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.stream.Collectors;
import javax.management.InstanceNotFoundException;
import javax.management.JMException;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;

/**
 * A KRaft cluster of child JVMs started from the Maven Central jars on this test's class path: one controller (node 0)
 * and brokers 1..n, each with a client listener (CLIENT, on 127.0.0.1) and an inter-broker listener (REPLICATION, on
 * {@code rdmabridge.test.address}: 127.0.0.1 by default, an RDMA interface's address on a real device, since the
 * plugin listens for RDMA where that listener is, on its port + 1000). Brokers chosen as RDMA brokers get the plugin
 * jar's agent and {@code rdma.replication.enable=true}; every broker has the plugin jar on its class path and in
 * {@code metric.reporters}, and {@code rdmabridge.test.childJvmOptions} (the disni profile's library path and module
 * export) among its JVM options. Time limits grow with {@code rdmabridge.test.slowdown}.
 *
 * <p>One harness for every Kafka line the plugin serves (3.9 and 4.x): the brokers run the Kafka of this module's
 * class path ({@link #KAFKA_VERSION}), and {@link #start} checks over JMX that each one does. Nothing here differs
 * between the lines: both format storage with {@code kafka.tools.StorageTool}, start with {@code kafka.Kafka}, accept
 * a static quorum in {@code controller.quorum.voters}, and log through SLF4J, which on both finds slf4j-simple: the
 * poms of neither line bring an SLF4J binding (a distribution adds its backend in libs/: reload4j in 3.9, log4j2 in
 * 4.x), so a broker's log is its standard error and output on both lines.
 */
final class KafkaCluster implements AutoCloseable {
    private static final int LOWEST_PORT = 10_000;
    private static final Set<Integer> HANDED_OUT = ConcurrentHashMap.newKeySet();
    /** The lowest port of the kernel's ephemeral range, read once. */
    private static final int EPHEMERAL_LOW = ephemeralLow();

    static final String PLUGIN = "io.rdmabridge.kafka.RdmaReplicationPlugin";
    static final String JMX_REPORTER = "org.apache.kafka.common.metrics.JmxReporter";
    /** Where the inter-broker (replication) listeners are. */
    static final String REPLICATION_HOST = System.getProperty("rdmabridge.test.address", "127.0.0.1");
    /** The plugin's default {@code rdma.port.offset}: a broker's RDMA port is its replication port + this. */
    static final int RDMA_PORT_OFFSET = 1000;
    /** The version of the Kafka jars on this test's class path, which its brokers run. */
    static final String KAFKA_VERSION = kafkaVersion();

    /** One node's ports, directory and process. */
    static final class Node {
        final int id;
        final boolean controller;
        final Path dir;
        final int clientPort;
        final int replicationPort;
        final int jmxPort;
        final Map<String, String> extra = new LinkedHashMap<>();
        boolean agent;
        Process process;

        Node(int id, boolean controller, Path dir, int clientPort, int replicationPort, int jmxPort) {
            this.id = id;
            this.controller = controller;
            this.dir = dir;
            this.clientPort = clientPort;
            this.replicationPort = replicationPort;
            this.jmxPort = jmxPort;
        }

        Path log() {
            return dir.resolve("broker.log");
        }
    }

    private final Path root;
    private final Path pluginJar;
    private final String classPath;
    private final String clusterId = UUID.randomUUID().toString().replace("-", "").substring(0, 22);
    private final Node controller;
    private final Map<Integer, Node> brokers = new LinkedHashMap<>();

    KafkaCluster(Path root, int brokerCount) throws IOException {
        this.root = root;
        String jar = System.getProperty("kafka.plugin.jar");
        if (jar == null || !Files.isRegularFile(Path.of(jar))) {
            throw new IllegalStateException("kafka.plugin.jar: " + jar + " (expected: the shaded plugin jar; build it "
                    + "with mvn -o -q -pl kafka-rdma-plugin -am package -DskipTests, or run mvn verify)");
        }
        String wanted = System.getProperty("it.kafka.version");
        if (wanted != null && !wanted.equals(KAFKA_VERSION)) {
            throw new IllegalStateException("Kafka " + KAFKA_VERSION + " is on the test class path, but the module "
                    + "asks for it.kafka.version=" + wanted + ": a dependency brought another kafka-clients; pin it in "
                    + "the module's pom");
        }
        pluginJar = Path.of(jar).toAbsolutePath();
        classPath = brokerClassPath(pluginJar);
        controller = new Node(0, true, root.resolve("controller"), freePort(), 0, freePort());
        for (int id = 1; id <= brokerCount; id++) {
            brokers.put(id, new Node(id, false, root.resolve("broker-" + id), freePort(), freeReplicationPort(),
                    freePort()));
        }
    }

    /** The version in kafka-clients' {@code kafka/kafka-version.properties} (AppInfoParser's package differs by line). */
    private static String kafkaVersion() {
        try (var in = KafkaCluster.class.getResourceAsStream("/kafka/kafka-version.properties")) {
            if (in == null) {
                throw new IllegalStateException("kafka/kafka-version.properties not found: kafka-clients is not on the "
                        + "test class path; add it to the module's test dependencies");
            }
            Properties p = new Properties();
            p.load(in);
            return p.getProperty("version");
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Kafka's jars and the plugin jar, as in a broker's libs/: none of the test's own modules or JUnit. */
    private static String brokerClassPath(Path pluginJar) {
        List<String> keep = new ArrayList<>();
        for (String entry : System.getProperty("java.class.path").split(File.pathSeparator)) {
            String e = entry.replace('\\', '/');
            if (e.contains("/kafka-rdma-plugin/") || e.contains("/netty-rdma-transport/")
                    || e.contains("/integration-tests/") || e.contains("/io/netty/") || e.contains("/com/ibm/disni/")
                    || e.contains("junit") || e.contains("opentest4j") || e.contains("apiguardian")
                    || e.contains("surefire") || e.contains("log4j-slf4j")) {
                continue;
            }
            keep.add(entry);
        }
        keep.add(pluginJar.toString());
        return String.join(File.pathSeparator, keep);
    }

    Node broker(int id) {
        return brokers.get(id);
    }

    Iterable<Node> brokers() {
        return brokers.values();
    }

    /** Makes {@code id} an RDMA broker: the agent in its JVM options and the flag in its properties. */
    KafkaCluster rdma(int id, Map<String, String> props) {
        Node n = brokers.get(id);
        n.agent = true;
        n.extra.put("rdma.replication.enable", "true");
        n.extra.putAll(props);
        return this;
    }

    String bootstrap() {
        return brokers.values().stream().map(n -> "127.0.0.1:" + n.clientPort).collect(Collectors.joining(","));
    }

    Admin admin() {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap());
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        return Admin.create(p);
    }

    private Properties properties(Node n) {
        Properties p = new Properties();
        p.put("node.id", Integer.toString(n.id));
        p.put("log.dirs", n.dir.resolve("data").toString());
        p.put("controller.quorum.voters", "0@127.0.0.1:" + controller.clientPort);
        p.put("controller.listener.names", "CONTROLLER");
        p.put("num.network.threads", "1");
        p.put("num.io.threads", "2");
        p.put("num.recovery.threads.per.data.dir", "1");
        p.put("background.threads", "2");
        p.put("log.cleaner.enable", "false");
        if (n.controller) {
            p.put("process.roles", "controller");
            p.put("listeners", "CONTROLLER://127.0.0.1:" + n.clientPort);
            p.put("listener.security.protocol.map", "CONTROLLER:PLAINTEXT");
        } else {
            p.put("process.roles", "broker");
            String listeners = "CLIENT://127.0.0.1:" + n.clientPort + ",REPLICATION://" + REPLICATION_HOST + ":"
                    + n.replicationPort;
            p.put("listeners", listeners);
            p.put("advertised.listeners", listeners);
            p.put("listener.security.protocol.map", "CONTROLLER:PLAINTEXT,CLIENT:PLAINTEXT,REPLICATION:PLAINTEXT");
            p.put("inter.broker.listener.name", "REPLICATION");
            // Internal topics as replicated as the cluster allows (three brokers in most tests, two in the device one).
            String replicas = Integer.toString(Math.min(3, brokers.size()));
            p.put("offsets.topic.replication.factor", replicas);
            p.put("offsets.topic.num.partitions", "3");
            p.put("transaction.state.log.replication.factor", replicas);
            p.put("transaction.state.log.min.isr", Integer.toString(Math.min(2, brokers.size())));
            p.put("group.initial.rebalance.delay.ms", "0");
            // As docs/kafka.md says: Kafka 4.x drops its JmxReporter once metric.reporters is set, so it is listed.
            p.put("metric.reporters", JMX_REPORTER + "," + PLUGIN);
            p.putAll(n.extra);
        }
        return p;
    }

    private Path writeProperties(Node n) throws IOException {
        Files.createDirectories(n.dir);
        Path file = n.dir.resolve("server.properties");
        StringBuilder sb = new StringBuilder();
        properties(n).forEach((k, v) -> sb.append(k).append('=').append(v).append('\n'));
        Files.writeString(file, sb.toString());
        return file;
    }

    private List<String> java(Node n, String mainClass, String... args) {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        if (n.agent && !mainClass.contains("StorageTool")) {
            cmd.add("-javaagent:" + pluginJar);
        }
        cmd.add("-Xmx384m");
        cmd.add("-Xms64m");
        cmd.add("-XX:+UseSerialGC");
        cmd.add("-XX:TieredStopAtLevel=1");
        cmd.add("-Xss512k");
        cmd.add("-Dorg.slf4j.simpleLogger.showDateTime=true");
        cmd.add("-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS");
        cmd.add("-Dorg.slf4j.simpleLogger.log.org.apache.kafka=warn");
        cmd.add("-Dorg.slf4j.simpleLogger.log.kafka=warn");
        cmd.add("-Dorg.slf4j.simpleLogger.log.state.change.logger=warn");
        if (!mainClass.contains("StorageTool")) {
            for (String option : System.getProperty("rdmabridge.test.childJvmOptions", "").trim().split("\\s+")) {
                if (!option.isEmpty()) {
                    cmd.add(option);
                }
            }
            cmd.add("-Dcom.sun.management.jmxremote.port=" + n.jmxPort);
            cmd.add("-Dcom.sun.management.jmxremote.rmi.port=" + n.jmxPort);
            cmd.add("-Dcom.sun.management.jmxremote.host=127.0.0.1");
            cmd.add("-Djava.rmi.server.hostname=127.0.0.1");
            cmd.add("-Dcom.sun.management.jmxremote.authenticate=false");
            cmd.add("-Dcom.sun.management.jmxremote.ssl=false");
        }
        cmd.add("-cp");
        cmd.add(classPath);
        cmd.add(mainClass);
        cmd.addAll(List.of(args));
        return cmd;
    }

    /** Formats every node's storage (in parallel), then starts the controller and the brokers. */
    void start() throws Exception {
        List<Process> formats = new ArrayList<>();
        List<Node> all = new ArrayList<>(brokers.values());
        all.add(0, controller);
        for (Node n : all) {
            Path props = writeProperties(n);
            formats.add(new ProcessBuilder(java(n, "kafka.tools.StorageTool", "format", "-t", clusterId, "-c",
                    props.toString())).redirectErrorStream(true).redirectOutput(n.dir.resolve("format.log").toFile())
                    .start());
        }
        for (int i = 0; i < formats.size(); i++) {
            Process p = formats.get(i);
            if (!p.waitFor(120, TimeUnit.SECONDS) || p.exitValue() != 0) {
                throw new IllegalStateException("StorageTool format of node " + all.get(i).id + " failed: "
                        + Files.readString(all.get(i).dir.resolve("format.log")));
            }
        }
        launch(controller);
        for (Node n : brokers.values()) {
            launch(n);
        }
        try {
            awaitBrokers(brokers.size());
        } catch (AssertionError e) {
            // The nodes' directories die with the test's temporary folder: keep what they said in the failure.
            StringBuilder logs = new StringBuilder(e.getMessage());
            for (Node n : all) {
                String log = log(n.id);
                logs.append("\n--- node ").append(n.id).append(" (alive: ").append(n.process.isAlive())
                        .append("), last lines of ").append(n.log()).append(":\n")
                        .append(log.length() > 3000 ? log.substring(log.length() - 3000) : log);
            }
            throw new AssertionError(logs.toString(), e);
        }
        for (Node n : brokers.values()) {
            // A broker registers its app-info bean at the end of its start-up, which may follow its registration.
            String[] running = new String[1];
            await(scaled(Duration.ofSeconds(60)), "broker " + n.id + "'s kafka.server:type=app-info bean", () -> {
                running[0] = brokerVersion(n.id);
                return running[0] != null;
            });
            if (!KAFKA_VERSION.equals(running[0])) {
                throw new AssertionError("broker " + n.id + " runs Kafka " + running[0] + ", expected "
                        + KAFKA_VERSION + " (the class path's)");
            }
        }
        System.out.println("Kafka " + KAFKA_VERSION + " cluster up: controller 0, brokers " + brokers.keySet());
    }

    private void launch(Node n) throws IOException {
        Path props = writeProperties(n);
        n.process = new ProcessBuilder(java(n, "kafka.Kafka", props.toString())).redirectErrorStream(true)
                .redirectOutput(ProcessBuilder.Redirect.appendTo(n.log().toFile())).start();
    }

    void awaitBrokers(int count) throws Exception {
        try (Admin admin = admin()) {
            await(scaled(Duration.ofSeconds(120)), "brokers registered: " + count, () -> {
                try {
                    return admin.describeCluster().nodes().get(10, TimeUnit.SECONDS).size() == count;
                } catch (Exception e) {
                    return false;
                }
            });
        }
    }

    /** kill -9. */
    void kill(int id) throws InterruptedException {
        Node n = brokers.get(id);
        n.process.destroyForcibly();
        n.process.waitFor(30, TimeUnit.SECONDS);
    }

    void restart(int id) throws IOException {
        launch(brokers.get(id));
    }

    String log(int id) throws IOException {
        Node n = id == 0 ? controller : brokers.get(id);
        return Files.exists(n.log()) ? Files.readString(n.log(), StandardCharsets.UTF_8) : "";
    }

    /**
     * The Kafka version broker {@code id} reports in its {@code kafka.server:type=app-info,id=<id>} bean, or null while
     * that bean (or the broker's JMX port) is not there yet.
     */
    private String brokerVersion(int id) {
        try (JMXConnector c = jmx(id)) {
            return (String) c.getMBeanServerConnection().getAttribute(
                    new ObjectName("kafka.server:type=app-info,id=" + id), "Version");
        } catch (InstanceNotFoundException | IOException e) {
            return null;
        } catch (JMException e) {
            throw new IllegalStateException("broker " + id + "'s app-info bean has no Version attribute", e);
        }
    }

    private JMXConnector jmx(int id) throws IOException {
        return JMXConnectorFactory.connect(new JMXServiceURL("service:jmx:rmi:///jndi/rmi://127.0.0.1:"
                + brokers.get(id).jmxPort + "/jmxrmi"));
    }

    /** Every attribute of {@code kafka.server:type=rdma-replication,*} in broker {@code id}'s JVM, by bean. */
    Map<String, Map<String, Double>> rdmaMetrics(int id) throws Exception {
        Map<String, Map<String, Double>> out = new LinkedHashMap<>();
        try (JMXConnector c = jmx(id)) {
            MBeanServerConnection mbs = c.getMBeanServerConnection();
            for (ObjectName name : mbs.queryNames(new ObjectName("kafka.server:type=rdma-replication,*"), null)) {
                Map<String, Double> attrs = new LinkedHashMap<>();
                // Replication goes on while the attributes are read one by one. The broker adds a chunk's bytes
                // before its copied bytes, so the copy counters are read first: a chunk counted in one is then
                // always counted in the bytes read after it, and copies per byte are never overstated.
                List<String> names = new ArrayList<>();
                for (var info : mbs.getMBeanInfo(name).getAttributes()) {
                    names.add(info.getName());
                }
                names.sort(Comparator.comparing(n -> !n.contains("copied")));
                for (String attribute : names) {
                    Object v = mbs.getAttribute(name, attribute);
                    if (v instanceof Number) {
                        attrs.put(attribute, ((Number) v).doubleValue());
                    }
                }
                String peer = name.getKeyProperty("peer");
                out.put(peer == null ? "all" : peer, attrs);
            }
        }
        return out;
    }

    /** {@code onTheHost} times {@code rdmabridge.test.slowdown} (10 in the rxe guest, whose Java is that much slower). */
    static Duration scaled(Duration onTheHost) {
        return onTheHost.multipliedBy(Long.getLong("rdmabridge.test.slowdown", 1));
    }

    static void await(Duration timeout, String what, BooleanSupplier condition) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("timed out after " + timeout.toSeconds() + " s waiting for " + what);
            }
            Thread.sleep(250);
        }
    }

    /**
     * A port a broker binds later. Taken below the kernel's ephemeral range ({@code ip_local_port_range}): a port from
     * {@code new ServerSocket(0)} is ephemeral, and an outgoing connection of this cluster or of another test could
     * take it before the broker binds it ("Address already in use", seen in CI). Never the same port twice per JVM,
     * nor a port already reserved as some broker's RDMA port (see {@link #freeReplicationPort}).
     */
    private static int freePort() throws IOException {
        int high = EPHEMERAL_LOW - RDMA_PORT_OFFSET;
        // A kernel whose ephemeral range leaves no room below it: take the kernel's ports after all.
        boolean kernelPicks = high <= LOWEST_PORT + 1000;
        for (int attempt = 0; attempt < 1000; attempt++) {
            int port;
            if (kernelPicks) {
                try (ServerSocket s = new ServerSocket(0)) {
                    port = s.getLocalPort();
                }
            } else {
                port = ThreadLocalRandom.current().nextInt(LOWEST_PORT, high);
            }
            if (isFree(port) && HANDED_OUT.add(port)) {
                return port;
            }
        }
        throw new IOException("no free port " + (kernelPicks ? "from the kernel" : "in " + LOWEST_PORT + ".." + high)
                + " after 1000 attempts (ports handed out in this JVM: " + HANDED_OUT.size() + ")");
    }

    private static int ephemeralLow() {
        // Files.readString would trust the size /proc reports (0) and return one byte ("3" of "32768 60999").
        try (BufferedReader r = Files.newBufferedReader(Path.of("/proc/sys/net/ipv4/ip_local_port_range"))) {
            return Integer.parseInt(r.readLine().trim().split("\\s+")[0]);
        } catch (IOException | RuntimeException e) {
            return 32768; // Linux's default
        }
    }

    /**
     * A free port for an inter-broker listener whose RDMA port (this port + {@link #RDMA_PORT_OFFSET}, the plugin's
     * default) is free as well and reserved with it, so that no other node's port is handed out on a broker's RDMA
     * port (a broker whose listener port was another's RDMA port failed to bind it, seen in CI).
     */
    private static int freeReplicationPort() throws IOException {
        for (int attempt = 0; attempt < 100; attempt++) {
            int port = freePort();
            int rdma = port + RDMA_PORT_OFFSET;
            if (rdma <= 65535 && isFree(rdma) && HANDED_OUT.add(rdma)) {
                return port;
            }
        }
        throw new IOException("no free port p with p + " + RDMA_PORT_OFFSET + " free in 100 attempts");
    }

    private static boolean isFree(int port) {
        try (ServerSocket s = new ServerSocket(port)) {
            return true;
        } catch (IOException e) {
            return false;
        }
    }

    @Override
    public void close() throws Exception {
        List<Node> all = new ArrayList<>(brokers.values());
        all.add(controller);
        // No graceful shutdown: the data is thrown away, and a controlled shutdown costs seconds per broker.
        for (Node n : all) {
            if (n.process != null) {
                n.process.destroyForcibly();
            }
        }
        for (Node n : all) {
            if (n.process != null) {
                n.process.waitFor(30, TimeUnit.SECONDS);
            }
        }
    }
}
