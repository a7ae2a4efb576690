"""hw/install_records.py: one device call's records replace the shipped ones, which stay
readable, marked superseded, beside where they were (no two generations side by side)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from lever.hw.install_records import install


def _rec(rid: str, rev: str) -> dict:
    return {"id": rid, "latency_us": {"dispatch": {"median": 1.0}}, "provenance": {"git_rev": rev},
            "how": {"notes": "n"}}


def _tgz(path: Path, top: str, files: dict[str, dict]) -> None:
    d = path.parent / top
    d.mkdir(parents=True)  # the call's folder holds the tarball beside what it was made from
    for name, doc in files.items():
        (d / name).write_text(json.dumps(doc))
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as t:
        t.add(d, arcname=top)


def test_a_call_replaces_every_shipped_testbed_record_and_keeps_the_old_ones(tmp_path):
    old, new = "1" * 40, "2" * 40
    data = tmp_path / "data"
    (data / "testbed").mkdir(parents=True)
    (data / "v2").mkdir()
    for name in ("emu-bed-ep2-native-baseline.json", "emu-bed-ep2-native-put-many.json",
                 "emu-bed-diag-sms62-native-baseline.json"):
        (data / name).write_text(json.dumps(_rec(name[:-5], old)))
    (data / "testbed" / "emu-bed-ep-chain2-native-baseline.json").write_text(json.dumps(_rec("c", old)))
    (data / "v2" / "emu-v2-hybrid-n2x2-native-baseline.json").write_text(json.dumps(_rec("v", old)))
    src = tmp_path / "call"
    _tgz(src / "bed" / "records.tgz", "bed_rec", {
        "emu-bed-ep2-native-baseline.json": _rec("b", new),
        "emu-bed-ep-chain2-native-baseline.json": _rec("c", new),
        "emu-bed-ep2-native-rxdev-write-imm-counting.json": _rec("r", new),
        "emu-bed-ep-repeat-a2-native-baseline.json": _rec("ra", new),
        "retries-exhausted-proxy-outcome.json": {"kind": "lever-hw-ep-outcome"}})
    _tgz(src / "v2" / "records.tgz", "v2_rec", {
        "emu-v2-hybrid-n2x2-native-baseline.json": _rec("v", new),
        "emu-v2-hybrid-n2x2-native-rxdev-write-imm-counting.json": _rec("vr", new),
        "smoke-v2-hybrid-n2x2-native-baseline-faults.json": _rec("s", new)})
    d = tmp_path / "diag-sms62-native-baseline.json"
    d.write_text(json.dumps(_rec("diag-sms62-native-baseline", new)))
    (src / "diag").mkdir()
    with tarfile.open(src / "diag" / "diag.tgz", "w:gz") as t:  # the diag script tars its folder's content
        t.add(d, arcname="./" + d.name)
    (src / "bed" / "log.txt").write_text("log")
    res = install(src, new, data)
    rev = lambda p: json.loads(p.read_text())["provenance"]["git_rev"]  # noqa: E731
    # shipped V1: the new one in place, the old ones (also one this call did not make) kept aside
    assert rev(data / "emu-bed-ep2-native-baseline.json") == new
    assert not (data / "emu-bed-ep2-native-put-many.json").exists()
    kept = data / "before-hwfix-1111111" / "emu-bed-ep2-native-put-many.json"
    assert "re-measured at " + new in json.loads(kept.read_text())["superseded_by"]
    # diagnostics, outcomes and receive-CQ comparisons beside the testbed's; V2 in its folder
    assert rev(data / "testbed" / "emu-bed-ep-chain2-native-baseline.json") == new
    assert (data / "testbed" / "before-hwfix-1111111" / "emu-bed-ep-chain2-native-baseline.json").exists()
    assert (data / "testbed" / "emu-bed-ep2-native-rxdev-write-imm-counting.json").exists()
    assert (data / "testbed" / "retries-exhausted-proxy-outcome.json").exists()
    # a repeated baseline is a noise measurement, not a second training baseline
    assert (data / "testbed" / "emu-bed-ep-repeat-a2-native-baseline.json").exists()
    assert not (data / "emu-bed-ep-repeat-a2-native-baseline.json").exists()
    assert rev(data / "v2" / "emu-v2-hybrid-n2x2-native-baseline.json") == new
    assert (data / "v2" / "rxdev" / "emu-v2-hybrid-n2x2-native-rxdev-write-imm-counting.json").exists()
    assert not list(data.rglob("smoke-*"))
    # a credit-diag baseline shipped as a calibration record is replaced where it was too
    shipped = json.loads((data / "emu-bed-diag-sms62-native-baseline.json").read_text())
    assert shipped["provenance"]["git_rev"] == new and shipped["id"] == "emu-bed-diag-sms62-native-baseline"
    assert (data / "before-hwfix-1111111" / "emu-bed-diag-sms62-native-baseline.json").exists()
    assert rev(data / "testbed" / "credit-diag" / "diag-sms62-native-baseline.json") == new
    assert (data / "testbed" / f"device-log-{new[:7]}.txt").read_text() == "log"
    assert "before-hwfix-1111111/emu-bed-ep2-native-baseline.json" in res["superseded"]
