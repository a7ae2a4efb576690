"""``lever sweep`` and ``lever sensitivity``: points, equality with one-by-one runs, resume, ranking."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from lever.sim.levers import load_with_levers
from lever.sim.results import simulate

from lever.reports import sweep as sw

ROOT = Path(__file__).resolve().parents[1]
SCN = "decode-ep16-efa-native"
TINY = {"workload.tokens_per_rank": 8}


def points(**kw):
    grid = [sw.parse_grid("workload.ep_ranks=8,16")]
    return sw.enumerate_points(SCN, grid, levers=kw.pop("levers", ["batched-doorbells"]), seeds=1,
                               sets=TINY, **kw)


def rows_of(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def norm(rows) -> dict[tuple[str, str], dict[str, str]]:
    """Rows keyed by (point key, op), every value as the table writes it, without the wall time."""
    return {(r["key"], r["op"]): {k: repr(v) if isinstance(v, float) else str(v)
                                  for k, v in r.items() if k != "wall_s"} for r in rows}


# -- parsing and enumeration --------------------------------------------------------

def test_axes_parse_and_reject():
    g = sw.parse_grid("workload.ep_ranks=8,16,32")
    assert g.path == "workload.ep_ranks" and g.values == (8, 16, 32)
    assert sw.parse_grid('design.signal_mode="flush",imm-counting').values == ("flush", "imm-counting")
    r = sw.parse_random("platform.gpu.fence_ns=100.0:2000:log")
    assert r.log and not r.integer and (r.lo, r.hi) == (100.0, 2000.0)
    assert sw.parse_random("design.doorbell_batch=1:16").integer
    for bad in ("workload.ep_ranks", "x=", "x=5:1", "x=a:b", "x=0:5:log", "x=1:2:cubic"):
        with pytest.raises(sw.SweepError):
            (sw.parse_grid if ":" not in bad else sw.parse_random)(bad)


def test_point_keys_stable_and_levers_always_with_baseline():
    pts = points()
    assert [(dict(p.values)["workload.ep_ranks"], p.lever) for p in pts] == [
        (8, "none"), (8, "batched-doorbells"), (16, "none"), (16, "batched-doorbells")]
    assert len({p.key for p in pts}) == 4
    assert [p.key for p in pts] == [p.key for p in points()]          # stable across enumerations
    assert points(levers=["none", "batched-doorbells"]) == pts            # 'none' is the baseline
    other = sw.enumerate_points(SCN, [sw.parse_grid("workload.ep_ranks=8,16")], seeds=2, sets=TINY)
    assert not {p.key for p in other} & {p.key for p in pts}             # seeds are part of the key


def test_swept_lever_parameter_reparameterises_the_lever_only():
    pts = sw.enumerate_points(SCN, [sw.parse_grid("design.doorbell_batch=2,4")],
                              levers=["batched-doorbells"], sets=TINY)
    for p in pts:
        scn = p.load()
        want = dict(p.values)["design.doorbell_batch"] if p.lever != "none" else 1
        assert scn.design.doorbell_batch == want


def test_random_axes_seeded_in_range_and_integer():
    axes = [sw.parse_random("platform.gpu.fence_ns=100:5000:log"),  # int bounds, float field
            sw.parse_random("design.doorbell_batch=1:16")]
    a = sw.random_values(axes, 20, seed=3)
    assert a == sw.random_values(axes, 20, seed=3) and a != sw.random_values(axes, 20, seed=4)
    assert all(100 <= f <= 5000 and isinstance(b, int) and 1 <= b <= 16 for f, b in a)
    assert len({b for _, b in a}) > 4
    pts = sw.enumerate_points(SCN, [sw.parse_grid("workload.ep_ranks=8,16")], axes, samples=3, sets=TINY)
    assert len(pts) == 3 * 2
    assert all(isinstance(dict(p.values)["platform.gpu.fence_ns"], float) for p in pts)
    scn = pts[0].load()                                   # the drawn value reaches the scenario
    assert scn.platform.gpu.fence_ns == dict(pts[0].values)["platform.gpu.fence_ns"]


def test_bad_point_fails_before_any_run(tmp_path):
    pts = sw.enumerate_points(SCN, [sw.parse_grid("workload.ep_ranks=16,12")], sets=TINY)
    with pytest.raises(sw.SweepError, match="ep_ranks=12"):
        sw.run_sweep(pts, tmp_path / "r.csv", workers=1, progress=False)
    assert not (tmp_path / "r.csv").exists()


# -- running ------------------------------------------------------------------------

def test_sweep_equals_points_run_one_by_one(tmp_path):
    pts = points()
    out = tmp_path / "r.csv"
    summary = sw.run_sweep(pts, out, executor="local", workers=2, progress=False)
    assert summary["ran"] == 4 and summary["skipped"] == 0
    table = rows_of(out)
    assert len(table) == 4 * 2
    one_by_one = [r for p in pts for r in sw.run_point(p)]
    assert norm(table) == norm(one_by_one)
    # and a point's row is what `lever simulate` computes for that scenario
    scn = load_with_levers(SCN, ["batched-doorbells"], {**TINY, "workload.ep_ranks": 16})
    ref = simulate(scn, seeds=1, with_critical_path=False).to_json()
    lev16 = [r for r in table if r["lever"] == "batched-doorbells" and r["workload.ep_ranks"] == "16"]
    for r in lev16:
        assert float(r["p50_us"]) == ref["ops"][r["op"]]["p50_us"]
        assert float(r["p99_us"]) == ref["ops"][r["op"]]["p99_us"]


CALLS: list[str] = []


def counting_runner(p: sw.Point) -> list[dict]:
    CALLS.append(p.key)
    return sw.run_point(p)


class Boom(RuntimeError):
    pass


def dying_runner(p: sw.Point) -> list[dict]:
    if len(CALLS) == 2:
        raise Boom("worker died")
    return counting_runner(p)


def test_resume_skips_finished_points_and_survives_a_crash(tmp_path):
    pts = points()
    out = tmp_path / "r.csv"
    CALLS.clear()
    with pytest.raises(Boom):
        sw.run_sweep(pts, out, workers=1, runner=dying_runner, progress=False)
    assert len(CALLS) == 2 and len(rows_of(out)) == 2 * 2        # finished points are on disk
    CALLS.clear()
    s = sw.run_sweep(pts, out, workers=1, runner=counting_runner, progress=False)
    assert s["skipped"] == 2 and s["ran"] == 2 and len(CALLS) == 2
    assert set(CALLS) == {p.key for p in pts[2:]}
    CALLS.clear()
    s = sw.run_sweep(pts, out, workers=1, runner=counting_runner, progress=False)
    assert CALLS == [] and s["ran"] == 0 and s["skipped"] == 4
    # a torn last line (killed mid-write) and a half-written point: both rerun, nothing duplicated
    text = out.read_text()
    out.write_text(text[: text.rstrip("\n").rfind("\n") + 1] + text.rstrip("\n").rsplit("\n", 1)[1][:20])
    CALLS.clear()
    sw.run_sweep(pts, out, workers=1, runner=counting_runner, progress=False)
    assert len(CALLS) == 1
    rows = rows_of(out)
    assert len(rows) == 8 and len({(r["key"], r["op"]) for r in rows}) == 8
    # a different sweep into the same table is refused, not mixed in
    other = sw.enumerate_points(SCN, [sw.parse_grid("design.doorbell_batch=1,2")], sets=TINY)
    with pytest.raises(sw.SweepError, match="columns"):
        sw.run_sweep(other, out, workers=1, progress=False)


def test_cli_sweep_json_resume_and_plot(tmp_path):
    out, png = tmp_path / "r.csv", tmp_path / "r.png"
    args = [sys.executable, "-m", "lever.cli", "sweep", SCN, "--grid", "workload.ep_ranks=8,16",
            "--lever", "lazy-completion-dispatch", "--set", "workload.tokens_per_rank=16", "--workers", "1",
            "--out", str(out), "--json"]
    r = subprocess.run([*args, "--plot", str(png)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ran"] == 4 and png.stat().st_size > 10_000
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert json.loads(r.stdout) == {**json.loads(r.stdout), "ran": 0, "skipped": 4}
    bad = subprocess.run([*args[:6], "workload.ep_ranks=12", "--out", str(tmp_path / "x.csv")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert bad.returncode == 2 and "ep_ranks" in bad.stderr and bad.stderr.count("\n") == 1


# -- sensitivity --------------------------------------------------------------------

def test_sensitivity_ranks_an_untouched_parameter_at_zero():
    from lever.calibration.sensitivity import sensitivity

    # the host proxy's post cost next to parameters the native put path does read
    res = sensitivity("lazy-completion-dispatch", "morris", n=2, seeds=1, sets=TINY, workers=1,
                      params=[("proxy.host_post_ns", 100.0, 50000.0), ("gpu.pcie_read_ns", 300.0, 20000.0),
                              ("gpu.fence_ns", 100.0, 20000.0), ("fabric.base_latency_ns", 1000.0, 50000.0)],
                      params_only=True)
    assert res["evaluations"] == 2 * (4 + 1)
    rank = {r["name"]: r for r in res["ops"]["dispatch"]["ranking"]}
    assert set(rank) == {"proxy.host_post_ns", "gpu.pcie_read_ns", "gpu.fence_ns", "fabric.base_latency_ns"}
    # the native path never posts through the host proxy: its effect on the delta is exactly 0
    assert rank["proxy.host_post_ns"]["mu_star_us"] == 0.0
    top = res["ops"]["dispatch"]["ranking"][0]
    assert top["mu_star_us"] > 1.0 and top["name"] != "proxy.host_post_ns"
    # the credit check is a completion poll over PCIe on p5: that is what the lever's gain hinges on
    assert top["name"] == "gpu.pcie_read_ns"
    assert res["ops"]["dispatch"]["delta_range_us"][0] < -1.0
    # the lever does not touch combine at all
    assert all(r["mu_star_us"] == 0.0 for r in res["ops"]["combine"]["ranking"])


def test_parameter_space_calibrated_and_free():
    from lever.calibration.sensitivity import SensitivityError, parameter_space
    from lever.sim.params import Calibrated

    scn = load_with_levers(SCN, [], TINY)
    scn.platform.calibrated = None  # bounds from [platform.free] when uncalibrated
    free = parameter_space(scn)
    assert {p["name"] for p in free} == set(scn.platform.free)
    for p in free:
        fp = scn.platform.free[p["name"]]
        assert (p["lo"], p["hi"]) == pytest.approx((fp.lo, fp.hi))
    scn.platform.calibrated = Calibrated(names=["gpu.fence_ns", "platform.nic.max_batch"],
                                         log_mean=[7.0, 2.0], log_cov=[[0.04, 0.0], [0.0, 0.25]])
    cal = {p["name"]: p for p in parameter_space(scn, sigmas=2.0)}
    assert set(cal) == {"gpu.fence_ns", "nic.max_batch"}
    assert (cal["gpu.fence_ns"]["lo"], cal["gpu.fence_ns"]["hi"]) == pytest.approx(
        (math.exp(7.0 - 0.4), math.exp(7.0 + 0.4)))
    assert cal["nic.max_batch"]["integer"] and not cal["gpu.fence_ns"]["integer"]
    only = parameter_space(scn, extra=[("proxy.host_post_ns", 100.0, 1000.0)], only_extra=True)
    assert [p["name"] for p in only] == ["proxy.host_post_ns"]
    with pytest.raises(SensitivityError):
        parameter_space(scn, extra=[("gpu.no_such_ns", 1.0, 10.0)])
