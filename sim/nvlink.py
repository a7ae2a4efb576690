"""Intra-node GPU-to-GPU traffic over NVLink: stores/copies and flags.

Each GPU has one NVLink egress port whose bandwidth copies share (arithmetic
"port free at" time, no process per copy); a copy or a flag becomes visible at
the peer ``flag_latency_ns`` after its last byte left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lever.sim.engine import call_later

if TYPE_CHECKING:
    from lever.sim.model import World


class Nvlink:
    def __init__(self, world: World, n_gpus: int) -> None:
        self.w = world
        self.env = world.env
        self.port_free = [0.0] * n_gpus
        self.ns_per_byte = 1.0 / world.platform.nvlink.gbytes_per_s  # GB/s == bytes/ns

    def copy(self, src: int, dst: int, nbytes: int, track: str, on_visible=None):
        """The issuing warp streams ``nbytes`` to ``dst``; returns when its stores are issued.

        The warp is busy for the serialisation time (category ``forward``);
        ``on_visible`` runs at the peer after the link latency.
        """
        w = self.w
        led = w.ledger
        now = self.env.now
        start = max(now, self.port_free[src])
        ser = led.cost("forward", nbytes * self.ns_per_byte)
        self.port_free[src] = start + ser
        busy = self.port_free[src] - now
        led.issue("forward", busy)
        led.counters["nvlink_bytes"] += nbytes
        lat = led.cost("forward", w.platform.nvlink.flag_latency_ns)
        if on_visible is not None:
            call_later(self.env, busy + lat, on_visible)
        if busy > 0:
            yield self.env.timeout(busy)
            if w.trace.enabled:
                w.trace.span(f"rank{src}", track, "nvlink", now, busy, dst=dst, bytes=nbytes)
