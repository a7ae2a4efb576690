"""Lever variants: the schema (one-line errors naming file and field), predict over every
runnable variant, the preregistration sealing all of them, compare naming the supported one."""

from __future__ import annotations

import copy

import pytest
from lever.calibration import compare as cmp
from lever.calibration import predict as pr
from lever.calibration.records import parse_record
from lever.sim import levers as levers_mod
from lever.sim import scenario as scn_mod
from lever.sim.errors import UserError

from lever.cli import main as lever_main

BASE = "decode-ep16-efa-native"
TINY = {"workload.ep_ranks": 2, "workload.gpus_per_node": 1, "workload.num_experts": 8, "workload.top_k": 2,
        "workload.tokens_per_rank": 8, "design.num_sms": 2, "design.qps_per_call": 3}

GOOD = f'''name = "tiny-batching"
baseline = "{BASE}"
description = "doorbell batching, of a size not known"
primary = "b8"
primary_why = "the size the campaign used"

[variants.b8]
description = "eight WQEs per doorbell"
source = "campaign record efa-ep16-batched-doorbells-b8"
[variants.b8.set]
"design.doorbell_batch" = 8

[variants.b2]
description = "two WQEs per doorbell, no fence around it"
source = "hand-made for the test"
[variants.b2.set]
"design.doorbell_batch" = 2
"design.fences_per_doorbell" = 0

[variants.by-bytes]
description = "a batch cut by bytes, not WQEs"
source = "hand-made for the test"
needs = "a doorbell batch measured in bytes"
'''


def _write(tmp_path, text: str, name: str = "tiny-batching"):
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return p


def test_shipped_variant_files_load_with_a_runnable_primary():
    for name in ("provider-batched-tail", "write-imm-counting"):
        lev = levers_mod.load_lever(name)
        assert lev.primary in lev.variants and lev.primary_why
        assert lev.variants[lev.primary].runnable and lev.set == lev.variants[lev.primary].set
        for v in lev.variants.values():
            assert v.source.strip() and v.description.strip()
            assert v.runnable != (v.needs is not None)
    assert levers_mod.load_lever("write-imm-counting").set == {"design.signal_mode": "imm-counting"}
    # unknowns are written down, not faked: a variant the model lacks a mechanism for says so
    lev = levers_mod.load_lever("write-imm-counting")
    assert any(not v.runnable for v in lev.variants.values())


def test_a_lever_reference_can_name_the_variant_a_run_built():
    """``NAME@VARIANT`` (a record's sim.levers) applies that variant's set, not the primary's;
    an unknown or not-runnable variant is a one-line error naming the lever file."""
    prim = levers_mod.load_with_levers(BASE, ["provider-batched-tail"], TINY)
    var = levers_mod.load_with_levers(BASE, ["provider-batched-tail@signals-in-one-doorbell"], TINY)
    assert prim.design.provider_batched_tail and prim.design.signal_post_group == 1
    assert not var.design.provider_batched_tail and var.design.signal_post_group == 16
    assert levers_mod.split_ref("a/b@c/d.toml") == ("a/b@c/d.toml", None)
    with pytest.raises(scn_mod.ScenarioError, match="provider-batched-tail.toml: variants: no variant 'nope'"):
        levers_mod.load_with_levers(BASE, ["provider-batched-tail@nope"], TINY)
    with pytest.raises(scn_mod.ScenarioError, match="not runnable yet"):
        levers_mod.load_with_levers(BASE, ["write-imm-counting@count-per-source-expert"], TINY)


BAD = {
    "both set and needs": (GOOD.replace('needs = "a doorbell batch measured in bytes"',
                                        'needs = "x"\n[variants.by-bytes.set]\n"design.doorbell_batch" = 3'),
                           "variants.by-bytes"),
    "neither": (GOOD.replace('needs = "a doorbell batch measured in bytes"', ""), "variants.by-bytes"),
    "no source": (GOOD.replace('source = "hand-made for the test"\nneeds', "needs"), "variants.by-bytes.source"),
    "unknown key": (GOOD.replace('needs = "a', 'cost_us = 3\nneeds = "a'), "variants.by-bytes.cost_us"),
    "primary missing": (GOOD.replace('primary = "b8"\n', ""), "primary"),
    "primary unknown": (GOOD.replace('primary = "b8"', 'primary = "b16"'), "primary"),
    "primary not runnable": (GOOD.replace('primary = "b8"', 'primary = "by-bytes"'), "primary"),
    "no primary_why": (GOOD.replace('primary_why = "the size the campaign used"\n', ""), "primary_why"),
    "set disagrees": (GOOD.replace('primary_why = "the size the campaign used"\n',
                                   'primary_why = "x"\n[set]\n"design.doorbell_batch" = 4\n'), "set"),
    "bad name": (GOOD.replace("[variants.b2]", "[variants.B_2]").replace("[variants.b2.set]", "[variants.B_2.set]"),
                 "variants.B_2"),
}


@pytest.mark.parametrize("label", sorted(BAD))
def test_a_bad_variant_is_one_line_naming_file_and_field(tmp_path, capsys, label):
    text, field = BAD[label]
    p = _write(tmp_path, text)
    with pytest.raises(scn_mod.ScenarioError) as e:
        levers_mod.load_lever(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: {field}") and "\n" not in msg, (label, msg)
    rc = lever_main(["predict", str(p), "--seeds", "1", "--workers", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and str(p) in err and err.count("\n") == 0, (label, err)


def test_a_variant_that_is_not_runnable_can_not_be_applied(tmp_path):
    p = _write(tmp_path, GOOD)
    with pytest.raises(scn_mod.ScenarioError, match="variants.by-bytes: not runnable yet"):
        levers_mod.load_with_levers(BASE, [str(p)], TINY, variants={str(p): "by-bytes"})


@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    p = _write(tmp_path_factory.mktemp("lev"), GOOD)
    return pr.predict(str(p), seeds=2, sets=TINY, with_cp=False, workers=1), p


def test_predict_reports_every_variant_and_its_primary(predicted, tmp_path):
    res, _ = predicted
    assert res["primary"] == "b8" and res["primary_why"] == "the size the campaign used"
    v = res["variants"]
    assert set(v) == {"b8", "b2", "by-bytes"}
    assert not v["by-bytes"]["runnable"] and v["by-bytes"]["needs"] == "a doorbell batch measured in bytes"
    for op, row in res["ops"].items():  # the primary is the lever itself
        assert v["b8"]["ops"][op]["delta_us"] == row["delta_us"] and v["b8"]["ops"][op]["band_us"] == row["band_us"]
    # a variant predicts what a plain lever file with its set predicts, on the same seeds
    plain = _write(tmp_path, f'name = "b2"\nbaseline = "{BASE}"\ndescription = "x"\n[set]\n'
                             '"design.doorbell_batch" = 2\n"design.fences_per_doorbell" = 0\n', "b2")
    ref = pr.predict(str(plain), seeds=2, sets=TINY, with_cp=False, workers=1)
    for op in res["ops"]:
        assert v["b2"]["ops"][op]["delta_us"] == ref["ops"][op]["delta_us"]
        assert v["b2"]["ops"][op]["band_us"] == ref["ops"][op]["band_us"]
    assert any(v["b2"]["ops"][op]["delta_us"] != res["ops"][op]["delta_us"] for op in res["ops"])


def test_preregistration_seals_every_variant(predicted):
    res, _ = predicted
    obj = pr.preregistration(res)
    assert obj["primary"] == "b8" and set(obj["variants"]) == {"b8", "b2", "by-bytes"}
    assert obj["variants"]["b2"]["predictions"]["dispatch"]["band_us"] == res["variants"]["b2"]["ops"]["dispatch"]["band_us"]
    assert obj["variants"]["by-bytes"] == {"runnable": False, "source": "hand-made for the test",
                                           "needs": "a doorbell batch measured in bytes"}
    cmp.check_prereg(obj, None)
    bad = copy.deepcopy(obj)
    bad["variants"]["b2"]["predictions"]["dispatch"]["band_us"][0] -= 100.0
    with pytest.raises(UserError, match="sha256 mismatch"):
        cmp.check_prereg(bad, None)


def _lat(rid: str, samples: list[float], levers: list[str]):
    return parse_record({
        "schema_version": 1, "id": rid, "nic": "efa", "what": {"design": "hand-made", "levers": levers},
        "latency_us": {"dispatch": {"median": sorted(samples)[len(samples) // 2], "samples": samples,
                                    "n": len(samples)}},
        "gate": {"passed": True}, "provenance": {"source": "hand-made"}})


def test_compare_names_the_variant_the_measurement_supports():
    pred = {"lever": "tiny-batching", "baseline": BASE, "sets": {}, "lever_only_sets": {}, "lever_sets": {},
            "platform": "p", "platform_digest": "d", "seeds": 3, "param_samples": 0,
            "band_kind": "noise-only", "band_level": 0.9,
            "ops": {"dispatch": {"baseline_p50_us": 100.0, "lever_p50_us": 99.0, "delta_us": -1.0,
                                 "band_us": [-3.0, 1.0]}},
            "primary": "b8", "primary_why": "w",
            "variants": {
                "b8": {"runnable": True, "source": "s", "ops": {"dispatch": {
                    "lever_p50_us": 99.0, "delta_us": -1.0, "band_us": [-3.0, 1.0]}}},
                "b2": {"runnable": True, "source": "s", "ops": {"dispatch": {
                    "lever_p50_us": 90.0, "delta_us": -10.0, "band_us": [-13.0, -7.0]}}},
                "by-bytes": {"runnable": False, "source": "s", "needs": "n"}}}
    prereg = pr.preregistration(pred)
    base = [100.0 + 0.1 * (i % 7) for i in range(40)]
    recs = [_lat("b", base, []), _lat("l", [x - 10.0 for x in base], ["tiny-batching"])]
    out = cmp.compare(prereg, recs)
    assert out["ops"]["dispatch"]["verdict"] == "refuted"  # the primary's
    assert out["variants"]["b2"]["verdict"] == "validated" and out["variants"]["b8"]["verdict"] == "refuted"
    assert out["variants"]["by-bytes"]["verdict"] == "not-runnable"
    assert out["supported"] == ["b2"] and out["primary"] == "b8"


def test_a_variant_the_baselines_platform_can_not_run_is_reported_not_fatal():
    """write-imm-counting's hw-completion-counter variant needs a NIC with completion counters;
    the emulated testbed's platform has none. Predicting the lever there still predicts the
    primary, and the variant is sealed as not runnable with the platform's reason."""
    res = pr.predict("write-imm-counting", seeds=1, baseline="emu-ep2-native",
                     sets={"workload.tokens_per_rank": 16}, with_cp=False)
    v = res["variants"]["hw-completion-counter"]
    assert v["runnable"] is False and "completion counters" in v["needs"]
    assert res["variants"][res["primary"]]["ops"]["dispatch"]["delta_us"] == res["ops"]["dispatch"]["delta_us"]
    sealed = pr.preregistration(res)["variants"]["hw-completion-counter"]
    assert sealed["runnable"] is False and "completion counters" in sealed["needs"]
