"""Intra-node GPU-to-GPU traffic over NVLink: stores/copies and flags.

Each GPU has one NVLink egress port whose bandwidth copies share (arithmetic
"port free at" time, no process per copy); a copy or a flag becomes visible at
the peer ``flag_latency_ns`` after its last byte left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lever.sim.engine import ROOT, Rec, call_later, hold

if TYPE_CHECKING:
    from lever.sim.context import Context


class Nvlink:
    """Every GPU's NVLink egress port: copies serialise on it, flags ride behind them."""

    def __init__(self, ctx: Context, n_gpus: int) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.port_free = [0.0] * n_gpus
        self.port_rec: list[Rec] = [ROOT] * n_gpus  # critical path: the copy ending at port_free
        self.ns_per_byte = 1.0 / ctx.platform.nvlink.gbytes_per_s  # GB/s == bytes/ns

    def copy(self, src: int, dst: int, nbytes: int, track: str, on_visible=None):
        """The issuing warp streams ``nbytes`` to ``dst``; returns when its stores are issued.

        The warp is busy for the serialisation time (category ``forward``);
        ``on_visible`` runs at the peer after the link latency.
        """
        ctx = self.ctx
        led = ctx.ledger
        path = led.path
        now = self.env.now
        queued = self.port_free[src] > now
        start = max(now, self.port_free[src])
        ser = led.cost("forward", nbytes * self.ns_per_byte)
        self.port_free[src] = start + ser
        busy = self.port_free[src] - now
        led.issue("forward", busy)
        led.counters["nvlink_bytes"] += nbytes
        lat = led.cost("forward", ctx.platform.nvlink.flag_latency_ns)
        if path is not None:  # the stores, behind the port's previous copy when it is busy
            self.port_rec[src] = (start, self.port_free[src], "forward",
                                  self.port_rec[src] if queued else path.cur)
        if on_visible is not None:
            if path is None:
                call_later(self.env, busy + lat, on_visible)
            else:
                path.call_later(busy + lat, (self.port_free[src], now + (busy + lat), "forward",
                                             self.port_rec[src]), on_visible)
        if busy > 0:
            if path is not None:
                path.cur = self.port_rec[src]  # the warp is done when its stores are
            yield hold(self.env, busy)
            if ctx.trace.enabled:
                ctx.trace.span(f"rank{src}", track, "nvlink", now, busy, dst=dst, bytes=nbytes)

    def flag(self, src: int, on_visible) -> None:
        """A flag from ``src``: issued after its earlier NVLink stores (never overtakes them),
        ``on_visible`` at the peer after the link latency."""
        led = self.ctx.ledger
        path = led.path
        now = self.env.now
        lat = max(0.0, self.port_free[src] - now) + led.cost(
            "forward", self.ctx.platform.nvlink.flag_latency_ns)
        if path is None:
            call_later(self.env, lat, on_visible)
        else:
            if self.port_free[src] > now:
                start, pred = self.port_free[src], self.port_rec[src]
            else:
                start, pred = now, path.cur
            path.call_later(lat, (start, now + lat, "forward", pred), on_visible)
