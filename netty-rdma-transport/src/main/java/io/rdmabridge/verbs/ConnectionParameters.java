package io.rdmabridge.verbs;

import java.util.Arrays;

/**
 * What {@link RdmaCmId#connect} and {@link RdmaCmId#accept} negotiate ({@code struct rdma_conn_param}).
 *
 * @param privateData        bytes delivered to the peer with the request or reply: at most
 *                           {@link #MAX_CONNECT_PRIVATE_DATA} on connect, {@link #MAX_ACCEPT_PRIVATE_DATA} on accept,
 *                           {@link #MAX_REJECT_PRIVATE_DATA} on reject (the RDMA CM limits over InfiniBand)
 * @param responderResources RDMA READs the peer may have outstanding against us
 * @param initiatorDepth     RDMA READs we may have outstanding against the peer
 * @param retryCount         transport retries before {@link WcStatus#RETRY_EXC_ERR}, 0..7
 * @param rnrRetryCount      how often the peer retries a SEND that finds none of our receives posted before it
 *                           completes with {@link WcStatus#RNR_RETRY_EXC_ERR}, 0..6: as rdma_connect(3) and
 *                           rdma_accept(3) have it, this side's value bounds the peer's sends, not its own; the
 *                           spec's 7 ("retry forever") is refused because an unbounded stall hides a missing receive
 */
public record ConnectionParameters(byte[] privateData, int responderResources, int initiatorDepth, int retryCount,
                                   int rnrRetryCount) {
    public static final int MAX_CONNECT_PRIVATE_DATA = 56;
    public static final int MAX_ACCEPT_PRIVATE_DATA = 196;
    public static final int MAX_REJECT_PRIVATE_DATA = 148;

    /** Sensible defaults: no private data, 16 READs each way, 7 transport retries, 6 RNR retries. */
    public static final ConnectionParameters DEFAULT = new ConnectionParameters(new byte[0], 16, 16, 7, 6);

    public ConnectionParameters {
        privateData = privateData == null ? new byte[0] : privateData.clone();
        if (privateData.length > MAX_ACCEPT_PRIVATE_DATA) {
            throw new IllegalArgumentException("privateData: " + privateData.length + " bytes (expected: <= "
                    + MAX_ACCEPT_PRIVATE_DATA + ")");
        }
        if (responderResources < 0 || responderResources > 255) {
            throw new IllegalArgumentException("responderResources: " + responderResources + " (expected: 0..255)");
        }
        if (initiatorDepth < 0 || initiatorDepth > 255) {
            throw new IllegalArgumentException("initiatorDepth: " + initiatorDepth + " (expected: 0..255)");
        }
        if (retryCount < 0 || retryCount > 7) {
            throw new IllegalArgumentException("retryCount: " + retryCount + " (expected: 0..7)");
        }
        if (rnrRetryCount < 0 || rnrRetryCount > 6) {
            throw new IllegalArgumentException("rnrRetryCount: " + rnrRetryCount
                    + " (expected: 0..6; 7 would retry forever)");
        }
    }

    /** A copy with other private data. */
    public ConnectionParameters withPrivateData(byte[] data) {
        return new ConnectionParameters(data, responderResources, initiatorDepth, retryCount, rnrRetryCount);
    }

    /** A copy with another receiver-not-ready retry count. */
    public ConnectionParameters withRnrRetryCount(int count) {
        return new ConnectionParameters(privateData, responderResources, initiatorDepth, retryCount, count);
    }

    @Override
    public byte[] privateData() {
        return privateData.clone();
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof ConnectionParameters p && Arrays.equals(privateData, p.privateData)
                && responderResources == p.responderResources && initiatorDepth == p.initiatorDepth
                && retryCount == p.retryCount && rnrRetryCount == p.rnrRetryCount;
    }

    @Override
    public int hashCode() {
        return 31 * Arrays.hashCode(privateData) + responderResources + 7 * initiatorDepth + 13 * retryCount
                + 17 * rnrRetryCount;
    }

    @Override
    public String toString() {
        return "ConnectionParameters{privateData=" + privateData.length + " bytes, responderResources="
                + responderResources + ", initiatorDepth=" + initiatorDepth + ", retryCount=" + retryCount
                + ", rnrRetryCount=" + rnrRetryCount + '}';
    }
}
