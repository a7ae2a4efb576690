"""The mechanism that distinguishes each shipped design, each test failing when it is removed.

pplx-garden: one bulk write per peer per stage from the CPU worker, immediates counted before
the flag; UCCL-EP: several proxy threads with their own FIFOs and queue pairs on both ends,
counts applied only when the arrived writes match; rail striping only where aws-ofi-nccl
stripes; GIN-GDA on p5en with the NIC's counters signalling without a flush. Small shapes.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from lever.sim.engine import Ledger, Trace
from lever.sim.model import World, simulate_op
from lever.sim.protocols.pplx_a2a import PplxTag
from lever.sim.routing import Routing
from lever.sim.scenario import ScenarioError, compose
from lever.sim.tags import ExpertTag

from lever.commands.designs import all_designs

SMALL = {"workload.tokens_per_rank": 4}
QUIET = {"platform.fabric.path_spread_ns": 0.0, "platform.fabric.jitter.distribution": "none"}


def _p50(scn, op: str, seeds: int = 1) -> float:
    return float(np.median([x for s in range(seeds) for x in simulate_op(scn, op, s).latency_us]))


# -- pplx-garden ---------------------------------------------------------------------------

@pytest.mark.parametrize("platform", ["p5", "p5en", "p6-b200"])
def test_pplx_posts_one_write_per_peer_per_stage_whatever_the_token_count(platform):
    """Dispatch: the route exchange to every other rank plus one bulk write per rank of the
    other nodes; combine: one write per rank of the other nodes, cut into one shard per NIC.
    Eight times the tokens changes the bytes, not the number of WQEs or doorbells."""
    R, rpn = 16, 8
    per = compose(platform, "pplx-garden").platform.nic.nics_per_gpu
    want = {"dispatch": R * ((R - 1) + (R - rpn)), "combine": R * (R - rpn) * per}
    seen = {}
    for tokens in (2, 16):
        scn = compose(platform, "pplx-garden", ep=R, overrides={"workload.tokens_per_rank": tokens})
        for op in ("dispatch", "combine"):
            c = simulate_op(scn, op, 0).counters
            assert c["host_wqes"] == c["host_doorbells"] == want[op], (op, tokens)
            assert c["host_recv_cqes"] == want[op]  # every write-with-immediate counted once
            assert c.get("messages_stripe", 0) == 0
            seen[(op, tokens)] = c["bytes_sent"]
    # the same writes carry more bytes: many tokens per write
    assert seen[("dispatch", 16)] > 4 * seen[("dispatch", 2)]
    assert seen[("combine", 16)] > 4 * seen[("combine", 2)]


def test_pplx_a_bulk_write_carries_every_token_for_its_peer():
    """Each dispatch write to a rank of another node is as large as every (token, expert)
    copy for that rank: the NIC cuts it into MTU packets."""
    scn = compose("p5en", "pplx-garden", ep=16, overrides={"workload.tokens_per_rank": 16})
    w = World(scn, "dispatch", 0, Ledger(), Trace(), Routing.for_scenario(scn, 0))
    from lever.sim.protocols import run_protocol

    done = run_protocol(w)
    sizes: dict[tuple[int, int], list[int]] = {}
    orig = w.messages.new

    def spy(src, dst, nbytes, tag, kind="data", value=1, seq=0):
        if kind == "data":
            sizes.setdefault((src, dst), []).append(nbytes)
        return orig(src, dst, nbytes, tag, kind, value, seq)

    w.messages.new = spy  # type: ignore[method-assign]
    w.env.run()
    assert all(ev.triggered for ev in done)
    rt, per_tok = w.routing, scn.workload.dispatch_bytes_per_token
    for (s, d), got in sizes.items():
        pairs = sum(1 for row in rt.topk[s] for e in row if rt.rank_of(int(e)) == d)
        assert got == [pairs * per_tok]
        assert w.node_of(s) != w.node_of(d)
    assert len(sizes) == 16 * 8
    assert w.ledger.counters["packets_landed"] > 3 * w.ledger.counters["messages_data"]


def test_pplx_flag_waits_for_the_counted_immediates():
    """The receive kernel starts when the worker counted every expected immediate: a later
    receive completion moves dispatch by as much (the flag waits for the count)."""
    base = compose("p5en", "pplx-garden", ep=16, overrides={**SMALL, **QUIET})
    slow = compose("p5en", "pplx-garden", ep=16, overrides={
        **SMALL, **QUIET, "platform.receiver.recv_completion_ns": 50_600.0})
    d = 50_600.0 - base.platform.receiver.recv_completion_ns
    for op in ("dispatch", "combine"):
        moved = (_p50(slow, op) - _p50(base, op)) * 1e3
        assert 0.95 * d <= moved <= 2.1 * d, (op, moved)  # dispatch waits two counted stages


def test_pplx_counts_per_stage_are_what_the_worker_waits_for():
    scn = compose("p5en", "pplx-garden", ep=16, overrides=SMALL)
    w = World(scn, "combine", 0, Ledger(), Trace(), Routing.for_scenario(scn, 0))
    from lever.sim.protocols import run_protocol

    done = run_protocol(w)
    w.env.run()
    assert all(ev.triggered for ev in done)
    rcv = w.receivers[0]
    # every rank of the other node sent its shards (two NICs a GPU on p5en), one count each
    assert all(rcv.data[PplxTag("combine", s)].value == 2 for s in range(8, 16))
    assert w.ledger.counters.get("ordering_violations", 0) == 0


# -- UCCL-EP ---------------------------------------------------------------------------------

def _uccl_thread_of_expert(scn, rt: Routing, e: int, op: str) -> int:
    pd = scn.design.proxy
    key = e - rt.experts_of(rt.rank_of(e))[0] if op == "dispatch" else e
    return (key % (pd.threads * pd.channels_per_thread)) % pd.threads


def test_uccl_receive_side_work_is_spread_over_the_proxy_threads_by_expert():
    """Every write-with-immediate (data and count) is consumed by the same-index thread at
    the target, the thread its expert maps to: per-thread receive CQEs match the routing."""
    scn = compose("p5en", "uccl-ep", ep=16, overrides=SMALL)
    rt = Routing.for_scenario(scn, 0)
    res = simulate_op(scn, "dispatch", 0)
    want: Counter[int] = Counter()
    for s in range(16):
        for row in rt.topk[s]:
            for e in row:
                d = rt.rank_of(int(e))
                if d // 8 != s // 8:
                    want[_uccl_thread_of_expert(scn, rt, int(e), "dispatch")] += 1
        for e in range(rt.num_experts):  # one count per (expert, source) pair across nodes
            if rt.rank_of(e) // 8 != s // 8:
                want[_uccl_thread_of_expert(scn, rt, e, "dispatch")] += 1
    got = {i: res.counters.get(f"host_recv_cqes_thread{i}", 0) for i in range(4)}
    assert got == dict(want) and min(got.values()) > 0


def test_uccl_more_proxy_threads_spread_a_heavy_host_load():
    """With costly CQ reads the host is the bottleneck: four threads (with their receive
    side) beat one by far."""
    over = {**SMALL, "platform.proxy.host_cq_poll_ns": 3000.0}
    four = compose("p5en", "uccl-ep", ep=16, overrides=over)
    one = compose("p5en", "uccl-ep", ep=16, overrides={**over, "design.proxy.threads": 1})
    assert _p50(one, "dispatch") > 1.8 * _p50(four, "dispatch")


def test_uccl_threads_each_post_on_their_own_nic():
    scn = compose("p5", "uccl-ep", ep=16, overrides=SMALL)
    w = World(scn, "dispatch", 0, Ledger(), Trace(), Routing.for_scenario(scn, 0))
    per = scn.platform.nic.nics_per_gpu
    threads = w.uccl.threads(3)
    assert [t.qp.nic.index for t in threads] == [3 * per + i % per for i in range(4)]
    assert all(len(t.fifos) == 8 for t in threads)


@pytest.mark.parametrize("mode, unsafe", [("imm-counting", False), ("flush", False),
                                          ("ordered", True)])
def test_uccl_counts_are_applied_only_when_their_writes_arrived(mode, unsafe):
    """Lossy SRD: a count overtakes its data. Counting immediates (the count held until the
    writes it covers arrived) or the sender barrier (posted after their completions) never
    lets a poller conclude early; applying on arrival does."""
    scn = compose("p5en", "uccl-ep", ep=16, overrides={
        **SMALL, "design.signal_mode": mode, "platform.fabric.loss_prob": 0.05,
        "platform.fabric.retransmit_timeout_ns": 200_000.0})
    bad = sum(simulate_op(scn, op, s).counters.get("ordering_violations", 0)
              for op in ("dispatch", "combine") for s in range(2))
    assert (bad > 0) == unsafe


def test_uccl_counts_travel_in_the_fifo_of_their_expert():
    """A count and its expert's writes go through one FIFO of one thread (by expert)."""
    scn = compose("p5en", "uccl-ep", ep=16, overrides=SMALL)
    w = World(scn, "dispatch", 0, Ledger(), Trace(), Routing.for_scenario(scn, 0))
    t = w.uccl
    m_data = w.message(0, 9, 7504, ExpertTag(0, 9 * 16 + 5))
    m_sig = w.message(0, 9, 64, ExpertTag(0, 9 * 16 + 5), kind="signal", value=3)
    assert t.fifo_for(0, m_data) is t.fifo_for(0, m_sig)
    f = t.fifo_for(0, m_data)
    assert (f.thread.index, f.index) == (5 % 4, 5 // 4)


# -- striping only where the design stripes ------------------------------------------------------

@pytest.mark.parametrize("design, stripes", [("deepep-v2-hybrid-gin-proxy", True),
                                             ("uccl-ep", False), ("pplx-garden", False)])
def test_rail_striping_only_for_aws_ofi_nccl(design, stripes):
    """A 14400 B combine row is above aws-ofi-nccl's stripe size: only GIN's proxy stripes."""
    scn = compose("p5", design, ep=16, overrides=SMALL)
    c = simulate_op(scn, "combine", 0).counters
    assert (c.get("messages_stripe", 0) > 0) == stripes


# -- GIN-GDA on p5en: the NIC's counters signal, no flush ---------------------------------------

def test_gin_gda_with_hardware_counters_posts_no_flush_and_no_signal_writes():
    """With hw-counter signalling (p5en's EFA counters: the design's own choice there) the
    scale-out warps post data only: no tail signal writes and no flush wait; told to flush,
    the same design posts both."""
    flush = compose("p5en", "deepep-v2-hybrid-gin-gda", ep=16,
                    overrides={**SMALL, "design.signal_mode": "flush"})
    hw = compose("p5en", "deepep-v2-hybrid-gin-gda", ep=16, overrides=SMALL)
    assert hw.design.signal_mode == "hw-counter"
    rf, rh = simulate_op(flush, "dispatch", 0), simulate_op(hw, "dispatch", 0)
    assert rf.counters["messages_signal"] > 0 and rf.ledger.busy.get("signal", 0) > 0
    assert rh.counters.get("messages_signal", 0) == 0
    assert rh.ledger.busy.get("signal", 0) == 0
    assert rh.counters.get("ordering_violations", 0) == 0


# -- every design on every instance ------------------------------------------------------------

@pytest.mark.parametrize("platform", ["p5", "p5en", "p6-b200", "ib-cx7"])
def test_every_design_runs_on_every_instance(platform):
    for design in all_designs():
        scn = compose(platform, design, ep=16, overrides={"workload.tokens_per_rank": 2})
        for op in ("dispatch", "combine"):
            r = simulate_op(scn, op, 0)
            assert len(r.latency_us) == 16 and min(r.latency_us) > 0, (design, op)
            if scn.design.signal_mode != "ordered" or scn.platform.fabric.mode == "rc":
                assert r.counters.get("ordering_violations", 0) == 0, (design, op)


def test_a_proxy_kind_off_the_proxy_path_is_one_line_naming_the_field():
    with pytest.raises(ScenarioError, match="design.*proxy.kind = 'uccl' needs path = 'proxy'"):
        compose("p5en", "deepep-v1-ll", overrides={"design.proxy.kind": "uccl"})
    with pytest.raises(ScenarioError, match="pplx-worker counts immediates"):
        compose("p5en", "pplx-garden", overrides={"design.signal_mode": "flush"})


@pytest.mark.parametrize("design", ["uccl-ep", "pplx-garden"])
def test_the_new_proxies_record_their_critical_path_without_gaps(design):
    """Every wait in the host pieces names what released it: each rank's chain sums to its
    latency and host time shows on it."""
    scn = compose("p5en", design, ep=16, overrides=SMALL)
    for op in ("dispatch", "combine"):
        r = simulate_op(scn, op, 0, critical_path=True)
        assert r.path_gap_ns < 1e-6
        for lat, cp in zip(r.latency_us, r.critical_path, strict=True):
            assert sum(cp.values()) == pytest.approx(lat, rel=1e-9)
        assert any(cp.get("proxy_post", 0) > 0 for cp in r.critical_path)


@pytest.mark.parametrize("design", ["deepep-v2-direct-gin-gda", "deepep-v2-hybrid-gin-proxy"])
@pytest.mark.parametrize("mode", ["imm-counting", "flush"])
def test_uccl_proxy_under_the_v2_protocols_meets_each_stream_and_its_count(design, mode):
    """Any protocol can run on UCCL-EP's proxy: a stream's writes and its count go through one
    thread, so the receiving thread's count reaches the signal (no deadlock, nothing early)."""
    scn = compose("p5en", design, ep=16, overrides={
        **SMALL, "design.path": "proxy", "design.proxy.kind": "uccl", "design.proxy.threads": 4,
        "design.proxy.channels_per_thread": 8, "design.signal_mode": mode,
        "platform.fabric.loss_prob": 0.02, "platform.fabric.retransmit_timeout_ns": 100_000.0})
    for op in ("dispatch", "combine"):
        r = simulate_op(scn, op, 0)
        assert min(r.latency_us) > 0 and r.counters.get("ordering_violations", 0) == 0
        assert sum(v for k, v in r.counters.items() if k.startswith("host_recv_cqes_thread")) > 0


def test_design_proxy_threads_set_gins_host_threads_too():
    scn = compose("p5", "deepep-v2-hybrid-gin-proxy", ep=16,
                  overrides={**SMALL, "design.proxy.threads": 3})
    w = World(scn, "dispatch", 0, Ledger(), Trace(), Routing.for_scenario(scn, 0))
    w.rings.get(0, 1, 8)
    assert len(w.rings._threads[0]) == 3
    base = World(compose("p5", "deepep-v2-hybrid-gin-proxy", ep=16, overrides=SMALL), "dispatch", 0,
                 Ledger(), Trace(), Routing.for_scenario(scn, 0))
    base.rings.get(0, 1, 8)
    assert len(base.rings._threads[0]) == scn.platform.proxy.threads == 1
