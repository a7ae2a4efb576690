"""The model's physics as relations derived from its parameters, not golden numbers.

Each test states a bound, a slope or an ordering that one mechanism of ``lever.sim`` is
responsible for (serialisation on a port, the retransmit timeout, visibility, in-order ring
slots...), so it fails when that mechanism is removed; ``benchmarks/mutants.py`` removes them
one at a time and checks that some test here (or in the other behaviour files) notices.
RC ordering and SRD reordering are covered by ``tests/test_fabric.py``.

Two kinds of setup: the wire pieces alone (:class:`Fabric` and :class:`Nic` on a bare SimPy
environment, a quiet fabric so every time is computable), and a :class:`World` built from a
small scenario with hand-written warp processes where the protocols would blur the relation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain, repeat

import numpy as np
import pytest
import simpy
from lever.sim import scenario
from lever.sim.engine import Ledger, Trace
from lever.sim.fabric import Fabric
from lever.sim.message import Message
from lever.sim.model import World, simulate_op
from lever.sim.nic import Nic, QueuePair
from lever.sim.params import FabricParams, JitterParams, NicParams, ReceiverParams, Scenario
from lever.sim.protocols.common import nvlink_flag, nvlink_put, publish, put
from lever.sim.routing import Routing
from lever.sim.tags import RankTag

NATIVE = "decode-ep16-efa-native"
PROXY = "decode-ep16-efa-proxy"
# EP2, one GPU per node: every write crosses the fabric, and a run takes milliseconds
EP2 = {"workload.ep_ranks": 2, "workload.gpus_per_node": 1, "workload.tokens_per_rank": 4}
# the same two ranks on one node: everything goes over NVLink
EP2_NODE = {"workload.ep_ranks": 2, "workload.gpus_per_node": 2, "workload.tokens_per_rank": 4}
QUIET = {"platform.fabric.path_spread_ns": 0.0, "platform.fabric.jitter.distribution": "none"}
BASE_NS = 1000.0  # one-way flight of the bare wire


# -- helpers ------------------------------------------------------------------------------

def _load(overrides: dict, name: str = NATIVE) -> Scenario:
    return scenario.load(name, {**EP2, **overrides})


def _lat(scn: Scenario, op: str, seeds: int = 2, scale: dict | None = None) -> list[float]:
    return [x for s in range(seeds) for x in simulate_op(scn, op, s, scale=scale).latency_us]


def _p50_ns(scn: Scenario, op: str, seeds: int = 2, scale: dict | None = None) -> float:
    return float(np.median(_lat(scn, op, seeds, scale))) * 1e3


def _losses(*pattern: bool) -> Callable[[int], bool]:
    """A scripted ``Fabric._lost``: the given outcomes in call order, then no loss.

    ``launch`` asks once for the data packet and, when it got through, once for its ACK."""
    it: Iterator[bool] = chain(pattern, repeat(False))
    return lambda _nic: next(it)


@dataclass
class Wire:
    """NICs (one per GPU) on one fabric, with no issuer: doorbells by hand."""

    env: simpy.Environment
    ledger: Ledger
    fabric: Fabric
    nics: list[Nic]
    qps: list[QueuePair]
    visible: dict[int, float] = field(default_factory=dict)  # message id -> visible at target
    complete: dict[int, float] = field(default_factory=dict)  # message id -> CQE at sender
    n_visible: dict[int, int] = field(default_factory=dict)

    def write(self, src: int, dst: int, nbytes: int) -> Message:
        m = Message(src, dst, nbytes, ("t", src, dst))
        m.qp = self.qps[src]

        def seen(msg: Message) -> None:
            self.visible[id(msg)] = self.env.now
            self.n_visible[id(msg)] = self.n_visible.get(id(msg), 0) + 1

        def done(msg: Message) -> None:
            self.complete[id(msg)] = self.env.now

        m.on_visible, m.on_complete = seen, done
        return m

    def ring(self, src: int, msgs: list[Message]) -> None:
        self.qps[src].posted += len(msgs)
        self.nics[src].doorbell(msgs)

    def run(self) -> None:
        self.env.run()


def _wire(n_gpus: int = 2, nic: NicParams | None = None, fabric: FabricParams | None = None,
          rp: ReceiverParams | None = None) -> Wire:
    env = simpy.Environment()
    led = Ledger()
    fp = fabric or FabricParams(paths=1, base_latency_ns=BASE_NS, path_spread_ns=0.0,
                                jitter=JitterParams(distribution="none"))
    fab = Fabric(env, fp, np.random.default_rng(0), led)
    p, r = nic or NicParams(), rp or ReceiverParams()
    nics = [Nic(env, g, g, p, r, fab, led, Trace()) for g in range(n_gpus)]
    for n in nics:
        n.peers, n.per_gpu = nics, 1
    return Wire(env, led, fab, nics, [QueuePair(env, 0, g, nics[g]) for g in range(n_gpus)])


def _wire_ns(nbytes: int, p: NicParams) -> float:
    """Serialisation of one write on one port: payload plus a header per MTU packet."""
    pkts = max(1, -(-nbytes // p.mtu_bytes))
    return (nbytes + pkts * p.header_bytes) * 8.0 / p.line_rate_gbps


def _world(scn: Scenario, op: str = "dispatch") -> World:
    return World(scn, op, 0, Ledger(), Trace(), Routing.for_scenario(scn, 0))


def _spy_doorbells(w: World) -> list[tuple[float, list[Message]]]:
    """Record every doorbell the NICs of ``w`` see: (time, WQEs handed over)."""
    log: list[tuple[float, list[Message]]] = []
    for nic in w.nics:
        orig = nic.doorbell

        def spy(msgs: list[Message], orig=orig) -> None:
            log.append((w.env.now, list(msgs)))
            orig(msgs)

        nic.doorbell = spy  # type: ignore[method-assign]
    return log


# -- the wire: serialisation, segmentation, DMA, message rate ------------------------------

def test_one_large_put_is_bounded_by_bytes_over_line_rate_and_scales_with_it():
    """A write's last packet can not land before every byte crossed the port: the landing
    time is at least bytes x 8 / line rate (plus a header per packet), and halving the line
    rate adds at least that much again."""
    nbytes = 1_000_000
    t: dict[float, float] = {}
    for rate in (100.0, 50.0):
        p = NicParams(line_rate_gbps=rate)
        wire = _wire(nic=p)
        m = wire.write(0, 1, nbytes)
        wire.ring(0, [m])
        wire.run()
        t[rate] = wire.visible[id(m)]
        assert t[rate] >= _wire_ns(nbytes, p) + BASE_NS, (rate, t[rate])
        assert wire.ledger.counters["bytes_landed"] == nbytes
    assert t[50.0] - t[100.0] >= 0.99 * _wire_ns(nbytes, NicParams(line_rate_gbps=100.0))


def test_fan_out_from_one_nic_is_bounded_by_its_egress():
    """One NIC writing to many targets: each target's port carries only its share, so only
    the sender's egress port bounds the last landing by the total bytes over the line rate."""
    k, nbytes = 4, 200_000
    p = NicParams()
    wire = _wire(n_gpus=k + 1, nic=p)
    msgs = [wire.write(0, d, nbytes) for d in range(1, k + 1)]
    wire.ring(0, msgs)
    wire.run()
    assert max(wire.visible.values()) >= k * _wire_ns(nbytes, p) + BASE_NS


def test_incast_at_one_target_is_bounded_by_its_ingress():
    """Many senders to one receiver at once: each sender's port carries one write, so only
    the target's ingress port bounds the landing of all bytes by their total over its rate."""
    k, nbytes = 4, 200_000
    p = NicParams()
    wire = _wire(n_gpus=k + 1, nic=p)
    msgs = []
    for s in range(1, k + 1):
        m = wire.write(s, 0, nbytes)
        msgs.append(m)
        wire.ring(s, [m])
    wire.run()
    assert max(wire.visible[id(m)] for m in msgs) >= k * _wire_ns(nbytes, p) + BASE_NS
    assert wire.ledger.counters["bytes_landed"] == k * nbytes


def test_a_slow_payload_dma_bounds_a_large_put_instead_of_the_port():
    """The NIC fetches the payload over PCIe at ``dma_gbps``: below the line rate, the fetch
    and not the port sets how soon the last byte can leave."""
    nbytes = 1_000_000
    p = NicParams(dma_gbps=25.0)
    wire = _wire(nic=p)
    m = wire.write(0, 1, nbytes)
    wire.ring(0, [m])
    wire.run()
    assert wire.visible[id(m)] >= p.dma_read_ns + nbytes * 8.0 / p.dma_gbps + BASE_NS


def test_a_write_is_cut_into_mtu_packets_each_with_a_header():
    """ceil(bytes / MTU) packets land, every byte once, and each packet's header costs wire
    time at both ports."""
    p = NicParams()
    nbytes = 3 * p.mtu_bytes + 1
    t = {}
    for hdr in (0, 512):
        wire = _wire(nic=p.model_copy(update={"header_bytes": hdr}))
        m = wire.write(0, 1, nbytes)
        wire.ring(0, [m])
        wire.run()
        c = wire.ledger.counters
        assert c["packets_landed"] == 4 and c["bytes_landed"] == nbytes
        t[hdr] = wire.visible[id(m)]
    assert t[512] - t[0] >= 4 * 512 * 8.0 / p.line_rate_gbps


def test_payload_fetch_costs_the_dma_read_unless_inline():
    """A write above ``inline_bytes`` waits for the NIC's PCIe read of its payload; one at or
    below it rides in the WQE."""
    p = NicParams(dma_read_ns=5000.0)
    t = {}
    for nbytes in (p.inline_bytes, p.inline_bytes + 1):
        wire = _wire(nic=p)
        m = wire.write(0, 1, nbytes)
        wire.ring(0, [m])
        wire.run()
        t[nbytes] = wire.visible[id(m)]
    assert t[p.inline_bytes + 1] - t[p.inline_bytes] >= p.dma_read_ns


def test_wqes_of_one_doorbell_are_paced_by_the_message_rate_ceiling():
    """The NIC parses one WQE per max(wqe_process_ns, 1 / max_msg_rate): n tiny writes can not
    all leave before n such slots passed."""
    n = 40
    t = {}
    for mops in (2.0, 1000.0):
        p = NicParams(wqe_process_ns=0.0, max_msg_rate_mops=mops)
        wire = _wire(nic=p)
        msgs = [wire.write(0, 1, 8) for _ in range(n)]
        wire.ring(0, msgs)
        wire.run()
        t[mops] = max(wire.visible.values())
        assert t[mops] >= n * 1e3 / mops
    assert t[2.0] - t[1000.0] >= (n - 1) * (1e3 / 2.0 - 1e3 / 1000.0) * 0.99


def test_completion_comes_completion_ns_after_the_latest_ack():
    """SRD ACKs come back out of order: the CQE waits for the latest one, not the last one
    processed, then ``completion_ns``."""
    p = NicParams()
    fp = FabricParams(paths=8, base_latency_ns=BASE_NS, path_spread_ns=500.0,
                      jitter=JitterParams(distribution="exponential", mean_ns=20_000.0))
    wire = _wire(nic=p, fabric=fp)
    acks: list[float] = []
    orig = wire.nics[0].ack

    def ack(msg: Message, t_arrive: float, *rest) -> None:
        acks.append(t_arrive)
        orig(msg, t_arrive, *rest)

    wire.nics[0].ack = ack  # type: ignore[method-assign]
    m = wire.write(0, 1, 10 * p.mtu_bytes)
    wire.ring(0, [m])
    wire.run()
    assert len(acks) == 10 and max(acks) > acks[-1]  # reordered: the last ACK is not the latest
    assert wire.complete[id(m)] == pytest.approx(max(acks) + p.completion_ns)
    assert wire.qps[0].completions.value == 1


# -- loss, retransmission, duplicates -------------------------------------------------------

def test_a_lost_packet_lands_one_retransmit_timeout_later():
    """The same write with and without its one packet lost: on a quiet wire the difference is
    the retransmit timeout, exactly."""
    rto = 200_000.0
    t = {}
    for lost in (False, True):
        wire = _wire(fabric=FabricParams(paths=1, base_latency_ns=BASE_NS, path_spread_ns=0.0,
                                         jitter=JitterParams(distribution="none"),
                                         retransmit_timeout_ns=rto, loss_prob=0.5))
        wire.fabric._lost = _losses(lost)  # type: ignore[method-assign]
        m = wire.write(0, 1, 4096)
        wire.ring(0, [m])
        wire.run()
        t[lost] = wire.visible[id(m)]
        assert wire.ledger.counters.get("retransmits", 0) == int(lost)
    assert t[True] - t[False] == pytest.approx(rto)


def test_a_lost_ack_resends_the_packet_and_the_duplicate_is_dropped_and_acked():
    """Data landed but its ACK was lost: the resent copy must not land twice (every byte
    once, visible once) yet must be ACKed, or the write would never complete."""
    rto = 200_000.0
    fp = FabricParams(paths=1, base_latency_ns=BASE_NS, path_spread_ns=0.0,
                      jitter=JitterParams(distribution="none"), retransmit_timeout_ns=rto,
                      loss_prob=0.5)
    wire = _wire(fabric=fp)
    wire.fabric._lost = _losses(False, True)  # type: ignore[method-assign]
    m = wire.write(0, 1, 4096)
    wire.ring(0, [m])
    wire.run()
    c = wire.ledger.counters
    assert c["retransmits"] == 1 and c["duplicates_dropped"] == 1
    assert c["bytes_landed"] == 4096 and c["packets_landed"] == 1
    assert wire.n_visible[id(m)] == 1 and wire.visible[id(m)] < rto
    assert wire.complete[id(m)] >= rto + 2 * BASE_NS  # the second copy's ACK completes it


def test_loss_raises_the_tail_by_about_the_retransmit_timeout():
    """With a timeout far above everything else, a loss on the critical path shows as at
    least one whole timeout in the slowest rank, and no more than one per retransmit."""
    rto = 1_000_000.0
    base = _load({"platform.fabric.retransmit_timeout_ns": rto})
    lossy = _load({"platform.fabric.retransmit_timeout_ns": rto, "platform.fabric.loss_prob": 0.2})
    for op in ("dispatch", "combine"):
        t0 = max(simulate_op(base, op, 0).latency_us) * 1e3
        r = simulate_op(lossy, op, 0)
        rt = r.counters.get("retransmits", 0)
        rise = max(r.latency_us) * 1e3 - t0
        assert rt > 0, op
        assert 0.95 * rto <= rise <= rt * rto + t0, (op, rise, rt)
        assert r.counters["bytes_landed"] == r.counters["bytes_sent"]


# -- visibility and completions on the critical path ---------------------------------------

X_NS = 20_000.0


@pytest.mark.parametrize("opening, hops", [
    ({"design.start_barrier": False, "design.notify_overlaps_data": False}, {True: 1, False: 2}),
    ({"design.start_barrier": True, "design.notify_overlaps_data": True}, {True: 2, False: 2}),
    ({"design.start_barrier": True, "design.notify_overlaps_data": False}, {True: 2, False: 3}),
], ids=["exchange-then-data", "barrier-exchange-beside-data", "barrier-then-exchange"])
def test_visibility_is_on_the_critical_path_once_per_signal_hop(opening, hops):
    """Hybrid dispatch waits for one signal chain per hop, each paying ``visibility_ns``: the
    opening barrier's signals (DeepEP V2), the count exchange where the data waits for it
    (hw/ep's V2; cached dispatch skips it), then the tail after the data. Where the exchange
    runs beside the data (DeepEP V2's notify warps) it is off the path."""
    for cached, n in hops.items():
        sets = {"design.cached": cached, **opening}
        scn = _load(sets)
        base = _p50_ns(scn, "dispatch")
        vis = scn.platform.receiver.visibility_ns
        more = _p50_ns(_load({**sets, "platform.receiver.visibility_ns": vis + X_NS}), "dispatch")
        assert more - base == pytest.approx(n * X_NS, rel=0.05), cached
        # the critical path's what-if agrees: free visibility saves it on every hop
        free = _p50_ns(scn, "dispatch", scale={"visibility": 0.0})
        assert base - free == pytest.approx(n * vis, rel=0.05), cached


def test_the_opening_barrier_puts_one_more_fabric_hop_before_the_combine():
    """DeepEP V2's combine opens with a barrier across the rail peers (``design.start_barrier``):
    its signals cross the fabric before any data moves, so one more one-way latency is on the
    combine's path than without it; the data and finish hops after it are the same."""
    def hops(sets: dict) -> float:
        scn = _load(sets)
        lat = scn.platform.fabric.base_latency_ns
        more = _load({**sets, "platform.fabric.base_latency_ns": lat + X_NS})
        return (_p50_ns(more, "combine") - _p50_ns(scn, "combine")) / X_NS
    without = hops({"design.start_barrier": False})
    with_barrier = hops({"design.start_barrier": True})
    assert with_barrier - without == pytest.approx(1.0, abs=0.1)


def test_send_completion_latency_is_on_the_critical_path_of_a_flush():
    """Flush-then-signal waits for the data's CQEs: ``completion_ns`` is paid once per op."""
    for op in ("dispatch", "combine"):
        scn = _load({})
        base = _p50_ns(scn, op)
        cpl = scn.platform.nic.completion_ns
        more = _p50_ns(_load({"platform.nic.completion_ns": cpl + X_NS}), op)
        assert more - base == pytest.approx(X_NS, rel=0.1), op


@pytest.mark.parametrize("sets, knob", [
    ({"design.protocol": "v1-ll", "design.cached": True}, "receiver.recv_completion_ns"),
    ({"design.signal_mode": "hw-counter", "platform.nic.hw_counters": True}, "nic.completion_ns"),
], ids=["imm-counting", "hw-counter"])
def test_receiver_side_counting_pays_its_completion_latency(sets, knob):
    """Counting at the target: each write counts ``recv_completion_ns`` (a receive CQE of a
    write-with-immediate; V1 LL cached dispatch) or ``completion_ns`` (the NIC's arrival
    counter) after it became visible; the last count is on the path."""
    scn = _load(sets)
    piece, name = knob.split(".")
    now = getattr(getattr(scn.platform, piece), name)
    more = _load({**sets, f"platform.{knob}": now + X_NS})
    assert _p50_ns(more, "dispatch") - _p50_ns(scn, "dispatch") == pytest.approx(X_NS, rel=0.1)


# -- the native issuer: doorbells, the doorbell turn, the SQ bound -------------------------

def _one_warp(extra: dict) -> dict:
    return {**QUIET, "design.num_sms": 1, "design.warps_per_sm": 1, **extra}


def _post(w: World, port, n: int, nbytes: int = 1024, dst: int = 1, after: bool = True):
    for i in range(n):
        yield from put(w, port, port.rank, dst, nbytes, RankTag(port.rank), seq=i)
    if after:
        yield from port.finish()


@pytest.mark.parametrize("batch, n, sizes", [(4, 10, [4, 4, 2]), (32, 40, [16, 16, 8])])
def test_doorbell_batch_rings_every_b_wqes_capped_at_max_batch(batch, n, sizes):
    """One warp rings when it holds ``doorbell_batch`` un-rung WQEs, but never holds more than
    the NIC's ``max_batch``; its last, partial batch is rung by ``finish``."""
    w = _world(_load(_one_warp({"design.doorbell_batch": batch})))
    assert w.platform.nic.max_batch == 16
    log = _spy_doorbells(w)
    w.env.process(_post(w, w.port(0, 0), n))
    w.env.run()
    assert [len(m) for _t, m in log] == sizes
    assert w.ledger.counters["doorbells"] == len(sizes)


def test_a_shared_qp_rings_its_doorbells_one_turn_at_a_time():
    """Warps sharing a QP ring in slot order: each doorbell waits for the previous holder's
    lock turn (atomic, doorbell, trailing fences); owned QPs ring together."""
    sets = {**QUIET, "design.num_sms": 1, "design.warps_per_sm": 4}
    shared = _world(_load({**sets, "design.qps_per_call": 2}))  # one data QP for 4 warps
    owned = _world(_load({**sets, "design.qps_per_call": 5, "design.qp_ownership": "owned"}))
    gaps = {}
    for name, w in (("shared", shared), ("owned", owned)):
        log = _spy_doorbells(w)
        for c in range(4):
            w.env.process(_post(w, w.port(0, c), 1))
        w.env.run()
        t = sorted(t for t, _m in log)
        gaps[name] = np.diff(t)
    g, d = shared.platform.gpu, shared.design
    hold = g.atomic_ns + g.doorbell_ns + (d.fences_per_doorbell - 1) * g.fence_ns
    assert len(gaps["shared"]) == 3 and min(gaps["shared"]) >= hold * 0.999
    assert shared.ledger.busy["lock"] > 0
    assert max(gaps["owned"]) == 0.0 and owned.ledger.busy.get("lock", 0.0) == 0.0


def test_deferred_aggregation_rings_once_for_several_warps_wqes():
    """With aggregation over A warps the QP keeps un-rung WQEs across its warps: the post that
    brings them to A x doorbell_batch rings for all, so 4 single puts take 2 doorbells."""
    w = _world(_load({**QUIET, "design.num_sms": 1, "design.warps_per_sm": 4,
                      "design.qps_per_call": 2, "design.deferred_doorbell_aggregation": 2}))
    log = _spy_doorbells(w)
    for c in range(4):
        w.env.process(_post(w, w.port(0, c), 1))
    w.env.run()
    assert sorted(len(m) for _t, m in log) == [2, 2]


def _sq_occupancy(w: World, n: int) -> int:
    """Most WQEs one warp's owned data QP ever held un-completed while posting ``n`` puts."""
    port = w.port(0, 0)
    qp = port.qp
    peak = 0

    def warp():
        nonlocal peak
        for i in range(n):
            yield from put(w, port, 0, 1, 1024, RankTag(0), seq=i)
            peak = max(peak, qp.posted - qp.completions.value)
        yield from port.flush()

    w.env.process(warp())
    w.env.run()
    return peak


def test_credit_checks_keep_an_owned_send_queue_within_its_depth():
    """A warp alone on its QP posts three times the SQ's depth back to back: the credit check
    makes it wait for completions, so the queue fills to its depth and no further."""
    depth, n = 4, 12
    w = _world(_load(_one_warp({"platform.nic.sq_depth": depth})))
    assert _sq_occupancy(w, n) == depth  # the bound binds: the warp waited for credits
    assert w.ledger.busy["credit_wait"] > 0


def test_a_credit_read_with_room_to_spare_is_paid_with_the_wqe_stores(monkeypatch):
    """With the SQ far from full the read before a post cannot end in a wait, so it is paid
    in the same timeout as the WQE stores after it: the same times and costs as paying it
    alone, one event fewer per put. Near a full SQ (room for fewer WQEs than the warps on the
    QP) the read is paid alone and the check after it still makes the warp wait: the same
    times as never fusing."""
    from lever.sim.issuer import NativePort

    def run(sets: dict, fuse: bool) -> tuple[float, int, float]:
        if not fuse:
            monkeypatch.setattr(NativePort, "_room", lambda self, need: False)
        w = _world(_load(_one_warp(sets)))
        port = w.port(0, 0)
        out = {}

        def warp():
            yield from _post(w, port, 12, after=False)
            yield from port.flush()
            out["t"] = w.env.now

        w.env.process(warp())
        n = 0
        try:
            while True:
                w.env.step()
                n += 1
        except simpy.core.EmptySchedule:
            pass
        monkeypatch.undo()
        return out["t"], n, w.ledger.busy["credit_wait"]

    t_f, n_f, cw_f = run({}, True)
    t_u, n_u, cw_u = run({}, False)
    assert t_f == pytest.approx(t_u, rel=1e-12) and cw_f == pytest.approx(cw_u, rel=1e-12)
    assert n_u - n_f == 12  # one timeout fewer per put
    # a shallow queue: no room to spare, the unfused check runs and waits as before
    t_s, n_s, cw_s = run({"platform.nic.sq_depth": 4}, True)
    t_su, n_su, cw_su = run({"platform.nic.sq_depth": 4}, False)
    assert t_s == pytest.approx(t_su, rel=1e-12) and cw_s == pytest.approx(cw_su, rel=1e-12)
    assert t_s > t_f and n_u - n_f > n_su - n_s > 0  # fused while the room lasts, then not


def test_lazy_completion_is_refused_when_the_sq_could_overflow():
    """Lazy completion drops the credit checks only when the call provably fits the SQ; with
    a shallow queue the model refuses it and the queue still never overflows."""
    n = 12
    sets = _one_warp({"design.lazy_completion_dispatch": True})
    shallow = _world(_load({**sets, "platform.nic.sq_depth": 4}))
    assert shallow.routing.max_puts_per_qp(shallow.design) > 4
    assert _sq_occupancy(shallow, n) <= 4
    assert shallow.ledger.counters["lazy_refused"] == 1
    deep = _world(_load({**sets, "platform.nic.sq_depth": 4096}))
    assert _sq_occupancy(deep, n) > 4  # lazy in force: no credit checks, nothing waits
    assert deep.ledger.events.get("credit_wait", 0) == 0
    assert deep.ledger.counters.get("lazy_refused", 0) == 0


def test_flush_waits_for_every_send_completion():
    """A flush returns only when every WQE of the warp has its CQE: at least a flight there
    and an ACK back after the doorbell."""
    w = _world(_load(_one_warp({})))
    port = w.port(0, 0)
    out = {}

    def warp():
        yield from _post(w, port, 5, after=False)
        yield from port.flush()
        out["t"] = w.env.now

    w.env.process(warp())
    w.env.run()
    assert port.done.value == 5 and out["t"] >= 2 * w.platform.fabric.base_latency_ns


@pytest.mark.parametrize("scope", ["warp", "qp"])
def test_a_qp_scoped_flush_waits_for_what_other_warps_ring_meanwhile(scope):
    """Two warps share one QP. Warp 0 posts one write and flushes; warp 1 rings a write every
    microsecond meanwhile. A warp-scoped flush ends one round trip after warp 0's own write;
    a QP-scoped flush (NCCL GIN: submitted == completed, read live) ends only when the QP has
    nothing in flight, after warp 1's last write completed."""
    w = _world(_load({**QUIET, "design.num_sms": 1, "design.warps_per_sm": 2,
                      "design.qps_per_call": 2, "design.flush_scope": scope}))
    a, b = w.port(0, 0), w.port(0, 1)
    assert a.qp is b.qp
    out = {}

    def flusher():
        yield from _post(w, a, 1)
        yield from a.flush()
        out["flush"] = w.env.now

    def other():
        for i in range(8):
            yield from put(w, b, 0, 1, 1024, RankTag(0), seq=i)
            yield w.env.timeout(1000.0)
        yield from b.finish()

    def last_completion():
        yield b.done.reach(8)
        out["b_done"] = w.env.now

    for g in (flusher(), other(), last_completion()):
        w.env.process(g)
    w.env.run()
    rtt = 2 * w.platform.fabric.base_latency_ns
    if scope == "warp":
        assert rtt <= out["flush"] < out["b_done"] - 4000.0
    else:
        assert out["flush"] >= out["b_done"] and a.qp.completions.value == a.qp.rung == 9


def test_a_credit_check_reads_the_counter_once_plus_once_per_new_cqe():
    """Three puts find no completions (one read each); after they completed, the fourth
    check consumes their three CQEs: 1 + 3 reads."""
    w = _world(_load(_one_warp({})))
    port = w.port(0, 0)

    def warp():
        yield from _post(w, port, 3, after=False)
        yield w.env.timeout(10 * w.platform.fabric.base_latency_ns)  # all three completed
        yield from put(w, port, 0, 1, 1024, RankTag(0), seq=3)
        yield from port.flush()

    w.env.process(warp())
    w.env.run()
    assert w.ledger.events["credit_wait"] == 4
    assert w.ledger.busy["credit_wait"] == pytest.approx(7 * port.counter_read_ns)


# -- the receiver ---------------------------------------------------------------------------

def test_a_warp_polling_every_sources_count_at_once_pays_one_poll_after_the_last():
    """Sixteen sources' counts land 1 us apart. A warp whose lanes poll them all at once goes
    on one poll after the last has landed (the lanes' poll, paid once), and a late word in the
    middle of the list holds it no longer than that; polled one after another each would cost
    a poll (at least a device load each)."""
    w = _world(_load({}))
    rcv, g = w.receivers[0], w.platform.gpu
    land = {s: 1000.0 * (s + 1) for s in range(16)}
    land[5] = 30000.0  # the last to land is not the last in the list
    out = {}

    def bump(s: int):
        yield w.env.timeout(land[s])
        rcv.data[RankTag(s)].add(1)
        rcv.known[RankTag(s)].add(1)

    def warp():
        yield from rcv.wait_all([(RankTag(s), 1) for s in range(16)], "rx")
        out["t"] = w.env.now

    for s in range(16):
        w.env.process(bump(s))
    w.env.process(warp())
    w.env.run()
    last = max(land.values())
    assert last + g.device_load_ns <= out["t"] < last + g.device_load_ns + g.poll_interval_ns
    assert w.ledger.events["poll_wait"] == 1  # one poll paid, not sixteen
    assert w.ledger.counters.get("ordering_violations", 0) == 0


def test_a_poller_sees_a_change_at_its_next_poll_plus_one_load():
    """A wait ends one poll phase (uniform over ``poll_interval_ns``) plus one dependent load
    after the awaited word changed."""
    w = _world(_load({}))
    rcv, g = w.receivers[0], w.platform.gpu
    tag = RankTag(1)
    delays: list[float] = []

    def poller():
        for i in range(200):
            t_set = w.env.now + 100.0
            w.env.process(_bump(rcv.known[tag], 100.0))
            yield from rcv.wait(tag, i + 1, "rx", check=False)
            delays.append(w.env.now - t_set)

    def _bump(counter, dt: float):
        yield w.env.timeout(dt)
        counter.add(1)

    w.env.process(poller())
    w.env.run()
    assert min(delays) >= g.device_load_ns
    assert max(delays) < g.device_load_ns + g.poll_interval_ns
    assert max(delays) - min(delays) > 0.8 * g.poll_interval_ns  # a phase, not a constant


def test_unordered_counting_accepts_only_the_visible_prefix_the_adds_cover():
    """In-band headers plus weak SignalAdds: sub-parts 0, 2 and 3 visible and adds worth 4
    give a prefix of 1; sub-part 1 arriving completes it to 4."""
    w = _world(_load({"design.signal_mode": "unordered-counting"}))
    rcv = w.receivers[1]
    tag = RankTag(0)

    def arrive(kind: str, seq: int = 0, value: int = 1) -> None:
        m = w.message(0, 1, 64, tag, kind=kind, value=value, seq=seq)
        rcv.on_visible(m)

    for seq in (0, 2, 3):
        arrive("data", seq)
    arrive("signal", value=4)
    assert rcv.known[tag].value == 1
    arrive("data", 1)
    assert rcv.known[tag].value == 4
    arrive("data", 4)  # visible but not yet vouched for by an add
    assert rcv.known[tag].value == 4


# -- the proxy path ---------------------------------------------------------------------------

def _proxy(extra: dict) -> World:
    return _world(_load({**QUIET, "platform.fabric.retransmit_timeout_ns": 500_000.0,
                         "platform.fabric.loss_prob": 0.5, **extra}, PROXY))


def test_proxy_ring_frees_slots_in_order_so_a_hole_blocks_the_gpu():
    """Ring of depth 2, first descriptor's packet lost: the second completes first, but the
    consumer index can not pass the hole, so the third post waits for the lost write."""
    w = _proxy({"platform.proxy.ring_depth": 2})
    w.fabric._lost = _losses(True)  # type: ignore[method-assign]
    port = w.port(0, 0)
    msgs = [w.message(0, 1, 1024, RankTag(0), seq=i) for i in range(3)]
    t_posted: list[float] = []

    def warp():
        for m in msgs:
            yield from port.post(m)
            t_posted.append(w.env.now)
        yield from port.flush()

    w.env.process(warp())
    w.env.run()
    first, second, _third = msgs
    ring = first.ring
    assert second.t_complete < first.t_complete  # the hole: a later write finished first
    pp = w.platform.proxy
    # the slot frees only after the lost write's CQE reached the host and the report the GPU
    assert t_posted[2] >= first.t_complete + pp.host_cq_poll_ns + pp.host_to_gpu_ns
    assert w.ledger.busy["proxy_queue"] >= first.t_complete - second.t_complete
    assert ring.freed.value == 3 and port.done.value == 3


def test_proxy_receiver_delivers_a_signal_only_after_its_data():
    """The signal overtakes its lost data on SRD; the receiving host holds it until the data
    it vouches for arrived, so a poller never concludes early."""
    w = _proxy({})
    w.fabric._lost = _losses(True)  # the data write's packet
    port = w.port(0, 0)
    tag = RankTag(0)
    rcv = w.receivers[1]
    seen: dict[str, float] = {}

    def sender():
        yield from put(w, port, 0, 1, 1024, tag)
        yield from publish(w, port, 0, 1, tag, 1)
        yield from port.flush()

    def watch(what: str, ev):
        yield ev
        seen[what] = w.env.now

    w.env.process(sender())
    w.env.process(watch("data", rcv.data[tag].reach(1)))
    w.env.process(watch("known", rcv.known[tag].reach(1)))
    w.env.run()
    assert seen["data"] >= w.platform.fabric.retransmit_timeout_ns
    assert seen["known"] >= seen["data"]


def test_proxy_striped_put_counts_once_when_its_last_stripe_arrived():
    """A put above ``stripe_min_bytes`` goes as stripes on several rails; the receiving host
    counts the put once, when all stripes are there (here: after one stripe's timeout)."""
    w = _proxy({})
    w.fabric._lost = _losses(True)  # the first stripe's packet
    port = w.port(0, 0)
    tag = RankTag(0)
    rcv = w.receivers[1]
    pp = w.platform.proxy
    nbytes = 2 * pp.stripe_min_bytes - 1
    seen: dict[str, float] = {}

    def watch():
        yield rcv.data[tag].reach(1)
        seen["data"] = w.env.now

    w.env.process(_post(w, port, 1, nbytes=nbytes, after=False))
    w.env.process(watch())
    w.env.run()
    c = w.ledger.counters
    assert c["messages_stripe"] == 2 and c["bytes_landed"] == nbytes
    assert rcv.data[tag].value == 1
    assert seen["data"] >= w.platform.fabric.retransmit_timeout_ns


# -- NVLink ------------------------------------------------------------------------------------

def test_nvlink_copies_from_one_gpu_share_its_port():
    """Copies issued together leave one after another: the k-th is visible no earlier than
    k serialisations plus the link latency."""
    w = _world(scenario.load(NATIVE, EP2_NODE))
    nl = w.platform.nvlink
    nbytes, k = 1_000_000, 4
    ser = nbytes / nl.gbytes_per_s
    vis: list[float] = []
    for i in range(k):
        tag = ("burst", i)
        w.env.process(nvlink_put(w, 0, 1, nbytes, tag, f"w{i}"))

    def watch(tag):
        yield w.receivers[1].data[tag].reach(1)
        vis.append(w.env.now)

    for i in range(k):
        w.env.process(watch(("burst", i)))
    w.env.run()
    assert sorted(vis)[-1] >= k * ser + nl.flag_latency_ns * 0.999
    assert w.ledger.counters["nvlink_bytes"] == k * nbytes


def test_nvlink_flag_is_delivered_after_the_stores_before_it():
    """A burst of copies from the GPU's warps, then a flag from the first warp to finish:
    the flag rides behind the stores already on the port, never ahead of the last one."""
    w = _world(scenario.load(NATIVE, EP2_NODE))
    rcv = w.receivers[1]
    data, flag = ("burst",), ("flag",)
    nbytes, k = 500_000, 4
    seen: dict[str, float] = {}

    def warp(i: int):
        yield from nvlink_put(w, 0, 1, nbytes, data, f"w{i}")
        if i == 0:
            nvlink_flag(w, 0, 1, flag, 1)

    def watch(what: str, ev):
        yield ev
        seen[what] = w.env.now

    for i in range(k):
        w.env.process(warp(i))
    w.env.process(watch("data", rcv.data[data].reach(k)))
    w.env.process(watch("flag", rcv.flags[flag].reach(1)))
    w.env.run()
    ser = nbytes / w.platform.nvlink.gbytes_per_s
    assert seen["data"] >= k * ser  # the stores did queue behind each other
    assert seen["flag"] >= seen["data"]
    assert rcv.known[flag].value == 1


def test_a_put_to_the_rank_itself_is_the_issuing_warps_own_copy_loop():
    """hw/ep's local_put: the warp copies a put to its own rank 512 bytes a step (one 16-byte
    load per lane, the store waiting for it), then a GPU-scope fence. With
    ``nvlink.self_copy_loads_in_flight`` = 1 a 7.5 KiB token keeps the warp 15 dependent
    device loads and a fence long and lands when the fence is done; 4 loads in flight take
    4 steps; 0 keeps the NVLink port's copy (bytes over the link rate, far shorter), and
    copies to a peer GPU never take the warp's loop."""
    nbytes = 7504

    def copy(n_inflight: int, dst: int = 0, step: float | None = None) -> tuple[float, float]:
        sets = {**EP2_NODE, "platform.nvlink.self_copy_loads_in_flight": n_inflight}
        if step is not None:
            sets["platform.nvlink.self_copy_step_ns"] = step
        w = _world(scenario.load(NATIVE, sets))
        done: dict[str, float] = {}

        def warp():
            yield from nvlink_put(w, 0, dst, nbytes, ("tok",), "w0")
            done["warp"] = w.env.now

        def watch():
            yield w.receivers[dst].data[("tok",)].reach(1)
            done["landed"] = w.env.now

        w.env.process(warp())
        w.env.process(watch())
        w.env.run()
        return done["warp"], done["landed"]

    g = scenario.load(NATIVE, EP2_NODE).platform.gpu
    one = 15 * g.device_load_ns + g.fence_gpu_ns
    assert copy(1) == (pytest.approx(one), pytest.approx(one))
    assert copy(4)[0] == pytest.approx(4 * g.device_load_ns + g.fence_gpu_ns)
    # a step priced on its own (nvlink.self_copy_step_ns) rather than as the unloaded L2 load
    assert copy(1, step=650.0)[0] == pytest.approx(15 * 650.0 + g.fence_gpu_ns)
    port = copy(0)
    assert port[0] < one / 10 and port[1] < one
    assert copy(1, dst=1) == pytest.approx(copy(0, dst=1))


# -- conservation ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [NATIVE, PROXY])
def test_every_byte_lands_once_under_loss(name):
    """Heavy loss, native and proxy: retransmits and duplicates happen, yet every sent byte
    lands exactly once and nothing is consumed before it is visible."""
    scn = _load({"platform.fabric.loss_prob": 0.2, "platform.fabric.retransmit_timeout_ns": 30_000.0},
                name)
    for op in ("dispatch", "combine"):
        r = simulate_op(scn, op, 1)
        c = r.counters
        assert c["retransmits"] > 0 and c["bytes_landed"] == c["bytes_sent"], (op, c)
        assert c.get("ordering_violations", 0) == 0
        assert math.isfinite(max(r.latency_us))
