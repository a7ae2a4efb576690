"""The model: mechanisms, conservation, determinism, shipped ordering."""

from __future__ import annotations

import numpy as np
import pytest
from lever.sim import scenario
from lever.sim.model import simulate_op
from lever.sim.results import simulate

SMALL = {"workload.tokens_per_rank": 32}


def p50(scn, op="dispatch", seeds=1, scale=None):
    lat = [x for s in range(seeds) for x in simulate_op(scn, op, s, scale=scale).latency_us]
    return float(np.median(lat))


def two_rank(mode: str, fabric: str, base_ns: float = 50_000.0):
    """EP2 over two nodes, one token, V1 LL: one data write and one count per expert pair."""
    return scenario.load("decode-ep16-efa-native", {"workload.ep_ranks": 2, "workload.gpus_per_node": 1, "workload.tokens_per_rank": 1, "workload.num_experts": 2, "workload.top_k": 1, "design.protocol": "v1-ll", "design.signal_mode": mode, "platform.fabric.mode": fabric, "platform.fabric.base_latency_ns": base_ns, "platform.fabric.path_spread_ns": 0, "platform.fabric.jitter.distribution": "none", "design.num_sms": 1, "design.warps_per_sm": 1})


def test_rc_flag_after_data_costs_no_round_trip_srd_flush_costs_one():
    B = 50_000.0
    rc = two_rank("ordered", "rc", B)
    srd = two_rank("flush", "srd", B)
    # the slowest rank waits for data from the other node: one way on RC, data+ACK+flag on SRD
    t_rc = max(simulate_op(rc, "dispatch", 0).latency_us) * 1e3
    t_srd = max(simulate_op(srd, "dispatch", 0).latency_us) * 1e3
    assert B <= t_rc < 1.5 * B, t_rc
    assert t_srd >= 3 * B, t_srd
    assert simulate_op(rc, "dispatch", 0).counters.get("ordering_violations", 0) == 0


def test_lazy_completion_zeroes_credit_wait_in_both_attributions():
    base = scenario.load("decode-ep16-efa-native", SMALL)
    lazy = scenario.load("decode-ep16-efa-native", {**SMALL, "design.lazy_completion_dispatch": True})
    rb = simulate(base, seeds=1, with_critical_path=False).to_json()
    rl = simulate(lazy, seeds=1, with_critical_path=False).to_json()
    assert rb["attribution"]["dispatch"]["put_path"].get("credit_wait", 0) > 0.02
    assert rl["attribution"]["dispatch"]["put_path"].get("credit_wait", 0) == 0
    from lever.sim.results import what_if_reruns

    cp = what_if_reruns(lazy, "dispatch", rl["ops"]["dispatch"]["p50_us"], 1, ("credit_wait",))
    assert cp["credit_wait"] == 0.0
    assert rl["counters"]["dispatch"].get("lazy_refused", 0) == 0


def test_issue_work_dominates_profiler_yet_cutting_it_leaves_latency_flat():
    # the wire is the bottleneck (one 25 Gb/s port): fences/doorbells overlap serialisation
    sets = {"workload.tokens_per_rank": 64, "design.signal_mode": "ordered", "design.cached": True, "platform.gpu.completion_counter_in_device_memory": True, "design.lazy_completion_dispatch": True, "design.qp_ownership": "owned", "design.qps_per_call": 17, "design.num_sms": 8, "design.warps_per_sm": 2, "platform.nic.nics_per_gpu": 1,
            "platform.gpu.fence_ns": 1400.0, "platform.gpu.token_prep_ns": 200.0}  # not the calibration's
    slow_wire = {**sets, "platform.nic.line_rate_gbps": 25}
    scn = scenario.load("decode-ep16-efa-native", slow_wire)
    res = simulate(scn, seeds=2, with_critical_path=False).to_json()
    pp = res["attribution"]["dispatch"]["put_path"]
    assert pp.get("fence", 0) + pp.get("doorbell", 0) > 0.5, pp
    base = p50(scn, seeds=2)
    cut = p50(scn, seeds=2, scale={"fence": 0.0, "doorbell": 0.0})
    assert abs(base - cut) / base < 0.03, (base, cut)
    # the critical path says why: the wire carries the latency, not the fences
    from lever.sim.results import what_if_reruns

    cp = what_if_reruns(scn, "dispatch", p50(scn), 1, ("fence", "wire"))
    assert cp["wire"] > 10 * max(cp["fence"], 0.1), cp
    # ...and with a fast wire the same cut is visible: the test can fail (three seeds: one
    # seed's median rank sits on either side of a step as the calibrated NIC moves, 0.91 or
    # 1.00 of the cut at seed 0 for a WQE parse of 377 or 392 ns, 0.92 and 0.96 over three)
    fast = scenario.load("decode-ep16-efa-native", {**sets, "platform.nic.line_rate_gbps": 400, "platform.fabric.base_latency_ns": 200})
    assert p50(fast, seeds=3, scale={"fence": 0.0, "doorbell": 0.0}) < 0.97 * p50(fast, seeds=3)


@pytest.mark.parametrize("protocol", ["v1-ll", "v2-hybrid"])
def test_conservation_under_loss(protocol):
    scn = scenario.load("decode-ep16-efa-native", {**SMALL, "design.protocol": protocol, "platform.fabric.loss_prob": 0.1, "platform.fabric.retransmit_timeout_ns": 20000})
    for op in ("dispatch", "combine"):
        r = simulate_op(scn, op, 0)
        c = r.counters
        assert len(r.latency_us) == 16 and all(x > 0 for x in r.latency_us)
        assert c["bytes_landed"] == c["bytes_sent"], c
        assert c.get("duplicates_dropped", 0) > 0  # lost ACKs did cause duplicates, all dropped
        assert c.get("ordering_violations", 0) == 0


def test_same_seed_same_result_different_seed_differs():
    scn = scenario.load("decode-ep16-efa-native", SMALL)
    a = simulate_op(scn, "dispatch", 3).latency_us
    b = simulate_op(scn, "dispatch", 3).latency_us
    c = simulate_op(scn, "dispatch", 4).latency_us
    assert a == b
    assert a != c


def test_depth_sampling_runs_the_same_events_and_reads_the_queue():
    """The speed benchmark's queue-depth loop must not change the run it measures."""
    scn = scenario.load("decode-ep16-efa-native", SMALL)
    plain = simulate_op(scn, "dispatch", 0)
    probed = simulate_op(scn, "dispatch", 0, depth=True)
    assert probed.latency_us == plain.latency_us and probed.events == plain.events
    assert plain.mean_pending is None
    # packets, landings and completions overlap: well above one pending event, far below all
    assert 10 < probed.mean_pending < probed.events / 10


def test_parallel_simulate_equals_serial_and_the_what_if_reruns():
    """``workers`` spreads independent runs over processes: the JSON object is the same,
    and each critical-path entry is the p50 drop of its own zeroed rerun."""
    from lever.sim.results import what_if_reruns

    scn = scenario.load("decode-ep16-efa-native", {"workload.tokens_per_rank": 8})
    a = simulate(scn, seeds=2, cp_seeds=2, workers=1, what_if=True).to_json()
    b = simulate(scn, seeds=2, cp_seeds=2, workers=2, what_if=True).to_json()
    a.pop("wall_s")
    b.pop("wall_s")
    assert a == b
    for op in ("dispatch", "combine"):
        base = a["ops"][op]["p50_us"]
        ref = what_if_reruns(scn, op, base, 2, cats=("fence", "wire"))
        got = a["attribution"][op]["what_if_us"]
        assert got["fence"] == ref["fence"] and got["wire"] == ref["wire"]
        assert got["wire"] > 0  # the wire is on every op's critical path
        assert a["attribution"][op]["critical_path"]["wire"] > 0  # the one-run chain's too


@pytest.mark.slow
def test_shipped_efa_native_beats_proxy_and_both_trail_ib():
    r = {name: simulate(scenario.load(name), seeds=1, with_critical_path=False).ops
         for name in ("decode-ep16-efa-native", "decode-ep16-efa-proxy", "decode-ep16-ib")}
    for op in ("dispatch", "combine"):
        nat = r["decode-ep16-efa-native"][op].p50_us
        prx = r["decode-ep16-efa-proxy"][op].p50_us
        ib = r["decode-ep16-ib"][op].p50_us
        assert nat < prx, (op, nat, prx)
        assert ib < nat, (op, ib, nat)


def test_put_many_span_is_one_post_group_and_doorbell_work_amortises():
    """A put_many span is reserved, credit-checked and rung once (as GIN's put path and
    hw/ep do); the NIC's per-doorbell work is paid once per doorbell, so it costs the
    one-WQE-per-doorbell baseline more than a batched design."""
    base = {"workload.tokens_per_rank": 32}
    # two channels with long put streams (no tail signals to ring a span early)
    long = {**base, "design.signal_mode": "imm-counting", "design.num_sms": 1}
    one = simulate_op(scenario.load("decode-ep16-efa-native", long), "dispatch", 0)
    span = simulate_op(scenario.load("decode-ep16-efa-native", {**long, "design.put_many_span": 8}),
                       "dispatch", 0)
    assert one.counters["doorbells"] > 4 * span.counters["doorbells"]
    assert one.ledger.events["credit_wait"] > 4 * span.ledger.events["credit_wait"]

    def cost(extra: dict) -> float:  # full decode shape, no tail signals: NIC-bound
        sets = {"design.signal_mode": "imm-counting", **extra}
        lo = p50(scenario.load("decode-ep16-efa-native", sets))
        hi = p50(scenario.load("decode-ep16-efa-native", {**sets, "platform.nic.doorbell_process_ns": 2000}))
        return hi - lo

    assert cost({}) > 3 * cost({"design.doorbell_batch": 8}) > 0


def test_seeds_are_streamed_not_built_up_front():
    """simulate() takes its runs from a generator as results are consumed (a few per worker in
    flight) and folds each seed in as it arrives, so memory does not grow with --seeds
    (measured: 54 MiB peak at 20 seeds, 58 MiB at 400, EP8 at 8 tokens, one worker)."""
    from lever.sim import results

    scn = scenario.load("decode-ep8-efa-native", {"workload.tokens_per_rank": 2})
    pulled: list[int] = []

    def jobs():
        for s in range(40):
            pulled.append(s)
            yield (scn, "dispatch", s, None, False, False)

    it = results._run_jobs(jobs(), 2)
    first = next(it)
    assert first.seed == 0 and len(pulled) <= 4 * 2 + 1
    it.close()


def test_simulate_reports_progress_of_every_run():
    from lever.sim.results import simulate

    scn = scenario.load("decode-ep8-efa-native", {"workload.tokens_per_rank": 2})
    seen: list[tuple[int, int]] = []
    simulate(scn, seeds=2, what_if=True, workers=1, progress=lambda d, t: seen.append((d, t)))
    total = 2 * (2 + 14)  # ops x (seeds + one what-if rerun per category)
    assert seen == [(k, total) for k in range(1, total + 1)]
