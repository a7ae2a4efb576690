"""Parameter provenance (``lever params``) and the joint calibration's plumbing: shared
parameters tied across platforms, per-platform ones kept apart, a Jacobian column of one
platform's parameter re-running only that platform's jobs, and the report of which records
constrain what."""

from __future__ import annotations

import json

import numpy as np
import pytest
from lever.calibration import fit as fit_mod
from lever.calibration import joint
from lever.calibration.fit import FitResult, Job, Row, job_values
from lever.calibration.paramtable import parameter_table, unit_of
from lever.calibration.records import load_record
from lever.sim.scenario import SCENARIO_DIR

from lever.cli import main

BASES = ["efa-p5", "ib-cx7", "emulated-nvlink"]


@pytest.mark.parametrize("name", BASES)
def test_every_parameter_of_a_base_platform_has_a_source_and_a_unit_where_it_has_one(name):
    _lp, rows = parameter_table(name, compare=False)
    assert rows
    missing = [r.path for r in rows if r.kind == "none"]
    assert missing == []
    for r in rows:
        if r.path.endswith("_ns"):
            assert r.unit == "ns"
    assert unit_of("nic.line_rate_gbps") == "Gb/s" and unit_of("nic.sq_depth") == ""


def test_the_gpu_class_file_sets_the_shared_costs_of_every_hopper_platform():
    for name in BASES:
        _lp, rows = parameter_table(name, compare=False)
        shared = {r.path for r in rows if r.shared == "hopper"}
        assert {"gpu.reduce_ns_per_kib", "gpu.token_prep_ns", "gpu.device_load_ns"} <= shared, name
        assert "gpu.fence_ns" not in shared  # depends on the store target: per platform


def _write_platform(tmp_path, body: str):
    p = tmp_path / "plat.toml"
    p.write_text(f'include = ["{SCENARIO_DIR / "gpus" / "hopper.toml"}"]\n' + body)
    return p


def test_a_shared_parameter_set_far_from_the_class_value_is_a_defect(tmp_path):
    p = _write_platform(tmp_path, """
[platform]
name = "odd"
[platform.gpu]
device_load_ns = 1480.0
""")
    _lp, rows = parameter_table(p, compare=False)
    row = next(r for r in rows if r.path == "gpu.device_load_ns")
    assert row.shared == ""  # this file set it, not the class file
    assert any("shared hopper parameter" in d for d in row.defects), row.defects
    # within the class value's uncertainty: no defect
    p2 = _write_platform(tmp_path, '[platform]\nname = "close"\n[platform.gpu]\ndevice_load_ns = 150.0\n')
    row2 = next(r for r in parameter_table(p2, compare=False)[1] if r.path == "gpu.device_load_ns")
    assert not any("shared" in d for d in row2.defects), row2.defects


def test_a_fitted_value_at_its_bound_and_an_unsourced_value_are_defects(tmp_path, capsys):
    p = _write_platform(tmp_path, """
[platform]
name = "fitted"
[platform.fabric]
base_latency_ns = 100000.0
[platform.free."fabric.base_latency_ns"]
lo = 1000.0
hi = 100000.0
[platform.calibrated]
names = ["fabric.base_latency_ns"]
log_mean = [11.5]
log_cov = [[0.01]]
""")
    _lp, rows = parameter_table(p, compare=False)
    lat = next(r for r in rows if r.path == "fabric.base_latency_ns")
    assert lat.kind == "fitted" and lat.rel_sigma == pytest.approx(0.1)
    assert any("bound" in d for d in lat.defects)
    assert any(r.defects == ["no source"] for r in rows if r.path == "nic.mtu_bytes")
    assert main(["params", str(p), "--json", "--no-compare", "--defects"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert any(d.startswith("fabric.base_latency_ns: fitted at a bound") for d in out["defects"])


def test_an_unidentified_value_says_whether_another_parameter_takes_its_place(tmp_path):
    """Two fitted values 0.99 correlated: the unidentified one names its partner; a value
    unidentified on its own says how uncertain it is."""
    body = """
[platform]
name = "pair"
[platform.fabric]
base_latency_ns = 9000.0
[platform.gpu]
fence_ns = 1500.0
token_prep_ns = 210.0
[platform.free."fabric.base_latency_ns"]
lo = 1000.0
hi = 100000.0
prior = { value = 8000.0, rel_sigma = 1.0 }
[platform.free."gpu.fence_ns"]
lo = 100.0
hi = 20000.0
prior = { value = 1430.0, rel_sigma = 0.3 }
[platform.free."gpu.token_prep_ns"]
lo = 20.0
hi = 20000.0
prior = { value = 200.0, rel_sigma = 1.0 }
[platform.calibrated]
names = ["fabric.base_latency_ns", "gpu.fence_ns", "gpu.token_prep_ns"]
log_mean = [9.105, 7.313, 5.347]
log_cov = [[0.04, -0.0396, 0.0], [-0.0396, 0.04, 0.0], [0.0, 0.0, 1.0]]
unidentifiable = ["gpu.fence_ns", "gpu.token_prep_ns"]
[platform.sources]
"gpu.token_prep_ns" = { kind = "fitted", ref = "a test's fit" }
"""
    rows = {r.path: r for r in parameter_table(_write_platform(tmp_path, body), compare=False)[1]}
    assert any("apart from fabric.base_latency_ns (correlation -0.990)" in d
               for d in rows["gpu.fence_ns"].defects), rows["gpu.fence_ns"].defects
    assert any("not identified by the records (1 sigma: x2.72)" in d
               for d in rows["gpu.token_prep_ns"].defects), rows["gpu.token_prep_ns"].defects


def test_a_source_naming_no_parameter_is_refused_with_one_line(tmp_path, capsys):
    p = _write_platform(tmp_path, '[platform]\nname = "bad"\n[platform.sources]\n'
                                  '"gpu.nope_ns" = { kind = "measured", ref = "x" }\n')
    assert main(["params", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gpu.nope_ns" in err[0]


# -- the joint fit ---------------------------------------------------------------------------

def _groups():
    recs = [load_record(SCENARIO_DIR.parent / "calibration" / "data" / f"{i}.json")
            for i in ("efa-ep16-native-headline", "ib-ep8-ll-reference")]
    return joint.resolve_groups(recs)


def test_a_joint_plan_ties_class_parameters_and_keeps_the_rest_per_platform():
    p = joint.plan(_groups())
    assert "gpu.reduce_ns_per_kib" in p.free and "gpu.reduce_ns_per_kib" in p.shared
    assert "gpu.fence_ns@efa-p5" in p.free and "gpu.fence_ns@ib-cx7" in p.free
    assert "gpu.fence_ns" not in p.free
    assert {j.group for j in p.jobs} == {"efa-p5", "ib-cx7"}
    efa = next(j for j in p.jobs if j.group == "efa-p5")
    vals = job_values(efa, {"gpu.reduce_ns_per_kib": 9.0, "gpu.fence_ns@efa-p5": 1.0,
                            "gpu.fence_ns@ib-cx7": 2.0})
    assert vals == {"gpu.reduce_ns_per_kib": 9.0, "gpu.fence_ns": 1.0}
    # the job runs on its base platform, not on the calibrated one its scenario includes
    assert dict(efa.base)["platform.fabric.base_latency_ns"] == 8000.0


def test_a_parameter_of_one_platform_reruns_only_that_platforms_jobs(monkeypatch):
    calls: list[tuple[str, dict]] = []

    def fake(job: Job, base_sets, values, seeds):
        calls.append((job.group, job_values(job, values)))
        return {op: {"p50_us": 1.0, "profiler": {}, "put_path": {}} for op in job.ops}

    monkeypatch.setattr(fit_mod, "run_job", fake)
    p = joint.plan(_groups())
    names = sorted(p.free)
    ev = fit_mod.Evaluator(p.jobs, {}, names, 1, workers=1)
    x = np.array([p.start[n] for n in names])
    ev.many([x])
    assert len(calls) == 2
    calls.clear()
    x2 = x.copy()
    x2[names.index("gpu.fence_ns@ib-cx7")] *= 1.05
    x3 = x.copy()
    x3[names.index("gpu.reduce_ns_per_kib")] *= 1.05
    ev.many([x2, x3])
    assert sorted(g for g, _ in calls) == ["efa-p5", "ib-cx7", "ib-cx7"]


def test_the_report_names_the_records_that_constrain_each_parameter():
    rows = [Row("a", "dispatch.p50", "us", 1.0, 1.0, 0.0), Row("b", "dispatch.p50", "us", 1.0, 1.0, 0.0)]
    res = FitResult(names=["x", "y"], x=np.ones(2), log_cov=np.eye(2), se_log=np.ones(2),
                    corr=np.eye(2), unidentifiable=[], at_bound=[], cost=0.0, rows=rows,
                    evaluations=0, wall_s=0.0, nfev=0, status="", jac=np.array([[1.0, 0.0], [0.01, 0.0]]))
    assert res.constrained_by() == {"x": ["a"], "y": []}


def test_a_group_result_carries_its_own_and_the_shared_parameters_with_their_covariance():
    g = _groups()
    p = joint.plan(g)
    names = sorted(p.free)
    cov = np.diag(np.arange(1.0, len(names) + 1))
    res = FitResult(names=names, x=np.arange(1.0, len(names) + 1), log_cov=cov,
                    se_log=np.sqrt(np.diag(cov)), corr=np.eye(len(names)), unidentifiable=[],
                    at_bound=[], cost=0.0, rows=[], evaluations=0, wall_s=0.0, nfev=0, status="")
    ib = next(x for x in g if x.name == "ib-cx7")
    sub = joint.group_result(res, ib, p.shared)
    assert "gpu.fence_ns" in sub.names and "gpu.reduce_ns_per_kib" in sub.names
    assert not any("@" in n for n in sub.names)
    i = names.index("gpu.fence_ns@ib-cx7")
    assert sub.x[sub.names.index("gpu.fence_ns")] == res.x[i]
    assert sub.log_cov[sub.names.index("gpu.fence_ns"), sub.names.index("gpu.fence_ns")] == cov[i, i]


def test_calibrate_joint_writes_one_platform_per_nic_with_the_shared_values_alike(monkeypatch, tmp_path, capsys):
    """The command end to end on a stand-in model (every run the same numbers): one calibrated
    file per base platform, the shared parameter's value the same in both, every fitted value
    sourced as fitted, the records it was fitted on named."""
    def fake(job: Job, base_sets, values, seeds):
        v = job_values(job, values)
        lat = 100.0 + v.get("gpu.reduce_ns_per_kib", 0.0)
        return {op: {"p50_us": lat, "profiler": {}, "put_path": {}} for op in job.ops}

    monkeypatch.setattr(fit_mod, "run_job", fake)
    data = SCENARIO_DIR.parent / "calibration" / "data"
    recs = [str(data / f"{i}.json") for i in ("efa-ep16-native-headline", "ib-ep8-ll-reference")]
    rc = main(["calibrate", "--joint", *recs, "--max-nfev", "2", "--workers", "1",
               "--out-dir", str(tmp_path), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(out["groups"]) == ["efa-p5", "ib-cx7"]
    assert {p["name"] for p in out["params"] if p["shared"]} == {"gpu.reduce_ns_per_kib", "gpu.token_prep_ns"}
    files = sorted(tmp_path.glob("*.toml"))
    assert [f.name for f in files] == ["efa-p5-calibrated.toml", "ib-cx7-calibrated.toml"]
    loaded = [parameter_table(f, compare=False)[0].platform for f in files]
    assert loaded[0].gpu.reduce_ns_per_kib == loaded[1].gpu.reduce_ns_per_kib
    for plat in loaded:
        assert plat.sources["gpu.reduce_ns_per_kib"].kind == "fitted"
        assert plat.gpu_class == "hopper" and plat.calibrated is not None
    assert "efa-ep16-native-headline" in loaded[0].sources["fabric.base_latency_ns"].ref
    # a shared value says it is one for the class and names the records of both platforms that
    # constrain it; `lever params` marks it shared on both
    for f, plat in zip(files, loaded, strict=True):
        ref = plat.sources["gpu.reduce_ns_per_kib"].ref
        assert "efa-ep16-native-headline" in ref and "ib-ep8-ll-reference" in ref, ref
        assert "every hopper platform (efa-p5, ib-cx7)" in ref
        assert plat.calibrated.shared == ["gpu.reduce_ns_per_kib", "gpu.token_prep_ns"]
        rows = {r.path: r for r in parameter_table(f, compare=False)[1]}
        assert rows["gpu.reduce_ns_per_kib"].shared == "hopper"
        assert rows["fabric.base_latency_ns"].shared == ""


def test_calibrate_without_joint_still_needs_records_and_out(capsys):
    assert main(["calibrate", "--max-nfev", "1"]) == 2
    assert "--joint" in capsys.readouterr().err
