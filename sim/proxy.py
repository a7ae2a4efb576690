"""The CPU proxy path (NCCL GIN proxy backend style).

The GPU warp writes a 128 B descriptor into a ring per (context, peer) in
pinned host memory and publishes it with a system-scope fence; it spins while
the ring is full (the consumer index lives in host memory, read over PCIe).
The descriptor becomes visible to the host ``gpu_to_host_ns`` later. Host
progress threads (``proxy.threads``, rings spread over them) loop over their
rings, take at most one descriptor per ring per pass, post it to the NIC
(``host_post_ns``), poll the CQ (``host_cq_poll_ns`` per completion) and write
progress back where the GPU polls (``host_to_gpu_ns``). A ring's consumer
index advances strictly in order: a completed descriptor behind an
incomplete one does not free its slot (holes wait).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from lever.sim.engine import Counter, Wakeup, start_daemon
from lever.sim.issuer import WarpPort

if TYPE_CHECKING:
    from lever.sim.context import Context
    from lever.sim.message import Message, Messages
    from lever.sim.nic import QueuePair


class Ring:
    """Descriptor queue in pinned memory for one (context, peer)."""

    __slots__ = ("key", "qp", "posted", "visible", "inflight", "freed", "thread")

    def __init__(self, ctx: Context, key: tuple[int, int, int], qp: QueuePair,
                 thread: ProxyThread) -> None:
        self.key = key
        self.qp = qp
        self.posted = 0
        self.visible: deque[Message] = deque()
        self.inflight: deque[Message] = deque()
        self.freed = Counter(ctx.env)
        self.thread = thread


class RingTable:
    """Every descriptor ring of one op, made on first use: one per (rank, context, peer),
    spread round-robin over the rank's host threads (``design.proxy.threads``, else the
    platform's ``proxy.threads``)."""

    def __init__(self, ctx: Context, qps: list[list[QueuePair]], messages: Messages) -> None:
        self.ctx = ctx
        self.qps = qps
        self.messages = messages
        self._rings: dict[tuple[int, int, int], Ring] = {}
        self._threads: dict[int, list[ProxyThread]] = {}
        self._per_rank: dict[int, int] = {}

    def close(self) -> None:
        """End of run: each ring and its thread point at each other (``World.close``)."""
        for threads in self._threads.values():
            for t in threads:
                t.rings = []

    def get(self, rank: int, qp_ctx: int, peer: int) -> Ring:
        key = (rank, qp_ctx, peer)
        ring = self._rings.get(key)
        if ring is None:
            threads = self._threads.get(rank)
            if threads is None:
                n = self.ctx.design.proxy.threads or self.ctx.platform.proxy.threads
                threads = [ProxyThread(self.ctx, rank, i, self.qps[rank], self.messages)
                           for i in range(n)]
                self._threads[rank] = threads
            n = self._per_rank.get(rank, 0)
            self._per_rank[rank] = n + 1
            thread = threads[n % len(threads)]
            ring = Ring(self.ctx, key, self.qps[rank][qp_ctx], thread)
            thread.rings.append(ring)
            self._rings[key] = ring
        return ring


class HostThread(Wakeup):
    """A host progress thread of one rank (GIN's proxy, UCCL-EP's, fabric-lib's worker): it
    sleeps when a pass of its loop found nothing to do, and the next CQE or command wakes it
    (:meth:`kick`), carrying the critical-path segment that woke it."""

    def __init__(self, ctx: Context, rank: int, track: str) -> None:
        super().__init__(ctx.env, ctx.ledger)
        self.ctx = ctx
        self.rank = rank
        self.track = track
        self.proc = f"rank{rank} host"


class CompletionThread(HostThread):
    """A host thread whose CQ holds send and receive completions alike, as ``(is_receive,
    write)`` (UCCL-EP's proxy threads, fabric-lib's worker)."""

    def __init__(self, ctx: Context, rank: int, track: str) -> None:
        super().__init__(ctx, rank, track)
        self.cq: deque[tuple[bool, Message]] = deque()

    def send_cqe(self, msg: Message) -> None:
        """The NIC wrote the send completion of one of this thread's writes."""
        self.cq.append((False, msg))
        self.kick()

    def recv_cqe(self, msg: Message) -> None:
        """The receive completion of a write-with-immediate that reached this thread."""
        self.cq.append((True, msg))
        self.kick()


class ProxyThread(HostThread):
    """One host progress thread of one rank: its rings, and the rank's queue pairs it
    posts (and stripes) the descriptors' writes on."""

    def __init__(self, ctx: Context, rank: int, index: int, qps: list[QueuePair],
                 messages: Messages) -> None:
        super().__init__(ctx, rank, f"proxy{index}")
        self.index = index
        self.qps = qps
        self.messages = messages
        self.rings: list[Ring] = []
        self.cq: deque[Message] = deque()
        self.drain = ctx.design.proxy.drain_rings
        start_daemon(ctx.env, self._loop())

    def cq_append(self, msg: Message) -> None:
        """The NIC wrote a CQE for one of this thread's posts."""
        self.cq.append(msg)
        self.kick()

    def _loop(self):
        env, w = self.env, self.ctx
        pp = w.platform.proxy
        led = w.ledger
        while True:
            did = False
            while self.cq:
                msg = self.cq.popleft()
                t0 = env.now
                yield w.hold("proxy_post", led.cost("proxy_post", pp.host_cq_poll_ns))
                w.trace.span(self.proc, self.track, "cq", t0, env.now - t0)
                if msg.parent is None:
                    self._progress(msg)
                elif msg.parent.parts_done == msg.parent.parts and not msg.parent.host_done:
                    self._progress(msg.parent)
                did = True
            for ring in self.rings:
                if ring.visible:
                    # one descriptor a pass, or every visible one (design.proxy.drain_rings),
                    # whose WQEs then share a doorbell per QP
                    rung: dict[QueuePair, list[Message]] = {}
                    while ring.visible:
                        msg = ring.visible.popleft()
                        ring.inflight.append(msg)
                        for i, stripe in enumerate(self._stripes(msg)):
                            t0 = env.now
                            post = pp.host_post_ns if i == 0 else pp.stripe_post_ns
                            yield w.hold("proxy_post", led.cost("proxy_post", post))
                            w.trace.span(self.proc, self.track, "post", t0, env.now - t0)
                            stripe.qp.posted += 1
                            if not self.drain:
                                led.counters["proxy_doorbells"] += 1
                                stripe.qp.nic.doorbell([stripe])
                            else:
                                rung.setdefault(stripe.qp, []).append(stripe)
                        if not self.drain:
                            break
                    for qp, msgs in rung.items():
                        led.counters["proxy_doorbells"] += 1
                        qp.nic.doorbell(msgs)
                    did = True
            if did:
                poll = led.cost("proxy_post", pp.host_poll_ns * len(self.rings))
                yield w.hold("proxy_post", poll)
            else:
                yield self.sleep()

    def _stripes(self, msg: Message) -> list[Message]:
        """The provider's writes for one put: striped over rails (NICs) when large.

        Each stripe is a write-with-immediate of its own (posted, completed and
        counted at the target separately); the put completes when all did.
        """
        pp = self.ctx.platform.proxy
        k = min(pp.stripe_rails, max(1, -(-msg.nbytes // pp.stripe_min_bytes)))
        if k == 1 or msg.kind != "data":
            return [msg]
        msg.parts = k
        qps = self.qps
        out = []
        base, left = msg.nbytes // k, msg.nbytes
        for i in range(k):
            size = base if i < k - 1 else left
            left -= size
            part = self.messages.new(msg.src, msg.dst, size, msg.tag, kind="stripe", seq=msg.seq)
            part.parent = msg
            part.qp = qps[(msg.qp.index + i) % len(qps)]  # next rails
            part.on_complete = self._stripe_done
            out.append(part)
        return out

    def _stripe_done(self, part: Message) -> None:
        parent = part.parent
        parent.parts_done += 1
        self.cq_append(part)  # the host reads one CQE per stripe
        if parent.parts_done == parent.parts:
            parent.t_complete = self.env.now

    def _progress(self, msg: Message) -> None:
        """Completion seen on the host: advance the ring in order, tell the GPU."""
        ring: Ring = msg.ring
        msg.host_done = True
        freed = 0
        while ring.inflight and ring.inflight[0].host_done:
            ring.inflight.popleft()
            freed += 1
        port: ProxyPort = msg.port
        led = self.ctx.ledger
        lat = led.cost("proxy_queue", self.ctx.platform.proxy.host_to_gpu_ns)
        self.ctx.later("proxy_queue", lat, _host_reported, ring, freed, port)


class ProxyPort(WarpPort):
    """One warp's view of the proxy path: same interface as the native port."""

    def __init__(self, ctx: Context, rank: int, warp: int, qp_ctx: int, rings: RingTable) -> None:
        super().__init__(ctx, rank, warp)
        self.qp_ctx = qp_ctx  # the GIN context (QP index) this warp posts on
        self.rings = rings

    def post(self, msg: Message):
        w = self.ctx
        pp, g = w.platform.proxy, w.platform.gpu
        ring = self.rings.get(self.rank, self.qp_ctx, msg.dst)
        msg.qp = ring.qp
        msg.ring = ring
        msg.port = self
        msg.on_complete = ring.thread.cq_append
        msg.t_post = self.env.now
        if ring.posted - ring.freed.value >= pp.ring_depth:
            # ring full: spin on the consumer index in host memory
            yield from self._wait("proxy_queue", ring.freed.reach(ring.posted - pp.ring_depth + 1))
            yield from self._pay("proxy_queue", g.pcie_read_ns)
        yield from self._pay("wqe", pp.descriptor_store_ns)
        yield from self._pay("fence", g.fence_ns)
        ring.posted += 1
        self.posted += 1
        w.ledger.counters["descriptors"] += 1
        lat = w.ledger.cost("proxy_queue", pp.gpu_to_host_ns)
        w.later("proxy_queue", lat, _descriptor_seen, ring, msg)

    def finish(self):
        return
        yield  # a generator with nothing to ring: the host posts

    def flush(self, cat: str = "signal"):
        """Wait until the host reported every descriptor of this warp complete."""
        if self.done.value < self.posted:
            yield from self._wait(cat, self.done.reach(self.posted))
        yield from self._pay(cat, self.ctx.platform.gpu.pcie_read_ns)


def _host_reported(ring: Ring, freed: int, port: ProxyPort) -> None:
    """The host's completion report reached GPU memory: ring slots free, the warp's count moves."""
    ring.freed.add(freed)
    port.done.add(1)


def _descriptor_seen(ring: Ring, msg: Message) -> None:
    """The descriptor crossed PCIe: the host thread may pick it up."""
    ring.visible.append(msg)
    ring.thread.kick()
