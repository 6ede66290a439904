package io.rdmabridge.benchmarks.grpc;

import io.grpc.KnownLength;
import io.grpc.MethodDescriptor;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;

/**
 * The one gRPC method of the streaming benchmark, {@value #NAME}: client streaming of byte arrays, answered once with
 * the number of bytes received and the server's process CPU time (and its soft RDMA engine thread's). The two ends
 * marshal the requests differently: the client sends byte arrays as a known-length stream (as protobuf messages go),
 * the server only counts the bytes it skips, so that neither end spends CPU on application work the transports do
 * not share. Thread-safe (constants).
 */
final class UploadMethod {
    static final String SERVICE = "bench.Upload";
    static final String NAME = SERVICE + "/Send";

    /** The client's view: byte arrays in, a {@link Reply} out. */
    static final MethodDescriptor<byte[], Reply> CLIENT = MethodDescriptor.<byte[], Reply>newBuilder()
            .setType(MethodDescriptor.MethodType.CLIENT_STREAMING).setFullMethodName(NAME)
            .setRequestMarshaller(new Bytes()).setResponseMarshaller(new ReplyMarshaller()).build();

    /** The server's view: each request is its length only. */
    static final MethodDescriptor<Integer, Reply> SERVER = MethodDescriptor.<Integer, Reply>newBuilder()
            .setType(MethodDescriptor.MethodType.CLIENT_STREAMING).setFullMethodName(NAME)
            .setRequestMarshaller(new Skipping()).setResponseMarshaller(new ReplyMarshaller()).build();

    private UploadMethod() {
    }

    /**
     * What the server answers when the client half-closes.
     *
     * @param bytes          request bytes it received in this call
     * @param cpuNanos       its process CPU time when it answered
     * @param engineCpuNanos the CPU time of its soft provider's engine thread then (0 without one, -1 unknown)
     */
    record Reply(long bytes, long cpuNanos, long engineCpuNanos) {
    }

    private static final class Bytes implements MethodDescriptor.Marshaller<byte[]> {
        @Override
        public InputStream stream(byte[] value) {
            return new KnownLengthStream(value);
        }

        @Override
        public byte[] parse(InputStream stream) {
            try {
                return stream.readAllBytes();
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    }

    /** Lets gRPC frame the message with its length up front, into one buffer, as it does for protobuf. */
    private static final class KnownLengthStream extends ByteArrayInputStream implements KnownLength {
        KnownLengthStream(byte[] bytes) {
            super(bytes);
        }
    }

    private static final class Skipping implements MethodDescriptor.Marshaller<Integer> {
        @Override
        public InputStream stream(Integer value) {
            throw new UnsupportedOperationException("the server only receives requests");
        }

        @Override
        public Integer parse(InputStream stream) {
            // gRPC's message stream skips by moving its reader index: the bytes are counted, not copied.
            try {
                long n = 0;
                for (long k; (k = stream.skip(Long.MAX_VALUE)) > 0; ) {
                    n += k;
                }
                return Math.toIntExact(n);
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    }

    private static final class ReplyMarshaller implements MethodDescriptor.Marshaller<Reply> {
        @Override
        public InputStream stream(Reply value) {
            String text = value.bytes() + " " + value.cpuNanos() + " " + value.engineCpuNanos();
            return new ByteArrayInputStream(text.getBytes(StandardCharsets.US_ASCII));
        }

        @Override
        public Reply parse(InputStream stream) {
            try {
                String[] f = new String(stream.readAllBytes(), StandardCharsets.US_ASCII).split(" ");
                return new Reply(Long.parseLong(f[0]), Long.parseLong(f[1]), Long.parseLong(f[2]));
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    }
}
