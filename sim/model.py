"""The world of one simulated op: every physical piece wired together.

:func:`simulate_op` builds a fresh SimPy environment for one op (dispatch or
combine) of one seed, lets the protocol run every rank, and returns what
happened. All randomness comes from one ``numpy`` generator seeded from the
scenario seed, the run seed and the op, so a (scenario, seed) pair gives the
same numbers bit for bit.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import simpy
from lever.sim.context import Context
from lever.sim.engine import (
    Ledger,
    ModelEnvironment,
    PathEnvironment,
    Trace,
    rec_of,
    run_events,
    walk,
)
from lever.sim.errors import UserError
from lever.sim.fabric import Draws, Fabric
from lever.sim.issuer import CqReadQueue, HostReadPath, NativePort, Port, SlotTurn
from lever.sim.message import Message, Messages
from lever.sim.nic import Nic, QueuePair
from lever.sim.nvlink import Nvlink
from lever.sim.params import Scenario
from lever.sim.protocols import run_protocol
from lever.sim.proxy import ProxyPort, RingTable
from lever.sim.proxy_uccl import UcclPort, UcclTable
from lever.sim.receiver import Receiver
from lever.sim.routing import Routing

OP_SALT = {"dispatch": 1, "combine": 2}


class ModelError(UserError, ValueError):
    """A scenario the model can not run as configured (message says why)."""


class World:
    """Every physical piece of one op, wired: the one place that knows them all.

    The pieces get a :class:`Context` (clock, ledger, trace, parameters) and the
    collaborators they talk to; protocols compose them through this object.
    """

    def __init__(self, scn: Scenario, op: str, seed: int, ledger: Ledger, trace: Trace,
                 routing: Routing, record_path: bool = False) -> None:
        self.scn = scn
        self.platform = scn.platform
        self.workload = scn.workload
        self.design = scn.design
        self.op = op
        # recording the critical path takes an environment whose processes carry it; a
        # plain run a ModelEnvironment (SimPy's, with a two-level queue of the same order);
        # the pieces see the recorder, or None, on the ledger
        self.env = PathEnvironment() if record_path else ModelEnvironment()
        ledger.path = self.env.path if record_path else None
        self.ledger = ledger
        self.trace = trace
        self.routing = routing
        self.rpn = self.workload.ranks_per_node  # a pydantic property: read once, used per token
        self.rng = np.random.default_rng([scn.seed, seed, OP_SALT[op]])
        key = (scn.seed, seed, OP_SALT[op])
        self.fabric = Fabric(self.env, self.platform.fabric, self.rng, ledger, seed_key=key)
        # poll phases: one stream per rank, apart from the fabric's
        self.poll_draws = [Draws(np.random.default_rng([*key, 5000 + r]), self.platform.fabric)
                           for r in range(self.workload.ep_ranks)]
        R = self.workload.ep_ranks
        per = self.platform.nic.nics_per_gpu
        self.nics = [
            Nic(self.env, g * per + i, g, self.platform.nic, self.platform.receiver, self.fabric,
                ledger, trace)
            for g in range(R)
            for i in range(per)
        ]
        pl = self.platform
        for n in self.nics:
            n.peers = self.nics
            n.per_gpu = per
            if not pl.send_completions_in_device_memory:
                n.send_cqe_engine_ns = pl.nic.host_cqe_write_ns
            if not pl.recv_cq_in_device_memory:
                n.recv_cqe_engine_ns = pl.nic.host_cqe_write_ns
        d = self.design
        self.qps = [
            [QueuePair(self.env, q, r, self.nics[r * per + q % per]) for q in range(d.qps_allocated)]
            for r in range(R)
        ]
        # V1 LL cached dispatch (the hw kernels' variant): counts come from the reused handle,
        # no count messages; the receiver counts write-with-immediate completions instead
        self.v1_cached = d.protocol == "v1-ll" and d.cached and op == "dispatch"
        self.signal_mode = "imm-counting" if self.v1_cached else d.signal_mode
        self.ctx = Context(self.env, ledger, trace, self.platform, d)
        if self.platform.nic.host_passes:  # the emulated NIC's host engine, a loop of its own
            for n in self.nics:
                n.make_host_engine(self.ctx, self.platform.nic.host_cqes_per_pass)
        self.receivers = [Receiver(self.ctx, r, self.signal_mode, self.poll_draws[r])
                          for r in range(R)]
        self.messages = Messages(ledger, self.receivers)
        self.rings = RingTable(self.ctx, self.qps, self.messages)
        # the design's own proxy where it is not GIN's (pplx-garden's worker: its protocol's)
        self.uccl = (UcclTable(self.ctx, self.nics, self.receivers, routing, op)
                     if d.proxy.kind == "uccl" else None)
        self.nvlink = Nvlink(self.ctx, R)
        self.channels = d.num_sms * d.warps_per_sm
        reserved = 1 if d.notify_qp_reserved else 0
        self.data_qps = list(range(reserved, d.qps_per_call)) or [0]
        # the channels that post: every channel, or, with owned QPs fewer than the channels,
        # one per data QP as hw/ep's V1 kernels do (ep_kernels.cu c_issue: the first ndata
        # channels issue every write and signal, strided over them; every channel receives)
        self.issue_channels = self.channels
        if d.qp_ownership == "owned" and self.channels > len(self.data_qps):
            if d.protocol != "v1-ll":
                raise ModelError(
                    f"design.qp_ownership = 'owned' needs a data QP per channel: {self.channels} channels "
                    f"(num_sms x warps_per_sm) but {len(self.data_qps)} data QPs (qps_per_call - reserved); "
                    "only v1-ll issues from fewer channels than it has"
                )
            self.issue_channels = len(self.data_qps)
        if d.signal_mode == "unordered-counting" and d.protocol != "v2-hybrid":
            raise ModelError("design.signal_mode = 'unordered-counting' applies to protocol v2-hybrid only")
        if d.signal_mode == "ordered" and self.platform.fabric.mode == "srd":
            ledger.counters["unsafe_ordered_on_srd"] = 1
        self.tails: dict = {}  # last tail value published per (src, dst, tag)
        # V1 LL count/flag writes go through QP 0 when it is kept for notify traffic
        self.counts_on_notify_qp = d.protocol == "v1-ll" and d.notify_qp_reserved
        self._ports: dict[tuple, Port] = {}
        self._host_reads: dict[int, HostReadPath] = {}
        for rcv in self.receivers:  # receive CQs polled through PCIe share the GPU's read path
            rcv.host = self.host_read(rcv.rank)
        if self.platform.nic.host_reads_in_flight:  # so do the emulated NIC's host engines,
            for n in self.nics:                     # warps of the same GPU
                if n.host is not None:
                    n.host.reads = self.host_read(n.gpu)
        self._cq_reads: dict[int, CqReadQueue] = {}
        self._turns: dict[int, SlotTurn] = {}
        for r in range(R):
            for c in range(self.issue_channels):
                self.qp_of(r, c).owners += 1
                if self.counts_on_notify_qp:
                    self.qps[r][0].owners += 1

    def close(self) -> None:
        """The op has run and its results are read: break the world's reference cycles
        (the environment's and its waiting daemons', ``ModelEnvironment.close``; the NICs'
        peer table; the proxy rings and their threads; the UCCL threads and their FIFOs) so
        that reference counting frees it at once instead of the cyclic collector
        (``tests/test_engine.py`` checks every design); the world is unusable afterwards."""
        close = getattr(self.env, "close", None)  # a bare SimPy environment (a test's) has none
        if close is not None:
            close()
        for n in self.nics:
            n.peers = []
            if n.host is not None:  # its queued WQEs and CQEs point back at it
                n.host.close()
        self.rings.close()
        if self.uccl is not None:
            self.uccl.close()

    # -- mapping ----------------------------------------------------------------
    def node_of(self, rank: int) -> int:
        return rank // self.rpn

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of(a) == self.node_of(b)

    def qp_of(self, rank: int, channel: int) -> QueuePair:
        """Data channel -> QP: channels start at QP 1 when QP 0 is kept for notify warps."""
        return self.qps[rank][self.data_qps[channel % len(self.data_qps)]]

    def lazy(self) -> bool:
        """Lazy completion applies only when the SQ provably can not overflow."""
        d = self.design
        want = d.lazy_completion_dispatch if self.op == "dispatch" else d.lazy_completion_combine
        if not want:
            return False
        worst = self.routing.max_puts_per_qp(d)
        if worst > self.platform.nic.sq_depth:
            self.ledger.counters["lazy_refused"] = 1
            return False
        return True

    def host_read(self, rank: int) -> HostReadPath:
        """The rank's GPU's read path to host memory, shared by all its warps' polls."""
        h = self._host_reads.get(rank)
        if h is None:
            h = self._host_reads[rank] = HostReadPath()
        return h

    def cq_reads(self, qp: QueuePair) -> CqReadQueue:
        """The polls of one QP's send CQ, shared by every warp posting on the QP."""
        q = self._cq_reads.get(id(qp))
        if q is None:
            q = self._cq_reads[id(qp)] = CqReadQueue()
        return q

    def turn(self, qp: QueuePair) -> SlotTurn:
        """The slot-order doorbell turn of one QP, shared by every warp posting on it."""
        t = self._turns.get(id(qp))
        if t is None:
            t = self._turns[id(qp)] = SlotTurn(self.env)
        return t

    def port(self, rank: int, channel: int) -> Port:
        key = (rank, channel)
        p = self._ports.get(key)
        if p is None:
            if self.design.path == "native":
                qp = self.qp_of(rank, channel)
                p = NativePort(self.ctx, rank, channel, qp, self.lazy(), self.host_read(rank),
                               self.cq_reads(qp), self.turn(qp))
            else:
                p = self._proxy_port(rank, channel, self.data_qps[channel % len(self.data_qps)])
            self._ports[key] = p
        return p

    def signal_port(self, rank: int, channel: int) -> Port:
        """Where a warp posts its count/flag writes: its data port, or (V1 LL with the
        notify QP kept) its own port on QP 0, shared by every warp of the rank."""
        if not self.counts_on_notify_qp:
            return self.port(rank, channel)
        key = (rank, channel, "signal")
        p = self._ports.get(key)
        if p is None:
            if self.design.path == "native":
                p = NativePort(self.ctx, rank, channel, self.qps[rank][0], self.lazy(),
                               self.host_read(rank), self.cq_reads(self.qps[rank][0]),
                               self.turn(self.qps[rank][0]))
            else:
                p = self._proxy_port(rank, channel, 0)
            self._ports[key] = p
        return p

    def notify_port(self, rank: int) -> Port:
        """Notify warps: QP 0 when reserved, else they share channel 0's QP."""
        key = (rank, -1)
        p = self._ports.get(key)
        if p is None:
            if self.design.path == "native":
                qp = self.qps[rank][0]
                qp.owners += 1
                p = NativePort(self.ctx, rank, -1, qp, lazy=True)
                p.track = "notify"
            else:
                p = self._proxy_port(rank, -1, 0)
                p.track = "notify"
            self._ports[key] = p
        return p

    def _proxy_port(self, rank: int, channel: int, qp_ctx: int) -> Port:
        """A warp's port on the design's proxy: GIN's descriptor rings (``qp_ctx`` the GIN
        context), or UCCL-EP's FIFOs (the FIFO chosen per write)."""
        if self.uccl is not None:
            return UcclPort(self.ctx, rank, channel, self.uccl)
        return ProxyPort(self.ctx, rank, channel, qp_ctx, self.rings)

    def message(self, src: int, dst: int, nbytes: int, tag, kind: str = "data",
                value: int = 1, seq: int = 0) -> Message:
        return self.messages.new(src, dst, nbytes, tag, kind, value, seq)


@dataclass
class OpResult:
    """One op of one seed: per-rank latency (us) and the ledger."""

    op: str
    seed: int
    latency_us: list[float]
    ledger: Ledger
    events: int
    trace: Trace | None = None
    counters: dict[str, int] = field(default_factory=dict)
    mean_pending: float | None = None  # mean length of SimPy's event queue (with ``depth=True``)
    # with ``critical_path=True``: per rank, us per category along the chain that ended it
    # (sums to ``latency_us[rank]``), and the largest gap found in any chain (ns, ~0)
    critical_path: list[dict[str, float]] | None = None
    path_gap_ns: float | None = None


def simulate_op(scn: Scenario, op: str, seed: int, scale: dict[str, float] | None = None,
                trace: bool = False, depth: bool = False, critical_path: bool = False,
                keep: list | None = None) -> OpResult:
    """Run one op for one seed; ``scale`` zeroes or scales cost categories.

    ``depth`` also samples how many events are pending (the heap SimPy pops
    from), for the speed benchmark: SimPy's own cost per event grows with it.
    ``critical_path`` records, in the same run, what released every wait and what
    every timed segment was (``sim/engine.py``, :class:`CriticalPath`), and walks each
    rank's chain back from its end; the run itself is the same bit for bit.
    ``keep``: the finished run is appended there, not freed on return, and frozen out of the
    collector's reach (``gc.freeze``), so its owner frees it when the result is on its way
    (a pool worker, at its next job or its exit: freeing a recorded EP256 dispatch is 0.7 s).
    """
    # the collector stays off until the world is freed: re-enabled while it is alive, its
    # first pass would traverse everything the run allocated (5% of a recorded EP128 dispatch)
    with _gc_paused():
        return _simulate_op(scn, op, seed, scale, trace, depth, critical_path, keep)


def _simulate_op(scn: Scenario, op: str, seed: int, scale: dict[str, float] | None,
                 trace: bool, depth: bool, critical_path: bool, keep: list | None = None) -> OpResult:
    ledger = Ledger(scale=dict(scale or {}))
    tr = Trace(enabled=trace)
    routing = Routing.for_scenario(scn, seed)
    world = World(scn, op, seed, ledger, tr, routing, record_path=critical_path)
    done = run_protocol(world)
    env = world.env
    mean_pending = None
    if depth:
        n_events, mean_pending = _run_sampling_depth(env)
    else:
        n_events = _run_counting(env)
    lat = []
    for r, ev in enumerate(done):
        if not ev.triggered:
            raise ModelError(f"{op}: rank {r} never completed (deadlock in the model)")
        lat.append(float(ev.value) / 1e3)
    res = OpResult(op, seed, lat, ledger, n_events, tr if trace else None, dict(ledger.counters),
                   mean_pending)
    if critical_path:
        res.critical_path, res.path_gap_ns = [], 0.0
        for ev in done:
            ns, gap = walk(rec_of(ev))
            res.critical_path.append({c: float(v) / 1e3 for c, v in ns.items() if c})
            res.path_gap_ns = max(res.path_gap_ns, float(gap))
        ledger.path = None  # the recorder holds the environment: not part of the result
    world.close()
    if keep is not None:
        keep.append(world)
        gc.freeze()  # the collector, re-enabled on return, would traverse all of it
    return res


@contextmanager
def _gc_paused():
    """The cyclic garbage collector off for an event loop, restored after.

    A finished run leaves no reference cycles (``World.close``), yet during the run
    generation scans over the live processes and events cost 10% (EP16) to 22% (EP128)
    of the time.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _run_counting(env: simpy.Environment) -> int:
    """Run to exhaustion counting processed events: :func:`run_events`, every event."""
    with _gc_paused():
        return run_events(env)


def _run_sampling_depth(env: simpy.Environment, every: int = 64) -> tuple[int, float]:
    """:func:`_run_counting` plus the queue length every ``every`` events; the same
    events, the same order."""
    n = 0
    total = 0
    samples = 0
    pending = getattr(env, "pending", lambda: len(env._queue))  # a ModelEnvironment's buckets too
    with _gc_paused():
        while True:
            k = run_events(env, every)
            n += k
            if k < every:
                break
            total += pending()
            samples += 1
    return n, total / max(1, samples)
