"""Verdict logic of ``lever compare`` on hand-made records and preregistrations."""

from __future__ import annotations

import json

import pytest
from lever.calibration import compare as cmp
from lever.calibration import predict as pr
from lever.calibration.records import RecordError, check_nic, parse_record
from lever.sim import levers as levers_mod
from lever.sim import scenario as scn_mod
from lever.sim.errors import UserError

from lever.cli import main as lever_main

LEVER = "lazy-completion-dispatch"
BASE = "decode-ep16-efa-native"


def _prereg(delta: float = -10.0, band: tuple[float, float] = (-14.0, -6.0), sets: list[str] | None = None) -> dict:
    scn = levers_mod.load_with_levers(BASE, [], sets or [])
    pred = {
        "lever": LEVER, "baseline": BASE, "sets": sets or [], "lever_only_sets": [], "lever_sets": {},
        "platform": scn.platform.name, "platform_digest": scn_mod.platform_digest(scn), "seeds": 3,
        "param_samples": 0, "band_kind": "noise-only", "band_level": 0.9,
        "ops": {"dispatch": {"baseline_p50_us": 100.0, "lever_p50_us": 100.0 + delta, "delta_us": delta,
                             "band_us": list(band)}},
    }
    return pr.preregistration(pred)


def _rec(rid: str, median: float, levers: list[str], p10: float | None = None, p90: float | None = None,
         n: int | None = None, samples: list[float] | None = None) -> dict:
    lat = {"median": median}
    if p10 is not None:
        lat.update(p10=p10, p90=p90, n=n)
    if samples is not None:
        lat = {"median": sorted(samples)[len(samples) // 2], "samples": samples, "n": len(samples)}
    return parse_record({
        "schema_version": 1, "id": rid, "nic": "efa",
        "what": {"design": "v2-hybrid native", "levers": levers},
        "latency_us": {"dispatch": lat}, "gate": {"passed": True}, "provenance": {"source": "hand-made"},
    })


def _judge(base_med: float, lev_med: float, spread: float = 1.0, n: int = 100) -> dict:
    recs = [_rec("b", base_med, [], base_med - spread, base_med + spread, n),
            _rec("l", lev_med, [LEVER], lev_med - spread, lev_med + spread, n)]
    return cmp.compare(_prereg(), recs)["ops"]["dispatch"]


def test_inside_band_validated():
    r = _judge(100.0, 90.0)
    assert r["verdict"] == "validated" and abs(r["measured_delta_us"] + 10.0) < 1e-9


def test_outside_band_refuted_without_sign_flip():
    r = _judge(100.0, 80.0)
    assert r["verdict"] == "refuted" and not r["sign_flip"]


def test_sign_flip_flagged():
    r = _judge(100.0, 105.0)
    assert r["verdict"] == "refuted" and r["sign_flip"]


def test_too_noisy_inconclusive():
    r = _judge(100.0, 90.0, spread=40.0, n=4)
    assert r["verdict"] == "inconclusive"
    lo, hi = r["measured_band_us"]
    assert hi - lo > 8.0


def test_no_spread_is_inconclusive():
    recs = [_rec("b", 100.0, []), _rec("l", 90.0, [LEVER])]
    assert cmp.compare(_prereg(), recs)["ops"]["dispatch"]["verdict"] == "inconclusive"


def test_samples_band():
    base = [100.0 + 0.1 * i for i in range(-10, 11)]
    lev = [x - 10.0 for x in base]
    recs = [_rec("b", 0, [], samples=base), _rec("l", 0, [LEVER], samples=lev)]
    r = cmp.compare(_prereg(), recs)["ops"]["dispatch"]
    assert r["measured_source"] == "samples" and r["verdict"] == "validated"
    assert r["measured_band_us"][0] <= -10.0 <= r["measured_band_us"][1]


def test_verdict_function_edges():
    assert cmp.verdict(-10, [-14, -6], -6.0, [-6.5, -5.5])["verdict"] == "validated"
    assert cmp.verdict(-10, [-14, -6], -5.9, [-6.0, -5.8])["verdict"] == "refuted"
    assert cmp.verdict(0, [0, 0], 0.3, [-0.2, 0.8])["verdict"] == "inconclusive"


def test_prereg_sha_roundtrip_and_tamper():
    p = _prereg()
    cmp.check_prereg(p, p["platform_digest"])
    bad = json.loads(json.dumps(p))
    bad["predictions"]["dispatch"]["band_us"] = [-100.0, 100.0]
    with pytest.raises(UserError, match="sha256"):
        cmp.check_prereg(bad, p["platform_digest"])


def test_platform_mismatch_refused():
    p = _prereg()
    with pytest.raises(UserError, match="platform digest"):
        cmp.check_prereg(p, "0" * 64)


def _write(tmp_path, prereg, recs):
    pp = tmp_path / "prereg.json"
    pp.write_text(json.dumps(prereg))
    paths = []
    for r in recs:
        q = tmp_path / f"{r.id}.json"
        q.write_text(json.dumps(r.model_dump(mode="json", exclude_none=True)))
        paths.append(str(q))
    return str(pp), paths


def test_cli_compare_ok_and_refusals(tmp_path, capsys):
    recs = [_rec("b", 100.0, [], 99.0, 101.0, 100), _rec("l", 90.0, [LEVER], 89.0, 91.0, 100)]
    pp, paths = _write(tmp_path, _prereg(), recs)
    assert lever_main(["compare", pp, *paths, "--json", "--plot", str(tmp_path / "c.png")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ops"]["dispatch"]["verdict"] == "validated"
    assert (tmp_path / "c.png").stat().st_size > 0
    # tampered: exit 2, one line
    t = json.loads(open(pp).read())
    t["predictions"]["dispatch"]["delta_us"] = 5.0
    (tmp_path / "prereg.json").write_text(json.dumps(t))
    assert lever_main(["compare", pp, *paths]) == 2
    err = capsys.readouterr().err.strip()
    assert "sha256" in err and "\n" not in err
    # made on another platform file (an older efa-p5): intact seal, other digest
    scn = levers_mod.load_with_levers(BASE, [], {"platform.gpu.fence_ns": 999.0})
    other = _prereg()
    other["platform_digest"] = scn_mod.platform_digest(scn)
    other["sha256"] = pr.content_sha256(other)
    pp2, _ = _write(tmp_path, other, [])
    assert lever_main(["compare", pp2, *paths]) == 2
    err = capsys.readouterr().err.strip()
    assert "platform digest" in err and "\n" not in err
    # the same prediction judged as sealed when asked: its own numbers, both digests named
    assert lever_main(["compare", pp2, *paths, "--json", "--sealed-platform"]) == 0
    cap = capsys.readouterr()
    got = json.loads(cap.out)
    assert got["ops"]["dispatch"]["verdict"] == "validated"
    assert got["ops"]["dispatch"]["predicted_delta_us"] == other["predictions"]["dispatch"]["delta_us"]
    assert got["platform_digest_now"] != other["platform_digest"] and "judged as sealed" in cap.err
    # still refused when tampered, asked or not
    (tmp_path / "prereg.json").write_text(json.dumps(t))
    assert lever_main(["compare", pp, *paths, "--sealed-platform"]) == 2
    assert "sha256" in capsys.readouterr().err


def test_emulated_records_never_judge_an_efa_prediction(tmp_path, capsys):
    from lever.calibration.records import DATA_DIR, load_record

    emu = [load_record(DATA_DIR / "emu-ep2-native-baseline.json"),
           load_record(DATA_DIR / f"emu-ep2-native-{LEVER}.json")]
    pp, paths = _write(tmp_path, _prereg(), emu)
    assert lever_main(["compare", pp, *paths]) == 2
    err = capsys.readouterr().err.strip()
    assert "emulated-srd" in err and "nic_kind 'efa'" in err and "\n" not in err
    with pytest.raises(RecordError, match="only a platform of their own NIC kind"):
        check_nic("efa", emu, "prereg", "judge")
    with pytest.raises(RecordError, match="only a platform of their own NIC kind"):
        check_nic("any", emu, "prereg", "judge")  # an emulated record never passes for a real NIC
    check_nic("emulated-srd", emu, "prereg", "judge")  # like with like passes
