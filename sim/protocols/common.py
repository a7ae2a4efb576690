"""Pieces every protocol composes: data puts, signals by strategy, NVLink delivery,
the notify/count exchange and rank-level barriers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lever.sim.engine import Counter
from lever.sim.tags import NotifyTag

if TYPE_CHECKING:
    from lever.sim.issuer import NativePort, Port
    from lever.sim.model import World
    from lever.sim.receiver import Receiver


def put(w: World, port: Port, src: int, dst: int, nbytes: int, tag, seq: int = 0,
        rx_cq: int = -1):
    """One RDMA write from ``port`` (native or proxy); ``rx_cq``: the destination QP's receive
    CQ it completes on, where the protocol picks one (``design.recv_cq = "per-dest-qp"``)."""
    m = w.message(src, dst, nbytes, tag, seq=seq)
    m.rx_cq = rx_cq
    yield from port.post(m)


def publish(w: World, port: Port, src: int, dst: int, tag, value: int, flushed: bool = False,
            rx_cq: int = -1):
    """A count/flag/tail signal vouching for ``value`` writes of ``tag`` sent so far
    (``rx_cq``: as for :func:`put`, the receive CQ an immediate-carried count lands on).

    Native ``flush`` mode waits for the send completions of this warp's data
    first (SRD-safe, one round trip); with ``provider_batched_tail`` that wait
    moves off the warp into the provider. ``unordered-counting`` sends a weak
    SignalAdd of the writes since the last signal. The proxy path posts the
    signal at once: the receiving host delivers it in sequence order.
    """
    d = w.design
    mode = w.signal_mode
    w.ledger.events["signal"] += 1
    if mode == "unordered-counting":
        key = (src, dst, tag)
        last = w.tails.get(key, 0)
        w.tails[key] = value
        value = value - last
    if d.path == "native" and mode == "flush" and not flushed:
        if d.provider_batched_tail:
            _provider_tail(w, port, src, dst, tag, value)
            return
        yield from port.flush("signal")
    m = w.message(src, dst, d.notify_bytes, tag, kind="signal", value=value)
    m.rx_cq = rx_cq
    group = min(d.signal_post_group, w.platform.nic.max_batch)
    if d.path == "native" and group > 1:
        # signals gathered into post groups: the group is written, fenced and rung once when
        # full, and the caller's finish() rings what is left
        yield from port.post(m, limit=group)
        return
    yield from port.post(m)
    if d.path == "native" and mode in ("flush", "ordered", "unordered-counting"):
        yield from port.finish()  # a signal is rung at once, never left in a doorbell batch


def _provider_tail(w: World, port: NativePort, src: int, dst: int, tag, value: int) -> None:
    """The provider posts the tail once the data before it completed; a newer tail
    for the same stream subsumes an older one still waiting (batching)."""
    key = (src, dst, tag)
    w.tails[key] = value
    target = port.posted
    env = w.env

    def proc():
        yield from port.finish()
        if port.done.value < target:
            yield port.done.reach(target)
        if w.tails.get(key) != value:
            return  # a later tail carries this one
        m = w.message(src, dst, w.design.notify_bytes, tag, kind="signal", value=value)
        m.qp = port.qp
        m.on_complete = None
        port.qp.nic.doorbell([m])

    env.process(proc())


def final_reduce_ns(w: World, kib: float) -> float:
    """A rank's final combine reduction of ``kib`` KiB of BF16 input rows, spread over the
    design's reducing warps (``reduce_warps``, else the data channels): each warp's loads are
    latency-bound (``reduce_ns_per_kib``), and all of them together still read every row once
    from device memory (at least ``kib`` over ``hbm_gbytes_per_s``)."""
    g = w.platform.gpu
    warps = w.design.reduce_warps or w.channels
    return max(g.reduce_ns_per_kib * kib / warps, kib * 1024.0 / g.hbm_gbytes_per_s)


def nvlink_put(w: World, src: int, dst: int, nbytes: int, tag, track: str, count: int = 1):
    """Intra-node data over NVLink (``count`` items of ``nbytes`` each, one stream of stores):
    visible (and ordered) at the peer after the link latency. A put to the rank itself is
    the issuing warp's own copy where the platform says so (``nvlink.self_copy_loads_in_flight``)."""
    if src == dst and w.platform.nvlink.self_copy_loads_in_flight:
        yield w.nvlink.self_copy(src, nbytes * count, track, nvlink_land, w.receivers[dst], tag, count)
        return
    yield from w.nvlink.copy(src, dst, nbytes * count, track, nvlink_land, w.receivers[dst], tag,
                             count)


def nvlink_send(w: World, src: int, dst: int, nbytes: int, tag, track: str, count: int = 1):
    """:func:`nvlink_put` as a plain call: the event to wait for, or None (for hot loops:
    ``ev = nvlink_send(...)``, then ``yield ev`` unless None)."""
    return w.nvlink.send(src, dst, nbytes * count, track, nvlink_land, w.receivers[dst], tag, count)


def nvlink_send_counted(w: World, src: int, dst: int, nbytes: int, tag, track: str,
                        count: int = 1):
    """:func:`nvlink_send` for a count the receiver reads only at its total
    (``Receiver.wait(..., total=True)``): the landing is booked on ``tallies[tag]`` now, no
    event at its instant."""
    return w.nvlink.send_ahead(src, dst, nbytes * count, track, w.receivers[dst].tallies[tag],
                               count)


def nvlink_land(rcv: Receiver, tag, count: int) -> None:
    """``count`` NVLink items of ``tag`` visible at ``rcv``: landed and known at once."""
    rcv.data[tag].add(count)
    rcv.known[tag].add(count)


def nvlink_flag(w: World, src: int, dst: int, tag, value: int):
    """An intra-node flag: ordered after the writer's earlier NVLink stores."""
    rcv = w.receivers[dst]

    def land():
        k = rcv.known[tag]
        if value > k.value:
            k.add(value - k.value)
        rcv.flags[tag].add(1)

    w.nvlink.flag(src, land)  # issued after the writer's earlier stores on the same link


def notify_exchange(w: World, rank: int, peers: list[int]):
    """Counts to every peer (small puts / NVLink flags), then poll until all peers' arrived."""
    port = w.notify_port(rank)
    d = w.design
    for p in peers:
        if w.same_node(rank, p):
            nvlink_flag(w, rank, p, NotifyTag(rank), 1)
        else:
            m = w.message(rank, p, d.notify_bytes, NotifyTag(rank), kind="notify")
            yield from port.post(m)
    yield from port.finish()
    rcv = w.receivers[rank]
    for p in peers:
        yield from rcv.wait(NotifyTag(p), 1, "notify", check=False)


class Barrier:
    """Arrivals of ``n`` parties at a rank-level (grid) sync."""

    def __init__(self, w: World, n: int) -> None:
        self.n = n
        self.c = Counter(w.env)

    def arrive(self):
        self.c.add(1)
        yield self.c.reach(self.n)
