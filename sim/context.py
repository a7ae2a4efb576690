"""What every physical piece of one simulated op shares, and nothing more.

A piece (a warp's port, a proxy thread, the receiver, NVLink) needs the clock,
the cost ledger, the trace sink and the parameters; anything else it talks to
(its queue pair, the descriptor rings, the message factory) is handed to it
when it is built, so the wiring is visible in ``sim/model.py`` and no piece
reaches back into the world that made it.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy
from lever.sim.engine import Ledger, Trace, call_later, hold
from lever.sim.params import Design, Platform


@dataclass(frozen=True, slots=True)
class Context:
    env: simpy.Environment
    ledger: Ledger
    trace: Trace
    platform: Platform
    design: Design

    def hold(self, cat: str, t: float) -> simpy.Event:
        """The running process spends ``t`` ns on ``cat`` (yield the result): the timeout,
        recorded as a segment of its chain when the critical path is recorded."""
        path = self.ledger.path
        if path is not None:
            path.seg(cat, t)
        return hold(self.env, t)

    def busy(self, cat: str, ns: float, n: int = 1) -> simpy.Event:
        """A warp's own work: the scaled cost counted for the profiler, then :meth:`hold`
        (inlined: one call per token on the hot path)."""
        led = self.ledger
        t = led.issue(cat, ns, n)
        if led.path is not None:
            led.path.seg(cat, t)
        return hold(self.env, t)

    def later(self, cat: str, delay: float, fn, *args) -> None:
        """``fn(*args)`` ``delay`` ns from now: a delayed effect of a piece (a receive CQE
        written, a push seen by the host, a report seen by the GPU), recorded as a segment
        of ``cat`` on the critical path when it is recorded."""
        path = self.ledger.path
        if path is None:
            call_later(self.env, delay, fn, *args)
        else:
            path.later(cat, delay, fn, *args)
