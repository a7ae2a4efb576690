"""The emulated NIC's host-facing engine: one serial loop per NIC that reads host doorbells in
passes, copies the rung WQEs into the NIC's device mirror, and writes CQEs into host memory.

Why a loop and not "free at" arithmetic: the testbed's engine (``hw/ep/ep_kernels.cu``
``nic_warp``, warp 0 of a NIC block with a queue in host memory) alternates. Each turn of its
loop reads every doorbell it serves at once (one PCIe round trip), copies the new WQEs of each
QP whose doorbell moved (one copy per moved QP, however many WQEs were rung on it since the
last read; the testbed's copy grows with the WQEs it carries, 5.9 us + 0.29 us a WQE across
57 H100 records, ``benchmarks/host_copy_per_wqe.py``: ``nic.host_mirror_copy_per_wqe_ns``, off
as shipped), then writes at most a claim's worth of due CQEs. So how many copies a WQE costs
depends on how many QPs ring between two reads (16 owned QPs ring apart, 8 shared ones ring
together), and a CQE waits behind the copies of the turn before it. Measured on an H100
(``hw/run_host_engine_on_device.sh``): a pass reads in 1.4-1.6 us, a copy takes 5.5-9 us under
load, and qp17-ownership makes 3.2x the baseline's copies for the same WQEs.

The engine is warps of the same GPU as the issuers, so its reads of host memory (a pass's
doorbell read, a copy's WQE reads: the copy's time is mostly its reads coming back) are host
reads in flight of that GPU: a system fence or a system-scope release of a doorbell turn
issued meanwhile waits for them (``nic.host_reads_in_flight`` with
``gpu.fence_waits_host_reads``; the turn_handoff primitives measured the release growing from
0.75 us alone to 2.7 us beside 8 warps reading host memory). The testbed's lazy-completion
dispatch, with no credit polls, still pays 2.1 us per doorbell release against 0.6-0.75 alone.
Off on the shipped platforms (README, Leave one lever out).

A real EFA device owns its doorbell BAR and writes CQEs by DMA: no EFA or IB platform has
this engine (``nic.host_engine = false``).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from lever.sim.engine import Wakeup, start_daemon

if TYPE_CHECKING:
    from lever.sim.context import Context
    from lever.sim.issuer import HostReadPath
    from lever.sim.message import Message
    from lever.sim.nic import Nic, QueuePair


class HostEngine(Wakeup):
    """One NIC's host-facing engine (``nic.host_passes``): its doorbells not yet read, its CQEs
    not yet written, and the loop that serves both (asleep while it has neither)."""

    def __init__(self, ctx: Context, nic: Nic, claim: int) -> None:
        super().__init__(ctx.env, ctx.ledger)
        self.ctx = ctx
        self.nic = nic
        self.rung: dict[QueuePair, list[Message]] = {}  # rung since the last read, in ring order
        self.cqes: deque[tuple[float, object, tuple]] = deque()  # (ns, then, args), due order
        p = nic.p
        self._read = p.host_doorbell_read_ns
        self._copy = p.host_mirror_copy_ns
        self._copy_per_wqe = p.host_mirror_copy_per_wqe_ns  # its reads of each WQE it carries
        self._claim = claim  # CQEs written per turn of the loop (the testbed's claim batch)
        # the GPU's read path to host memory (set by the model): the engine's reads are in
        # flight on it, so the GPU's fences wait for them
        self.reads: HostReadPath | None = None
        start_daemon(self.env, self._loop())

    def _reading(self, ns: float) -> None:
        """A read of host memory by the engine, from now for ``ns``: in flight on the GPU."""
        r = self.reads
        if r is not None:
            r.in_flight_until(self.env._now + ns)

    def doorbell(self, qp: QueuePair, msgs: list[Message]) -> None:
        """A doorbell of ``qp`` moved: its WQEs wait for the next pass to read it."""
        got = self.rung.get(qp)
        if got is None:
            self.rung[qp] = list(msgs)
        else:
            got.extend(msgs)
        self.kick()

    def cqe(self, ns: float, then, args: tuple) -> None:
        """A CQE is due: written on a later turn, ``ns`` of the engine's time, then ``then``."""
        self.cqes.append((ns, then, args))
        self.kick()

    def close(self) -> None:
        """End of run: what is still queued points back at the NIC (``World.close``)."""
        self.rung = {}
        self.cqes.clear()

    def _span(self, name: str, start: float) -> None:
        """A Perfetto span on the NIC's "host engine" track (when the run is traced)."""
        trace = self.nic.trace
        if trace.enabled:
            trace.span(f"nic{self.nic.index}", "host engine", name, start, self.env._now - start)

    def _loop(self):
        led = self.ledger
        counters = led.counters
        nic = self.nic
        hold = self.ctx.hold
        while True:
            if not self.rung and not self.cqes:
                yield self.sleep()
                continue
            # a pass: every doorbell read at once, as they stand when the read is issued; the
            # QPs that moved since the last read are copied after it
            counters["nic_host_passes"] += 1
            moved, self.rung = self.rung, {}
            t0 = self.env._now
            t = led.cost("nic", self._read)
            self._reading(t)
            yield hold("nic", t)
            self._span("doorbell read", t0)
            for msgs in moved.values():
                counters["nic_host_qp_copies"] += 1
                t0 = self.env._now
                t = led.cost("nic", self._copy + self._copy_per_wqe * len(msgs))
                self._reading(t)
                yield hold("nic", t)
                self._span(f"copy {len(msgs)} WQE", t0)
                nic.parse(msgs)  # mirrored: the WQE engine takes them
            for _ in range(min(self._claim, len(self.cqes))):
                ns, then, args = self.cqes.popleft()
                t0 = self.env._now
                yield hold("nic", led.cost("nic", ns))
                self._span("CQE", t0)
                then(*args)
