"""pplx-garden's all-to-all (``perplexityai/pplx-garden``, ``p2p-all-to-all/``; the paper
"fabric-lib: RDMA Point-to-Point Communication for LLM Systems", arXiv 2510.27656): the GPU
kernels pack tokens and raise flags, a CPU control thread per GPU turns each stage into one
bulk write-with-immediate per peer, and the fabric-lib worker (``sim/worker.py``) posts them
and counts the immediates that land.

Dispatch, on rank r (``a2a_dispatch_send.cu``, ``a2a_worker.rs`` ``WorkerState::step``):

1. the send kernel counts the tokens per expert and raises ``dispatch_route_done`` (a fence and
   a flag store; the host sees it ``proxy.gpu_to_host_ns`` later); the control thread submits
   the route exchange: one write-with-immediate of the expert counts (4 B per expert) to every
   other rank, sharded by peers over the NICs;
2. the kernel's warps pack the tokens (``gpu.token_prep_ns`` each), a copy per (token, expert):
   same-node copies straight into the peer over NVLink, the rest into the send buffer grouped
   by destination rank; then ``dispatch_send_done`` (fence, flag);
3. the control thread submits one bulk write per rank of the other nodes (every (token,
   expert) copy for that rank, its private receive buffer), sharded by peers; waits for the
   route counter (one immediate from every other rank), writes the receive layout into GPU
   memory; and waits for the dispatch counter (one immediate from every rank of the other
   nodes), then sets ``dispatch_recv_flag`` in GPU memory (``proxy.host_to_gpu_ns``);
4. the receive kernel polls both flags and the NVLink arrivals of its node, then it is done.

Tokens above the private buffer (``max_private_tokens``, 256 in its benchmark) would go in a
second, byte-sharded write; at decode shape no rank sends that many to one peer, and the
model sends everything in the private write.

Combine (``a2a_combine_send.cu``, ``a2a_combine_recv.cu``): the send kernel returns every
(token, expert) row, same-node ones over NVLink, the rest into the send buffer, and raises
``combine_send_done``; the control thread submits one write per rank of the other nodes,
sharded by bytes (every write cut into one shard per NIC, each a write-with-immediate), waits
for the combine counter (ranks of the other nodes x NICs per GPU immediates) and sets
``combine_recv_flag``; the receive kernel polls it and the NVLink rows, then reduces each
token's top-k rows.

The barriers after each stage (one immediate to every peer) overlap the next stage and are
not part of an op's latency here; the control thread's own CPU time (routing arithmetic) is
not charged.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from lever.sim.engine import Counter
from lever.sim.protocols.common import nvlink_put
from lever.sim.worker import FabricWorker, arrived, divide_evenly

if TYPE_CHECKING:
    from lever.sim.message import Message
    from lever.sim.model import World


class PplxTag(NamedTuple):
    """pplx-garden: what a write or flag feeds at its target: ``stage`` (route, dispatch,
    combine: the immediate value naming the counter; nvl: NVLink copies) from ``src``; a flag
    the host sets in GPU memory is ``PplxTag(name, FLAG)``."""

    stage: str
    src: int
    kind: str = "pplx"


FLAG = -1
"""The ``src`` of a flag's tag: set by the host, not written by a peer."""


def run(w: World) -> list:
    R = w.workload.ep_ranks
    per = w.platform.nic.nics_per_gpu
    workers = [FabricWorker(w.ctx, r, w.nics[r * per:(r + 1) * per]) for r in range(R)]
    rt = w.routing
    # pairs[s][d]: (token, expert) copies rank s sends rank d in dispatch
    pairs = [[0] * R for _ in range(R)]
    for s in range(R):
        for row in rt.topk[s]:
            for e in row:
                pairs[s][rt.rank_of(int(e))] += 1
    fn = _dispatch_rank if w.op == "dispatch" else _combine_rank
    return [w.env.process(fn(w, r, workers, pairs)) for r in range(R)]


def _write(w: World, workers: list[FabricWorker], src: int, dst: int, nbytes: int, stage: str,
           nic: int) -> Message:
    """One write-with-immediate of ``nbytes`` from ``src`` to ``dst`` on NIC ``nic`` of the
    source GPU, its immediate naming the target's counter of ``stage``."""
    kind = "notify" if stage == "route" else "data"
    m = w.message(src, dst, nbytes, PplxTag(stage, src), kind=kind)
    m.qp = workers[src].qps[nic]
    m.on_visible = partial(_land, w, workers)
    return m


def _land(w: World, workers: list[FabricWorker], msg: Message) -> None:
    w.receivers[msg.dst].data[msg.tag].add(1)  # the truth a consumer is checked against
    arrived(w.ctx, workers, msg)


def _shard_peers(w: World, workers: list[FabricWorker], src: int, peers: list[int],
                 sizes: list[int], stage: str) -> list[Message]:
    """A scatter sharded by peers: contiguous ranges of peers, one range per NIC."""
    out = []
    for nic, (beg, end) in enumerate(divide_evenly(len(peers), len(workers[src].qps))):
        out += [_write(w, workers, src, peers[i], sizes[i], stage, nic) for i in range(beg, end)]
    return out


def _shard_bytes(w: World, workers: list[FabricWorker], src: int, peers: list[int],
                 sizes: list[int], stage: str) -> list[Message]:
    """A scatter sharded by bytes: every write cut into one shard per NIC."""
    k = len(workers[src].qps)
    out = []
    for nic in range(k):
        for p, n in zip(peers, sizes, strict=True):
            part = n // k if nic < k - 1 else n - (n // k) * (k - 1)
            out.append(_write(w, workers, src, p, part, stage, nic))
    return out


def _flag_to_gpu(w: World, rank: int, what: str) -> None:
    """The host sets a flag in GPU memory (GDRCopy store): the GPU sees it later."""
    rcv = w.receivers[rank]
    tag = PplxTag(what, FLAG)
    lat = w.ledger.cost("proxy_queue", w.platform.proxy.host_to_gpu_ns)
    w.ctx.later("proxy_queue", lat, _set, rcv.known[tag])


def _set(c: Counter) -> None:
    c.add(1)


def _gpu_flag(w: World, flag: Counter):
    """A kernel raises a flag the host polls: a system fence, then the store crosses PCIe."""
    yield w.ctx.busy("fence", w.platform.gpu.fence_ns)
    w.ctx.later("proxy_queue", w.ledger.cost("proxy_queue", w.platform.proxy.gpu_to_host_ns),
          _set, flag)


def _remote_peers(w: World, r: int) -> list[int]:
    """Ranks of the other nodes in fabric-lib's order: next node first, local index within."""
    R, rpn = w.workload.ep_ranks, w.rpn
    node = r // rpn
    return [((node + pn) * rpn + i) % R for pn in range(1, R // rpn) for i in range(rpn)]


def _dispatch_rank(w: World, r: int, workers: list[FabricWorker], pairs: list[list[int]]):
    env = w.env
    R = w.workload.ep_ranks
    rt, g, wl = w.routing, w.platform.gpu, w.workload
    nbytes = wl.dispatch_bytes_per_token
    worker = workers[r]
    rcv = w.receivers[r]
    remote = _remote_peers(w, r)
    route_done, send_done = Counter(env), Counter(env)

    def control():
        """The all-to-all control thread of rank r (a2a_worker.rs, step)."""
        yield route_done.reach(1)
        others = [(r + i) % R for i in range(1, R)]
        worker.submit(_shard_peers(w, workers, r, others, [4 * wl.num_experts] * len(others), "route"))
        yield send_done.reach(1)
        if remote:
            worker.submit(_shard_peers(w, workers, r, remote, [pairs[r][p] * nbytes for p in remote],
                                       "dispatch"))
        yield worker.imm["route"].reach(R - 1)
        _flag_to_gpu(w, r, "routed")  # the receive layout written into GPU memory
        yield worker.imm["dispatch"].reach(len(remote))
        _flag_to_gpu(w, r, "dispatch")  # dispatch_recv_flag

    env.process(control())
    # the send kernel: route counts, then packing; same-node copies over NVLink
    yield from _gpu_flag(w, route_done)
    C = w.channels

    def warp(c: int):
        track = f"pack{c}"
        for t in range(c, wl.tokens_per_rank, C):
            yield w.ctx.busy("compute", g.token_prep_ns)
            for dst, k in sorted(rt.hits[r][t].items()):
                if dst != r and w.same_node(r, dst):
                    yield from nvlink_put(w, r, dst, nbytes, PplxTag("nvl", r), track, k)

    yield env.all_of([env.process(warp(c)) for c in range(C)])
    yield from _gpu_flag(w, send_done)
    # the receive kernel: the host's flags, then the node's NVLink copies
    yield from rcv.wait(PplxTag("routed", FLAG), 1, "rx", check=False)
    yield from rcv.wait(PplxTag("dispatch", FLAG), 1, "rx", check=False)
    for s in remote:
        rcv.check(PplxTag("dispatch", s), 1)
    for s in range(R):
        if s != r and w.same_node(r, s) and pairs[s][r]:
            yield from rcv.wait(PplxTag("nvl", s), pairs[s][r], "rx")
    return env.now


def _combine_rank(w: World, r: int, workers: list[FabricWorker], pairs: list[list[int]]):
    env = w.env
    R = w.workload.ep_ranks
    g, wl = w.platform.gpu, w.workload
    nbytes = wl.combine_bytes_per_token
    worker = workers[r]
    rcv = w.receivers[r]
    remote = _remote_peers(w, r)
    per = len(worker.qps)
    send_done = Counter(env)

    def control():
        yield send_done.reach(1)
        if remote:
            worker.submit(_shard_bytes(w, workers, r, remote, [pairs[p][r] * nbytes for p in remote],
                                       "combine"))
        yield worker.imm["combine"].reach(len(remote) * per)
        _flag_to_gpu(w, r, "combine")  # combine_recv_flag

    env.process(control())
    # the send kernel: every (token, expert) row back to its source; same-node over NVLink
    C = w.channels
    same = [s for s in range(R) if s != r and w.same_node(r, s) and pairs[s][r]]

    def warp(c: int):
        track = f"ret{c}"
        for s in same[c::C]:
            yield from nvlink_put(w, r, s, nbytes, PplxTag("nvl", r), track, pairs[s][r])

    yield env.all_of([env.process(warp(c)) for c in range(C)])
    yield from _gpu_flag(w, send_done)
    # the receive kernel: the host's flag and the node's rows, then the top-k reduction
    yield from rcv.wait(PplxTag("combine", FLAG), 1, "rx", check=False)
    for s in remote:
        rcv.check(PplxTag("combine", s), per)
    for s in range(R):
        if s != r and w.same_node(r, s) and pairs[r][s]:
            yield from rcv.wait(PplxTag("nvl", s), pairs[r][s], "rx")
    kib = nbytes / 1024
    yield w.ctx.busy("compute", g.reduce_ns_per_kib * kib * wl.top_k * wl.tokens_per_rank / C)
    return env.now
