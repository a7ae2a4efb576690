"""DeepEP V2 hybrid: one RDMA write per (token, destination node) to the same-index
GPU there, tail signals every ``scaleout_update_interval`` tokens, and forward
warps on the receiving GPU that poll those tails and forward over NVLink.

Dispatch, on rank r = (node n, local l):
1. notify exchange of counts (skipped when ``cached``: the layout handle is reused);
2. scale-out warp c takes tokens ``t mod channels == c``; per remote destination
   node m it writes the token into ``recv[n][c][slot]`` on rank (m, l) and every
   ``interval`` tokens publishes the (finish, tail) word by the platform's
   strategy (strong/ordered, flush-then-signal, unordered counting, or none when
   the receiver counts immediates); tokens for its own node go over NVLink;
3. forward warps on (m, l) poll the tails of their (source node, channel) pairs
   round-robin and copy each accepted token over NVLink to every rank of node m
   that hosts one of its experts;
4. every rank waits for all its tokens, then a closing NVLink barrier in the node.

Combine in reverse: expert ranks send partial rows over NVLink to the forwarder
of the token's source (same local index), forward warps reduce and write one
row per token to the source node, flush, one signal per node; the source waits
for every node's finish and reduces.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from typing import TYPE_CHECKING

from lever.sim.engine import Counter, Rec, event_at
from lever.sim.protocols.common import (
    Barrier,
    final_reduce_ns,
    notify_exchange,
    nvlink_flag,
    nvlink_send_counted,
    publish,
)
from lever.sim.tags import BarrierTag, CombineTag, ForwardTag, PartialTag, TailTag

if TYPE_CHECKING:
    from lever.sim.model import World
    from simpy.events import Event


def run(w: World) -> list:
    R = w.workload.ep_ranks
    fn = _dispatch_rank if w.op == "dispatch" else _combine_rank
    shared = _Shared.of(w)
    return [w.env.process(fn(w, r, shared)) for r in range(R)]


class _Moved:
    """A watcher of one polled tail word (``Counter.watch``): marks its pair as moved and wakes
    the forward warp, so a sweep reads only the words that changed (a sweep of every pair at
    every wake was 7% of EP256's dispatch; skipping a word that did not move changes nothing)."""

    __slots__ = ("flags", "i", "wake")

    def __init__(self, flags: list[bool], i: int, wake: Counter) -> None:
        self.flags = flags
        self.i = i
        self.wake = wake

    def add(self, n: int = 1) -> None:
        self.flags[self.i] = True
        self.wake.add(n)


def _on_node(dsts: list[int], lo: int, hi: int) -> list[int]:
    """A token's destination ranks on the node of ranks ``lo..hi-1``: a slice of its sorted
    destinations (``Routing.dst_ranks`` rows are sorted), not a filter of each."""
    return dsts[bisect_left(dsts, lo):bisect_left(dsts, hi)]


def _cur(w: World) -> Rec | None:
    """The segment of whatever runs now, when the critical path is recorded."""
    path = w.ledger.path
    return None if path is None else path.cur


class _Shared:
    """Routing-derived layout every rank agrees on (what notify/the handle carries)."""

    def __init__(self, w: World) -> None:
        rt = w.routing
        R = w.workload.ep_ranks
        self.rpn = w.workload.ranks_per_node
        self.nodes = max(1, R // self.rpn)
        C = w.channels
        self.C = C
        # per source rank s, channel c, dest node m: list of tokens (in order)
        self.stream: dict[tuple[int, int, int], list[int]] = {}
        # expected_from[d][s]: tokens of source s that rank d must receive
        self.expected_from: list[dict[int, int]] = [{} for _ in range(R)]
        # held[d]: the (source, token) pairs whose experts rank d hosts, by source then token
        # (the combine's expert side; one pass, not one scan of every token per rank)
        self.held: list[list[tuple[int, int]]] = [[] for _ in range(R)]
        stream, held, expected = self.stream, self.held, self.expected_from
        for s in range(R):
            ranks = rt.dst_ranks[s]
            for t, nodes in enumerate(rt.dst_nodes[s]):
                c = t % C
                for m in nodes:
                    lst = stream.get((s, c, m))
                    if lst is None:
                        stream[(s, c, m)] = [t]
                    else:
                        lst.append(t)
                st = (s, t)
                for d in ranks[t]:
                    e = expected[d]
                    e[s] = e.get(s, 0) + 1
                    held[d].append(st)

    @classmethod
    def of(cls, w: World) -> _Shared:
        """The layout of ``w``'s routing and channels, made once per routing: the routing is
        shared by runs of one draw (``Routing.for_scenario``: dispatch and combine, a fit's
        runs), and the layout is read-only once made."""
        cache = w.routing.__dict__.setdefault("_v2_hybrid_layouts", {})
        key = (w.channels, w.workload.ranks_per_node)
        sh = cache.get(key)
        if sh is None:
            sh = cache[key] = cls(w)
        return sh

    def rank(self, node: int, local: int) -> int:
        return node * self.rpn + local


def _dispatch_rank(w: World, r: int, sh: _Shared):
    env = w.env
    d, g, wl, rt = w.design, w.platform.gpu, w.workload, w.routing
    n, loc = divmod(r, sh.rpn)
    C, N = sh.C, sh.nodes
    nbytes = wl.dispatch_bytes_per_token
    counting = d.path == "native" and d.signal_mode in ("imm-counting", "hw-counter")
    if d.start_barrier:
        yield from _start_barrier(w, r, sh, "dispatch")
    notify = None
    if not d.cached:
        peers = [sh.rank(m, loc) for m in range(N) if m != n] + [
            sh.rank(n, j) for j in range(sh.rpn) if j != loc]
        if d.notify_overlaps_data:
            notify = env.process(notify_exchange(w, r, peers))
        else:
            yield from notify_exchange(w, r, peers)

    rpn = sh.rpn
    mine = ForwardTag(r)

    def scaleout(c: int):
        port = w.port(r, c)
        post = port.post
        message = w.message
        busy = w.ctx.busy
        tail = TailTag(r, c)
        sent = [0] * N
        for t in range(c, wl.tokens_per_rank, C):
            yield busy("compute", g.token_prep_ns)
            for m in rt.dst_nodes[r][t]:
                if m == n:
                    for dst in rt.dst_ranks[r][t]:
                        if dst != r and dst // rpn == n:
                            ev = nvlink_send_counted(w, r, dst, nbytes, mine, port.track)
                            if ev is not None:
                                yield ev
                        elif dst == r:  # in its own buffer now
                            w.receivers[r].tallies[mine].add_at(env._now, 1, _cur(w))
                    continue
                yield from post(message(r, m * rpn + loc, nbytes, tail, seq=sent[m]))
                sent[m] += 1
                if not counting and sent[m] % d.scaleout_update_interval == 0:
                    yield from publish(w, port, r, sh.rank(m, loc), tail, sent[m])
        for m in range(N):  # the finish word: final tail for every remote node
            if m != n and not counting and (sent[m] % d.scaleout_update_interval or not sent[m]):
                yield from publish(w, port, r, sh.rank(m, loc), tail, sent[m])
        yield from port.finish()

    def forward(j: int, pairs: list[tuple[int, int]]):
        """Poll the tails of (source rank, channel) pairs round-robin; forward what landed."""
        rcv = w.receivers[r]
        track = f"fwd{j}"
        done = [0] * len(pairs)
        want = [len(sh.stream.get((s, c, n), ())) for s, c in pairs]
        # per pair, per token of its stream: the destination GPUs of this node (routing is fixed;
        # a slice, not a filter: a generator per token was 1.4% of an EP256 dispatch)
        lo, hi = n * rpn, (n + 1) * rpn
        here = []
        for s, c in pairs:
            rows = [rt.dst_ranks[s][t] for t in sh.stream.get((s, c, n), ())]
            here.append([_on_node(x, lo, hi) for x in rows])
        wake = Counter(env)  # bumped whenever any polled tail moves
        tags = [TailTag(s, c) for s, c in pairs]
        known = [rcv.known[tag] for tag in tags]  # the words polled, looked up once
        moved = [True] * len(pairs)  # a tail moved since the warp last read it
        for i, k in enumerate(known):
            k.watch(_Moved(moved, i, wake))
        left = sum(1 for i in range(len(pairs)) if done[i] < want[i])  # pairs not finished
        chunk_max = d.nvlink_chunk_tokens
        while left:
            mark = wake.value
            progressed = False
            for i, (s, _c) in enumerate(pairs):
                if not moved[i]:  # the same value as at its last read: nothing new to forward
                    continue
                moved[i] = False
                avail = known[i].value
                if avail > want[i]:  # min(value, want)
                    avail = want[i]
                if avail > done[i]:
                    tag = tags[i]
                    rcv.check(tag, avail)
                    # per destination GPU of this node, chunks of nvlink_chunk_tokens tokens
                    per_dst: dict[int, int] = {}
                    for dsts in here[i][done[i]:avail]:
                        for dst in dsts:
                            per_dst[dst] = per_dst.get(dst, 0) + 1
                    ftag = ForwardTag(s)
                    for dst, k in per_dst.items():
                        if dst == r:
                            rcv.tallies[ftag].add_at(env._now, k, _cur(w))
                            continue
                        while k > 0:
                            chunk = k if k < chunk_max else chunk_max  # min(k, chunk_max)
                            k -= chunk
                            ev = nvlink_send_counted(w, r, dst, nbytes, ftag, track, chunk)
                            if ev is not None:
                                yield ev
                    done[i] = avail
                    if avail == want[i]:
                        left -= 1
                    progressed = True
            if not progressed:
                t0 = env._now
                yield wake.reach(mark + 1)
                w.ledger.waited("poll_wait", env._now - t0)
                yield w.ctx.busy("poll_wait", rcv.poll_ns())
                if w.trace.enabled:
                    w.trace.span(f"rank{r}", track, "poll_wait", t0, env.now - t0)

    F = max(1, d.num_sms * d.forward_warps_per_sm)
    pairs = [(sh.rank(m, loc), c) for m in range(N) if m != n for c in range(C)]
    procs = [env.process(scaleout(c)) for c in range(C)]
    if notify is not None:
        procs.append(notify)
    if pairs:
        procs += [env.process(forward(j, pairs[j::F])) for j in range(min(F, len(pairs)))]
    # final buffer: every (token, this rank) pair from every source
    rcv = w.receivers[r]

    def watch(s: int, n_exp: int):
        # every token of s for this rank, over NVLink from a forward warp or a peer's scale-out
        # warp (or kept here): counted to their total, booked as they are sent
        yield from rcv.wait(ForwardTag(s), n_exp, "rx", total=True)

    exp = sh.expected_from[r]
    procs += [env.process(watch(s, k)) for s, k in exp.items()]
    yield env.all_of(procs)
    yield from _node_barrier(w, r, sh, "dispatch")
    return env.now


def _start_barrier(w: World, r: int, sh: _Shared, what: str):
    """The opening barrier of a DeepEP V2 hybrid op (``design.start_barrier``): a flag to every
    other rank of the node over NVLink and a signal to every rail peer (the same local index
    on every other node) on the notify QP, then a wait for all of theirs. In the kernel SM 0
    runs the NVLink half and SM 1 the scale-out half at once, then the grid syncs: the rank's
    warps start when both are done. Nothing was written before the signal, so no flush
    precedes it in any signal mode; it lands as a small put the waiting SM polls, as a
    count of the notify exchange does (its own message kind, ``barrier``, for the counters)."""
    n, loc = divmod(r, sh.rpn)
    key = what + "-open"
    mine = BarrierTag(key, r)
    near = [sh.rank(n, j) for j in range(sh.rpn) if j != loc]
    far = [sh.rank(m, loc) for m in range(sh.nodes) if m != n]
    for p in near:
        nvlink_flag(w, r, p, mine, 1)
    if far:
        port = w.notify_port(r)
        for p in far:
            yield from port.post(w.message(r, p, w.design.notify_bytes, mine, kind="barrier"))
        yield from port.finish()
    rcv = w.receivers[r]
    for p in near + far:
        yield from rcv.wait(BarrierTag(key, p), 1, "barrier", check=False)


def _node_barrier(w: World, r: int, sh: _Shared, what: str):
    """Closing NVLink barrier among the ranks of one node."""
    n, loc = divmod(r, sh.rpn)
    for j in range(sh.rpn):
        if j != loc:
            nvlink_flag(w, r, sh.rank(n, j), BarrierTag(what, r), 1)
    rcv = w.receivers[r]
    for j in range(sh.rpn):
        if j != loc:
            yield from rcv.wait(BarrierTag(what, sh.rank(n, j)), 1, "barrier", check=False)


def _expert_sides(w: World, r: int, sh: _Shared, held: list[tuple[int, int]], nbytes: int,
                  kib: float) -> list[Event]:
    """The combine's expert warps of rank ``r``, as arithmetic: one event per warp, at its end.

    Warp ``c`` takes ``held[c::C]`` in order; per (source, token) it reduces the token's rows
    for its experts here (``compute``), then streams the partial row over NVLink to the
    token's forwarder on this node (the source itself when it is on this node; kept here when
    this rank is the forwarder). Nothing the warps wait on comes from outside: their only
    shared resource is this GPU's NVLink port, which nothing else uses until the closing
    barrier (after every warp ended). So the C warps and the port are a closed pipeline, and
    its whole schedule is computed here at the start, in the order SimPy would run it: each
    warp's next step in a local queue ordered by (instant, order of scheduling), as SimPy's
    is. Each partial row's landing at its forwarder is booked on the token's tally there
    (``Receiver.tallies``): its forward warp waits for all of the token's partials, and every
    rank's expert side is booked at the op's start, before any forward warp runs. What
    others observe stays an event: the instant a token's last partial landed (released by
    its tally), and each warp's end (the rank waits for all).

    The same instants as a process per warp; the events of the two waits per token (the
    reduction, the stores) and of each landing are gone, so at an instant shared with other
    events the waits they release may run in another (deterministic) order."""
    env = w.env
    led = w.ledger
    path = led.path
    tr = w.trace
    nv = w.nvlink
    g = w.platform.gpu
    rt = w.routing
    rcv = w.receivers[r]
    C = sh.C
    n = r // sh.rpn
    start = path.cur if path is not None else None  # what started the rank's processes
    lists = [held[c::C] for c in range(C)]
    chain = [start] * C  # each warp's own last segment (critical path)
    # (instant, scheduling order, warp, next item, whether that item's reduction is done)
    t0 = env._now  # the op's start, or the end of its opening barrier
    queue = [(t0, c, c, 0, False) for c in range(C)]
    order = C
    end_at = [0.0] * C
    rpn = sh.rpn
    base = n * rpn  # sh.rank(n, local) is base + local
    tallies = [x.tallies for x in w.receivers]
    hits = rt.hits
    red = g.reduce_ns_per_kib * kib  # led.issue("compute", red * rows): its factor and sums
    f_compute = led.factor("compute")
    busy_sums = led.busy
    counts = led.events
    push = heapq.heappush
    pop = heapq.heappop
    reserve = nv.reserve
    while queue:
        now, _, c, i, reduced = pop(queue)
        items = lists[c]
        while True:  # one resume of warp c: run to its next wait
            if reduced:
                s, t = items[i]
                fwd = s if s // rpn == n else base + s % rpn
                tag = PartialTag(s, t)
                i += 1
                reduced = False
                if fwd == r:  # kept here: landed at once
                    rcv.tallies[tag].add_at(now, 1, chain[c])
                    continue
                busy, t_vis, vis_rec = reserve(r, nbytes, now, chain[c])
                tallies[fwd][tag].add_at(t_vis, 1, vis_rec)
                if busy > 0:
                    if path is not None:
                        chain[c] = nv.port_rec[r]
                    if tr.enabled:
                        tr.span(f"rank{r}", f"cmb{c}", "nvlink", now, busy, dst=fwd, bytes=nbytes)
                    push(queue, (now + busy, order, c, i, False))
                    order += 1
                    break
                continue
            if i == len(items):
                end_at[c] = now
                break
            s, t = items[i]
            dt = red * hits[s][t][r] * f_compute
            busy_sums["compute"] += dt
            counts["compute"] += 1
            if path is not None:
                chain[c] = (now, now + dt, "compute", chain[c])
            push(queue, (now + dt, order, c, i, True))
            order += 1
            break
    # each fires at its warp's end, as the warp's process would
    return [event_at(env, end_at[c], chain[c]) for c in range(C)]


def _combine_rank(w: World, r: int, sh: _Shared):
    env = w.env
    d, g, wl, rt = w.design, w.platform.gpu, w.workload, w.routing
    n, loc = divmod(r, sh.rpn)
    C, N = sh.C, sh.nodes
    nbytes = wl.combine_bytes_per_token
    rcv = w.receivers[r]
    kib = nbytes / 1024

    if d.start_barrier:
        yield from _start_barrier(w, r, sh, "combine")
    # 1. partial rows over NVLink to the forwarder of each token's source (same local index)
    held = sh.held[r]

    expert_ends = _expert_sides(w, r, sh, held, nbytes, kib)

    # 2. forward warps: reduce the node's partials per token, write one row to the source node
    F = max(1, d.num_sms * d.forward_warps_per_sm)
    remote = [sh.rank(m, loc) for m in range(N) if m != n]
    work: list[tuple[int, int]] = [(s, t) for s in remote for t, nodes in enumerate(rt.dst_nodes[s])
                                   if n in nodes]
    bar = Barrier(w, min(F, len(work)) or 1)
    sent_to: dict[int, int] = {s: 0 for s in remote}

    rpn = sh.rpn
    lo, hi = n * rpn, (n + 1) * rpn  # this node's ranks
    red_ns = g.reduce_ns_per_kib * kib  # a reduction's cost per partial row
    to_source = {s: CombineTag(n, s) for s in remote}  # the tag of each source's rows

    def forwarder(j: int):
        port = w.port(r, j % C)
        track = f"fwd{j}"
        for s, t in work[j::F]:
            # the token's expert ranks on this node, one partial row each
            contrib = len(_on_node(rt.dst_ranks[s][t], lo, hi))
            # the poll that sees the partials, then their reduction: one wait of the warp
            yield from rcv.wait(PartialTag(s, t), contrib, track, total=True,
                                then=("compute", red_ns * contrib))
            seq = sent_to[s]  # claimed before posting: forward warps run concurrently
            sent_to[s] += 1
            yield from port.post(w.message(r, s, nbytes, to_source[s], seq=seq))
        # the finish signal goes on the notify QP, after every forward warp's data on other
        # QPs: no single connection orders them, so flag-after-data modes flush first (as V2 does)
        if d.path == "native" and d.signal_mode in ("flush", "ordered"):
            yield from port.flush("signal")
        else:
            yield from port.finish()
        yield from bar.arrive()
        if j == 0:
            sport = w.notify_port(r)
            for s in remote:
                yield from publish(w, sport, r, s, CombineTag(n, s), sent_to[s], flushed=True)
            yield from sport.finish()

    procs = expert_ends
    if work:
        procs += [env.process(forwarder(j)) for j in range(min(F, len(work)))]
    # 3. the source side: every node's finish plus the local partials, then reduce
    mine = [(t, nodes) for t, nodes in enumerate(rt.dst_nodes[r])]

    def source_side():
        for m in range(N):
            if m == n:
                continue
            cnt = sum(1 for _t, nodes in mine if m in nodes)
            yield from rcv.wait(CombineTag(m, r), cnt, "rx", flags=1)
        for t, _nodes in mine:
            local = len(_on_node(rt.dst_ranks[r][t], lo, hi))
            if local:
                yield from rcv.wait(PartialTag(r, t), local, "rx", total=True)
        yield w.ctx.busy("compute", final_reduce_ns(w, kib * len(mine) * N))

    procs.append(env.process(source_side()))
    yield env.all_of(procs)
    yield from _node_barrier(w, r, sh, "combine")
    return env.now
