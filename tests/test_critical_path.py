"""The one-run critical path: each rank's chain sums to its latency, names the cost that
dominates, differs from the what-if column where a parallel chain is almost as long, and
recording it changes nothing in the run (same events, same numbers bit for bit)."""

from __future__ import annotations

import json

import pytest
from lever.sim import scenario
from lever.sim.model import simulate_op
from lever.sim.params import CATEGORIES, Scenario
from lever.sim.results import simulate

from tests.golden_cases import FROZEN

# EP2, one rank per node, 8 tokens, one expert per rank, two warps, no jitter: every
# chain is short enough to read, and one cost made large must dominate it
EP2 = {"workload.ep_ranks": 2, "workload.gpus_per_node": 1, "workload.tokens_per_rank": 8,
       "workload.num_experts": 2, "workload.top_k": 1, "design.num_sms": 1,
       "design.warps_per_sm": 2, "platform.fabric.path_spread_ns": 0,
       "platform.fabric.jitter.distribution": "none"}
DOMINANT = {
    "wire": {"platform.fabric.base_latency_ns": 500_000},
    "fence": {"platform.gpu.fence_ns": 100_000},
    "poll_wait": {"platform.gpu.poll_interval_ns": 400_000},
}


def assert_sums(r, rel: float = 1e-12) -> None:
    """Every rank's chain sums to its latency up to rounding, and has no gap."""
    assert r.critical_path is not None and len(r.critical_path) == len(r.latency_us)
    for lat, chain in zip(r.latency_us, r.critical_path, strict=True):
        assert set(chain) <= set(CATEGORIES), chain
        assert abs(sum(chain.values()) - lat) <= rel * lat, (sum(chain.values()), lat)
    assert r.path_gap_ns < 1e-6, r.path_gap_ns


@pytest.mark.parametrize("protocol", ["v2-hybrid", "v2-direct", "v1-ll"])
@pytest.mark.parametrize("cat", sorted(DOMINANT))
def test_chain_sums_to_latency_and_names_the_dominant_cost(cat, protocol):
    sets = {**EP2, **DOMINANT[cat], "design.protocol": protocol}
    scn = scenario.load("decode-ep16-efa-native", sets)
    for op in ("dispatch", "combine"):
        r = simulate_op(scn, op, 0, critical_path=True)
        assert_sums(r)
        for chain in r.critical_path:
            assert max(chain, key=chain.get) == cat, chain
    res = simulate(scn, seeds=2)  # the reported chain: the median rank's, summing to the p50
    for op, st in res.ops.items():
        cp = res.attribution[op].critical_path
        assert set(cp) == set(CATEGORIES)
        assert sum(cp.values()) == pytest.approx(st.p50_us, rel=1e-12)
        assert max(cp, key=cp.get) == cat


# One warp streams 64 tokens to the other node's rank on its own QP (cached, lazy
# completions, receive-completion counting from a CQ in GPU memory: nothing but the puts and
# the wire). A put costs
# the warp 2957 ns (token packing 200, slot atomic and WQE stores 199, doorbell 19, two
# fences 2538); at 21 Gb/s its 7568 B packet takes 2883 ns of port time. Issue is the
# bottleneck by 74 ns per token.
STREAM = {"workload.ep_ranks": 2, "workload.gpus_per_node": 1, "workload.tokens_per_rank": 64,
          "workload.num_experts": 4, "workload.top_k": 3, "design.protocol": "v2-direct",
          "design.num_sms": 1, "design.warps_per_sm": 1, "design.cached": True,
          "design.signal_mode": "imm-counting", "design.lazy_completion_dispatch": True,
          "design.qp_ownership": "owned", "platform.nic.nics_per_gpu": 1,
          # the receive CQ in GPU memory without reposts: its owner keeps up with the wire
          "platform.gpu.completion_counter_in_device_memory": True,
          "platform.nic.unsolicited_write_recv": True,
          # the costs the arithmetic below uses, whatever the calibration says
          "platform.gpu.token_prep_ns": 200.0, "platform.gpu.fence_ns": 1269.0,
          "platform.gpu.atomic_ns": 148.5, "platform.gpu.wqe_store_ns": 50.7,
          "platform.gpu.doorbell_ns": 19.4,
          "platform.fabric.path_spread_ns": 0, "platform.fabric.jitter.distribution": "none"}


def stream(rate_gbps: float) -> Scenario:
    sets = {**STREAM, "platform.nic.line_rate_gbps": rate_gbps, "ops": ["dispatch"]}
    return scenario.load("decode-ep16-efa-native", sets)


def test_chain_sees_fences_the_what_if_does_not_when_the_wire_is_right_behind():
    """Every put is on the chain (the port waits for each WQE), so the chain charges the
    fences of all 64 puts. Zeroing them makes a put 419 ns, and the port, at 2883 ns a
    packet, becomes the bottleneck: the op gets only ~64 x 74 ns faster. The chain says
    what this run waited for; the what-if what making it free would win. The difference
    is the slack of the next-longest chain (the port), ~0 here."""
    res = simulate(stream(21.0), seeds=1, what_if=True)
    att = res.attribution["dispatch"]
    p50 = res.ops["dispatch"].p50_us
    chain, wi = att.critical_path, att.what_if_us
    assert sum(chain.values()) == pytest.approx(p50, rel=1e-12)
    assert att.put_path["fence"] > 0.9  # the profiler sees fences too
    assert chain["fence"] > 0.6 * p50, chain  # 161.2 of 239.1 us
    assert wi["fence"] < 10.0, wi  # 5.9 us
    assert max(chain, key=chain.get) == "fence"
    # both see the wire's own share alike: it is on the chain either way
    assert chain["wire"] == pytest.approx(wi["wire"], rel=0.1)
    # a fast port leaves no parallel chain close behind: the two columns then agree
    fast = simulate(stream(100.0), seeds=1, what_if=True).attribution["dispatch"]
    assert fast.what_if_us["fence"] > 0.85 * fast.critical_path["fence"], fast


def frozen_cases() -> list[tuple[str, Scenario]]:
    data = json.loads(FROZEN.read_text())
    return [(name, Scenario.model_validate(d)) for name, d in sorted(data.items())]


@pytest.mark.parametrize("name, scn", frozen_cases(), ids=[n for n, _ in frozen_cases()])
def test_recording_changes_nothing_and_every_chain_closes(name, scn):
    """Recording schedules no event and draws no random number: the same events and the
    same numbers bit for bit (golden cases: proxy, loss, unordered counting, RC, batching)."""
    for op in ("dispatch", "combine"):
        plain = simulate_op(scn, op, 0)
        rec = simulate_op(scn, op, 0, critical_path=True)
        assert rec.events == plain.events
        assert [x.hex() for x in rec.latency_us] == [x.hex() for x in plain.latency_us]
        assert dict(rec.ledger.busy) == dict(plain.ledger.busy)
        assert rec.counters == plain.counters
        assert plain.critical_path is None and rec.ledger.path is None
        assert_sums(rec, rel=1e-9)


def test_json_has_the_chain_always_and_the_what_if_on_request():
    scn = scenario.load("decode-ep16-efa-native", {**EP2, "ops": ["dispatch"]})
    plain = simulate(scn, seeds=1).to_json()["attribution"]["dispatch"]
    assert "critical_path" in plain and "what_if_us" not in plain
    both = simulate(scn, seeds=1, what_if=True).to_json()["attribution"]["dispatch"]
    assert both["critical_path"] == plain["critical_path"]
    assert set(both["what_if_us"]) == set(CATEGORIES)
    off = simulate(scn, seeds=1, with_critical_path=False).to_json()["attribution"]["dispatch"]
    assert "critical_path" not in off and "what_if_us" not in off
