"""DeepEP V1 low-latency: one write per (token, expert), then a count per (expert, source rank).

Dispatch: warp ``t mod channels`` packs token ``t`` and writes it to each of its
top-k experts (NVLink when the expert's rank is on the same node and
``ll_intranode_nvlink``, RDMA otherwise). After a grid sync, warp ``e mod
channels`` sends the count of tokens for expert ``e`` (the flag the receiver
polls; through QP 0 when it is kept for notify traffic). In ``flush`` mode every warp first waits for the send completions of
its data (SRD-safe). Then the same warps turn receivers (DeepEP LL's receive
phase): each polls, for its local experts, every source's count and then knows
(by the signalling strategy) that many tokens landed.

Where the receiver counts write-with-immediate completions (``signal_mode =
"imm-counting"``, and cached dispatch) there is no grid sync: nothing has to be flushed
before a count, so each warp sends its counts as soon as its own writes are posted (hw/ep's
``dispatch_rank`` skips both the flush and the rank barrier then; DeepEP LL waits only for
the expert's own sends). With the sync, every warp's counts leave together, and on a shared
QP 0 they queue for its CQ's reads at once (the testbed's 88 us credit reads on QP 0 after
the barrier, 3.4 us without it: calibration/data/testbed/h100-713e7da).

``cached`` dispatch (as the hw kernels build it): the layout handle of the
previous call gives every count, so no count messages are sent and no flush
precedes them; the receiver counts write-with-immediate completions.

With owned QPs fewer than the channels (``design.qp_ownership = "owned"``), only the first
``World.issue_channels`` channels post, one per data QP, with every write and signal dealt
over them; every channel still receives (hw/ep's ``c_issue``).

Combine is the same exchange in reverse: every (token, expert) result goes back
to its source rank (BF16 row), counts per (expert, source), then the source
reduces its top-k rows per token. With ``ll_combine_flags = "per-rank"`` (the hw/ep
kernels) a rank sends one flag per destination rank after all its rows to it, and
every receiving warp polls every source's flag before the reduction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lever.sim.issuer import warp_track
from lever.sim.protocols.common import (
    Barrier,
    final_reduce_ns,
    nvlink_flag,
    nvlink_put,
    publish,
    put,
)
from lever.sim.tags import ExpertTag, RankTag

if TYPE_CHECKING:
    from lever.sim.model import World


def run(w: World) -> list:
    env = w.env
    R = w.workload.ep_ranks
    rt = w.routing
    dispatch = w.op == "dispatch"
    nbytes = w.workload.dispatch_bytes_per_token if dispatch else w.workload.combine_bytes_per_token
    C = w.issue_channels
    # items[r]: (channel, dst, tag, token) per write, in issue order; counts[(src, dst, expert)] = n
    items: list[list[tuple[int, int, tuple, int]]] = [[] for _ in range(R)]
    counts: dict[tuple[int, int, int], int] = {}
    if dispatch:
        for s in range(R):
            for t, row in enumerate(rt.topk[s]):
                for e in row:
                    e = int(e)
                    d = rt.rank_of(e)
                    items[s].append((t % C, d, ExpertTag(s, e), t))
                    counts[(s, d, e)] = counts.get((s, d, e), 0) + 1
    else:
        per_rank = w.design.ll_combine_flags == "per-rank"
        # what each expert received, per (expert, source rank), in token order
        got: dict[tuple[int, int], list[int]] = {}
        for src in range(R):
            for t, row in enumerate(rt.topk[src]):
                for e in row:
                    got.setdefault((int(e), src), []).append(t)
        concurrent = w.design.ll_combine_order == "concurrent"
        for s in range(R):  # s hosts expert e; results go back to the token's source rank
            # (expert, source) pairs expert-major, source-minor; each pair's rows in token order
            rows = [(j, e, src, t) for e in rt.experts_of(s) for src in range(R)
                    for j, t in enumerate(got.get((e, src), ()))]
            if concurrent:
                # DeepEP LL's combine: a warp group per (expert, destination rank) pair, all
                # at once: every pair's j-th row before any pair's (j+1)-th (a stable sort).
                # In turn (hw/ep's combine_rank), pair after pair: every rank walks the
                # sources in the same order, so at any instant all ranks write to the same few
                # sources, whose receive ports then set the pace (IB pure RDMA EP256: the p50
                # source 28% later than with the pairs side by side; tests/test_mechanisms.py::
                # test_v1_combine_pairs_side_by_side_spread_the_sources_load)
                rows.sort(key=_row_index)
            # dealt round robin over the channels, so the channels write to different
            # destinations at once
            for k, (_j, e, src, t) in enumerate(rows):
                # one flag per (expert, source), or per source rank for all its rows; the
                # token rides along: its channel at the source is the receive CQ its row
                # completes on (design.recv_cq = "per-dest-qp")
                key = (s, src, -1) if per_rank else (s, src, e)
                items[s].append((k % C, src, RankTag(s) if per_rank else ExpertTag(s, e), t))
                counts[key] = counts.get(key, 0) + 1
    done = []
    for r in range(R):
        done.append(env.process(_rank(w, r, items[r], counts, nbytes, dispatch)))
    return done


def _row_index(row: tuple[int, int, int, int]) -> int:
    """A combine row's place within its (expert, source) pair."""
    return row[0]


def _rank(w: World, r: int, items, counts, nbytes: int, dispatch: bool):
    env = w.env
    R = w.workload.ep_ranks
    rt = w.routing
    C = w.channels
    Ci = w.issue_channels  # the posting channels (all of them unless owned QPs are fewer)
    by_ch: dict[int, list] = {}
    for it in items:
        by_ch.setdefault(it[0], []).append(it)
    # the grid sync before the counts, unless nothing is flushed before them (module doc)
    barrier = Barrier(w, C) if w.signal_mode != "imm-counting" else None
    # signals this rank sends: one per (expert, peer) pair it talks to, zero counts included
    per_rank = not dispatch and w.design.ll_combine_flags == "per-rank"
    if dispatch:
        sig = [(e, rt.rank_of(e)) for e in range(rt.num_experts)]
    elif per_rank:
        sig = [(-1, p) for p in range(R)]
    else:
        sig = [(e, p) for e in rt.experts_of(r) for p in range(R)]

    nvl = w.design.ll_intranode_nvlink
    cached = w.v1_cached  # counts known from the reused handle: no count messages

    def warp(c: int):
        if c >= Ci:  # a receiving-only channel (owned QPs fewer than channels): the grid sync
            track = warp_track(w.design.warps_per_sm, c)
            if barrier is not None:
                yield from barrier.arrive()
        else:
            port = w.port(r, c)
            track = port.track
            g = w.platform.gpu
            last_token = -1
            for _c, dst, tag, tok in by_ch.get(c, []):
                if dispatch and tok != last_token:
                    yield w.ctx.busy("compute", g.token_prep_ns)
                last_token = tok
                if nvl and w.same_node(r, dst):
                    yield from nvlink_put(w, r, dst, nbytes, tag, track)
                else:  # the destination QP: the expert's (dispatch), the token's channel (combine)
                    yield from put(w, port, r, dst, nbytes, tag, rx_cq=tag.expert if dispatch else tok % Ci)
            if w.signal_mode == "flush" and w.design.path == "native":
                yield from port.flush("signal")
            else:
                yield from port.finish()
            if barrier is not None:
                yield from barrier.arrive()
            sport = w.signal_port(r, c)
            for e, p in ([] if cached else sig[c::Ci]):
                n = counts.get((r, p, e), 0)
                tag = RankTag(r) if per_rank else ExpertTag(r, e)
                if nvl and w.same_node(r, p):
                    nvlink_flag(w, r, p, tag, n)
                else:
                    yield from publish(w, sport, r, p, tag, n, flushed=True, rx_cq=e if dispatch else -1)
            yield from sport.finish()
        # receive phase, on every warp: each polls the counts of its experts (per-rank
        # combine flags: every warp polls every source's flag)
        if per_rank:  # every source's flag at once, a lane each (hw/ep)
            yield from w.receivers[r].wait_all(
                [(RankTag(s), counts.get((s, r, -1), 0)) for s in range(R)], track, flags=1, spin=c)
            return
        for e in rx_experts[c::C]:
            yield from expert_rx(e, track)

    def expert_rx(e: int, track: str):
        # every source's count of the expert at once, a lane each (hw/ep; DeepEP LL gives each
        # (source, expert) pair a warp group): one poll after the last, not one per source
        srcs = range(R) if dispatch else [rt.rank_of(e)]
        yield from w.receivers[r].wait_all([(ExpertTag(s, e), counts.get((s, r, e), 0)) for s in srcs],
                                           track, flags=0 if cached else 1, spin=e if dispatch else -1)

    rx_experts = list(rt.experts_of(r)) if dispatch else list(range(rt.num_experts))
    yield env.all_of([env.process(warp(c)) for c in range(C)])
    if not dispatch:
        # reduce the top-k BF16 rows of every token, spread over the reducing warps
        kib = w.workload.combine_bytes_per_token / 1024
        yield w.ctx.busy("compute", final_reduce_ns(w, kib * w.workload.top_k * w.workload.tokens_per_rank))
    return env.now
