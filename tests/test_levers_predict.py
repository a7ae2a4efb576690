"""Lever predictions on the shipped EFA baseline: mechanisms, paired seeds, CLI."""

from __future__ import annotations

import json
import math

import pytest
from lever.calibration import predict as pr
from lever.sim import levers as levers_mod
from lever.sim import scenario
from lever.sim.model import simulate_op
from lever.sim.results import PUT_PATH, profiler_shares, run_seeds, stats, what_if_reruns

from lever.cli import main as lever_main

BASE = "decode-ep16-efa-native"
SMALL = {"workload.tokens_per_rank": 32}


def test_every_lever_file_loads_on_its_baseline():
    names = levers_mod.all_levers()
    for want in ("qp-fanout-fix", "qp17-ownership", "lazy-completion-dispatch", "lazy-completion-combine",
                 "batched-doorbells", "write-imm-counting", "provider-batched-tail", "put-many",
                 "deferred-doorbell-aggregation", "cached-dispatch", "scaleout-update-interval",
                 "unordered-signals"):
        assert want in names
    for n in names:
        lev = levers_mod.load_lever(n)
        assert lev.set and lev.description
        base = levers_mod.load_with_levers(lev.baseline, [], SMALL)
        scn = levers_mod.load_with_levers(lev.baseline, [n], SMALL)
        assert scn.design != base.design, n


def test_lazy_completion_removes_credit_wait():
    for lever, op in (("lazy-completion-dispatch", "dispatch"), ("lazy-completion-combine", "combine")):
        sides = {}
        for name, levs in (("base", []), ("lever", [lever])):
            scn = levers_mod.load_with_levers(BASE, levs, SMALL)
            res = run_seeds(scn, op, 1)
            p50 = stats([x for r in res for x in r.latency_us])["p50_us"]
            cp = what_if_reruns(scn, op, p50, 1, cats=("credit_wait",))["credit_wait"]
            sides[name] = (profiler_shares(res, PUT_PATH).get("credit_wait", 0.0), cp,
                           res[0].counters.get("lazy_refused", 0))
        assert sides["base"][0] > 0 and sides["base"][1] > 0, sides
        assert sides["lever"][0] == 0.0 and sides["lever"][1] == 0.0, sides
        assert sides["lever"][2] == 0


def test_batched_doorbells_changes_dispatch_by_a_few_us_at_most():
    base = levers_mod.load_with_levers(BASE, [], {"design.scaleout_update_interval": 6})
    lev = levers_mod.load_with_levers(BASE, ["batched-doorbells"], [])
    assert lev.design.doorbell_batch == 8
    d = [stats(simulate_op(lev, "dispatch", s).latency_us)["p50_us"]
         - stats(simulate_op(base, "dispatch", s).latency_us)["p50_us"] for s in range(2)]
    assert abs(sum(d) / len(d)) <= 5.0, d


def _data_doorbells(c: dict) -> int:
    return c["doorbells"] - c.get("messages_signal", 0) - c.get("messages_notify", 0)


def test_deferred_doorbell_aggregation_cuts_doorbells_by_its_factor():
    lev = levers_mod.load_lever("deferred-doorbell-aggregation")
    f = lev.set["design.deferred_doorbell_aggregation"]
    # on the shipped shape, with no flush between tail signals (imm counting), so every QP's
    # WQEs of a call group into doorbells of f; a partial group is rung when a warp finishes
    sets = {"design.signal_mode": "imm-counting"}
    b = simulate_op(levers_mod.load_with_levers(BASE, [], sets), "dispatch", 0)
    x = simulate_op(levers_mod.load_with_levers(BASE, [lev.name], sets), "dispatch", 0)
    nb, nx = _data_doorbells(b.counters), _data_doorbells(x.counters)
    assert nb == b.counters["messages_data"]          # baseline: one doorbell per data WQE
    assert nx * f >= nb                               # never better than the factor
    scn = levers_mod.load_with_levers(BASE, [], sets)
    finishing = scn.workload.ep_ranks * scn.design.num_sms * scn.design.warps_per_sm
    assert nx <= -(-nb // f) + finishing               # at most one partial ring per finishing warp
    assert 0.75 * f <= nb / nx <= f
    # and on the shipped baseline as is (flush-then-signal): the ratio still exceeds 2
    b0 = simulate_op(levers_mod.load_with_levers(BASE, [], SMALL), "dispatch", 0).counters
    x0 = simulate_op(levers_mod.load_with_levers(BASE, [lev.name], SMALL), "dispatch", 0).counters
    assert _data_doorbells(b0) / _data_doorbells(x0) >= 1.9


def test_noop_lever_band_is_exactly_zero():
    r = pr.predict("batched-doorbells", seeds=3, sets=SMALL, with_cp=False, lever_names=[])
    for op in ("dispatch", "combine"):
        assert r["ops"][op]["delta_us"] == 0.0
        assert r["ops"][op]["band_us"] == [0.0, 0.0]
        assert r["ops"][op]["per_seed_delta_us"] == [0.0, 0.0, 0.0]


def test_common_random_numbers_narrow_the_band():
    kw = dict(seeds=4, sets=SMALL, with_cp=False, workers=2)
    paired = pr.predict("lazy-completion-combine", paired=True, **kw)["ops"]["combine"]
    unpaired = pr.predict("lazy-completion-combine", paired=False, **kw)["ops"]["combine"]
    wp = paired["band_us"][1] - paired["band_us"][0]
    wu = unpaired["band_us"][1] - unpaired["band_us"][0]
    assert 0 < wp < wu, (paired["band_us"], unpaired["band_us"])


def test_cli_predict_lever_parameter_and_prereg(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = lever_main(["predict", "batched-doorbells", "--seeds", "2", "--set", "workload.tokens_per_rank=32",
                     "--set", "design.doorbell_batch=4", "--no-critical-path", "--json", "--out", str(out)])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res["lever_only_sets"] == {"design.doorbell_batch": 4} and res["sets"] == SMALL
    # the shipped EFA calibration carries its own delta error: every band is at least its 90% width
    assert res["band_kind"] == "noise-only+model"
    sd = scenario.load("decode-ep16-efa-native").platform.calibrated.delta_discrepancy_us
    for o in res["ops"].values():
        lo, hi = o["band_us"]
        assert lo <= o["delta_us"] - 1.6448 * sd and hi >= o["delta_us"] + 1.6448 * sd
    pre = json.loads(out.read_text())
    assert pre["sha256"] == pr.content_sha256(pre)
    assert set(pre["predictions"]) == {"dispatch", "combine"}
    for k in ("lever", "baseline", "platform_digest", "verdict_rule", "date", "git_rev"):
        assert pre[k] is not None


def test_param_samples_widen_band_when_calibrated():
    scn = levers_mod.load_with_levers(BASE, [], SMALL)
    assert pr.param_sets(scn, 3) == [] or scn.platform.calibrated is not None
    cal = {"platform.calibrated.names": ["gpu.fence_ns"], "platform.calibrated.log_mean": [7.24], "platform.calibrated.log_cov": [[0.25]]}
    scn2 = levers_mod.load_with_levers(BASE, [], {**SMALL, **cal})
    draws = pr.param_sets(scn2, 3)
    assert len(draws) == 3 and all(list(d) == ["platform.gpu.fence_ns"] and d["platform.gpu.fence_ns"] > 0 for d in draws)


def test_parameter_draws_are_the_cholesky_transform_of_the_seeds_normals():
    """A band's parameter draws depend only on the seed and the covariance, not on the LAPACK
    build: the unique Cholesky factor (SVD's vector signs are the library's choice), and for a
    covariance that is only semi-definite, eigenvectors with a fixed sign."""
    import numpy as np
    import pytest

    cov = np.array([[0.30, 0.05, -0.02], [0.05, 0.10, 0.01], [-0.02, 0.01, 0.05]])
    mean = np.log([1000.0, 300.0, 50.0])
    names = ["gpu.fence_ns", "nic.wqe_process_ns", "nic.line_rate_gbps"]
    draws = pr.draw_params(names, mean, cov, 5, rng_seed=7)
    z = np.random.default_rng(7).standard_normal((5, 3))
    want = np.exp(mean + z @ np.linalg.cholesky(cov).T)
    got = np.array([[d[f"platform.{n}"] for n in names] for d in draws])
    assert np.allclose(got, want, rtol=1e-12)
    # not positive definite (an unconstrained direction whose variance came out a hair below
    # zero): Cholesky refuses it, and the eigh factor reproduces the covariance with that
    # direction at 0 and each eigenvector's largest component positive (the fixed sign)
    v = np.array([[1.0, 1.0], [1.0, -1.0]]) / np.sqrt(2.0)
    indefinite = v @ np.diag([0.2, -1e-9]) @ v.T
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.cholesky(indefinite)
    f = pr.cov_factor(indefinite)
    assert np.allclose(f @ f.T, v @ np.diag([0.2, 0.0]) @ v.T, atol=1e-12)
    assert np.all(f[np.argmax(np.abs(f), axis=0), [0, 1]] >= 0)
    # many draws have the covariance asked for
    big = pr.draw_params(names, mean, cov, 20000, rng_seed=1)
    logs = np.log([[d[f"platform.{n}"] for n in names] for d in big])
    assert np.allclose(np.cov(logs.T), cov, atol=0.01)


def test_a_band_carries_the_calibrations_own_delta_error_in_quadrature():
    """``platform.calibrated.delta_discrepancy_us`` (the fit's typical miss on the lever deltas
    it was fitted to) widens a predicted band per side, in quadrature, by its 90% half-width;
    a platform without it (uncalibrated, or no lever record in its fit) leaves the band as is."""
    assert pr.model_band(5.0, (2.0, 9.0), None) == (2.0, 9.0)
    assert pr.model_band(5.0, (2.0, 9.0), 0.0) == (2.0, 9.0)
    lo, hi = pr.model_band(5.0, (2.0, 9.0), 10.0)
    m = 1.6448536269514722 * 10.0
    assert lo == pytest.approx(5.0 - math.hypot(3.0, m)) and hi == pytest.approx(5.0 + math.hypot(4.0, m))

