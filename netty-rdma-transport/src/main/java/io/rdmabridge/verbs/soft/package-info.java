/**
 * The software RDMA provider ({@code rdmabridge.provider=soft}): a user-space RC device, {@code soft0}, for tests,
 * demos and machines without RDMA hardware.
 *
 * <h2>Design</h2>
 * <ul>
 *   <li>{@link io.rdmabridge.verbs.soft.SoftEngine}: the JVM-wide device, memory-key tables (random, non-zero keys
 *       from {@link java.security.SecureRandom}, read without locks), the in-JVM listener registry, the engine thread
 *       (one NIO selector for all TCP sockets) and the timer thread.</li>
 *   <li>{@link io.rdmabridge.verbs.soft.SoftQueuePair}: preallocated send and receive rings; completions in posting
 *       order; errors move the queue pair to ERROR before they become visible, then flush.</li>
 *   <li>{@link io.rdmabridge.verbs.soft.DirectLink}: in-JVM peers; the posting thread executes the work request
 *       against the peer's memory and receive queue itself.</li>
 *   <li>{@link io.rdmabridge.verbs.soft.TcpLink}: one TCP connection per queue pair, the
 *       {@link io.rdmabridge.verbs.soft.SoftHandshake} then {@link io.rdmabridge.verbs.soft.SoftFrame}s, validated
 *       field by field; bounded buffers; cumulative ACKs; RNR NAK with go-back retransmission; a transport timeout
 *       ({@code rdmabridge.soft.transportTimeoutMillis}, 30 s, between hosts): waiting work requests that see no
 *       sign of the peer that long fail with {@code RETRY_EXC_ERR}, as a NIC's do once its retries run out, where a
 *       vanished host would otherwise leave them to TCP's retransmission timeout.</li>
 *   <li>{@link io.rdmabridge.verbs.soft.SoftCompletionQueue}: lock-free many-producer, single-consumer ring.</li>
 *   <li>Same-host path ({@code rdmabridge.soft.sameHost=shm}, below): {@link io.rdmabridge.verbs.soft.SharedMemoryFiles}
 *       (registered memory in shared files, the same-host token), {@link io.rdmabridge.verbs.soft.SharedKeyTable}
 *       (a process's published keys and queue pairs) and {@link io.rdmabridge.verbs.soft.SharedPeer} (the
 *       requester's one-sided WRITE and READ) and {@link io.rdmabridge.verbs.soft.ShmRing} (each direction's frame
 *       stream), driven by the {@link io.rdmabridge.verbs.soft.TcpLink}.</li>
 * </ul>
 *
 * <h2>Modes</h2>
 * <ul>
 *   <li>{@code rdmabridge.soft.privateData} = {@code deliver} (default) or {@code none}: in {@code none} the provider
 *       behaves like DiSNI 2.1 and delivers no connection-manager private data ({@code deliversPrivateData()} is
 *       false, events carry none, accept with private data is refused, reject sends none), so that protocols above
 *       the SPI are tested as they run on DiSNI. Read when a {@link io.rdmabridge.verbs.soft.SoftProvider} is
 *       created with its zero-argument constructor (the {@link java.util.ServiceLoader} path); tests that need both
 *       modes in one JVM construct {@code new SoftProvider(SoftProvider.PrivateDataMode.NONE)} instead.</li>
 *   <li>{@code rdmabridge.soft.loopback} = {@code direct} (default) or {@code tcp}: the TCP wire path even between
 *       queue pairs of one JVM.</li>
 *   <li>{@code rdmabridge.soft.sameHost} = {@code shm} (default) or {@code tcp}: the same-host path below, read at
 *       every allocation and connection; {@code rdmabridge.soft.shmDirectory} (default {@code /dev/shm}, read when
 *       the device starts) holds its files. On that path {@code rdmabridge.soft.rings} = {@code true} (default) or
 *       {@code false} (read per connection) moves each side's frames into a shared-memory ring of
 *       {@code rdmabridge.soft.ringBytes} data bytes (default 2097152, a power of two from 262144 to 67108864, read
 *       per connection), and
 *       {@code rdmabridge.soft.ringSpinMicros} (default 0, read once) is how long the engine thread keeps polling
 *       the rings after the last frame before it parks; {@code rdmabridge.soft.pollProgress} = {@code true}
 *       (default) or {@code false} (read once) lets threads polling completion queues execute their queue pairs'
 *       ring frames (below).</li>
 * </ul>
 *
 * <h2>Where soft0 differs from a device (a review against real verbs, 2026-11-30)</h2>
 * The conformance suite runs every case on rxe as well (docs/disni.md); these differences are known and left, because
 * nothing above the SPI relies on any of them:
 * <ul>
 *   <li>A failed work request ends the link: both queue pairs go to ERROR and both ids see DISCONNECTED. A device
 *       moves only the queue pairs the error class names, and raises no connection-manager event until someone calls
 *       {@code rdma_disconnect}; the channel disconnects on every failure itself.</li>
 *   <li>A send-queue slot is free again once its work request completes, signaled or not, as on rxe; mlx5 frees
 *       slots only when a later signaled completion is polled. The channel signals and polls within the queue's
 *       depth.</li>
 *   <li>The active side reaches RTS before the passive one; a send posted before ESTABLISHED can be flushed. The
 *       channel sends only after ESTABLISHED.</li>
 *   <li>{@code maxQp} is advertised, not enforced, and queue pair numbers wrap at 2^24 without skipping live ones.</li>
 *   <li>Deregistering memory that a local copy (a receive landing, a SEND's gather) has begun to use lets that copy
 *       finish ({@link io.rdmabridge.verbs.MemoryRegion#close()}); a peer's RDMA READ or WRITE is waited out.</li>
 *   <li>{@code vendorError} is always 0.</li>
 * </ul>
 *
 * <h2>Same-host path (issue 13): what is done, what is next</h2>
 * Done (on by default since the hardening below; {@code -Drdmabridge.soft.sameHost=tcp} turns it off):
 * <ul>
 *   <li>Memory allocated through {@link io.rdmabridge.verbs.ProtectionDomain#allocateMemory} (the channel's slabs,
 *       receive rings and header rings) lives in owner-only files {@code rdmabridge-soft-<pid namespace>-<pid>-<n>},
 *       deleted at free, at exit, and, when their owner was killed, by a surviving peer (below) or the next process
 *       of the same pid namespace. The DiSNI provider keeps the default, plain direct memory.</li>
 *   <li>The handshake (version 2) carries a same-host token (boot id, shared-memory directory, effective user and
 *       pid namespace) and the pid; equal non-zero tokens make the TCP link same-host, once the kernel's socket
 *       tables show the connection's other end as a socket of this host owned by our user
 *       ({@link io.rdmabridge.verbs.soft.PeerSockets}: the token is no secret).</li>
 *   <li>Each process publishes its registrations that lie in shared files, and its RTS queue pairs of same-host
 *       links, in {@code rdmabridge-soft-<pid namespace>-<pid>-keys}. A requester executes RDMA WRITE and READ
 *       one-sided when every earlier request of the queue pair is done (RC order; one of 64 KiB or more waits for the
 *       acknowledgement of earlier ones, a smaller one goes over the wire) and the table vouches for key, domain,
 *       bounds, access and queue pair; a DIRECT frame tells the responder which PSNs it will not see. Deregistration
 *       waits out peers' copies (an in-use count per key slot; a slot whose holder never let go is retired).
 *       Everything else takes the TCP path unchanged, which stays the authority: a doubtful case is never failed
 *       one-sided, it is sent.</li>
 *   <li>Mapped files ({@link io.rdmabridge.verbs.soft.MappedFileLinks}): a read-only file mapping registered as such
 *       ({@link io.rdmabridge.verbs.ProtectionDomain#registerFileMapping}, a file region's chunk) is published, for
 *       remote read, with a link to its file in the shared-memory directory and the file's device and inode; the
 *       requester reads the file itself with {@code pread}, one copy out of the page cache and no work on the owner's
 *       side, where before the owner's engine copied the chunk into the ring for it. {@code SoftSameHostTest} and
 *       {@code SoftSameHostHostileTest} cover it, a file renamed over the mapped one and links that lead elsewhere.</li>
 *   <li>Frames through shared memory ({@link io.rdmabridge.verbs.soft.ShmRing}, issue 13's second stage): after
 *       CONNECTED each side creates a ring in a file of its own and announces it with a RING frame, its last data
 *       frame on the socket; it then encodes every frame straight into the ring, and the peer, once it has processed
 *       the RING frame, executes them in place (a SEND costs one copy into the ring and one into the receive buffer,
 *       and no system call). Such a link keeps the handshake's 512-byte socket buffers, where a link without a ring
 *       has 256 KiB each way; the peer's frames on the socket grow the read buffer when they need it (a peer that runs
 *       with rings off: {@code SoftSameHostMixedRingsConformanceTest}). The socket keeps the handshake, DOORBELL
 *       frames (the engine thread busy-polls its rings for {@code ringSpinMicros}, then sets a parked flag and blocks
 *       in {@code select()}; a writer that finds the flag, or a reader that frees a full ring, sends one), the final
 *       DISCONNECT or NAK (taken only after the ring is drained) and peer death. Every header is copied out of the
 *       ring before it is checked, the peer's counters must move forward by at most the capacity, and a fault on a
 *       truncated file closes that link (and, since HotSpot 17 raises a fault of compiled code only at the thread's
 *       next safepoint, the link whose code it surfaced in, if another).</li>
 *   <li>Progress on poll (issue 13's wake-up cost): polling a completion queue first executes what its queue pairs'
 *       peers published in their rings ({@link io.rdmabridge.verbs.soft.TcpLink#progress}), so an event loop that
 *       is awake (busy, or busy-polling) takes its frames without waiting for the engine thread to wake; a poller
 *       that stays awake takes the ring's parked flag so the peer stops ringing the engine, and gives it back when
 *       it arms its queue (its next poll is the last look). One consumer at a time per link (a compare-and-set
 *       slot); the engine still executes whatever no poller takes, and parks at most 10 ms while rings are read,
 *       which bounds the delay left by a poller that stopped without arming. {@code SoftRingTest} checks that
 *       polls alone carry SENDs and acknowledgements with the engine thread held.</li>
 *   <li>Direct wake-ups (issue 13's "one cheap signal when the peer sleeps"): a poller that arms its completion queue
 *       parks on its rings itself, naming in the ring's control page its network namespace and the UDP port of its
 *       event loop's wake socket ({@link io.rdmabridge.verbs.EventNotifier#loopbackWakePort()}, on the loopback
 *       address; the loop then waits in a selector instead of parking its thread). The peer's writer that finds that
 *       flag sends one byte there instead of a DOORBELL, so a sleeping loop is woken by its peer with no engine
 *       thread in between (a DOORBELL wakes the engine, which executes the frames and then wakes the loop). Anything
 *       else (no port, another namespace, a failed send) falls back to the DOORBELL, and the engine's 10 ms park
 *       bounds the delay of a lost datagram. {@code rdmabridge.soft.directWake=false} turns it off.
 *       {@code SoftRingTest} checks that a sleeping poller is woken with the engine thread held, and that a wake
 *       socket in another namespace gets a DOORBELL instead.</li>
 *   <li>Acknowledgements with the answer (issue 13's 64 B latency): a device acknowledges a message within
 *       microseconds, while the requester's loop is still awake; here the acknowledgement is written by the
 *       responder's poller after its own wake-up, when the requester has gone to sleep, so a ping-pong woke each loop
 *       twice per message. A poller that executes ring frames which complete receives, and owes nothing but their
 *       acknowledgement, now holds it until a post carries it (the answer), it arms its completion queue or polls again
 *       (never holding twice in a row), the link ends (a pending acknowledgement goes before the socket closes), or
 *       the engine next polls the rings, which publishes whatever a poller left held
 *       ({@code rdmabridge.soft.holdAcknowledgements=false} turns it off). A responder that dies between handing a
 *       message up and its next action leaves the requester's SEND flushed although delivered; a device's window for
 *       that is microseconds, this one the poller's loop iteration. With the channel's
 *       {@code SEND_COMPLETION_POLL_NANOS}, a loop that awaits a send's completion polls instead of sleeping, and the
 *       answer arrives with it. {@code SoftRingTest} checks each release with the engine thread held, and the
 *       engine's.</li>
 *   <li>{@code SoftSameHostConformanceTest} runs the conformance suite with both processes on this path and
 *       {@code RdmaSameHostEchoTest} the channel's cross-process echo (and peer kill), each checking that frames
 *       crossed rings and RDMA ran one-sided; {@code SoftSameHostTest} covers files, cleanup, tokens, the
 *       deregistration guard and one-sided WRITE/READ ordering; {@code SoftRingTest} wraps and skips, order both
 *       ways at once from the switch on, every byte while writers and readers race around full rings, doorbells
 *       after parking and on a full ring, and hostile ring contents (garbage, counters backward or past the capacity,
 *       a truncated file), each closing one link.</li>
 * </ul>
 * Hardened against a hostile or broken peer (same user, same host):
 * <ul>
 *   <li>Truncated memory file. In JDK 17 a fault (SIGBUS) in a copy through a mapping of a truncated file becomes
 *       an {@link java.lang.InternalError} that reaches the thread later, after the copy returned, often outside any
 *       {@code try} around it ({@code DirectMemoryFaultTest}), so it cannot be handled. Hence the requester never
 *       maps a peer's memory file: it copies with positional reads and writes on it
 *       ({@link io.rdmabridge.verbs.soft.SharedPeer}), which cannot fault, straight into or out of our scatter/gather
 *       entries (one kernel copy; 64 KiB as fast as the mapped copy, 1 MiB WRITE about half). A copy of 256 KiB or more
 *       is shared, chunk by chunk, with a second thread, {@link io.rdmabridge.verbs.soft.CopyHelper}
 *       ({@code rdmabridge.soft.copyHelper=false} turns it off), as a device's copy does not take the requester's
 *       core; the requester still returns only once every chunk is copied. A file shorter than the
 *       table says fails the request with {@code REM_ACCESS_ERR} (as on a NIC, a failed READ's destination is
 *       undefined; nothing behind it runs) and closes that link with a WARN naming the file; falling back to TCP
 *       instead would make the owner's engine fault on its own file. Other links and the engine carry on
 *       ({@code SoftSameHostHostileTest}).</li>
 *   <li>Garbage in the key table: every value is read once and checked (overflow-safe bounds, domain, access, queue
 *       pair, file number within the peer's own {@code <pid>} prefix, opened without following links, copy within
 *       the file's size); anything that does not add up is declined to the wire, where the owner decides. The
 *       table's bounds are the owner's word about its own memory, as a NIC's are: a lie can only reach the owner's
 *       own files, never ours beyond the work request's local entries. Tested with targeted lies and random bytes
 *       under load ({@code SoftSameHostHostileTest}).</li>
 *   <li>Hostile DIRECT frames (not same-host, wrong PSN, inside a message, count outside 1..2^24) close that link
 *       with a WARN naming the rule ({@code SoftWireTest}).</li>
 *   <li>A peer's files open and key tables mapped are counted in {@link io.rdmabridge.verbs.ResourceUsage}
 *       ({@code peerFiles}, {@code peerKeyTables}, {@code peerBytes}); tests wait for them to return to zero.</li>
 *   <li>A killed peer's files are deleted by the survivor when the link closes, at once if the peer is gone or a
 *       zombie, else re-checked on the timer with backoff for about 13 s; tested with a killed child JVM.</li>
 * </ul>
 * Since progress on poll, an event loop polling its completion queue reads the peer's ring too, so a truncated ring
 * file can fault it as it can fault the engine: a fault inside the drain closes that link (handed to the engine
 * thread), and one HotSpot raises later fails the channel or the task whose code it surfaced in, not the loop
 * ({@code RdmaIoHandler} catches a poll's throwable per channel, Netty a task's).
 * Remaining risk: the key table itself is still a mapping (its in-use counts need atomics both processes see), as
 * are the frame rings (their fault is attributed, see Next). The table's
 * size is checked before each request, but a peer that truncates its own table in the microseconds a request reads
 * it makes this process fault as above (an {@link java.lang.InternalError} at an unpredictable point of the posting
 * or engine thread). Closing that needs a table the peer cannot shrink (a sealed memfd, which needs native code) or
 * a guard without shared atomics (byte-range file locks per key, at two system calls a request). Note the bound on
 * "hostile" here: a peer must run as our user to open our files at all, and such a process can as well truncate our
 * own memory files (the channel's slabs) and fault us there, so the hardening protects against a broken peer and
 * keeps a hostile one from corrupting data or reaching our memory through the protocol, not from crashing us.
 *
 * <p>Next:
 * <ul>
 *   <li>A SEND the requester executes itself, straight into the peer's posted receive (one copy instead of two; the
 *       peer's posted receives published in shared memory, each claimed by one side, a flush waiting out a copy in
 *       progress): the requester would know the outcome at once, as a device's quick acknowledgement lets it. It would
 *       not meet the 64 KiB throughput target here (docs/benchmarks.md: with the receiver's copy skipped, an upper
 *       bound, 1.42x-1.57x epoll against 2x).</li>
 *   <li>Completions through shared rings, so a same-host requester need not wait for an ACK frame.</li>
 *   <li>Faults on truncated files: HotSpot 17 raises a fault of compiled code late, at the thread's next safepoint, so
 *       on the engine thread it can interrupt (and close) another link, and on a posting thread that wrote into its
 *       own ring it can surface in the application's code after the post (the one-sided copies of
 *       {@link io.rdmabridge.verbs.soft.SharedPeer} use positional I/O and cannot fault). Memory a peer cannot shrink (memfd with seals, passed over a Unix
 *       socket) would remove the fault rather than attribute it.</li>
 *   <li>One-sided requests while earlier ones are still in flight (today they wait for an acknowledgement, a round
 *       trip through the peer's engine, or go over the wire); this needs the earlier requests' target ranges, since
 *       a READ must see an earlier SEND's or WRITE's bytes.</li>
 *   <li>The key table stays a 64 MiB sparse file: only the header, the queue-pair slots (512 KiB) and the key slots
 *       the device has handed out (4,096 at first, doubling as it hands out more) are committed, each page before it
 *       is touched, so that a full directory fails a registration's publication (it stays on the TCP path) instead of
 *       faulting. Sizing it to the live slots would need peers to remap it as it grows, for a saving
 *       bounded by 64 MiB per process; not done.</li>
 * </ul>
 * Limits: a peer killed mid-copy holds the deregistration of that key up for 2 s (then a WARN); a killed peer whose
 * pid still looks alive 13 s after the last link to it closed leaves its files to the next process on the host that
 * starts this path.
 */
package io.rdmabridge.verbs.soft;
