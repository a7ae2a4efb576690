"""Calibration: parameter recovery, identifiability flags, bad records refused, atomic output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from lever.calibration.fit import FitError, fit, predict
from lever.calibration.records import DATA_DIR, RecordError, load_record, parse_record
from lever.sim.levers import load_with_levers
from lever.sim.params import FreeParam, Prior

from lever.cli import main as lever_main

TINY = {"workload.ep_ranks": 2, "workload.gpus_per_node": 1, "workload.num_experts": 8, "workload.top_k": 2,
        "workload.tokens_per_rank": 8, "design.num_sms": 2, "design.qps_per_call": 3,
        # each warp flushes its own writes: with a QP-scoped flush (the GIN designs') a tail
        # waits for the other warp's writes too, which hides the fence behind the wire in a
        # case this small (fitted 1818 ns against 2100 at 0.5% noise, every row within 0.9%)
        "design.flush_scope": "warp"}
TRUTH = {"fabric.base_latency_ns": 12000.0, "gpu.fence_ns": 2100.0}
SCN = "decode-ep16-efa-native"


def _record(id_: str, sets: dict, lat: dict) -> dict:
    return {"schema_version": 1, "id": id_, "nic": "efa", "what": {"design": "v2-hybrid native"},
            "sim": {"scenario": SCN, "set": sets}, "gate": {"passed": True},
            "provenance": {"source": "synthetic: the model at known parameters, 0.5% noise"},
            "latency_us": {op: {"median": v} for op, v in lat.items()}}


def _base() -> tuple:
    """The hand-set EFA platform and the overrides that install it: the recovery runs on it, so
    a recalibration of the shipped platform does not move the truth or the start."""
    from lever.calibration.fit import flatten_platform
    from lever.calibration.paramtable import load_platform

    plat = load_platform("efa-p5").platform
    return plat, flatten_platform(plat.model_dump(mode="json"))


def _synthetic_records() -> list:
    rng = np.random.default_rng(7)
    _plat, base = _base()
    variants = {"tiny-b1": {}, "tiny-b8": {"design.doorbell_batch": 8},
                "tiny-t16": {"workload.tokens_per_rank": 16}}
    out = []
    for id_, extra in variants.items():
        sets = {**TINY, **extra}
        truth_sets = {**base, **{f"platform.{k}": v for k, v in TRUTH.items()}}
        rows = predict([parse_record(_record(id_, sets, {"dispatch": 1.0, "combine": 1.0}))],
                       values={}, base_sets=truth_sets, workers=1)
        lat = {r.quantity.split(".")[0]: r.predicted * (1 + rng.normal(0, 0.005)) for r in rows}
        out.append(parse_record(_record(id_, sets, lat), id_))
    return out


@pytest.fixture(scope="module")
def recovery():
    recs = _synthetic_records()
    plat, base = _base()
    free = {"fabric.base_latency_ns": FreeParam(lo=1000, hi=50000),
            "gpu.fence_ns": FreeParam(lo=100, hi=20000),
            # the native path never touches the proxy: nothing can identify this one
            "proxy.host_post_ns": FreeParam(lo=100, hi=50000, prior=Prior(value=900, rel_sigma=0.5))}
    return fit(recs, plat, base, free=free, max_nfev=12, workers=2), recs


def test_recovers_known_parameters(recovery):
    res, _ = recovery
    est = dict(zip(res.names, res.x, strict=True))
    for k, v in TRUTH.items():
        assert abs(est[k] / v - 1) < 0.10, (k, est[k], v)
    for r in res.rows:
        assert abs(r.pct_err) < 3.0, r


def test_flags_unidentifiable(recovery):
    res, _ = recovery
    assert "proxy.host_post_ns" in res.unidentifiable
    assert "fabric.base_latency_ns" not in res.unidentifiable
    se = {p["name"]: p["log_se"] for p in res.params()}
    assert se["fabric.base_latency_ns"] < 0.2


def test_multi_start_keeps_the_best_local_fit_and_is_reproducible():
    recs = _synthetic_records()[:2]
    plat = load_with_levers(SCN).platform
    free = {"fabric.base_latency_ns": FreeParam(lo=1000, hi=50000),
            "gpu.fence_ns": FreeParam(lo=100, hi=20000)}
    one = fit(recs, plat, free=free, max_nfev=3, workers=2)
    three = fit(recs, plat, free=free, max_nfev=3, workers=2, starts=3)
    again = fit(recs, plat, free=free, max_nfev=3, workers=2, starts=3)
    assert three.cost <= one.cost  # start 0 is the single fit's own start
    assert three.evaluations > one.evaluations
    assert np.array_equal(three.x, again.x)  # the extra starts are seeded


def test_fit_refuses_empty_free():
    with pytest.raises(FitError, match="no \\[platform.free\\]"):
        fit(_synthetic_records()[:1], load_with_levers(SCN).platform, free={})


# ------------------------------------------------------------------ bad records


def _good() -> dict:
    return json.loads((DATA_DIR / "efa-ep16-native-headline.json").read_text())


def _bad_cases(tmp: Path) -> dict[str, tuple[Path, str]]:
    cases = {}
    g = _good()
    p = tmp / "truncated.json"
    p.write_text(json.dumps(g)[:200])
    cases["truncated"] = (p, "not valid JSON")
    g = _good()
    g["schema_version"] = 99
    p = tmp / "version.json"
    p.write_text(json.dumps(g))
    cases["wrong version"] = (p, "schema_version")
    g = _good()
    g["latency_us"]["dispatch"]["median"] = 338.5e-6 * 1e-3  # seconds given as if us -> still positive
    g["latency_us"]["dispatch"] = {"median_s": 338.5e-6}
    p = tmp / "unit.json"
    p.write_text(json.dumps(g))
    cases["unit-confused field"] = (p, "latency_us.dispatch")
    g = _good()
    g["latency_us"]["combine"]["median"] = 480.7e3 * 1e3  # ns given as us, times 1e3 again
    p = tmp / "unit2.json"
    p.write_text(json.dumps(g))
    cases["unit-confused value"] = (p, "wrong unit")
    g = _good()
    del g["provenance"]
    p = tmp / "malformed.json"
    p.write_text(json.dumps(g))
    cases["missing field"] = (p, "provenance")
    g = _good()
    g["nic"] = "efa-ish"
    p = tmp / "nic.json"
    p.write_text(json.dumps(g))
    cases["bad nic"] = (p, "nic")
    return cases


def test_bad_records_refused_nothing_written(tmp_path, capsys):
    out = tmp_path / "out.toml"
    for label, (path, field) in _bad_cases(tmp_path).items():
        with pytest.raises(RecordError) as e:
            load_record(path)
        msg = str(e.value)
        assert str(path) in msg and field in msg, (label, msg)
        rc = lever_main(["calibrate", str(path), "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and str(path) in err and "\n" not in err.strip(), (label, err)
        assert not out.exists(), label
    assert list(tmp_path.glob("*.toml")) == [] and list(tmp_path.glob(".*tmp")) == []


def test_mixed_nics_refused(tmp_path, capsys):
    out = tmp_path / "o.toml"
    rc = lever_main(["calibrate", str(DATA_DIR / "efa-ep16-native-headline.json"),
                     str(DATA_DIR / "ib-ep8-ll-reference.json"), "--out", str(out)])
    assert rc == 2 and "nic" in capsys.readouterr().err and not out.exists()


def test_emulated_records_never_calibrate_a_real_platform(tmp_path, capsys):
    emu = str(DATA_DIR / "emu-ep2-native-baseline.json")
    out = tmp_path / "o.toml"
    for plat in ("platforms/efa-p5.toml", "platforms/ib-cx7.toml"):
        rc = lever_main(["calibrate", emu, "--platform", plat, "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and "is nic 'emulated-srd'" in err and err.count("\n") == 1
        assert not out.exists()
    # ...and real EFA records never an emulated platform
    rc = lever_main(["calibrate", str(DATA_DIR / "efa-ep16-native-headline.json"), "--platform",
                     "platforms/emulated-nvlink.toml", "--out", str(out)])
    assert rc == 2 and "nic_kind 'emulated-srd'" in capsys.readouterr().err and not out.exists()


def test_failed_fit_writes_nothing(tmp_path, capsys):
    """A fit that fails mid-way (a record pointing at a missing scenario) leaves no file."""
    g = _good()
    g["sim"] = {"scenario": "no-such-scenario"}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(g))
    out = tmp_path / "o.toml"
    shutil.copy(DATA_DIR / "efa-ep16-native-headline.json", tmp_path / "ok.json")
    rc = lever_main(["calibrate", str(tmp_path / "ok.json"), str(p), "--out", str(out),
                     "--platform", "platforms/efa-p5.toml", "--max-nfev", "1", "--workers", "1"])
    assert rc != 0 and not out.exists()
    assert list(tmp_path.glob(".*tmp")) == []


def test_shipped_records_load():
    recs = [load_record(p) for p in sorted(DATA_DIR.glob("*.json"))]
    ids = [r.id for r in recs]
    assert len(set(ids)) == len(ids)  # every record (training, primitives, emulated) loads, ids unique
    training = [r for r in recs if r.nic in ("efa", "ib")]
    assert len(training) == 9  # 5 EFA campaign facts, 4 DeepEP LL tables (NVLink, pure RDMA)
    for r in training:
        assert r.provenance.source.startswith(("EFA campaign", "InfiniBand reference",
                                               "DeepEP README")) and r.sim


def _native_emulated_record(path: str, cq_read_ns: float) -> object:
    """The shipped emulated baseline's run configuration with one put-path metric, on the
    ``path`` it names (the model runs the record's own sets either way)."""
    d = json.loads((DATA_DIR / "emu-bed-ep2-native-baseline.json").read_text())
    d["what"]["path"] = path
    d["metrics"] = {"combine_credit_read_ns": {"median": cq_read_ns}}
    d["attribution"] = {}
    return parse_record(d, "metric-test")


def test_a_native_records_credit_read_is_fitted_and_follows_the_cq_read_interval():
    """The put-path metric is a row of the fit (so a fit can not trade the time of one credit
    read for another cost of the same share), the model's side of it is its own credit read,
    and the row moves with the mechanism that sets it: polls of one host CQ served one after
    another, ``nic.cq_shared_read_ns`` apart."""
    from lever.calibration.fit import METRIC_SIGMA

    rec = _native_emulated_record("native", 3000.0)
    rows = {}
    for v in (1000.0, 3000.0):
        got = [r for r in predict([rec], values={"nic.cq_shared_read_ns": v}, workers=1)
               if r.quantity == "combine.credit_read_ns"]
        assert len(got) == 1 and got[0].unit == "ns" and got[0].measured == 3000.0
        rows[v] = got[0]
    slow, fast = rows[3000.0], rows[1000.0]
    assert slow.predicted > 1.5 * fast.predicted  # 12 warps a CQ queue for its lines
    assert slow.residual == pytest.approx(np.log(slow.predicted / 3000.0) / METRIC_SIGMA)


def test_a_proxy_records_put_path_metrics_are_not_fitted():
    """On the proxy path hw/ep's post chain is its host thread's, which the model's warps'
    ledger does not hold: no row."""
    rec = _native_emulated_record("proxy", 3000.0)
    assert not [r for r in predict([rec], workers=1) if r.unit == "ns"]


def test_a_calibrated_platform_carries_the_fits_miss_on_its_lever_deltas():
    """``lever calibrate`` writes ``[platform.calibrated] delta_discrepancy_us``, the fit's typical
    miss on the lever deltas among its records (each lever record against its baseline), which
    ``lever predict`` widens its bands by; a fit with no lever record writes none."""
    from lever.calibration.fit import FitResult, Row, calibrated_platform
    from lever.calibration.validate import MAD_TO_SD
    from lever.sim import scenario

    base = load_record(DATA_DIR / "emu-ep2-native-baseline.json")
    lev = load_record(DATA_DIR / "emu-ep2-native-batched-doorbells.json")
    plat = scenario.load("emu-ep2-native").platform
    name = sorted(plat.free)[0]
    rows = [Row(base.id, f"{op}.p50", "us", 1000.0, 1000.0, 0.0) for op in ("dispatch", "combine")]
    rows += [Row(lev.id, "dispatch.p50", "us", 900.0, 930.0, 30.0),  # the delta missed by 30 us
             Row(lev.id, "combine.p50", "us", 950.0, 940.0, -10.0)]  # and by 10 us
    one = np.ones((1, 1))
    res = FitResult(names=[name], x=np.array([plat.free[name].lo * 2]), log_cov=one * 0.01,
                    se_log=np.array([0.1]), corr=one, unidentifiable=[], at_bound=[], cost=1.0,
                    rows=rows, evaluations=1, wall_s=0.0, nfev=1, status="test")
    cal = calibrated_platform(plat, res, [base, lev], "t").calibrated
    assert cal.delta_discrepancy_us == pytest.approx(MAD_TO_SD * 20.0, abs=1e-3)
    alone = calibrated_platform(plat, FitResult(**{**res.__dict__, "rows": rows[:2]}), [base], "t")
    assert alone.calibrated.delta_discrepancy_us is None
