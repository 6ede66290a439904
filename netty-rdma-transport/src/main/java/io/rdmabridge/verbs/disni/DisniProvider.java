package io.rdmabridge.verbs.disni;

import com.ibm.disni.util.MemoryUtils;
import com.ibm.disni.verbs.IbvContext;
import com.ibm.disni.verbs.RdmaCm;
import com.ibm.disni.verbs.impl.NatIbvContext;
import com.ibm.disni.verbs.impl.NativeDispatcher;
import com.ibm.disni.verbs.impl.RdmaProviderNat;
import io.rdmabridge.verbs.DirectMemory;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaEventChannel;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import io.rdmabridge.verbs.ResourceUsage;
import java.io.File;
import java.io.IOException;
import java.lang.reflect.Field;
import java.net.Inet4Address;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.NetworkInterface;
import java.net.SocketException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The real-hardware provider: the verbs SPI over DiSNI 2.1's low-level verbs ({@code com.ibm.disni.verbs}), which
 * call libibverbs and librdmacm through DiSNI's JNI library {@code libdisni}. DiSNI's blocking endpoint API is never
 * used: every connection-manager operation is non-blocking and reports through {@link RdmaEventChannel#poll}.
 *
 * <h2>Availability</h2>
 * Nothing DiSNI loads natively is touched by this class's construction or static initialization. The probe, run on
 * the first {@link #isAvailable()} or {@link #unavailabilityCause()}, checks in this order and names every failed
 * prerequisite with its fix: {@code libdisni} on {@code java.library.path}; {@code sun.nio.ch} exported to DiSNI
 * ({@code --add-exports java.base/sun.nio.ch=ALL-UNNAMED} at least, which DiSNI needs for {@code
 * sun.nio.ch.DirectBuffer} on JDK 17); an RDMA device listed by the kernel and {@code /dev/infiniband/rdma_cm}. Then it
 * loads libdisni, opens an event channel and a connection-manager id, and binds an id to each local IPv4 address to
 * find the devices rdma_cm can reach.
 *
 * <h2>What DiSNI 2.1 cannot do (and this provider therefore does not)</h2>
 * <ul>
 *   <li>Private data is sent with {@code connect} only: DiSNI acknowledges every CM event natively without copying
 *       its private data or status, so {@link io.rdmabridge.verbs.CmEvent#privateData()} is always empty,
 *       {@link io.rdmabridge.verbs.RdmaCmId#peerParameters()} is {@code null}, and {@code accept} with private data
 *       is refused ({@link #deliversPrivateData()} is false).</li>
 *   <li>No {@code rdma_reject}: {@code reject} destroys the id, which makes the kernel send a consumer-defined
 *       reject without private data; the peer sees {@code REJECTED}.</li>
 *   <li>No {@code ibv_query_device} / {@code ibv_query_port}: {@link io.rdmabridge.verbs.DeviceAttributes} are
 *       conservative documented defaults (see {@link DisniDevice}); names and ports come from sysfs.</li>
 *   <li>Queue pairs always get 4 scatter/gather entries; {@code responder_resources} and {@code initiator_depth}
 *       are the device's maximum; one memory region holds at most 2^31-1 bytes; IPv4 only; no SRQ.</li>
 * </ul>
 *
 * <h2>Completion events</h2>
 * Where {@code sun.nio.ch} is open to this class ({@code --add-opens java.base/sun.nio.ch=ALL-UNNAMED}, which also
 * exports it to DiSNI; Spark adds it to its JVMs by default, the Kafka agent opens it itself), one thread,
 * {@code disni-cq-events}, waits for the events of every completion queue of the provider ({@link
 * CompletionEventThread}). With {@code --add-exports} alone each queue has a thread of its own, as DiSNI's API
 * implies; the provider logs that once, with the option that changes it.
 *
 * Thread-safe.
 */
public final class DisniProvider implements RdmaProvider {
    private static final Logger logger = LoggerFactory.getLogger(DisniProvider.class);
    /** The name users choose it by. */
    public static final String NAME = "disni";
    static final int PRIORITY = 10;

    /** The way out every cause offers; the selection names the setting that chooses it (RdmaProviders). */
    private static final String SOFT_FIX = "or use the software provider (soft) instead";

    private final ResourceUsage usage = new ResourceUsage();
    // Chosen at the first completion queue with a notifier: null where the JDK's epoll cannot be reached.
    private CompletionEventThread completionEvents;
    private volatile boolean completionEventsChosen;
    private final ConcurrentHashMap<Long, DisniDevice> devicesByContext = new ConcurrentHashMap<>();
    private final Object probeLock = new Object();
    private volatile boolean probed;
    private Throwable cause;
    private NativeDispatcher dispatcher;
    private volatile boolean discovered;

    /** Creates the provider; loads nothing native. */
    public DisniProvider() {
    }

    @Override
    public String name() {
        return NAME;
    }

    @Override
    public boolean isHardware() {
        return true;
    }

    @Override
    public int priority() {
        return PRIORITY;
    }

    @Override
    public boolean deliversPrivateData() {
        return false;
    }

    @Override
    public boolean isAvailable() {
        return unavailabilityCause() == null;
    }

    @Override
    public Throwable unavailabilityCause() {
        if (!probed) {
            synchronized (probeLock) {
                if (!probed) {
                    try {
                        cause = probe();
                    } catch (Throwable t) {
                        cause = new RdmaException("DiSNI probe failed unexpectedly (" + t + "): " + SOFT_FIX, t);
                    }
                    probed = true;
                }
            }
        }
        return cause;
    }

    void ensureAvailable() throws RdmaException {
        Throwable t = unavailabilityCause();
        if (t != null) {
            throw new RdmaException("the disni provider is unavailable: " + t.getMessage(), t);
        }
    }

    NativeDispatcher dispatcher() {
        return dispatcher;
    }

    ResourceUsage usage() {
        return usage;
    }

    /** The one thread for every queue's completion events, or {@code null}: each queue then starts its own. */
    CompletionEventThread completionEvents() {
        if (!completionEventsChosen) {
            synchronized (probeLock) {
                if (!completionEventsChosen) {
                    Throwable epoll = CompletionEventThread.unavailabilityCause();
                    if (epoll == null) {
                        completionEvents = new CompletionEventThread("disni-cq-events");
                    } else {
                        logger.info("DiSNI completion events wait on a thread per completion queue, not one for"
                                + " all, because {}", epoll.getMessage());
                    }
                    completionEventsChosen = true;
                }
            }
        }
        return completionEvents;
    }

    @Override
    public ResourceUsage resourceUsage() {
        return usage;
    }

    @Override
    public RdmaEventChannel createEventChannel(EventNotifier notifier) throws RdmaException {
        ensureAvailable();
        return new DisniEventChannel(this, notifier);
    }

    /**
     * The devices rdma_cm can reach: DiSNI cannot list devices, so the first call binds a connection-manager id to
     * each local IPv4 address and keeps the device behind every address that binds; devices met later through
     * connection-manager ids are added as they appear. A device with no IPv4 address is invisible to rdma_cm and
     * therefore not listed.
     */
    @Override
    public List<RdmaDevice> devices() throws RdmaException {
        ensureAvailable();
        if (!discovered) {
            synchronized (probeLock) {
                if (!discovered) {
                    discover();
                    discovered = true;
                }
            }
        }
        List<RdmaDevice> list = new ArrayList<>(devicesByContext.values());
        list.sort(Comparator.comparing(RdmaDevice::name));
        return Collections.unmodifiableList(list);
    }

    /** The one device object of a native context (rdma_cm opens one context per device and process). */
    DisniDevice deviceFor(IbvContext context, InetAddress localAddress) {
        long handle = ((NatIbvContext) context).getObjId();
        DisniDevice device = devicesByContext.get(handle);
        if (device == null) {
            device = devicesByContext.computeIfAbsent(handle,
                    h -> new DisniDevice(this, context, h, interfaceName(localAddress)));
        }
        return device;
    }

    private Throwable probe() {
        List<String> problems = new ArrayList<>();
        String libraryPath = System.getProperty("java.library.path", "");
        String fileName = System.mapLibraryName("disni");
        Path library = findOnPath(libraryPath, fileName);
        if (library == null) {
            problems.add("libdisni not found on java.library.path=" + libraryPath + ": install DiSNI's native library ("
                    + fileName + ", built from github.com/zrlio/disni), or add its directory to java.library.path, "
                    + SOFT_FIX);
        }
        Module javaBase = Object.class.getModule();
        Module disni = MemoryUtils.class.getModule(); // loads the class without initializing it
        if (!javaBase.isExported("sun.nio.ch", disni)) {
            problems.add("sun.nio.ch is not exported to DiSNI (it casts buffers to sun.nio.ch.DirectBuffer): add the"
                    + " JVM option --add-opens java.base/sun.nio.ch=ALL-UNNAMED (which also gives all completion"
                    + " queues one event thread; --add-exports is the minimum), " + SOFT_FIX);
        }
        if (NativeWords.unavailabilityCause() != null || DirectMemory.unavailabilityCause() != null) {
            problems.add("sun.misc.Unsafe is not accessible (" + NativeWords.unavailabilityCause()
                    + "): run on a JDK that ships the jdk.unsupported module, " + SOFT_FIX);
        }
        if (SysfsDevices.deviceNames().isEmpty()) {
            problems.add("no RDMA device: " + SysfsDevices.CLASS_INFINIBAND + " lists none; load the device's driver"
                    + " (e.g. mlx5_ib) or create a software device (rdma link add rxe0 type rxe netdev <interface>), "
                    + SOFT_FIX);
        } else if (!Files.exists(Paths.get("/dev/infiniband/rdma_cm"))) {
            problems.add("/dev/infiniband/rdma_cm does not exist: load the rdma_ucm kernel module (modprobe rdma_ucm)"
                    + " or pass the device into the container, " + SOFT_FIX);
        }
        if (!problems.isEmpty()) {
            return new RdmaException(String.join("; ", problems));
        }
        try {
            // Loads libdisni: NativeDispatcher's static initializer calls System.loadLibrary("disni").
            com.ibm.disni.verbs.RdmaProvider nat = com.ibm.disni.verbs.RdmaProvider.provider();
            Field f = RdmaProviderNat.class.getDeclaredField("nativeDispatcher");
            f.setAccessible(true);
            dispatcher = (NativeDispatcher) f.get(nat);
        } catch (UnsatisfiedLinkError | NoClassDefFoundError e) {
            return new RdmaException("libdisni at " + library + " cannot be loaded (" + e.getMessage() + "): install"
                    + " rdma-core's libibverbs and librdmacm, which libdisni links against, " + SOFT_FIX, e);
        } catch (IOException e) {
            return new RdmaException("libdisni at " + library + " does not match DiSNI 2.1's Java classes ("
                    + DisniErrors.clean(e) + "): rebuild libdisni from the v2.1 tag of github.com/zrlio/disni, "
                    + SOFT_FIX, e);
        } catch (ReflectiveOperationException | RuntimeException e) {
            return new RdmaException("DiSNI on the class path is not version 2.1 (" + e + "): use"
                    + " com.ibm.disni:disni:2.1, " + SOFT_FIX, e);
        }
        try {
            com.ibm.disni.verbs.RdmaEventChannel channel = com.ibm.disni.verbs.RdmaEventChannel.createEventChannel();
            try {
                com.ibm.disni.verbs.RdmaCmId id = channel.createId(RdmaCm.RDMA_PS_TCP);
                id.destroyId();
            } finally {
                channel.destroyEventChannel();
            }
        } catch (IOException | RuntimeException e) {
            return new RdmaException("rdma_cm is not usable (" + DisniErrors.clean(e) + "): check that"
                    + " /dev/infiniband/rdma_cm is readable and writable by this user, " + SOFT_FIX, e);
        }
        try {
            discover();
            discovered = true;
        } catch (RdmaException e) {
            return e;
        }
        return null;
    }

    private void discover() throws RdmaException {
        List<InetAddress> tried = new ArrayList<>();
        try {
            com.ibm.disni.verbs.RdmaEventChannel channel = com.ibm.disni.verbs.RdmaEventChannel.createEventChannel();
            try {
                for (InetAddress address : localIpv4Addresses()) {
                    tried.add(address);
                    com.ibm.disni.verbs.RdmaCmId id = channel.createId(RdmaCm.RDMA_PS_TCP);
                    try {
                        id.bindAddr(new InetSocketAddress(address, 0));
                        IbvContext context = id.getVerbs();
                        if (context != null) {
                            deviceFor(context, address);
                        }
                    } catch (IOException e) {
                        // rdma_bind_addr refuses addresses that no RDMA device serves: not a device, keep looking.
                    } finally {
                        id.destroyId();
                    }
                }
            } finally {
                channel.destroyEventChannel();
            }
        } catch (IOException e) {
            throw new RdmaException("cannot list RDMA devices through rdma_cm (" + DisniErrors.clean(e) + ")", e);
        }
        if (devicesByContext.isEmpty()) {
            throw new RdmaException("no RDMA device reachable through rdma_cm: none of the local IPv4 addresses "
                    + tried + " is served by one of the devices " + SysfsDevices.deviceNames() + "; give an"
                    + " RDMA-capable interface an IPv4 address (IPoIB, RoCE or iWARP), " + SOFT_FIX);
        }
    }

    private static List<InetAddress> localIpv4Addresses() throws IOException {
        List<InetAddress> addresses = new ArrayList<>();
        try {
            for (NetworkInterface nif : Collections.list(NetworkInterface.getNetworkInterfaces())) {
                if (!nif.isUp()) {
                    continue;
                }
                for (InetAddress a : Collections.list(nif.getInetAddresses())) {
                    if (a instanceof Inet4Address && !a.isLoopbackAddress()) {
                        addresses.add(a);
                    }
                }
            }
        } catch (SocketException e) {
            throw new IOException("cannot list network interfaces: " + e.getMessage(), e);
        }
        return addresses;
    }

    private static String interfaceName(InetAddress address) {
        if (address == null) {
            return null;
        }
        try {
            NetworkInterface nif = NetworkInterface.getByInetAddress(address);
            return nif == null ? null : nif.getName();
        } catch (SocketException e) {
            return null;
        }
    }

    static Path findOnPath(String searchPath, String fileName) {
        for (String dir : searchPath.split(File.pathSeparator)) {
            if (dir.isEmpty()) {
                continue;
            }
            try {
                Path candidate = Paths.get(dir, fileName);
                if (Files.isRegularFile(candidate)) {
                    return candidate;
                }
            } catch (RuntimeException e) {
                // An unusable path entry is skipped, as System.loadLibrary does.
            }
        }
        return null;
    }

    @Override
    public String toString() {
        return "DisniProvider{available=" + (probed ? String.valueOf(cause == null) : "not probed") + '}';
    }
}
