"""Designs and instances as files, composed from the command line."""

from __future__ import annotations

import json

import pytest
from lever.sim.scenario import ScenarioError, compose, load

from lever.cli import main

SMALL = {"workload.tokens_per_rank": 8}


def test_compose_equals_the_scenario_file_that_includes_the_same_files():
    a = compose("efa-p5-calibrated", "v2-hybrid-native", "decode-ep16")
    b = load("decode-ep16-efa-native")
    assert a.model_dump(exclude={"name", "description"}) == b.model_dump(exclude={"name", "description"})


def test_campaign_designs_are_the_public_designs_as_the_campaign_ran_them():
    for campaign, public in (("v2-hybrid-native", "deepep-v2-hybrid-gin-gda"),
                             ("v2-hybrid-proxy", "deepep-v2-hybrid-gin-proxy"),
                             ("v1-ll-ib", "deepep-v1-ll")):
        a = compose("p5", campaign).design.model_dump(exclude={"name"})
        b = compose("p5", public).design.model_dump(exclude={"name"})
        assert a == b, campaign


def test_instances_carry_their_published_nic_counts_and_rates():
    nic = {p: compose(p, "deepep-v2-hybrid-gin-gda").platform.nic for p in ("p5", "p5en", "p6-b200")}
    assert (nic["p5"].nics_per_gpu, nic["p5en"].nics_per_gpu, nic["p6-b200"].nics_per_gpu) == (4, 2, 1)
    assert (nic["p5en"].line_rate_gbps, nic["p6-b200"].line_rate_gbps) == (200.0, 400.0)
    # the same NIC bandwidth per GPU on all three: 400 Gb/s
    assert {n.nics_per_gpu * round(n.line_rate_gbps) for n in nic.values()} == {400}


def test_compose_names_the_option_of_a_missing_file():
    with pytest.raises(ScenarioError, match="--design nope: no such file in designs/"):
        compose("p5en", "nope")
    with pytest.raises(ScenarioError, match="--platform nope"):
        compose("nope", "deepep-v1-ll")


def test_simulate_composes_from_the_command_line(capsys):
    rc = main(["simulate", "--design", "deepep-v2-direct-gin-gda", "--platform", "p5en", "--ep", "16",
               "--set", "workload.tokens_per_rank=8", "--seeds", "1", "--no-critical-path",
               "--workers", "1", "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res["scenario"] == "deepep-v2-direct-gin-gda@p5en-ep16" and res["ops"]["dispatch"]["p50_us"] > 0


def test_designs_runs_each_design_at_each_ep_and_reports_refusals(capsys, tmp_path):
    rc = main(["designs", "--platform", "p5en", "--ep", "8,16", "--design", "deepep-v1-ll",
               "--design", "deepep-v2-direct-gin-gda", "--set", "workload.tokens_per_rank=8",
               "--workers", "1", "--json", "--plot", str(tmp_path / "d.png")])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {(r["design"], r["ep"]) for r in rows} == {(d, e) for d in ("deepep-v1-ll", "deepep-v2-direct-gin-gda")
                                                      for e in (8, 16)}
    assert all(r["dispatch_p50_us"] > 0 and r["combine_p50_us"] > 0 for r in rows)
    assert (tmp_path / "d.png").stat().st_size > 0
    assert main(["designs", "--platform", "p5en", "--ep", "x"]) == 2


def test_any_ep_size_spreads_the_experts_as_evenly_as_they_can_be():
    from lever.sim.model import simulate_op
    from lever.sim.routing import Routing

    scn = compose("p5en", "deepep-v1-ll", ep=24, overrides={
        "workload.tokens_per_rank": 4, "design.signal_mode": "flush"})  # SRD-safe counts
    rt = Routing.for_scenario(scn, 0)
    assert sorted(set(rt.experts_per_rank)) == [10, 11] and sum(rt.experts_per_rank) == 256
    assert rt.experts_per_rank.count(11) == 256 % 24  # the first 16 ranks host one more
    assert all(rt.rank_of(e) == r for r in range(24) for e in rt.experts_of(r))
    # every (token, expert) write lands and every count is consumed: the op completes
    for op in ("dispatch", "combine"):
        r = simulate_op(scn, op, 0)
        assert len(r.latency_us) == 24 and min(r.latency_us) > 0
        assert r.counters.get("ordering_violations", 0) == 0
