"""Behaviour tests of the mechanisms the EFA fits were standing in for (issue 15): receive
completions counted one by one from a CQ, the receive queue write-with-immediate consumes,
the device's completion counters, WQEs larger than 64 B, and a final reduction spread over
the reducing warps but bounded by device memory. Each test fails when its mechanism is
removed (``benchmarks/mutants.py`` removes them one at a time)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from lever.sim import scenario
from lever.sim.context import Context
from lever.sim.engine import Ledger, Trace
from lever.sim.model import World, simulate_op
from lever.sim.protocols.common import final_reduce_ns, put
from lever.sim.recv_cq import CQ_LINE_BYTES, RecvCq
from lever.sim.routing import Routing
from lever.sim.scenario import ScenarioError
from lever.sim.tags import RankTag

NATIVE = "decode-ep16-efa-native"
EP2 = {"workload.ep_ranks": 2, "workload.gpus_per_node": 1, "workload.tokens_per_rank": 4}
QUIET = {"platform.fabric.path_spread_ns": 0.0, "platform.fabric.jitter.distribution": "none"}


def _load(sets: dict, name: str = NATIVE):
    return scenario.load(name, {**EP2, **sets})


def _world(scn) -> World:
    return World(scn, "dispatch", 0, Ledger(), Trace(), Routing.for_scenario(scn, 0))


def _cq(sets: dict) -> tuple[simpy.Environment, RecvCq, list[float], Context]:
    scn = _load(sets)
    env = simpy.Environment()
    ctx = Context(env, Ledger(), Trace(), scn.platform, scn.design)
    seen: list[float] = []
    return env, RecvCq(ctx, lambda _item: seen.append(env.now)), seen, ctx


# -- the receive CQ ---------------------------------------------------------------------------

@pytest.mark.parametrize("in_device", [True, False])
def test_a_burst_of_cqes_is_consumed_in_order_one_line_per_read(in_device):
    """Eight CQEs written at once: the owner reads them a line at a time (64 B / cqe_bytes per
    read) and counts each after its line's read plus per-CQE work; the read is a load from
    GPU memory or a PCIe read, as the CQ's placement says."""
    env, cq, seen, ctx = _cq({"platform.gpu.completion_counter_in_device_memory": in_device})
    g, rp, nic = ctx.platform.gpu, ctx.platform.receiver, ctx.platform.nic
    for i in range(8):
        cq.cqe(i)
    env.run()
    per_line = CQ_LINE_BYTES // rp.cqe_bytes
    read = g.device_load_ns if in_device else g.pcie_read_ns
    per_cqe = rp.cq_poll_ns + (0.0 if nic.unsolicited_write_recv else rp.rq_repost_ns)
    lines = -(-8 // per_line)
    assert cq.reads == lines
    assert seen[-1] == pytest.approx(lines * read + 8 * per_cqe)
    assert seen[0] == pytest.approx(read + per_line * per_cqe)  # the first line's CQEs together
    assert seen == sorted(seen)


def test_cqes_that_share_a_line_are_read_together():
    """16 B CQEs put four in a line: a burst of eight takes two reads, 64 B CQEs eight; CQEs
    arriving one at a time, each after the owner went idle, take a read each."""
    reads = {}
    for size in (16, 64):
        env, cq, _seen, _ctx = _cq({"platform.receiver.cqe_bytes": size})
        for i in range(8):
            cq.cqe(i)
        env.run()
        reads[size] = cq.reads
    assert reads == {16: 2, 64: 8}
    env, cq, seen, _ctx = _cq({"platform.receiver.cqe_bytes": 16})
    for i in range(4):
        env.run(until=env.now + 10_000.0)
        cq.cqe(i)
    env.run()
    assert cq.reads == 4


def test_unsolicited_write_receive_saves_the_repost_of_every_cqe():
    done = {}
    for unsolicited in (False, True):
        env, cq, seen, ctx = _cq({"platform.nic.unsolicited_write_recv": unsolicited})
        for i in range(6):
            cq.cqe(i)
        env.run()
        done[unsolicited] = seen[-1]
    assert done[False] - done[True] == pytest.approx(6 * ctx.platform.receiver.rq_repost_ns)


def test_imm_counting_dispatch_pays_the_cq_over_pcie_where_the_cq_is_in_host_memory():
    """Cached V1 LL dispatch counts receive CQEs: a slower PCIe read lengthens it when the CQ is
    in host memory (each line read crosses PCIe) and not when it is in GPU memory."""
    base = {**QUIET, "design.protocol": "v1-ll", "design.cached": True}

    def p50(sets: dict) -> float:
        scn = _load({**base, **sets})
        return float(np.median([x for s in range(2) for x in simulate_op(scn, "dispatch", s).latency_us]))

    for in_device, moves in ((False, True), (True, False)):
        sets = {"platform.gpu.completion_counter_in_device_memory": in_device}
        slow = {**sets, "platform.gpu.pcie_read_ns": 20000.0}
        gain = p50(slow) - p50(sets)
        if moves:
            assert gain > 15.0, gain  # us: at least one 20 us read on the path
        else:
            assert abs(gain) < 1.0, gain


def test_imm_counting_counts_every_write_once_through_the_cq():
    scn = _load({**QUIET, "design.protocol": "v1-ll", "design.cached": True})
    w = _world(scn)
    simulate = simulate_op(scn, "dispatch", 0)
    assert simulate.counters["recv_cqes"] == simulate.counters["messages_data"]
    assert w.receivers[0].cqs == {}  # made only when a write-with-immediate lands


# -- completion counters ---------------------------------------------------------------------

def _credit_reads(sets: dict) -> tuple[float, float]:
    w = _world(_load({"design.num_sms": 1, "design.warps_per_sm": 1, **sets}))
    port = w.port(0, 0)

    def warp():
        for i in range(3):
            yield from put(w, port, 0, 1, 1024, RankTag(0), seq=i)
        yield from port.finish()
        yield w.env.timeout(10 * w.platform.fabric.base_latency_ns)  # all three completed
        yield from put(w, port, 0, 1, 1024, RankTag(0), seq=3)
        yield from port.flush()

    w.env.process(warp())
    w.env.run()
    return w.ledger.busy["credit_wait"], port.counter_read_ns


def test_a_device_completion_counter_is_one_read_from_gpu_memory_whatever_completed():
    """Without counters the fourth credit check reads the CQ plus its three new CQEs, through
    PCIe on p5; with the device's counter every check is one read of GPU memory."""
    cq_busy, cq_read = _credit_reads({})
    hw_busy, hw_read = _credit_reads({"platform.nic.hw_counters": True})
    g = _load({}).platform.gpu
    assert cq_read == g.pcie_read_ns and hw_read == g.device_load_ns
    assert cq_busy == pytest.approx(7 * cq_read)
    assert hw_busy == pytest.approx(4 * hw_read)


def test_hw_counter_signalling_is_refused_on_a_nic_without_counters():
    with pytest.raises(ScenarioError, match="nic.hw_counters"):
        _load({"design.signal_mode": "hw-counter"})
    assert _load({"design.signal_mode": "hw-counter", "platform.nic.hw_counters": True})


# -- WQE size ------------------------------------------------------------------------------

@pytest.mark.parametrize("inline, nbytes, blocks", [
    (32, 32, 1),    # fits beside the 32 B descriptor
    (32, 64, 1),    # not inline: the payload is fetched by DMA, the WQE stays 64 B
    (96, 64, 2),    # inline beyond 32 B: a 128 B WQE
    (96, 96, 2),
    (160, 160, 3),
])
def test_a_wqe_grows_by_64_b_blocks_when_inline_data_does_not_fit(inline, nbytes, blocks):
    w = _world(_load({"platform.nic.inline_bytes": inline}))
    assert w.port(0, 0).wqe_blocks(nbytes) == blocks


def test_inline_signals_in_128_b_wqes_pay_twice_the_stores_and_no_payload_fetch():
    """64 B writes: with 32 B inline they are fetched by DMA from 64 B WQEs; with 96 B inline
    they ride in 128 B WQEs (two blocks of stores each) and skip the DMA read."""
    out = {}
    for inline in (32, 96):
        scn = _load({**QUIET, "platform.nic.inline_bytes": inline, "design.num_sms": 1,
                     "design.warps_per_sm": 1, "design.qp_ownership": "owned"})
        w = _world(scn)
        port = w.port(0, 0)
        t = {}

        def warp(w=w, port=port, t=t):
            for i in range(4):
                yield from put(w, port, 0, 1, 64, RankTag(0), seq=i)
            yield from port.flush()
            t["end"] = w.env.now

        w.env.process(warp())
        w.env.run()
        out[inline] = (w.ledger.events["wqe"], w.ledger.busy["wqe"], t["end"])
    g = _load({}).platform.gpu
    assert out[96][1] - out[32][1] == pytest.approx(4 * g.wqe_store_ns)
    assert out[96][0] - out[32][0] == 4
    nic = _load({}).platform.nic
    assert out[32][2] - out[96][2] > 0.9 * nic.dma_read_ns - 4 * g.wqe_store_ns


# -- the final reduction -------------------------------------------------------------------

def test_the_final_reduction_spreads_over_the_reducing_warps_down_to_the_hbm_floor():
    kib = 14400 / 1024 * 8 * 128  # V1 LL combine at decode shape: top-8 rows of 128 tokens
    few = _world(_load({"design.reduce_warps": 96}))
    many = _world(_load({"design.reduce_warps": 96 * 40}))
    g = few.platform.gpu
    assert final_reduce_ns(few, kib) == pytest.approx(g.reduce_ns_per_kib * kib / 96)
    floor = kib * 1024 / g.hbm_gbytes_per_s
    assert final_reduce_ns(many, kib) == pytest.approx(max(g.reduce_ns_per_kib * kib / 3840, floor))
    fast = _world(_load({"design.reduce_warps": 96 * 40, "platform.gpu.reduce_ns_per_kib": 1.0}))
    assert final_reduce_ns(fast, kib) == pytest.approx(floor)
    chan = _world(_load({}))
    assert final_reduce_ns(chan, kib) == pytest.approx(max(g.reduce_ns_per_kib * kib / chan.channels, floor))


def test_gin_gda_signals_through_counters_where_the_instance_has_them_unless_told_otherwise():
    """NCCL GIN EFA-GDA: flush-then-signal on p5 (no counters), the device's counters on p5en;
    a signalling mode a lever or --set chooses holds on both."""
    for platform, mode in (("p5", "flush"), ("p5en", "hw-counter"), ("p6-b200", "hw-counter")):
        scn = scenario.compose(platform, "deepep-v2-hybrid-gin-gda", ep=16)
        assert scn.design.signal_mode == mode, platform
    told = scenario.compose("p5en", "deepep-v2-hybrid-gin-gda", ep=16,
                            overrides={"design.signal_mode": "imm-counting"})
    assert told.design.signal_mode == "imm-counting"
    # and the counters shorten the op: no flush round trip before each tail
    fast = scenario.compose("p5en", "deepep-v2-hybrid-gin-gda", ep=16, overrides={**EP2, **QUIET})
    slow = scenario.compose("p5en", "deepep-v2-hybrid-gin-gda", ep=16,
                            overrides={**EP2, **QUIET, "design.signal_mode": "flush"})
    p50 = {k: float(np.median(simulate_op(s, "dispatch", 0).latency_us)) for k, s in (("hw", fast), ("flush", slow))}
    assert p50["hw"] < p50["flush"], p50


# -- the proxy's receiving host threads ------------------------------------------------------

def test_the_gin_proxy_receive_side_runs_on_as_many_host_threads_as_send():
    """Each receiving host thread owns the endpoints of its index: with 4 threads the receive
    completions of a rank are handled by all four (not one serial host resource), and with
    a slow host CQ read that shortens the op."""
    sets = {**QUIET, "platform.proxy.host_cq_poll_ns": 5000.0}

    scn4 = _load({**sets, "platform.proxy.threads": 4}, name="decode-ep16-efa-proxy")
    r1 = simulate_op(_load({**sets, "platform.proxy.threads": 1}, name="decode-ep16-efa-proxy"), "dispatch", 0)
    r4 = simulate_op(scn4, "dispatch", 0)
    assert max(r4.latency_us) < max(r1.latency_us)
    from lever.sim.model import run_protocol

    w = _world(scn4)
    run_protocol(w)
    w.env.run()
    worked = [t for t in w.receivers[1]._host_busy_until if t > 0]
    assert len(worked) > 1, w.receivers[1]._host_busy_until  # not one serial host resource


# -- signals in post groups -------------------------------------------------------------------

@pytest.mark.parametrize("group", [1, 4, 16, 64])
def test_signals_posted_as_one_group_share_a_doorbell(group):
    """V1 LL with one warp: its count signals to the peer ring one doorbell per post group of
    ``design.signal_post_group`` (at most nic.max_batch) instead of one each; the data's
    doorbells do not change, and fewer doorbells on the warp's chain end the op no later."""
    sets = {**EP2, **QUIET, "design.protocol": "v1-ll", "design.num_sms": 1, "design.warps_per_sm": 1,
            "design.forward_warps_per_sm": 0, "workload.num_experts": 64, "workload.top_k": 2}
    base = simulate_op(scenario.load(NATIVE, sets), "dispatch", 0)
    scn = scenario.load(NATIVE, {**sets, "design.signal_post_group": group})
    res = simulate_op(scn, "dispatch", 0)
    signals = scn.workload.num_experts // 2  # per rank: counts to the peer's experts (own: NVLink)
    g = min(group, scn.platform.nic.max_batch)
    saved = 2 * (signals - -(-signals // g))  # doorbells are counted over both ranks
    assert base.counters["doorbells"] - res.counters["doorbells"] == saved
    assert max(res.latency_us) <= max(base.latency_us)


def test_per_rank_combine_flags_send_one_flag_per_destination_and_wait_for_every_source():
    """V1 LL combine as the hw/ep kernels run it: one flag per destination rank after all its
    rows (not one per expert and source), and no reduction before every source's flag."""
    sets = {**EP2, **QUIET, "design.protocol": "v1-ll", "design.forward_warps_per_sm": 0,
            "workload.num_experts": 16, "workload.top_k": 2}
    per_expert = simulate_op(scenario.load(NATIVE, sets), "combine", 0)
    scn = scenario.load(NATIVE, {**sets, "design.ll_combine_flags": "per-rank"})
    res = simulate_op(scn, "combine", 0)
    R, E = 2, 16
    assert per_expert.counters["messages_signal"] == R * (E // R) * (R - 1)  # own rank: NVLink
    assert res.counters["messages_signal"] == R * (R - 1)
    assert max(res.latency_us) < max(per_expert.latency_us)  # fewer flags on the critical chain


# -- the GPU's read path to host memory -------------------------------------------------------

def test_host_read_path_queues_lines_but_not_a_lone_read():
    from lever.sim.issuer import HostReadPath

    h = HostReadPath()
    assert h.read(0.0, 40.0, 1000.0) == 1000.0  # alone: the round trip
    # 128 polls of 32 lines at 1.27 ns each, all at once: the last waits for 5.2 us of lines
    h = HostReadPath()
    ends = [h.read(0.0, 32 * 1.27, 1073.0) for _ in range(128)]
    assert ends[0] == 1073.0 and ends[-1] == pytest.approx(128 * 32 * 1.27)
    assert ends == sorted(ends)


def test_many_warps_polling_a_host_memory_cq_queue_on_the_read_path():
    """Credit polls of a send CQ in host memory: with 32 lines per poll and every warp of
    the rank polling, reads queue on the GPU's read path, so the credit wait grows; with the
    CQ in device memory the path is not used."""
    sets = {**EP2, **QUIET, "design.protocol": "v1-ll", "design.forward_warps_per_sm": 0,
            "platform.gpu.completion_counter_in_device_memory": False,
            "design.credit_read_lines": 32,
            # the line queue alone: polls of one CQ waiting their turn bypass it (CqReadQueue)
            "platform.nic.cq_shared_read_ns": 0.0}
    base = simulate_op(scenario.load(NATIVE, {**sets, "platform.gpu.host_read_line_ns": 0.0}), "dispatch", 0)
    slow = simulate_op(scenario.load(NATIVE, {**sets, "platform.gpu.host_read_line_ns": 20.0}), "dispatch", 0)
    assert max(slow.latency_us) > max(base.latency_us)
    assert slow.ledger.busy["credit_wait"] > base.ledger.busy["credit_wait"]
    dev = {**sets, "platform.gpu.completion_counter_in_device_memory": True}
    a = simulate_op(scenario.load(NATIVE, {**dev, "platform.gpu.host_read_line_ns": 0.0}), "dispatch", 0)
    b = simulate_op(scenario.load(NATIVE, {**dev, "platform.gpu.host_read_line_ns": 20.0}), "dispatch", 0)
    assert a.latency_us == b.latency_us


# -- polls of one CQ, and the doorbell turn in slot order -------------------------------------

def test_polls_of_one_cq_are_served_one_after_another():
    from lever.sim.issuer import CqReadQueue

    q = CqReadQueue()
    starts = [q.start(0.0, 1150.0) for _ in range(4)]
    assert starts == [0.0, 1150.0, 2300.0, 3450.0]
    assert q.start(10_000.0, 1150.0) == 10_000.0  # the CQ idle by then: served at once


def _credit_world(sets: dict) -> World:
    return _world(scenario.load(NATIVE, {**EP2, **QUIET, "design.protocol": "v1-ll",
                                         "design.forward_warps_per_sm": 0,
                                         "platform.gpu.completion_counter_in_device_memory": False,
                                         "platform.gpu.host_read_line_ns": 0.0, **sets}))


@pytest.mark.parametrize("lines", [1, 32])
def test_a_credit_poll_reads_until_a_read_finds_no_new_cqe(lines):
    """40 CQEs written since the last poll: a poll reading one CQE at a time reads 41 times,
    one reading 32 at once (hw/ep cq_poll) reads 3 times (32, 8, then none new)."""
    w = _credit_world({"design.credit_read_lines": lines, "platform.nic.cq_shared_read_ns": 0.0})
    port = w.port(0, 0)
    port.qp.completions.value = 40
    reads = 1 + -(-40 // lines)
    assert port._credit_read() == pytest.approx(reads * w.platform.gpu.pcie_read_ns)
    assert port._credit_read() == pytest.approx(w.platform.gpu.pcie_read_ns)  # none new


def test_warps_polling_one_host_cq_at_once_wait_their_turn():
    """Warps sharing a QP poll its CQ in host memory at the same instant: with
    nic.cq_shared_read_ns the k-th waits k intervals before its read; a warp on another QP
    does not wait; with the CQ in device memory nobody does."""
    w = _credit_world({"platform.nic.cq_shared_read_ns": 1000.0})
    rtt = w.platform.gpu.pcie_read_ns
    shared = [p for p in (w.port(0, c) for c in range(w.channels)) if p.qp is w.port(0, 0).qp]
    assert len(shared) >= 2
    assert [p._credit_read() for p in shared[:2]] == pytest.approx([rtt, 1000.0 + rtt])
    other = next(p for p in (w.port(0, c) for c in range(w.channels)) if p.qp is not w.port(0, 0).qp)
    assert other._credit_read() == pytest.approx(rtt)
    dev = _credit_world({"platform.nic.cq_shared_read_ns": 1000.0,
                         "platform.gpu.completion_counter_in_device_memory": True})
    ports = [dev.port(0, c) for c in range(dev.channels)]
    same = [p for p in ports if p.qp is ports[0].qp][:2]
    assert [p._credit_read() for p in same] == pytest.approx([dev.platform.gpu.device_load_ns] * 2)


def test_slot_turn_grants_tickets_in_order():
    from lever.sim.issuer import SlotTurn

    env = simpy.Environment()
    t = SlotTurn(env)
    a, b, c = t.take(), t.take(), t.take()
    assert t.wait(a) is None  # first reserved: its turn at once
    ev_c, ev_b = t.wait(c), t.wait(b)
    assert ev_c is not None and ev_b is not None
    t.passed(a)
    assert ev_b.triggered and not ev_c.triggered  # b rings before c, whoever was ready first
    t.passed(b)
    assert ev_c.triggered


def test_doorbells_of_a_shared_qp_ring_in_the_order_slots_were_reserved():
    """A warp reserves its slots before its credit poll; a poll reads once per CQE written
    since the last poll (one CQE per read), so the first of two warps polling reads the CQEs
    and the second finds none and gets ready first. The doorbells still ring in reservation
    order (a turn taken when ready would let the second overtake)."""
    from lever.sim import issuer, nic

    scn = scenario.load(NATIVE, {**EP2, **QUIET, "design.protocol": "v1-ll",
                                 "design.forward_warps_per_sm": 0, "workload.tokens_per_rank": 32,
                                 "design.qps_per_call": 2,
                                 "platform.gpu.completion_counter_in_device_memory": False,
                                 "design.credit_read_lines": 1,
                                 "platform.nic.cq_shared_read_ns": 0.0})
    posted: dict[int, list[int]] = {}
    rung: dict[int, list[int]] = {}
    orig_post, orig_db = issuer.NativePort.post, nic.Nic.doorbell

    def post(self, msg, limit=None):
        if self.turn is not None or self.shared:
            posted.setdefault(id(self.qp), []).append(id(msg))
        return orig_post(self, msg, limit)

    def doorbell(self, msgs):
        for m in msgs:
            rung.setdefault(id(m.qp), []).append(id(m))
        return orig_db(self, msgs)

    mp = pytest.MonkeyPatch()
    mp.setattr(issuer.NativePort, "post", post)
    mp.setattr(nic.Nic, "doorbell", doorbell)
    try:
        res = simulate_op(scn, "dispatch", 0)
    finally:
        mp.undo()
    assert res.latency_us and sum(len(v) for v in posted.values()) > 50
    for k, order in posted.items():
        assert rung[k] == order
    assert res.ledger.busy["lock"] > 0  # someone was ready before its turn


def test_a_fence_waits_for_the_host_reads_in_flight():
    from lever.sim.issuer import HostReadPath

    h = HostReadPath()
    assert h.fence_ns(0.0, 500.0) == 500.0  # nothing in flight: its own cost
    h.read(0.0, 40.0, 1000.0)
    assert h.fence_ns(100.0, 500.0) == pytest.approx(900.0)  # the read is back at 1000
    assert h.fence_ns(2000.0, 500.0) == 500.0


@pytest.mark.parametrize("in_device", [False, True])
def test_fences_slow_down_as_credit_polls_of_a_host_cq_do(in_device):
    """Warps sharing a QP poll its host-memory CQ one after another: a fence issued while
    those reads are in flight waits for them (gpu.fence_waits_host_reads), so dispatch's
    fence time grows; with the CQ in GPU memory there are no such reads and nothing moves."""
    sets = {**EP2, **QUIET, "design.protocol": "v1-ll", "design.forward_warps_per_sm": 0,
            "workload.tokens_per_rank": 32, "design.qps_per_call": 2,
            "platform.gpu.completion_counter_in_device_memory": in_device,
            "design.credit_read_lines": 32, "platform.nic.cq_shared_read_ns": 1150.0}
    off = simulate_op(scenario.load(NATIVE, {**sets, "platform.gpu.fence_waits_host_reads": False}), "dispatch", 0)
    on = simulate_op(scenario.load(NATIVE, {**sets, "platform.gpu.fence_waits_host_reads": True}), "dispatch", 0)
    if in_device:
        assert on.latency_us == off.latency_us
    else:
        assert on.ledger.busy["fence"] > 2 * off.ledger.busy["fence"]
        assert max(on.latency_us) > max(off.latency_us)


def test_every_post_turn_under_aggregation_passes_the_turn_per_group_and_rings_the_pool():
    """Deferred aggregation as hw/ep runs it (design.aggregation_turn = "every-post"): every
    post group waits for the QP's turn in slot order, the group that fills the pool to
    nic.max_batch rings it (its system fence inside the turn), the others hand the turn on;
    with "ringer" only the filling warp takes a (FIFO) turn and no slot turn is used."""
    from lever.sim import issuer, nic

    sets = {**EP2, **QUIET, "design.protocol": "v1-ll", "design.forward_warps_per_sm": 0,
            "workload.tokens_per_rank": 32, "design.qps_per_call": 2,
            "design.deferred_doorbell_aggregation": 16}
    counts = {"take": 0, "db": 0, "wqes": 0}
    orig_take, orig_db = issuer.SlotTurn.take, nic.Nic.doorbell

    def take(self):
        counts["take"] += 1
        return orig_take(self)

    def doorbell(self, msgs):
        counts["db"] += 1
        counts["wqes"] += len(msgs)
        return orig_db(self, msgs)

    mp = pytest.MonkeyPatch()
    mp.setattr(issuer.SlotTurn, "take", take)
    mp.setattr(nic.Nic, "doorbell", doorbell)
    try:
        every = simulate_op(scenario.load(NATIVE, {**sets, "design.aggregation_turn": "every-post"}), "dispatch", 0)
        seen = dict(counts)
        counts.update(take=0, db=0, wqes=0)
        ringer = simulate_op(scenario.load(NATIVE, {**sets, "design.aggregation_turn": "ringer"}), "dispatch", 0)
    finally:
        mp.undo()
    assert every.latency_us and ringer.latency_us
    assert seen["db"] > 0 and seen["take"] >= 4 * seen["db"]  # most groups hand the turn on
    assert seen["wqes"] / seen["db"] > 4  # the pool rings many groups' WQEs at once
    assert counts["take"] == 0 and counts["db"] > 0


def test_every_post_turn_hand_off_is_a_system_release():
    """hw/ep passes the turn of a QP whose doorbell is host or BAR memory with st.release.sys,
    rung or not: a release at system scope is a system fence before the store. So under
    every-post aggregation each post group pays the fence after a doorbell (fences_per_doorbell
    - 1) when it hands the turn on, and only the ringer pays the fence before its doorbell.
    Each group also pays its GPU-scope fence before the hand-off: fences counted = 2 x groups
    + ringers. With fences_per_doorbell = 1 (no fence after the doorbell) a hand-off pays
    none: groups + ringers."""
    sets = {**EP2, **QUIET, "design.protocol": "v1-ll", "design.forward_warps_per_sm": 0,
            "workload.tokens_per_rank": 32, "design.qps_per_call": 2,
            "design.deferred_doorbell_aggregation": 16, "design.aggregation_turn": "every-post"}
    r2 = simulate_op(scenario.load(NATIVE, sets), "dispatch", 0)
    r1 = simulate_op(scenario.load(NATIVE, {**sets, "design.fences_per_doorbell": 1}), "dispatch", 0)
    groups = r2.ledger.events["lock"]  # one turn (an atomic on the turn word) per post group
    rung = r2.counters["doorbells"]
    assert groups > 4 * rung > 0
    assert r2.ledger.events["fence"] == 2 * groups + rung
    assert r1.ledger.events["fence"] == r1.ledger.events["lock"] + r1.counters["doorbells"]
    assert r2.ledger.busy["fence"] > r1.ledger.busy["fence"] + (groups - rung) * 0.5 * 1e3
    # gpu.turn_release_ns sets that fence's cost apart from the fence after the WQE stores
    f = scenario.load(NATIVE, sets).platform.gpu.fence_ns
    r0 = simulate_op(scenario.load(NATIVE, {**sets, "platform.gpu.turn_release_ns": 0.0}), "dispatch", 0)
    assert r0.ledger.busy["fence"] < r2.ledger.busy["fence"] - 0.5 * groups * f


# -- receive CQs per destination QP, spun on by their warp; CQE writes on the NIC's engine ----

def test_a_fence_waits_for_the_read_a_spinning_poller_has_out():
    """A warp spinning on a host line (a receive CQ) has one read out at every instant, back
    to back from its phase: a fence waits for the one out when it issues, and only while the
    warp spins."""
    from lever.sim.issuer import HostReadPath

    h = HostReadPath()
    owner = object()
    h.spin(owner, 0.0, 1000.0)
    assert h.fence_ns(2300.0, 100.0) == pytest.approx(700.0)  # the read issued at 2000 is back at 3000
    assert h.fence_ns(2950.0, 100.0) == pytest.approx(100.0)  # its own cost is longer
    h.unspin(owner)
    assert h.fence_ns(2300.0, 100.0) == 100.0


def _dest_qp_cq(sets: dict) -> tuple[simpy.Environment, RecvCq, list[float], Context]:
    scn = _load({"design.recv_cq": "per-dest-qp", "design.recv_cq_cqes_per_read": 1, **sets})
    env = simpy.Environment()
    ctx = Context(env, Ledger(), Trace(), scn.platform, scn.design)
    seen: list[float] = []
    return env, RecvCq(ctx, lambda _item: seen.append(env.now), spins=True), seen, ctx


def test_a_destination_qps_cq_is_read_only_while_its_warp_waits_one_cqe_per_read():
    """per-dest-qp: CQEs written before the owning warp polls wait for it; then each read
    returns one CQE (recv_cq_cqes_per_read = 1), so n CQEs cost n reads."""
    env, cq, seen, ctx = _dest_qp_cq({"platform.gpu.completion_counter_in_device_memory": False})
    g, rp, nic = ctx.platform.gpu, ctx.platform.receiver, ctx.platform.nic
    per_cqe = rp.cq_poll_ns + (0.0 if nic.unsolicited_write_recv else rp.rq_repost_ns)
    for i in range(4):
        cq.cqe(i)
    env.run(until=50_000)
    assert seen == [] and cq.reads == 0  # nobody polls it yet
    cq.spin_start()
    env.run()
    assert cq.reads == 4
    assert seen[-1] == pytest.approx(50_000 + 4 * (g.pcie_read_ns + per_cqe))


def test_a_cqe_written_mid_spin_is_seen_by_the_next_read_of_the_spin():
    """The warp spins from t = 0 with reads of one round trip each: a CQE written at 0.3 of a
    round trip is caught by the read issued at 1 round trip, back at 2."""
    env, cq, seen, ctx = _dest_qp_cq({"platform.gpu.completion_counter_in_device_memory": False})
    rp, nic = ctx.platform.receiver, ctx.platform.nic
    rt = ctx.platform.gpu.pcie_read_ns
    per = rp.cq_poll_ns + (0.0 if nic.unsolicited_write_recv else rp.rq_repost_ns)
    cq.spin_start()
    env.run(until=0.3 * rt)
    cq.cqe("x")
    env.run()
    assert seen == [pytest.approx(2 * rt + per)]


# the host engine paying doorbell_process_ns per doorbell instead of working in passes
PER_DOORBELL = {"platform.nic.host_doorbell_read_ns": 0.0, "platform.nic.host_mirror_copy_ns": 0.0}


def _write_imm(sets: dict):
    """V1 EP2 write-with-immediate on the emulated testbed's shape (hw/ep): a receive CQ per
    destination QP, one CQE per read."""
    base = {"workload.ep_ranks": 2, "workload.gpus_per_node": 1, "workload.tokens_per_rank": 32,
            "design.protocol": "v1-ll", "design.forward_warps_per_sm": 0,
            "design.signal_mode": "imm-counting", "design.ll_combine_flags": "per-rank",
            "design.recv_cq": "per-dest-qp", "design.recv_cq_cqes_per_read": 1,
            "design.num_sms": 4, **QUIET}
    return scenario.load("emu-ep2-native", {**base, **sets})


@pytest.mark.parametrize("op", ["dispatch", "combine"])
def test_receive_cqes_written_into_host_memory_queue_on_the_sending_nics_engine(op):
    """The emulated NIC writes every CQE into host memory on its one host-engine warp
    (nic.host_cqe_write_ns): with the receive CQs in host memory write-with-immediate's CQEs
    queue there with the send CQEs and the WQE work, and the op slows; with them in GPU memory
    (hw/ep --rxcq device) only the send CQEs pay. Without the engine cost the two are alike."""
    lat = {}
    for w in (0.0, 4000.0):  # beyond the engine's share of a CQE's interval: it queues
        for rx_dev in (False, True):
            scn = _write_imm({"platform.nic.host_cqe_write_ns": w,
                              "platform.receiver.recv_cq_in_device_memory": rx_dev})
            res = simulate_op(scn, op, 0)
            lat[(w, rx_dev)] = max(res.latency_us)
            if w:
                writes = res.ledger.counters["nic_host_cqe_writes"]
                cqes = res.ledger.counters["recv_cqes"]
                assert writes >= cqes > 0 if not rx_dev else writes > 0
    assert lat[(4000.0, False)] > lat[(4000.0, True)] + 20.0
    assert abs(lat[(0.0, False)] - lat[(0.0, True)]) < 0.2 * (lat[(4000.0, False)] - lat[(4000.0, True)])


def test_send_cqes_in_host_memory_cost_the_nics_engine():
    """The baseline's send CQEs: written on the engine when the send CQ is in host memory,
    off it in GPU memory; the engine's cost shows only in the first."""
    base = {"design.signal_mode": "flush", "platform.nic.host_cqe_write_ns": 3000.0}
    host = simulate_op(_write_imm({**base}), "dispatch", 0)
    free = simulate_op(_write_imm({**base, "platform.nic.host_cqe_write_ns": 0.0}), "dispatch", 0)
    assert host.ledger.counters["nic_host_cqe_writes"] > 0
    assert free.ledger.counters["nic_host_cqe_writes"] == 0
    assert max(host.latency_us) > max(free.latency_us)


def test_spinning_on_a_host_receive_cq_slows_the_fences_of_the_same_gpu():
    """While warps spin on host-memory receive CQs, the system fences of the GPU's posts wait
    for their reads (gpu.fence_waits_host_reads); with the CQs in GPU memory they do not. (A
    fence shorter than a PCIe round trip: else the read out is back before the fence is.)"""
    fence = {}
    for rx_dev in (False, True):
        res = simulate_op(_write_imm({"platform.nic.host_cqe_write_ns": 0.0, "platform.gpu.fence_ns": 200.0,
                                      "platform.receiver.recv_cq_in_device_memory": rx_dev}),
                          "dispatch", 0)
        fence[rx_dev] = res.ledger.busy["fence"]
    assert fence[False] > fence[True]


def test_cqe_writes_on_a_host_engine_of_their_own_leave_the_wqe_engine_free():
    """nic.host_engine (the emulated NIC's host-engine warp): CQE writes into host memory queue
    on their own engine, so WQE parsing does not wait behind them; on the WQE engine (a NIC
    without one) they hold up the next WQEs. The writes are the same in number either way."""
    lat, writes = {}, {}
    for apart in (False, True):
        scn = _write_imm({"platform.nic.host_cqe_write_ns": 3000.0, "platform.nic.host_engine": apart,
                          "platform.nic.doorbell_process_ns": 0.0, **PER_DOORBELL})
        res = simulate_op(scn, "dispatch", 0)
        lat[apart], writes[apart] = max(res.latency_us), res.ledger.counters["nic_host_cqe_writes"]
    assert writes[True] == writes[False] > 0
    assert lat[True] < lat[False]


def test_a_host_engine_mirrors_the_doorbells_wqes_before_they_are_parsed():
    """With nic.host_engine the doorbell's work (read it, mirror the new WQEs from the host SQ)
    is the host engine's, and a WQE is parsed only once mirrored: a slow mirror delays the
    first packet of a lone put by its cost."""
    from lever.sim.engine import Ledger, Trace
    from lever.sim.fabric import Fabric
    from lever.sim.message import Message
    from lever.sim.nic import Nic

    scn = _write_imm({"platform.nic.host_engine": True, "platform.nic.doorbell_process_ns": 5000.0,
                      **PER_DOORBELL})
    env = simpy.Environment()
    led = Ledger()
    fab = Fabric(env, scn.platform.fabric, np.random.default_rng(0), led)
    nic = Nic(env, 0, 0, scn.platform.nic, scn.platform.receiver, fab, led, Trace())
    sent = []
    nic._transmit = lambda msg, t0, rec=None: sent.append(t0)
    nic.doorbell([Message(0, 1, 64, RankTag(0))])
    assert sent == [pytest.approx(5000.0 + nic.wqe_ns)]
    assert nic.host_free == pytest.approx(5000.0)


def _pass_nic(read: float, copy: float, per_wqe: float = 0.0):
    """A lone emulated NIC whose host engine works in passes; what it parses, when."""
    from lever.sim.fabric import Fabric
    from lever.sim.nic import Nic, QueuePair

    scn = _write_imm({"platform.nic.host_engine": True, "platform.nic.doorbell_process_ns": 0.0,
                      "platform.nic.host_doorbell_read_ns": read, "platform.nic.host_mirror_copy_ns": copy,
                      "platform.nic.host_mirror_copy_per_wqe_ns": per_wqe})
    env = simpy.Environment()
    led = Ledger()
    fab = Fabric(env, scn.platform.fabric, np.random.default_rng(0), led)
    nic = Nic(env, 0, 0, scn.platform.nic, scn.platform.receiver, fab, led, Trace())
    nic.make_host_engine(Context(env, led, Trace(), scn.platform, scn.design), 2)
    sent: list[tuple[int, float]] = []
    nic._transmit = lambda msg, t0, rec=None: sent.append((msg.qp.index, t0))
    qps = [QueuePair(env, i, 0, nic) for i in range(2)]
    return env, nic, qps, sent, led


def _rung(qp, n: int = 1):
    from lever.sim.message import Message

    msgs = [Message(0, 1, 64, RankTag(0)) for _ in range(n)]
    for m in msgs:
        m.qp = qp
    qp.nic.doorbell(msgs)


def test_doorbells_rung_on_one_qp_before_the_host_engine_reads_share_one_copy():
    """The emulated NIC's host engine (nic.host_doorbell_read_ns, nic.host_mirror_copy_ns) reads
    every doorbell in one pass, then copies the new WQEs of each QP whose doorbell moved: two
    doorbells of one QP rung before the read cost one copy, a second QP's doorbell a second
    copy in the same pass, and a doorbell rung after the read waits for the next pass."""
    read, copy = 1500.0, 6000.0
    env, nic, (a, b), sent, led = _pass_nic(read, copy)
    _rung(a)
    _rung(a)
    _rung(b)
    env.run(until=read / 2)
    _rung(a)  # the pass has started reading: the next one sees it
    env.run()
    wqe = nic.wqe_ns
    first = read + copy
    assert [q for q, _ in sent] == [0, 0, 1, 0]
    assert [t for _, t in sent][:3] == [pytest.approx(first + wqe), pytest.approx(first + 2 * wqe),
                                        pytest.approx(first + copy + wqe)]
    assert sent[3][1] == pytest.approx(first + copy + read + copy + wqe)
    assert led.counters["nic_host_passes"] == 2
    assert led.counters["nic_host_qp_copies"] == 3


def test_a_host_engine_copy_costs_more_for_each_wqe_it_carries():
    """A copy reads each new WQE of its QP over PCIe (nic.host_mirror_copy_per_wqe_ns; 5.9 us +
    0.29 us a WQE across 57 H100 records, benchmarks/host_copy_per_wqe.py): three doorbells of
    one QP rung before a pass cost one copy of three WQEs, the other QP's one a copy of one."""
    read, copy, per = 1500.0, 6000.0, 300.0
    env, nic, (a, b), sent, led = _pass_nic(read, copy, per)
    for _ in range(3):
        _rung(a)
    _rung(b)
    env.run()
    wqe = nic.wqe_ns
    first = read + copy + 3 * per
    assert [q for q, _ in sent] == [0, 0, 0, 1]
    assert sent[0][1] == pytest.approx(first + wqe)
    assert sent[3][1] == pytest.approx(first + copy + per + wqe)
    assert led.counters["nic_host_qp_copies"] == 2


def test_the_host_engine_writes_a_claims_worth_of_cqes_between_two_doorbell_passes():
    """CQEs due on the host engine wait behind the copies of the pass before them and are
    written at most nic.host_cqes_per_pass a turn: a doorbell rung behind five due CQEs is
    copied after two of them, not after all five."""
    read, copy, cqe = 1000.0, 4000.0, 500.0
    env, nic, (a, _), sent, led = _pass_nic(read, copy)
    written: list[float] = []
    for _ in range(5):
        nic.engine_write(cqe, lambda: written.append(env.now))
    _rung(a)
    env.run()
    # turn 1: read, copy a, two CQEs; turn 2: read, two CQEs; turn 3: read, one CQE
    assert sent == [(0, pytest.approx(read + copy + nic.wqe_ns))]
    t1 = read + copy
    assert written == [pytest.approx(t1 + cqe), pytest.approx(t1 + 2 * cqe),
                       pytest.approx(t1 + 2 * cqe + read + cqe), pytest.approx(t1 + 2 * cqe + read + 2 * cqe),
                       pytest.approx(t1 + 4 * cqe + 2 * read + cqe)]
    assert led.counters["nic_host_passes"] == 3


def test_owned_qps_ring_apart_and_cost_the_host_engine_more_copies_per_wqe():
    """qp17-ownership on the testbed's shape: 16 QPs each rung by one warp ring apart, so the
    host engine copies nearly every WQE on its own (3.2x the baseline's copies for the same
    WQEs on the H100, testbed/h100-d354afd), where 8 QPs shared by 96 warps ring together.
    Charging every doorbell its own copy (no coalescing) would make both one copy a WQE. The
    issuers here post at a slow fence (3 us), as the testbed's do (7.8 us a WQE on an owned
    QP); at the calibrated fence the model's owned QPs ring faster and coalesce more (README)."""
    per_wqe = {}
    for owned in (False, True):
        sets = {"design.signal_mode": "flush", "workload.tokens_per_rank": 64, "design.num_sms": 24,
                "platform.nic.host_doorbell_read_ns": 1500.0, "platform.nic.host_mirror_copy_ns": 6000.0,
                "platform.nic.doorbell_process_ns": 0.0, "platform.gpu.fence_ns": 3000.0}
        if owned:
            sets.update({"design.qps_per_call": 17, "design.qps_allocated": 17,
                         "design.notify_qp_reserved": True, "design.qp_ownership": "owned"})
        res = simulate_op(_write_imm(sets), "dispatch", 0)
        c = res.ledger.counters
        assert c["nic_host_passes"] > 0
        per_wqe[owned] = c["nic_host_qp_copies"] / c["doorbells"]
    assert per_wqe[False] < 0.5
    assert per_wqe[True] > 1.2 * per_wqe[False]


def test_a_traced_run_shows_the_host_engines_passes_copies_and_cqes():
    """`lever simulate --trace` on the emulated platform: each NIC's host engine has a track of
    its own with its doorbell reads, its QP copies (how many WQEs each carried) and its CQE
    writes, as many as the counters say."""
    sets = {"platform.nic.host_doorbell_read_ns": 1500.0, "platform.nic.host_mirror_copy_ns": 6000.0,
            "platform.nic.doorbell_process_ns": 0.0, "design.signal_mode": "flush"}
    res = simulate_op(_write_imm(sets), "dispatch", 0, trace=True)
    names: dict[str, int] = {}
    tids = {e["tid"] for e in res.trace.events if e.get("ph") == "M" and e["args"].get("name") == "host engine"}
    assert tids
    for e in res.trace.events:
        if e.get("ph") == "X" and e["tid"] in tids:
            key = "copy" if e["name"].startswith("copy") else e["name"]
            names[key] = names.get(key, 0) + 1
    c = res.ledger.counters
    assert names["doorbell read"] == c["nic_host_passes"]
    assert names["copy"] == c["nic_host_qp_copies"]
    assert names["CQE"] == c["nic_host_cqe_writes"]


def test_the_release_of_a_doorbell_turn_waits_for_the_host_reads_in_flight():
    """The fence after a doorbell is a release of the turn word at system scope (hw/ep
    turn_pass: st.release.sys): with gpu.release_waits_host_reads it waits for the GPU's host
    reads in flight, as a system fence does, inside the turn, so the next warp's doorbell waits
    with it. Measured: the holder's release 0.75 us alone, 2.7 / 9.3 / 33 us beside 8 / 32 / 96
    warps reading host memory (turn_handoff primitives, testbed/h100-6d9061d). Off, it costs
    its own price whatever is in flight."""
    on = {"workload.tokens_per_rank": 4, "platform.gpu.release_waits_host_reads": True}
    port = _world(scenario.load("emu-ep2-native", on)).port(0, 0)
    rel = port.release_ns
    assert port.release_host is not None and rel > 0
    assert port._release_tail(2, 0.0) == [("fence", pytest.approx(rel), 1)]
    port.fence_host.read(0.0, 40.0, 10_000.0)  # a credit poll of a host CQ, back at 10 us
    assert port._release_tail(2, 1000.0) == [("fence", pytest.approx(9000.0), 1)]
    assert port._release_tail(2, 20_000.0) == [("fence", pytest.approx(rel), 1)]
    assert port._release_tail(1, 1000.0) == []  # no fence after the doorbell: no release
    for sets in ({**on, "platform.gpu.release_waits_host_reads": False},
                 {**on, "platform.gpu.fence_waits_host_reads": False}):
        p2 = _world(scenario.load("emu-ep2-native", sets)).port(0, 0)
        assert p2.release_host is None
        if p2.fence_host is not None:
            p2.fence_host.read(0.0, 40.0, 10_000.0)
        assert p2._release_tail(2, 1000.0) == [("fence", pytest.approx(rel), 1)]


def test_released_turns_queue_behind_the_credit_polls_of_a_host_cq():
    """On the testbed's shape (12 warps a shared QP, its CQ in host memory), the releases wait
    for the credit polls in flight inside the turn: the dispatch's warps wait longer for their
    turns and the dispatch is slower (the testbed: 41% of the put path waiting for the turn in
    the baseline's dispatch, where without it the model had 7%)."""
    base = {"workload.tokens_per_rank": 32}  # the emulated platform ships with the release waiting
    off = simulate_op(scenario.load("emu-ep2-native", {**base, "platform.gpu.release_waits_host_reads": False}),
                      "dispatch", 0)
    on = simulate_op(scenario.load("emu-ep2-native", {**base, "platform.gpu.release_waits_host_reads": True}),
                     "dispatch", 0)
    assert on.ledger.counters["doorbells"] == off.ledger.counters["doorbells"]
    assert on.ledger.busy["lock"] > 1.5 * off.ledger.busy["lock"]
    assert max(on.latency_us) > max(off.latency_us)


def test_the_host_engines_reads_hold_up_the_fences_of_its_gpu():
    """The emulated NIC's host engine is warps of the issuers' GPU: with
    nic.host_reads_in_flight its doorbell reads and WQE copies are host reads in flight, and a
    system fence or turn release issued meanwhile waits for them. Lazy completion makes no
    credit polls, so the dispatch's other host reads are the receivers' polls; the engine's
    reads make its fences dearer, and as the releases are in the turns the turns queue longer
    and the dispatch is slower (the testbed's lazy dispatch: 2.1 us a release against
    0.6-0.75 alone, 89% of its put path waiting for the turn)."""
    sets = {"workload.tokens_per_rank": 32, "design.lazy_completion_dispatch": True,
            "platform.gpu.release_waits_host_reads": True,
            "platform.gpu.fence_ns": 1448.0}  # the primitive's fence (the shipped fit's is 8.3 us)
    bare = simulate_op(scenario.load("emu-ep2-native", {**sets, "platform.nic.host_reads_in_flight": False}),
                       "dispatch", 0)
    res = simulate_op(scenario.load("emu-ep2-native", {**sets, "platform.nic.host_reads_in_flight": True}),
                      "dispatch", 0)
    led = res.ledger
    assert led.counters["nic_host_passes"] > 0 and "credit_wait" not in led.busy
    assert bare.ledger.counters["doorbells"] == led.counters["doorbells"]
    assert led.busy["fence"] > 1.2 * bare.ledger.busy["fence"]
    assert led.busy["lock"] > 1.5 * bare.ledger.busy["lock"]
    assert max(res.latency_us) > 1.1 * max(bare.latency_us)


@pytest.mark.parametrize("batch", [1, 4])
def test_every_wqe_is_built_before_its_stores(batch):
    """gpu.wqe_build_ns: the warp loads the peer's address handle, keys and addresses before it
    can store a WQE (hw/ep put_word; measured 761 ns a WQE on the one-warp chain against 62 ns
    of stores). It is paid once per WQE, batched doorbells or not, in the wqe category, and a
    lone warp's dispatch grows by at least that much per WQE it posts on the wire."""
    sets = {**EP2, **QUIET, "design.protocol": "v1-ll", "design.forward_warps_per_sm": 0,
            "design.num_sms": 1, "design.warps_per_sm": 1, "design.doorbell_batch": batch}
    res = {b: simulate_op(scenario.load(NATIVE, {**sets, "platform.gpu.wqe_build_ns": b}), "dispatch", 0)
           for b in (0.0, 700.0)}
    a, b = res[0.0].ledger, res[700.0].ledger
    wqes = a.counters["messages_data"] + a.counters["messages_signal"]
    assert wqes > 10 and b.counters["messages_data"] + b.counters["messages_signal"] == wqes
    assert b.busy["wqe"] - a.busy["wqe"] == pytest.approx(700.0 * wqes)
    # one warp a rank posts every WQE of its rank, one after another
    assert max(res[700.0].latency_us) - max(res[0.0].latency_us) > 0.9 * 0.7 * wqes / 2


# -- the emulated NIC's delivering warps -------------------------------------------------------

def _pool(warps: int, batch: int, lead: float = 900.0):
    from lever.sim.nic_delivery import DeliveryPool
    from lever.sim.params import NicParams

    p = NicParams(deliver_warps=warps, deliver_batch_count=batch, deliver_lead_ns=lead,
                  deliver_claim_ns=1700.0, deliver_copy_round_ns=1400.0, deliver_fence_ns=1900.0)
    return DeliveryPool(p, 1.0)


def test_a_delivering_warp_claims_copies_and_fences_a_packet_from_its_lead():
    """An idle pool: a packet due at t is claimed at t - lead, copied a round per 8 KiB (at least
    one) and fenced: visible at t - 900 + 1700 + copy + 1900, whatever warp takes it."""
    pool = _pool(6, 2)
    assert pool.land(10_000.0, 7504) == pytest.approx(10_000.0 - 900 + 1700 + 1400 + 1900)
    assert pool.land(50_000.0, 8928) == pytest.approx(50_000.0 - 900 + 1700 + 2 * 1400 + 1900)
    assert pool.land(90_000.0, 8) == pytest.approx(90_000.0 - 900 + 1700 + 1400 + 1900)


def test_due_packets_share_a_batch_and_queue_for_busy_warps():
    """One warp, batch of two: a packet due within the lead of the batch's claim joins it (one
    more copy, no second claim or fence); a third waits for the warp: the claim lag the testbed
    measures (nic_claim_lag_per_packet_ns), which a constant landing time cannot show. With
    six warps the third is claimed at its own lead."""
    one = _pool(1, 2)
    first = one.land(10_000.0, 7504)
    second = one.land(10_000.0, 7504)  # claimable at the first's claim (9.1 us): joins it
    assert second == pytest.approx(first + 1400)
    third = one.land(10_000.0, 7504)  # the batch is full: the warp takes it after its fence
    assert third == pytest.approx(second + 1700 + 1400 + 1900)
    late = one.land(10_500.0, 7504)  # not yet claimable at 9.1 us: waits for the next claim
    assert late == pytest.approx(third + 1400)  # it is: the third's batch, claimed at 15.5 us
    six = _pool(6, 2)
    for _ in range(2):
        six.land(10_000.0, 7504)
    assert six.land(10_000.0, 7504) == pytest.approx(10_000.0 - 900 + 1700 + 1400 + 1900)
    assert six.land(10_500.0, 7504) == pytest.approx(10_500.0 - 900 + 1700 + 1400 + 1900)
    alone = _pool(1, 1)  # batches of one: the second packet waits for the first's fence
    a = alone.land(10_000.0, 7504)
    assert alone.land(10_000.0, 7504) == pytest.approx(a + 1700 + 1400 + 1900)


def test_the_emulated_nics_delivering_warps_slow_a_loaded_op():
    """On the emulated platform the packets land through their sending NIC's delivering warps:
    with one warp a NIC instead of six the combine's packets queue for it and the op ends
    later; a real NIC (deliver_warps = 0) lands them by DMA as they arrive."""
    sets = {"workload.ep_ranks": 2, "workload.gpus_per_node": 1, "platform.nic.line_rate_gbps": 100.0,
            "platform.nic.deliver_claim_ns": 1700.0, "platform.nic.deliver_copy_round_ns": 1400.0,
            "platform.nic.deliver_fence_ns": 1900.0, "platform.nic.deliver_lead_ns": 900.0,
            "platform.receiver.land_ns": 0.0}
    lat = {}
    for warps in (6, 1):
        scn = scenario.load("emu-ep2-native", {**sets, "platform.nic.deliver_warps": warps})
        assert scn.platform.nic.deliver_warps == warps
        lat[warps] = max(simulate_op(scn, "combine", 0).latency_us)
    assert lat[1] > lat[6] + 20.0, lat
    assert scenario.load(NATIVE, {}).platform.nic.deliver_warps == 0


def test_a_draining_proxy_thread_rings_one_doorbell_for_a_rings_visible_descriptors():
    """The testbed's proxy thread (hw/ep/proxy_host.h post()) takes every visible descriptor of
    a ring in a pass and rings the QP's doorbell once for them (1.8-2.4 descriptors a doorbell
    measured, proxy_descriptors_per_batch_count); GIN's takes one a pass, a doorbell each.
    The same WQEs reach the NIC either way."""
    sets = {"workload.ep_ranks": 2, "workload.gpus_per_node": 1, "design.path": "proxy",
            "platform.proxy.threads": 1, "design.signal_mode": "flush", "design.forward_warps_per_sm": 0,
            "design.ll_combine_flags": "per-rank"}
    got = {}
    for drain in (False, True):
        res = simulate_op(scenario.load("emu-ep2-native", {**sets, "design.proxy.drain_rings": drain}),
                          "dispatch", 0)
        c = res.ledger.counters
        got[drain] = (c["proxy_doorbells"], c["messages_data"] + c["messages_signal"])
    assert got[False][0] == got[False][1]  # a doorbell per WQE
    assert got[True][1] == got[False][1]
    assert got[True][0] < 0.8 * got[True][1], got


@pytest.mark.parametrize("host_cq", [False, True])
def test_a_group_whose_turn_is_free_when_its_fence_issues_waits_once(host_cq):
    """A post group whose slot turn is its own when its fence issues (every group reserved
    before it has rung), or will be before the fence ends (the group before it is in its last
    wait, passing the turn at a known instant), pays the fence, the ringing and the release as
    one wait, its doorbell a call at its instant: nothing another warp does meanwhile can move
    them. Each doorbell rings the same WQEs at the same instant as with a wait for each step,
    the op's latencies are the same, and the warps wait fewer times. With the CQ in host
    memory the fence's cost is known only when it issues (it waits for the reads then in
    flight), so only the stores are paid apart."""
    from lever.sim import issuer, nic

    sets = {"platform.gpu.completion_counter_in_device_memory": not host_cq}  # EP16 V2 hybrid
    orig_db = nic.Nic.doorbell

    def run(fuse: bool):
        rung = []

        def doorbell(self, msgs):
            rung.append((self.env.now, tuple(m.seq for m in msgs), msgs[0].src, msgs[0].dst))
            return orig_db(self, msgs)

        mp = pytest.MonkeyPatch()
        mp.setattr(nic.Nic, "doorbell", doorbell)
        mp.setattr(issuer.NativePort, "fuse_turn", fuse)
        try:
            return simulate_op(scenario.load(NATIVE, sets), "dispatch", 0), sorted(rung)
        finally:
            mp.undo()

    fused, rung_fused = run(True)
    apart, rung_apart = run(False)
    assert len(rung_apart) > 1000 and fused.ledger.busy["lock"] > 0  # shared QPs, some waited
    assert rung_fused == rung_apart
    assert fused.latency_us == apart.latency_us
    assert fused.counters == apart.counters
    assert fused.ledger.busy == pytest.approx(apart.ledger.busy, rel=1e-12)  # summed in another order
    assert fused.events < apart.events - len(rung_apart) // (4 if host_cq else 2)


def test_v1_combine_pairs_side_by_side_spread_the_sources_load():
    """DeepEP LL's combine runs a warp group per (expert, destination rank) pair, all at once
    (``ll_combine_order = "concurrent"``); dealt pair after pair (``in-turn``, hw/ep's
    combine_rank) every rank writes to the same few sources at any instant, so the sources are
    served one band after another and finish in rank order. One expert a rank makes the whole
    combine one such sweep (pure RDMA, so every row crosses a receive port)."""
    sets = {"workload.ep_ranks": 32, "workload.num_experts": 32, "workload.tokens_per_rank": 64,
            "design.num_sms": 16, "design.ll_intranode_nvlink": False}
    lat = {}
    for order in ("in-turn", "concurrent"):
        scn = scenario.load("decode-ep16-ib", {**sets, "design.ll_combine_order": order})
        lat[order] = np.array(simulate_op(scn, "combine", 0).latency_us)
    turn, side = lat["in-turn"], lat["concurrent"]
    assert turn.min() == pytest.approx(side.min(), rel=0.01)  # the first source served as early
    assert np.corrcoef(np.arange(32), turn)[0, 1] > 0.9  # in turn: finished in the order served
    assert turn.max() > 1.4 * side.max()
    assert side.max() < 1.01 * side.min()  # side by side: every source with the first
    assert np.median(side) < 0.85 * np.median(turn)


def test_deepep_ll_deals_its_combine_pairs_side_by_side_and_the_hw_kernels_in_turn():
    from lever.hw.ep import scenario_overrides

    assert scenario.load("decode-ep16-ib").design.ll_combine_order == "concurrent"
    assert scenario.load("emu-ep2-native").design.ll_combine_order == "in-turn"
    assert scenario_overrides(2, False, {})["design.ll_combine_order"] == "in-turn"
