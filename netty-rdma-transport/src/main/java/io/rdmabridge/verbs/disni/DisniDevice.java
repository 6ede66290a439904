package io.rdmabridge.verbs.disni;

import com.ibm.disni.verbs.IbvCQ;
import com.ibm.disni.verbs.IbvCompChannel;
import com.ibm.disni.verbs.IbvContext;
import com.ibm.disni.verbs.IbvPd;
import io.rdmabridge.verbs.CompletionQueue;
import io.rdmabridge.verbs.DeviceAttributes;
import io.rdmabridge.verbs.EventNotifier;
import io.rdmabridge.verbs.PortAttributes;
import io.rdmabridge.verbs.ProtectionDomain;
import io.rdmabridge.verbs.RdmaDevice;
import io.rdmabridge.verbs.RdmaException;
import io.rdmabridge.verbs.RdmaProvider;
import java.io.IOException;
import java.util.List;

/**
 * One opened device: the {@code ibv_context} rdma_cm opened for it, found through a connection-manager id.
 *
 * <p>DiSNI 2.1 has no {@code ibv_query_device}, so the attributes are conservative defaults that every RDMA device
 * this project targets (ConnectX, soft-RoCE, siw) meets: {@value #MAX_QP} queue pairs, {@value #MAX_QP_WR} work
 * requests per queue, {@value #MAX_SGE} scatter/gather entries (DiSNI creates every queue pair with exactly that
 * many), {@value #MAX_CQE} completion-queue entries, {@value #MAX_INLINE_DATA} inline bytes, 2^31-1 bytes per memory
 * region (DiSNI passes the length as a Java int), {@value #MAX_MR} memory regions and {@value #MAX_QP_RD_ATOM}
 * outstanding RDMA READs. Name, transport and ports come from sysfs. Thread-safe.
 */
final class DisniDevice implements RdmaDevice {
    static final int MAX_QP = 1024;
    static final int MAX_QP_WR = 1024;
    static final int MAX_SGE = 4;
    static final int MAX_CQE = 16384;
    static final int MAX_INLINE_DATA = 64;
    static final int MAX_MR = 4096;
    static final int MAX_QP_RD_ATOM = 16;

    private final DisniProvider provider;
    private final IbvContext context;
    private final String name;
    private final DeviceAttributes attributes;
    private final List<PortAttributes> ports;

    DisniDevice(DisniProvider provider, IbvContext context, long contextHandle, String interfaceName) {
        this.provider = provider;
        this.context = context;
        String sysfsName = SysfsDevices.deviceOfInterface(interfaceName);
        this.name = sysfsName != null ? sysfsName : "rdma-context-0x" + Long.toHexString(contextHandle);
        this.ports = List.copyOf(SysfsDevices.ports(sysfsName));
        this.attributes = new DeviceAttributes(name, SysfsDevices.transport(sysfsName), MAX_QP, MAX_QP_WR, MAX_SGE,
                MAX_CQE, MAX_INLINE_DATA, Integer.MAX_VALUE, MAX_MR, MAX_QP_RD_ATOM);
    }

    DisniProvider disniProvider() {
        return provider;
    }

    @Override
    public RdmaProvider provider() {
        return provider;
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public DeviceAttributes attributes() {
        return attributes;
    }

    @Override
    public List<PortAttributes> ports() {
        return ports;
    }

    @Override
    public ProtectionDomain allocProtectionDomain() throws RdmaException {
        IbvPd pd;
        try {
            pd = context.allocPd();
        } catch (IOException e) {
            throw new RdmaException("ibv_alloc_pd on " + name + " failed: " + DisniErrors.clean(e), e);
        }
        if (pd == null) {
            throw new RdmaException("ibv_alloc_pd on " + name + " failed");
        }
        provider.usage().protectionDomains(1);
        return new DisniProtectionDomain(this, pd);
    }

    @Override
    public CompletionQueue createCompletionQueue(int entries, EventNotifier notifier) throws RdmaException {
        if (entries <= 0 || entries > MAX_CQE) {
            throw new IllegalArgumentException("entries: " + entries + " (expected: 1.." + MAX_CQE + ", the limit of"
                    + " device " + name + ")");
        }
        IbvCompChannel channel;
        try {
            // DiSNI's createCQ requires a completion channel even when nobody waits for events.
            channel = context.createCompChannel();
        } catch (IOException e) {
            throw new RdmaException("ibv_create_comp_channel on " + name + " failed: " + DisniErrors.clean(e), e);
        }
        IbvCQ cq;
        try {
            cq = context.createCQ(channel, entries, 0);
        } catch (IOException e) {
            destroyQuietly(channel);
            throw new RdmaException("ibv_create_cq(" + entries + ") on " + name + " failed: " + DisniErrors.clean(e),
                    e);
        }
        DisniCompletionQueue queue;
        try {
            queue = new DisniCompletionQueue(this, channel, cq, entries, notifier);
        } catch (IOException | RuntimeException e) {
            try {
                cq.destroyCQ();
            } catch (IOException ignored) {
                // Reported through the exception below.
            }
            destroyQuietly(channel);
            throw new RdmaException("cannot prepare completion queue on " + name + ": " + DisniErrors.clean(e), e);
        }
        provider.usage().completionQueues(1);
        return queue;
    }

    private static void destroyQuietly(IbvCompChannel channel) {
        try {
            channel.destroyCompChannel();
        } catch (IOException ignored) {
            // Already failing; the caller reports the first error.
        }
    }

    @Override
    public String toString() {
        return "DisniDevice{" + name + ", " + attributes.transport() + '}';
    }
}
