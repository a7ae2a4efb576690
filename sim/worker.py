"""pplx-garden's fabric-lib worker (``perplexityai/pplx-garden``, ``fabric-lib/src/worker.rs``,
``domain_group.rs``, ``efa/efa_domain.rs``, ``imm_count.rs``): one CPU thread per GPU that owns
every NIC (libfabric domain) of that GPU, posts every RDMA write the GPU's transfers need and
polls every completion, send and receive, on those NICs' CQs.

A transfer is submitted to the thread as one request (a channel between threads): a scatter of
one write per peer, each a *bulk* write-with-immediate covering every token for that peer in
the stage (one WQE; the NIC cuts it into MTU packets). The request is sharded statically over
the GPU's NICs (``DomainGroup::submit_scatter_transfer_request``): by peers (the peers split
into contiguous ranges, one range per NIC, each write whole on its NIC) or by bytes (every
write cut into one shard per NIC, each shard a write-with-immediate of its own).

The loop (``worker_step``): take at most one submitted request, post the writes waiting
(``fi_writemsg``, ``proxy.host_post_ns`` each), read the CQs (``proxy.host_cq_poll_ns`` per
CQE), and after a pass with work poll progress on every domain (``proxy.host_poll_ns`` each).
A receive completion carries the write's immediate, which names a counter
(``ImmCountMap``): the counter ticks once per write. Whoever waits on a counter (the
all-to-all control thread, ``p2p-all-to-all/src/a2a_worker.rs``) sees it at once; a flag it
then sets in GPU memory (a GDRCopy store) is seen by the GPU ``proxy.host_to_gpu_ns`` later.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Hashable
from functools import partial
from typing import TYPE_CHECKING

from lever.sim.engine import Counter, start_daemon
from lever.sim.nic import QueuePair
from lever.sim.proxy import CompletionThread

if TYPE_CHECKING:
    from lever.sim.context import Context
    from lever.sim.message import Message
    from lever.sim.nic import Nic


class FabricWorker(CompletionThread):
    """The fabric-lib worker thread of one GPU: its NICs' queue pairs, the requests submitted
    to it, its CQ and its immediate counters."""

    def __init__(self, ctx: Context, rank: int, nics: list[Nic]) -> None:
        super().__init__(ctx, rank, "fabric")
        self.qps = [QueuePair(ctx.env, i, rank, nic) for i, nic in enumerate(nics)]
        self.requests: deque[list[Message]] = deque()
        self.sendq: deque[Message] = deque()
        self.imm: dict[Hashable, Counter] = defaultdict(partial(Counter, self.env))  # no cycle
        self.tx = Counter(ctx.env)  # send completions seen (the transfers' tx counter)
        start_daemon(ctx.env, self._loop())

    # -- what the control thread and the NICs do ----------------------------------------
    def submit(self, writes: list[Message]) -> None:
        """Hand one transfer request (its writes, each already on its NIC's queue pair)."""
        for m in writes:
            m.on_complete = self.send_cqe
        self.requests.append(writes)
        self.kick()

    # -- the loop --------------------------------------------------------------------------
    def _loop(self):
        env, w = self.env, self.ctx
        pp = w.platform.proxy
        led = w.ledger
        while True:
            did = False
            if self.requests:  # one command per step (worker_step: cmd_rx.try_recv)
                self.sendq.extend(self.requests.popleft())
                did = True
            while self.sendq:
                msg = self.sendq.popleft()
                t0 = env.now
                yield w.hold("proxy_post", led.cost("proxy_post", pp.host_post_ns))
                w.trace.span(self.proc, self.track, "post", t0, env.now - t0)
                msg.t_post = env.now
                msg.qp.posted += 1
                led.counters["host_wqes"] += 1
                led.counters["host_doorbells"] += 1  # fi_writemsg rings for its one WQE
                msg.qp.nic.doorbell([msg])
                did = True
            if self.cq:
                cqes = list(self.cq)
                self.cq.clear()
                t0 = env.now
                yield w.hold("proxy_post", led.cost("proxy_post", pp.host_cq_poll_ns) * len(cqes))
                w.trace.span(self.proc, self.track, "cq", t0, env.now - t0)
                for is_recv, msg in cqes:
                    if is_recv:
                        led.counters["host_recv_cqes"] += 1
                        self.imm[msg.tag[0]].add(1)  # the immediate names the counter
                    else:
                        self.tx.add(1)
                did = True
            if did:
                yield w.hold("proxy_post", led.cost("proxy_post", pp.host_poll_ns * len(self.qps)))
            else:
                yield self.sleep()


def arrived(ctx: Context, workers: list[FabricWorker], msg: Message) -> None:
    """Every byte of a write is visible at its target: its receive completion reaches the
    target worker's CQ ``receiver.recv_completion_ns`` later."""
    cost = ctx.ledger.cost("signal", ctx.platform.receiver.recv_completion_ns)
    ctx.later("signal", cost, workers[msg.dst].recv_cqe, msg)


def divide_evenly(n: int, k: int) -> list[tuple[int, int]]:
    """``n`` items in at most ``k`` contiguous ranges of ``ceil(n / k)`` (the last shorter),
    as fabric-lib shards a scatter's peers over the NICs."""
    step = -(-n // k) if n else 0
    out, beg = [], 0
    while beg < n:
        out.append((beg, min(n, beg + step)))
        beg += step
    return out
