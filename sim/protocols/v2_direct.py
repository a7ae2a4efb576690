"""DeepEP V2 direct: count exchange, one write per (token, destination rank), then a barrier.

The barrier: every data context flushed (wait for local completion of every
put; on the proxy path, for the host's progress), a grid sync, one signal per
peer on context 0 (the notify QP), and a poll of every peer's signal.
Intra-node peers are reached over NVLink. ``cached`` skips the count exchange.
Combine sends each received token's result row back to its source rank the
same way and ends with the per-token top-k reduction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lever.sim.protocols.common import (
    Barrier,
    final_reduce_ns,
    notify_exchange,
    nvlink_flag,
    nvlink_put,
    publish,
    put,
)
from lever.sim.tags import RankTag

if TYPE_CHECKING:
    from lever.sim.model import World


def run(w: World) -> list:
    R = w.workload.ep_ranks
    rt = w.routing
    dispatch = w.op == "dispatch"
    C = w.channels
    items: list[list[tuple[int, int, int]]] = [[] for _ in range(R)]  # (channel, dst, token)
    if dispatch:
        for s in range(R):
            for t, dsts in enumerate(rt.dst_ranks[s]):
                for d in dsts:
                    items[s].append((t % C, d, t))
    else:
        k = [0] * R
        for src in range(R):
            for t, dsts in enumerate(rt.dst_ranks[src]):
                for d in dsts:
                    items[d].append((k[d] % C, src, t))
                    k[d] += 1
    n_to = [[0] * R for _ in range(R)]
    for s in range(R):
        for _c, d, _t in items[s]:
            n_to[s][d] += 1
    return [w.env.process(_rank(w, r, items[r], n_to, dispatch)) for r in range(R)]


def _rank(w: World, r: int, items, n_to, dispatch: bool):
    env = w.env
    R = w.workload.ep_ranks
    C = w.channels
    d = w.design
    g = w.platform.gpu
    wl = w.workload
    nbytes = wl.dispatch_bytes_per_token if dispatch else wl.combine_bytes_per_token
    peers = [p for p in range(R) if p != r]
    if not d.cached:
        yield from notify_exchange(w, r, peers)
    by_ch: dict[int, list] = {}
    for it in items:
        by_ch.setdefault(it[0], []).append(it)
    barrier = Barrier(w, C)
    tag = RankTag(r)

    def warp(c: int):
        port = w.port(r, c)
        last = -1
        for _c, dst, tok in by_ch.get(c, []):
            if dispatch and tok != last:
                yield w.ctx.busy("compute", g.token_prep_ns)
            last = tok
            if dst == r:
                continue
            if w.same_node(r, dst):
                yield from nvlink_put(w, r, dst, nbytes, tag, port.track)
            else:
                yield from put(w, port, r, dst, nbytes, tag)
        # the barrier's signals go on the notify QP, apart from this warp's data QP: no single
        # connection orders them, so flag-after-data modes flush every context first
        if (d.path == "native" and d.signal_mode in ("flush", "ordered")) or d.path == "proxy":
            yield from port.flush("signal")
        else:
            yield from port.finish()
        yield from barrier.arrive()

    yield env.all_of([env.process(warp(c)) for c in range(C)])
    sport = w.notify_port(r)
    for p in peers:
        if w.same_node(r, p):
            nvlink_flag(w, r, p, tag, n_to[r][p])
        else:
            yield from publish(w, sport, r, p, tag, n_to[r][p], flushed=True)
    yield from sport.finish()
    rcv = w.receivers[r]
    for p in peers:
        yield from rcv.wait(RankTag(p), n_to[p][r], "barrier", flags=1)
    if not dispatch:
        kib = wl.combine_bytes_per_token / 1024
        yield w.ctx.busy("compute", final_reduce_ns(w, kib * wl.top_k * wl.tokens_per_rank))
    return env.now
