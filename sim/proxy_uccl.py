"""UCCL-EP's CPU proxy (``uccl-project/uccl``, ``ep/``): several proxy threads per GPU, each
with its own command FIFOs (channels) and its own queue pairs, on both ends of every write.

GPU side (:class:`UcclPort`): before each put the warp fences (``__threadfence_system``,
``ep/src/internode_ll.cu``) and pushes one 128-bit command into a FIFO in host memory
(``ep/include/uccl_ibgda.cuh``, ``nvshmemi_ibgda_put_nbi_warp``). The FIFO follows from the
expert the write is for, not from the warp: channel ``expert mod (threads x channels)``,
thread ``channel mod threads``, FIFO ``channel div threads`` (the local expert index at the
target in dispatch, the global one in combine), so one expert's writes and its count go
through one thread; the streams of the other protocols go by destination rank. The host sees a command ``proxy.gpu_to_host_ns`` after the push.

Host thread (:class:`UcclThread`, ``ep/src/proxy.cpp`` ``Proxy::run_dual``), one loop:

1. poll its CQ (``poll_cq_dual``): every CQE, a send completion or the receive completion of
   a write-with-immediate, costs ``proxy.host_cq_poll_ns``. A send completion retires
   commands of its FIFO strictly in order (``notify_gpu_completion``), reported to the GPU
   ``proxy.host_to_gpu_ns`` later. A receive completion of a data write bumps the count of
   arrived writes of its (source, expert); a count (the atomic, carried in the immediate)
   is applied when that count matches it and held otherwise (``remote_process_completions``,
   ``USE_RECEIVER_BARRIER``, the EFA build);
2. take from each of its FIFOs the visible commands, at most ``design.proxy.inflight_per_channel``
   in flight per FIFO (``post_gpu_command``), group them by destination rank and post each
   group as one chain of write-with-immediate WRs with one doorbell (``ibv_wr_start`` ...
   ``ibv_wr_complete``, ``post_rdma_async_batched_fast_mode``): ``proxy.host_post_ns`` for
   a chain's first WR and ``proxy.stripe_post_ns`` for each further WR of it (the cost of one
   more WR posted back to back);
3. apply held counts whose writes have now all arrived (``apply_pending_updates``); the GPU
   sees an applied count ``proxy.host_to_gpu_ns`` later.

A thread's queue pairs sit on NIC ``thread mod nics_per_gpu`` (``per_thread_rdma_init``) and
are connected to the same-index thread of the peer, so a rank's receive work is spread over
its threads by expert. There is no rail striping: a write goes whole on its thread's NIC.

``design.signal_mode`` chooses how a count is made safe, as UCCL-EP's builds do:
``imm-counting`` (the receiving thread counts, above); ``flush`` (``USE_SENDER_BARRIER``: the
sending thread holds a count until every write of its stream it posted before completed,
then the receiver applies it on arrival); ``ordered`` (applied on arrival, as on RC: on SRD a
count can overtake its data, and consuming then counts an ordering violation).
Not modelled: the FIFO's own depth (2048 commands, never reached at decode shape) and the
in-flight byte cap (unlimited by default).
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import TYPE_CHECKING

from lever.sim.engine import start_daemon
from lever.sim.issuer import WarpPort
from lever.sim.message import POLLED_KINDS
from lever.sim.nic import QueuePair
from lever.sim.proxy import CompletionThread
from lever.sim.tags import ExpertTag

if TYPE_CHECKING:
    from lever.sim.context import Context
    from lever.sim.message import Message
    from lever.sim.nic import Nic
    from lever.sim.receiver import Receiver
    from lever.sim.routing import Routing


class Fifo:
    """One command FIFO (channel) of one proxy thread: commands the host can see, and those
    it took and has not retired (posted, or held by the sender barrier), in order."""

    __slots__ = ("index", "thread", "visible", "pending")

    def __init__(self, index: int, thread: UcclThread) -> None:
        self.index = index
        self.thread = thread
        self.visible: deque[Message] = deque()
        self.pending: deque[Message] = deque()

    def push(self, msg: Message) -> None:
        """The command crossed PCIe: the thread may take it."""
        self.visible.append(msg)
        self.thread.kick()


class UcclTable:
    """Every UCCL-EP proxy thread and FIFO of one op, made per rank on first use; the target
    side of every write the threads post (:meth:`arrived`)."""

    def __init__(self, ctx: Context, nics: list[Nic], receivers: list[Receiver],
                 routing: Routing, op: str) -> None:
        self.ctx = ctx
        self.nics = nics
        self.receivers = receivers
        self.routing = routing
        self.dispatch = op == "dispatch"
        pd = ctx.design.proxy
        self.n_threads = pd.threads or ctx.platform.proxy.threads
        self.n_fifos = pd.channels_per_thread
        self.per = ctx.platform.nic.nics_per_gpu
        self._threads: dict[int, list[UcclThread]] = {}

    def close(self) -> None:
        """End of run: threads, their FIFOs and this table point at each other
        (``World.close``)."""
        for ts in self._threads.values():
            for t in ts:
                t.fifos = []
        self._threads = {}

    def threads(self, rank: int) -> list[UcclThread]:
        ts = self._threads.get(rank)
        if ts is None:
            ts = [UcclThread(self.ctx, rank, i, self.nics[rank * self.per + i % self.per], self)
                  for i in range(self.n_threads)]
            self._threads[rank] = ts
        return ts

    def fifo_for(self, rank: int, msg: Message) -> Fifo:
        """The FIFO a command goes to: by the expert of a V1 LL write (local index at the target
        in dispatch, global in combine, as UCCL-EP's kernels pick it); any other stream by its
        destination rank, so a stream's writes and its count always meet on one thread (the
        receiving thread counts only what reaches it)."""
        tag = msg.tag
        if isinstance(tag, ExpertTag):
            e = tag.expert
            key = e - self.routing.experts_of(self.routing.rank_of(e))[0] if self.dispatch else e
        else:
            key = msg.dst
        ch = key % (self.n_threads * self.n_fifos)
        return self.threads(rank)[ch % self.n_threads].fifos[ch // self.n_threads]

    def arrived(self, msg: Message) -> None:
        """Every byte of ``msg`` is visible at its target: the receive completion of the
        write-with-immediate reaches the CQ of the same-index thread there."""
        rcv = self.receivers[msg.dst]
        if msg.kind in POLLED_KINDS:
            rcv.on_visible(msg)  # a count exchange or barrier word: polled by the GPU itself
            return
        if msg.kind == "data":
            rcv.data[msg.tag].add(1)  # the truth a consumer is checked against
        src_thread: UcclThread = msg.ring.thread
        dst_thread = self.threads(msg.dst)[src_thread.index]
        rp = self.ctx.platform.receiver
        self.ctx.later("signal", self.ctx.ledger.cost("signal", rp.recv_completion_ns),
              dst_thread.recv_cqe, msg)


class UcclThread(CompletionThread):
    """One UCCL-EP proxy thread of one rank: its FIFOs, its queue pair (on one NIC), its CQ,
    and the receive-side counts of the writes that reach it."""

    def __init__(self, ctx: Context, rank: int, index: int, nic: Nic, table: UcclTable) -> None:
        super().__init__(ctx, rank, f"uccl{index}")
        self.index = index
        self.table = table
        self.qp = QueuePair(ctx.env, index, rank, nic)
        self.fifos = [Fifo(i, self) for i in range(table.n_fifos)]
        self.arrived: dict = defaultdict(int)  # receive side: data writes counted per tag
        self.held: list[Message] = []  # receive side: counts waiting for their writes
        self.sent: dict = defaultdict(int)  # send side: data writes posted per tag
        self.completed: dict = defaultdict(int)  # send side: ... and completed
        self.postponed: list[Message] = []  # sender barrier: counts waiting for completions
        self.mode = ctx.design.signal_mode
        start_daemon(ctx.env, self._loop())

    # -- the loop --------------------------------------------------------------------------
    def _loop(self):
        env, w = self.env, self.ctx
        pp = w.platform.proxy
        led = w.ledger
        budget = w.design.proxy.inflight_per_channel
        while True:
            did = False
            if self.cq:  # 1. poll the CQ: every CQE present, then act on them
                cqes = list(self.cq)
                self.cq.clear()
                t0 = env.now
                yield w.hold("proxy_post", led.cost("proxy_post", pp.host_cq_poll_ns) * len(cqes))
                w.trace.span(self.proc, self.track, "cq", t0, env.now - t0)
                for is_recv, msg in cqes:
                    if is_recv:
                        self._received(msg)
                    else:
                        self._completed(msg)
                self._retire()
                did = True
            # 2. take commands from every FIFO (in-flight budget each), post per destination
            chains: dict[int, list[Message]] = {}
            for fifo in self.fifos:
                while fifo.visible and len(fifo.pending) < budget:
                    msg = fifo.visible.popleft()
                    fifo.pending.append(msg)
                    if msg.kind == "data":
                        self.sent[msg.tag] += 1
                    elif self.mode == "flush" and self.completed[msg.tag] < self.sent[msg.tag]:
                        self.postponed.append(msg)  # sender barrier: after its writes completed
                        continue
                    chains.setdefault(msg.dst, []).append(msg)
            ready = [m for m in self.postponed if self.completed[m.tag] >= self.sent[m.tag]]
            for m in ready:
                self.postponed.remove(m)
                chains.setdefault(m.dst, []).append(m)
            for msgs in chains.values():
                t0 = env.now
                cost = pp.host_post_ns + pp.stripe_post_ns * (len(msgs) - 1)
                yield w.hold("proxy_post", led.cost("proxy_post", cost))
                w.trace.span(self.proc, self.track, "post", t0, env.now - t0)
                self.qp.posted += len(msgs)
                led.counters["host_wqes"] += len(msgs)
                led.counters["host_doorbells"] += 1
                self.qp.nic.doorbell(msgs)
                did = True
            # 3. counts whose writes have all arrived
            if self.held:
                self._apply_held()
            if did:
                yield w.hold("proxy_post", led.cost("proxy_post", pp.host_poll_ns * len(self.fifos)))
            else:
                yield self.sleep()

    # -- send side -----------------------------------------------------------------------
    def _completed(self, msg: Message) -> None:
        msg.host_done = True
        if msg.kind == "data":
            self.completed[msg.tag] += 1

    def _retire(self) -> None:
        """Retire completed commands at the head of each FIFO (in order: a hole waits) and
        report each to its warp (``proxy.host_to_gpu_ns`` later)."""
        lat = self.ctx.ledger.cost("proxy_queue", self.ctx.platform.proxy.host_to_gpu_ns)
        for fifo in self.fifos:
            while fifo.pending and fifo.pending[0].host_done:
                msg = fifo.pending.popleft()
                self.ctx.later("proxy_queue", lat, msg.port.done.add, 1)

    # -- receive side --------------------------------------------------------------------
    def _received(self, msg: Message) -> None:
        self.ctx.ledger.counters[f"host_recv_cqes_thread{self.index}"] += 1
        if msg.kind == "data":
            self.arrived[msg.tag] += 1
            return
        if self.mode == "imm-counting" and self.arrived[msg.tag] < msg.value:
            self.held.append(msg)  # the count overtook some of its writes: hold it
            return
        self._apply(msg)

    def _apply_held(self) -> None:
        keep = []
        for m in self.held:
            if self.arrived[m.tag] >= m.value:
                self._apply(m)
            else:
                keep.append(m)
        self.held = keep

    def _apply(self, msg: Message) -> None:
        """The atomic the count carries, written where the GPU polls it."""
        rcv = self.table.receivers[self.rank]
        lat = self.ctx.ledger.cost("proxy_queue", self.ctx.platform.proxy.host_to_gpu_ns)
        self.ctx.later("proxy_queue", lat, _deliver, rcv, msg.tag, msg.value)


def _deliver(rcv: Receiver, tag, value: int) -> None:
    """An applied count reached GPU memory: the poller may conclude ``value`` writes."""
    k = rcv.known[tag]
    if value > k.value:
        k.add(value - k.value)
    rcv.flags[tag].add(1)


class UcclPort(WarpPort):
    """One warp's view of UCCL-EP's proxy: a fence and a 128-bit command push per write."""

    def __init__(self, ctx: Context, rank: int, warp: int, table: UcclTable) -> None:
        super().__init__(ctx, rank, warp)
        self.table = table

    def post(self, msg: Message):
        w = self.ctx
        pp, g = w.platform.proxy, w.platform.gpu
        fifo = self.table.fifo_for(self.rank, msg)
        msg.qp = fifo.thread.qp
        msg.ring = fifo  # type: ignore[assignment]  # the FIFO plays the ring's part
        msg.port = self
        msg.on_complete = fifo.thread.send_cqe
        msg.on_visible = self.table.arrived
        msg.t_post = self.env.now
        yield from self._pay_all([("fence", g.fence_ns, 1), ("wqe", pp.descriptor_store_ns, 1)])
        self.posted += 1
        w.ledger.counters["descriptors"] += 1
        w.later("proxy_queue", w.ledger.cost("proxy_queue", pp.gpu_to_host_ns), fifo.push, msg)

    def finish(self):
        return
        yield  # nothing to ring: the host posts

    def flush(self, cat: str = "signal"):
        """Wait until the host retired every command of this warp, then read that report."""
        if self.done.value < self.posted:
            yield from self._wait(cat, self.done.reach(self.posted))
        yield from self._pay(cat, self.ctx.platform.gpu.pcie_read_ns)
