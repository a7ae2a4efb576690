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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lever.sim.engine import ROOT, Rec, call_at

if TYPE_CHECKING:
    from lever.sim.context import Context

CQ_LINE_BYTES = 64
"""One read of the CQ returns one cache line (PCIe read completions and L2 lines: 64 B)."""


class RecvCq:
    """One receive CQ and the thread that consumes it; ``deliver(item)`` runs per CQE, in order."""

    def __init__(self, ctx: Context, deliver: Callable[[Any], None]) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.deliver = deliver
        g, nic, rp = ctx.platform.gpu, ctx.platform.nic, ctx.platform.receiver
        self.read_ns = g.device_load_ns if g.completion_counter_in_device_memory else g.pcie_read_ns
        self.per_line = max(1, CQ_LINE_BYTES // rp.cqe_bytes)
        self.per_cqe_ns = rp.cq_poll_ns + (0.0 if nic.unsolicited_write_recv else rp.rq_repost_ns)
        self.queue: deque[Any] = deque()
        self.head = 0  # CQEs consumed: the ring position of the next one (lines are aligned)
        self.busy = False
        self._rec: Rec = ROOT  # critical path: the owner's last read, which the next follows
        self.reads = 0

    def cqe(self, item: Any) -> None:
        """The NIC wrote a CQE now; the owner reads it at once if idle, else after its read."""
        self.queue.append(item)
        if not self.busy:
            self._read(chained=False)

    def _read(self, chained: bool) -> None:
        """Read the line holding the next CQE; what the line holds is taken when the read
        returns (CQEs written meanwhile into the same line come with it)."""
        led = self.ctx.ledger
        now = self.env.now
        dt = led.cost("signal", self.read_ns)
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
        if self.queue:
            self._read(chained=True)
