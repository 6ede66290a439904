package io.rdmabridge.verbs;

/**
 * Queue sizes of a queue pair ({@code struct ibv_qp_cap}).
 *
 * @param maxSendWr     outstanding send work requests
 * @param maxRecvWr     outstanding receive work requests
 * @param maxSendSge    scatter/gather entries per send
 * @param maxRecvSge    scatter entries per receive
 * @param maxInlineData bytes one inline send may carry
 */
public record QpCapabilities(int maxSendWr, int maxRecvWr, int maxSendSge, int maxRecvSge, int maxInlineData) {

    public QpCapabilities {
        checkPositive("maxSendWr", maxSendWr);
        checkPositive("maxRecvWr", maxRecvWr);
        checkPositive("maxSendSge", maxSendSge);
        checkPositive("maxRecvSge", maxRecvSge);
        if (maxInlineData < 0) {
            throw new IllegalArgumentException("maxInlineData: " + maxInlineData + " (expected: >= 0)");
        }
    }

    private static void checkPositive(String name, int value) {
        if (value <= 0) {
            throw new IllegalArgumentException(name + ": " + value + " (expected: > 0)");
        }
    }

    /**
     * Validates against a device's limits.
     *
     * @throws IllegalArgumentException naming the first field above the device's limit
     */
    public QpCapabilities checkAgainst(DeviceAttributes device) {
        checkLimit("maxSendWr", maxSendWr, device.maxQpWr(), device);
        checkLimit("maxRecvWr", maxRecvWr, device.maxQpWr(), device);
        checkLimit("maxSendSge", maxSendSge, device.maxSge(), device);
        checkLimit("maxRecvSge", maxRecvSge, device.maxSge(), device);
        checkLimit("maxInlineData", maxInlineData, device.maxInlineData(), device);
        return this;
    }

    private static void checkLimit(String name, int value, int limit, DeviceAttributes device) {
        if (value > limit) {
            throw new IllegalArgumentException(name + ": " + value + " (expected: <= " + limit + ", the limit of device "
                    + device.name() + ")");
        }
    }
}
