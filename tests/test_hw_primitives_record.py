"""The primitives harness on CPU: raw timings -> record, the no-GPU failure, the
committed H200 records.

Why: the conversion from samples to a record is what calibration reads, so it is
tested on hand-made timings with known percentiles; the CLI's promise without a GPU
is one clear line and a non-zero exit; the committed records must validate, carry
provenance, cover every family, and agree with campaign table within 2x.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from lever.calibration.records import DATA_DIR, RecordError, dump_record, load_record
from lever.hw.primitives import (
    CAMPAIGN_PRIMITIVES,
    FAMILIES_1GPU,
    Check,
    build_record,
    design_comparison,
    summarize,
)

ROOT = Path(__file__).resolve().parents[1]
PLATFORM = {
    "gpu": "1x NVIDIA H200",
    "nic": "none",
    "driver": "580.159.04",
    "cuda": "13.0",
    "torch": "2.11.0",
}
PROV = {
    "source": "test",
    "date": "2026-11-30T00:00:00+00:00",
    "git_rev": "abc123",
    "command": "test",
}


def _record(samples, checks=None, **kw):
    checks = (
        [Check("latency", True, "chase ended on the host-computed line")]
        if checks is None
        else checks
    )
    return build_record(
        samples, checks, gpus=kw.pop("gpus", 1), reps=5, platform=PLATFORM, provenance=PROV, **kw
    )


def test_summarize_known_percentiles():
    d = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (d.median, d.n, d.mean) == (3.0, 5, 3.0)
    assert d.p10 == pytest.approx(1.4) and d.p90 == pytest.approx(4.6)
    assert d.std == pytest.approx(math.sqrt(2.5))
    assert d.samples == [5.0, 1.0, 3.0, 2.0, 4.0]


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [1.0, float("inf")], [2.0, -1.0]])
def test_summarize_refuses_broken_samples(bad):
    with pytest.raises(ValueError):
        summarize(bad)


def test_raw_timings_become_a_valid_record(tmp_path):
    rec = _record(
        {"pcie_read_rtt_ns": [1100.0, 1150.0, 1200.0], "nvlink_copy_gbytes_per_s": [390.0, 392.0]}
    )
    assert rec.nic == "none" and rec.what.design == "primitives"
    assert rec.gate.passed is True and rec.gate.checks[0].startswith("PASS latency")
    assert rec.metrics["pcie_read_rtt_ns"].median == 1150.0
    assert rec.metrics["nvlink_copy_gbytes_per_s"].n == 2
    assert rec.provenance.git_rev == "abc123" and rec.what.platform.gpu == "1x NVIDIA H200"
    assert rec.how.warmup is not None and rec.how.repetitions == 5
    out = tmp_path / "r.json"
    dump_record(rec, out)
    back = load_record(out)
    assert back.digest() == rec.digest()


def test_a_failed_verification_fails_the_gate():
    rec = _record(
        {"pcie_read_rtt_ns": [1.0, 2.0]},
        checks=[
            Check("latency", True, "ok"),
            Check("cq_poll", False, "stale value seen at site 0"),
        ],
    )
    assert rec.gate.passed is False
    assert "cq_poll: stale value seen" in rec.gate.detail
    assert any(c.startswith("FAIL cq_poll") for c in rec.gate.checks)


def test_no_checks_is_not_a_pass():
    assert _record({"pcie_read_rtt_ns": [1.0]}, checks=[]).gate.passed is False


def test_bad_input_is_refused():
    with pytest.raises(RecordError, match="unit suffix"):
        _record({"pcie_read_rtt": [1.0]})
    with pytest.raises(ValueError, match="no metric"):
        _record({})
    with pytest.raises(ValueError, match="gpus"):
        _record({"pcie_read_rtt_ns": [1.0]}, gpus=3)


def test_design_comparison_ratio():
    rec = _record(
        {
            "pcie_read_rtt_ns": [2500.0],
            "device_load_ns": [150.0],
            "nvlink_copy_gbytes_per_s": [195.0],
        }
    )
    rows = {r[0]: r[-1] for r in design_comparison(rec)}
    assert rows["pcie_read_rtt_ns"] == pytest.approx(2.0)
    assert rows["device_load_ns"] == 1.0
    assert rows["nvlink_copy_gbytes_per_s"] == pytest.approx(0.5)


def _no_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return True
    return not torch.cuda.is_available()


@pytest.mark.skipif(not _no_cuda(), reason="a CUDA device is present")
@pytest.mark.parametrize(
    "entry",
    [
        # what the `lever` console script runs (python -m lever.cli would load lever.cli twice:
        # as __main__ and as lever.cli, with two different UserError classes)
        ["-c", "import sys; from lever.cli import main; sys.exit(main())", "hw", "primitives"],
        ["-m", "lever.hw.primitives"],
    ],
)
def test_without_gpu_one_line_and_nonzero_exit(tmp_path, entry):
    out = tmp_path / "x.json"
    r = subprocess.run(
        [sys.executable, *entry, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], r.stderr
    assert not out.exists()


# ------------------------------------------------------------------ committed records

RECORDS = {1: DATA_DIR / "h200-primitives-1gpu.json", 2: DATA_DIR / "h200-primitives-2gpu.json"}


@pytest.mark.parametrize("gpus", [1, 2])
def test_committed_records_are_real_and_complete(gpus):
    rec = load_record(RECORDS[gpus])
    assert rec.what.design == "primitives" and rec.nic == "none" and rec.gate.passed is True
    p = rec.what.platform
    assert "H200" in p.gpu and p.driver and p.cuda and p.torch
    assert rec.provenance.date and len(rec.provenance.git_rev) >= 7
    # host_read, fence_reads, warp_copy and turn_handoff came after these records: each has
    # its own record
    later = ("host_read", "fence_reads", "warp_copy", "turn_handoff")
    fams = tuple(f for f in FAMILIES_1GPU if f not in later) if gpus == 1 else ("nvlink",)
    for fam in fams:
        assert any(c.startswith(f"PASS {fam}:") for c in rec.gate.checks), fam
    for d in rec.metrics.values():
        assert d.n and d.n >= 5 and d.samples and len(d.samples) == d.n


def test_committed_records_agree_with_design_within_2x():
    rows = [r for g in (1, 2) for r in design_comparison(load_record(RECORDS[g]))]
    assert {r[0] for r in rows} == set(CAMPAIGN_PRIMITIVES)
    off = [(name, m, lo, hi) for name, _w, m, lo, hi, ratio in rows if not 0.5 <= ratio <= 2.0]
    assert not off, off


def test_the_fence_record_says_fences_wait_for_every_sms_host_reads():
    """h200-primitives-fence-reads (hw/primitives/fence_reads.cu, hw/run_fence_on_device.sh):
    the facts sim/issuer.py HostReadPath stands on. A system fence alone is ~0.5 us; one warp
    on ANOTHER SM spinning on a host line makes it cost about a read more (the GPU's fences
    wait for the whole GPU's host reads, not their SM's), as on the same SM; warps reading the
    same lines queue, and a fence waits for the queue (it grows with the readers); W warps
    fencing at once do not slow each other beyond ~1.5x."""
    rec = load_record(DATA_DIR / "testbed" / "h200-primitives-fence-reads.json")
    assert rec.gate.passed and any(c.startswith("PASS fence_reads:") for c in rec.gate.checks)
    m = {k: v.median for k, v in rec.metrics.items()}
    alone, rtt = m["fence_reads_shared_othersm_w0_ns"], m["fence_reads_step_shared_w1_ns"]
    other, same = m["fence_reads_shared_othersm_w1_ns"], m["fence_reads_shared_samesm_w1_ns"]
    assert alone < 0.6 * rtt
    assert other > alone + 0.3 * rtt and abs(other - same) < 0.15 * other
    ws = [m[f"fence_reads_shared_othersm_w{w}_ns"] for w in (1, 4, 8, 16)]
    assert ws == sorted(ws) and ws[-1] > 3 * ws[0]
    assert m["fence_reads_step_shared_w16_ns"] > 2 * rtt  # the readers themselves queue
    assert m["fence_concurrent_host_w96_ns"] < 1.5 * m["fence_concurrent_host_w1_ns"]
    assert m["fence_concurrent_device_w128_ns"] < 1.5 * m["fence_concurrent_device_w1_ns"]


def test_the_turn_record_says_a_released_turn_waits_for_the_host_reads_in_flight():
    """h100-primitives-turn-handoff (hw/primitives/turn_handoff.cu, hw/run_turn_on_device.sh,
    an H100 at 6d9061d): passing a shared QP's doorbell turn as hw/ep does (doorbell store to
    host memory, st.release.sys of the turn word, the next warp's ld.acquire.sys spin). What
    sim/issuer.py _release_tail stands on: alone a hand-off is the holder's release (0.75 us)
    plus ~0.2 us for the next warp to see it, whatever the warps; beside warps reading host
    memory the release grows with them, as a system fence does (HostReadPath.fence_ns), and
    the hand-off with it; at GPU scope it is cheaper."""
    rec = load_record(DATA_DIR / "testbed" / "h100-6d9061d" / "h100-primitives-turn-handoff.json")
    assert rec.gate.passed and any(c.startswith("PASS turn_handoff:") for c in rec.gate.checks)
    assert len(rec.provenance.git_rev) == 40 and not rec.provenance.dirty
    assert "H100" in rec.what.platform.gpu
    m = {k: v.median for k, v in rec.metrics.items()}
    for body in ("bare", "post"):
        for w in (2, 4, 12):
            hand, rel = m[f"turn_handoff_sys_{body}_w{w}_r0_ns"], m[f"turn_release_sys_{body}_w{w}_r0_ns"]
            assert 0 < hand - rel < 400 and 600 < rel < 1000
            assert m[f"turn_handoff_gpu_{body}_w{w}_r0_ns"] < hand
        rels = [m[f"turn_release_sys_{body}_w12_r{r}_ns"] for r in (0, 8, 32, 96)]
        hands = [m[f"turn_handoff_sys_{body}_w12_r{r}_ns"] for r in (0, 8, 32, 96)]
        assert rels == sorted(rels) and rels[-1] > 20 * rels[0]
        assert all(0.7 * h < r < h for r, h in zip(rels, hands, strict=True))  # the release is most of it
