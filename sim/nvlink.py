"""Intra-node GPU-to-GPU traffic over NVLink: stores/copies and flags.

Each GPU has one NVLink egress port whose bandwidth copies share (arithmetic
"port free at" time, no process per copy); a copy or a flag becomes visible at
the peer ``flag_latency_ns`` after its last byte left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lever.sim.engine import call_later

if TYPE_CHECKING:
    from lever.sim.context import Context


class Nvlink:
    """Every GPU's NVLink egress port: copies serialise on it, flags ride behind them."""

    def __init__(self, ctx: Context, n_gpus: int) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.port_free = [0.0] * n_gpus
        self.ns_per_byte = 1.0 / ctx.platform.nvlink.gbytes_per_s  # GB/s == bytes/ns

    def copy(self, src: int, dst: int, nbytes: int, track: str, on_visible=None):
        """The issuing warp streams ``nbytes`` to ``dst``; returns when its stores are issued.

        The warp is busy for the serialisation time (category ``forward``);
        ``on_visible`` runs at the peer after the link latency.
        """
        ctx = self.ctx
        led = ctx.ledger
        now = self.env.now
        start = max(now, self.port_free[src])
        ser = led.cost("forward", nbytes * self.ns_per_byte)
        self.port_free[src] = start + ser
        busy = self.port_free[src] - now
        led.issue("forward", busy)
        led.counters["nvlink_bytes"] += nbytes
        lat = led.cost("forward", ctx.platform.nvlink.flag_latency_ns)
        if on_visible is not None:
            call_later(self.env, busy + lat, on_visible)
        if busy > 0:
            yield self.env.timeout(busy)
            if ctx.trace.enabled:
                ctx.trace.span(f"rank{src}", track, "nvlink", now, busy, dst=dst, bytes=nbytes)
