"""A receive completion queue: the CQEs write-with-immediate produces at the target.

Every write-with-immediate that lands produces one receive CQE, written by the NIC
``recv_completion_ns`` after the write became visible. The CQEs of one CQ are consumed
in order by the one GPU thread that owns it (here: one CQ per NIC of the rank, as a
GIN context keeps one per device), and only then does the count a waiting warp polls
move. What consuming costs, per read of the CQ:

- one read of a line of CQEs: a device-memory load where the CQ is in GPU memory, a
  PCIe read where the GPU polls it through a host pointer (p5, p5en:
  ``gpu.completion_counter_in_device_memory`` false). A line holds ``64 / cqe_bytes``
  CQEs at aligned ring positions, so CQEs written close together are read together (what
  the line holds is what was written by the time the read returns);
- per CQE in the line, ``cq_poll_ns`` (parse it, advance the consumer index);
- per CQE, reposting the receive WR it consumed (``rq_repost_ns``), unless the QP has
  unsolicited write receive (``nic.unsolicited_write_recv``, rdma-core 52+).

The owner is one serial resource: CQEs arriving while it is busy wait for it, which is
what makes counting immediates cost more as writes get smaller and more numerous.
Its work is charged to ``signal`` (the counting strategy's cost) on the critical path.

Two owners (``design.recv_cq``):

- ``per-rail``: a thread that reads the CQ whenever a CQE is there (a GIN context's CQ
  per device), from the start of the op.
- ``per-dest-qp`` (hw/ep): the CQ of one destination QP, read only by the warp that
  receives on it, and only while that warp waits (:meth:`spin_start` / :meth:`spin_end`):
  CQEs that came earlier wait for it. A waiting warp spins, one read after the other, so a
  CQE written while a read is out is seen by the next read (the one issued at the next
  multiple of the read's round trip from the spin's start). Where the CQ is in host memory
  the spinning reads are host reads in flight all the while: a system fence of any warp of
  the GPU waits for the one out when it issues (``gpu.fence_waits_host_reads``,
  :class:`~lever.sim.issuer.HostReadPath`), which is what a host-memory receive CQ costs
  the send side.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lever.sim.engine import ROOT, Rec, call_at

if TYPE_CHECKING:
    from lever.sim.context import Context
    from lever.sim.issuer import HostReadPath

CQ_LINE_BYTES = 64
"""One read of the CQ returns one cache line (PCIe read completions and L2 lines: 64 B)."""


class RecvCq:
    """One receive CQ and the thread that consumes it; ``deliver(item)`` runs per CQE, in order."""

    def __init__(self, ctx: Context, deliver: Callable[[Any], None], spins: bool = False,
                 host: HostReadPath | None = None) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.deliver = deliver
        g, nic, rp, d = ctx.platform.gpu, ctx.platform.nic, ctx.platform.receiver, ctx.design
        in_device = ctx.platform.recv_cq_in_device_memory
        self.read_ns = g.device_load_ns if in_device else g.pcie_read_ns
        self.per_line = d.recv_cq_cqes_per_read or max(1, CQ_LINE_BYTES // rp.cqe_bytes)
        self.per_cqe_ns = rp.cq_poll_ns + (0.0 if nic.unsolicited_write_recv else rp.rq_repost_ns)
        self.queue: deque[Any] = deque()
        self.head = 0  # CQEs consumed: the ring position of the next one (lines are aligned)
        self.busy = False
        self._rec: Rec = ROOT  # critical path: the owner's last read, which the next follows
        self.reads = 0
        # per-dest-qp: reads only while the owning warp waits, spinning from ``_phase``; its
        # reads in flight are seen by the GPU's fences where the CQ is in host memory
        self.spins = spins
        self.spinning = False
        self._phase = 0.0
        self._host = host if (spins and not in_device and host is not None
                              and g.fence_waits_host_reads) else None

    def cqe(self, item: Any) -> None:
        """The NIC wrote a CQE now; the owner reads it at once if idle, else after its read
        (per-dest-qp: only if its warp is spinning, with the next read of the spin)."""
        self.queue.append(item)
        if not self.busy and (self.spinning or not self.spins):
            self._read(chained=False)

    def spin_start(self) -> None:
        """The owning warp starts polling the CQ (per-dest-qp)."""
        if self.spinning:
            return
        self.spinning = True
        self._phase = self.env.now
        if self._host is not None:
            self._host.spin(self, self._phase, self.read_ns)
        if self.queue and not self.busy:
            self._read(chained=False)

    def spin_end(self) -> None:
        """The owning warp has what it waited for and stops polling; a read out completes."""
        self.spinning = False
        if self._host is not None:
            self._host.unspin(self)

    def _read(self, chained: bool) -> None:
        """Read the line holding the next CQE; what the line holds is taken when the read
        returns (CQEs written meanwhile into the same line come with it). A spinning warp's
        read that sees a CQE written while it was idle is the first of its reads issued
        after the write."""
        led = self.ctx.ledger
        now = self.env.now
        start = now
        if self.spins and not chained and self.read_ns > 0:
            k = -((self._phase - now) // self.read_ns)  # ceil((now - phase) / read_ns)
            start = self._phase + k * self.read_ns
        dt = (start - now) + led.cost("signal", self.read_ns)
        self.busy = True
        self.reads += 1
        led.counters["recv_cq_reads"] += 1
        path = led.path
        if path is None:
            call_at(self.env, now + dt, self._sampled)
        else:  # behind the owner's previous work, or behind the CQE that woke it
            self._rec = (now, now + dt, "signal", self._rec if chained else path.cur)
            path.call_at(now + dt, self._rec, self._sampled)

    def _sampled(self) -> None:
        """The line came back: consume the CQEs it holds, in order."""
        led = self.ctx.ledger
        room = self.per_line - self.head % self.per_line
        n = min(len(self.queue), room)
        self.head += n
        led.counters["recv_cqes"] += n
        now = self.env.now
        t = now + led.cost("signal", n * self.per_cqe_ns)
        path = led.path
        if path is None:
            call_at(self.env, t, self._done, n)
        else:
            self._rec = (now, t, "signal", self._rec)
            path.call_at(t, self._rec, self._done, n)

    def _done(self, n: int) -> None:
        for _ in range(n):
            self.deliver(self.queue.popleft())
        self.busy = False
        if self.spins:
            if not self.spinning:
                return
            self._phase = self.env.now  # the spin goes on from here, one read after the other
            if self._host is not None:
                self._host.spin(self, self._phase, self.read_ns)
        if self.queue:
            self._read(chained=True)
