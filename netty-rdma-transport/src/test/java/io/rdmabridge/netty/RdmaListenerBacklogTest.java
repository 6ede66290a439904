package io.rdmabridge.netty;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.Channel;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelOption;
import io.rdmabridge.verbs.CmEventType;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;

/**
 * Connect requests that arrive while the listener's loop is busy (a long task, a stall) wait for it in the provider.
 * The kernel's rdma_cm counts the requests not yet taken from an event channel against the backlog given to
 * {@code rdma_listen}, so {@code SO_BACKLOG} must bound them here too: past it a request is rejected at once, and a
 * flood of connectors cannot pile up native ids (DiSNI's event thread takes every request from the kernel as it comes)
 * or sockets (the soft provider) behind a busy loop. On the soft provider, and in the rxe stage on DiSNI over
 * Soft-RoCE ({@link DeviceUnderTest}).
 */
@Tag("device")
class RdmaListenerBacklogTest extends AbstractChannelTest {
    private static final int BACKLOG = 2;
    private static final int CONNECTORS = 8;

    RdmaListenerBacklogTest() {
        super(DeviceUnderTest.provider());
    }

    @Test
    @Timeout(300)
    void shouldRejectConnectRequestsPastSoBacklogWhileTheListenersLoopIsBusy() throws Exception {
        Channel server = listen(new ServerBootstrap().option(ChannelOption.SO_BACKLOG, BACKLOG)
                .childHandler(new ChannelInboundHandlerAdapter() {
                    @Override
                    public boolean isSharable() {
                        return true;
                    }
                }));
        CountDownLatch busy = new CountDownLatch(1);
        server.eventLoop().execute(() -> {
            try {
                busy.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        InetSocketAddress address = (InetSocketAddress) server.localAddress();
        ExecutorService clients = Executors.newFixedThreadPool(CONNECTORS);
        List<Future<RawVerbsPeer>> attempts = new ArrayList<>();
        try {
            for (int i = 0; i < CONNECTORS; i++) {
                attempts.add(clients.submit(() -> RawVerbsPeer.attempt(DeviceUnderTest.provider(), address,
                        () -> { })));
            }
            // The refused ones end while the listener's loop is still busy; the admitted ones wait for it.
            long deadline = System.nanoTime() + DeviceUnderTest.scaled(Duration.ofSeconds(8)).toNanos();
            int rejected;
            do {
                Thread.sleep(20);
                rejected = count(attempts, CmEventType.REJECTED);
            } while (rejected < CONNECTORS - BACKLOG && System.nanoTime() < deadline);
            assertEquals(CONNECTORS - BACKLOG, rejected, "connect requests rejected by a listener with SO_BACKLOG "
                    + BACKLOG + " while its loop was busy");
            busy.countDown();
            for (Future<RawVerbsPeer> f : attempts) {
                f.get(DeviceUnderTest.scaled(Duration.ofSeconds(20)).toSeconds(), TimeUnit.SECONDS);
            }
            assertEquals(BACKLOG, count(attempts, CmEventType.ESTABLISHED),
                    "connections accepted once the listener's loop was free");
        } finally {
            busy.countDown();
            for (Future<RawVerbsPeer> f : attempts) {
                try {
                    f.get(DeviceUnderTest.scaled(Duration.ofSeconds(20)).toSeconds(), TimeUnit.SECONDS).close();
                } catch (ExecutionException e) {
                    // The attempt itself failed; the assertions above name it.
                }
            }
            clients.shutdown();
        }
    }

    /** How many finished attempts ended with {@code type}; an attempt that failed itself counts for none. */
    private static int count(List<Future<RawVerbsPeer>> attempts, CmEventType type) throws InterruptedException {
        int n = 0;
        for (Future<RawVerbsPeer> f : attempts) {
            try {
                if (f.isDone() && f.get().outcome() == type) {
                    n++;
                }
            } catch (ExecutionException e) {
                // Counts for none.
            }
        }
        return n;
    }
}
