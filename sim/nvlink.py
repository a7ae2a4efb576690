"""Intra-node GPU-to-GPU traffic over NVLink: stores/copies and flags.

Each GPU has one NVLink egress port whose bandwidth copies share (arithmetic
"port free at" time, no process per copy); a copy or a flag becomes visible at
the peer ``flag_latency_ns`` after its last byte left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lever.sim.engine import ROOT, Rec, Tally, call_at, call_later, hold

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
        self.lat_ns = ctx.platform.nvlink.flag_latency_ns
        led = ctx.ledger  # its factor, sums and counters, read once (fixed for a run)
        self._f = led.factor("forward")
        self._busy = led.busy
        self._events = led.events
        self._counters = led.counters

    def reserve(self, src: int, nbytes: int, now: float, cur: Rec | None
                ) -> tuple[float, float, Rec | None]:
        """Book ``nbytes`` of stores from ``src`` issued at ``now`` on its port: the warp's busy
        time (its stores, behind the port's earlier copies), the instant the bytes are
        visible at the peer, and the segment they are visible at the end of (``cur``: the
        warp's own segment, None when no path is recorded). Pure "free at" arithmetic, counted
        for the profiler: what :meth:`copy` does before it waits, and what a closed pipeline
        of copies (``protocols/v2_hybrid.py``'s expert warps) computes without events."""
        f = self._f
        free = self.port_free[src]
        queued = free > now
        start = free if queued else now
        # led.cost("forward", ...), led.issue("forward", busy): the same products and sums
        free = self.port_free[src] = start + nbytes * self.ns_per_byte * f
        busy = free - now
        self._busy["forward"] += busy * f
        self._events["forward"] += 1
        self._counters["nvlink_bytes"] += nbytes
        lat = self.lat_ns * f
        t_vis = now + (busy + lat)  # where call_later(busy + lat) lands
        if cur is None:
            return busy, t_vis, None
        rec = self.port_rec[src] = (start, free, "forward", self.port_rec[src] if queued else cur)
        return busy, t_vis, (free, t_vis, "forward", rec)

    def send(self, src: int, dst: int, nbytes: int, track: str, on_visible=None, *args):
        """The issuing warp streams ``nbytes`` to ``dst``: the event to wait for until its
        stores are issued (None when the port takes them at once), for the warp to yield.

        The warp is busy for the serialisation time (category ``forward``);
        ``on_visible(*args)`` runs at the peer after the link latency. A plain function, not
        a generator: the warp yields the event itself (no generator per copy)."""
        env = self.env
        ctx = self.ctx
        path = ctx.ledger.path
        now = env._now
        busy, t_vis, vis_rec = self.reserve(src, nbytes, now, None if path is None else path.cur)
        if on_visible is not None:
            if path is None:
                call_at(env, t_vis, on_visible, *args)
            else:
                path.call_at(t_vis, vis_rec, on_visible, *args)
        if busy > 0:
            if path is not None:
                path.cur = self.port_rec[src]  # the warp is done when its stores are
            if ctx.trace.enabled:
                ctx.trace.span(f"rank{src}", track, "nvlink", now, busy, dst=dst, bytes=nbytes)
            return hold(env, busy)
        return None

    def send_ahead(self, src: int, dst: int, nbytes: int, track: str, tally: Tally,
                   k: int = 1):
        """:meth:`send` whose landing is booked on ``tally`` now (``k`` writes, at the instant
        the bytes are visible at the peer) rather than called at that instant: for a count
        read only at its total (``engine.Tally``). The event to wait for, or None."""
        env = self.env
        ctx = self.ctx
        path = ctx.ledger.path
        now = env._now
        busy, t_vis, vis_rec = self.reserve(src, nbytes, now, None if path is None else path.cur)
        tally.add_at(t_vis, k, vis_rec)
        if busy > 0:
            if path is not None:
                path.cur = self.port_rec[src]
            if ctx.trace.enabled:
                ctx.trace.span(f"rank{src}", track, "nvlink", now, busy, dst=dst, bytes=nbytes)
            return hold(env, busy)
        return None

    def self_copy(self, src: int, nbytes: int, track: str, on_visible, *args):
        """A put to the rank itself copied by the issuing warp (``nvlink.self_copy_loads_in_flight``
        = N > 0): one step per 512 x N bytes (the warp's 32 lanes, N 16-byte loads each), each
        step waiting for its loads (``nvlink.self_copy_step_ns``, else a dependent device load,
        ``gpu.device_load_ns``) before its stores, then a GPU-scope fence; ``on_visible(*args)`` when the fence is done. Why a
        warp's own loop and not the port: such a copy is bound by the loads one warp keeps in
        flight (hw/ep local_put: one per lane, 15 steps for a 7.5 KiB token), not by the
        link's bandwidth. The event to wait for."""
        ctx = self.ctx
        g = ctx.platform.gpu
        nl = ctx.platform.nvlink
        per_step = 512 * nl.self_copy_loads_in_flight
        steps = -(-nbytes // per_step)
        step_ns = g.device_load_ns if nl.self_copy_step_ns is None else nl.self_copy_step_ns
        t = ctx.ledger.issue("forward", steps * step_ns + g.fence_gpu_ns)
        self._counters["nvlink_bytes"] += nbytes
        self._counters["self_copies"] += 1
        path = ctx.ledger.path
        if path is not None:
            path.seg("forward", t)
            path.call_later(t, path.cur, on_visible, *args)
        else:
            call_later(self.env, t, on_visible, *args)
        if ctx.trace.enabled:
            ctx.trace.span(f"rank{src}", track, "nvlink", self.env.now, t, dst=src, bytes=nbytes)
        return hold(self.env, t)

    def copy(self, src: int, dst: int, nbytes: int, track: str, on_visible=None, *args):
        """:meth:`send` as a process fragment (``yield from nvlink.copy(...)``)."""
        ev = self.send(src, dst, nbytes, track, on_visible, *args)
        if ev is not None:
            yield ev

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
