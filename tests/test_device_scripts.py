"""The device scripts (``hw/run_*_on_device.sh``) run only on the GPU machine, where a typo costs
device time: here they must parse as bash, and the ranks-per-GPU probe's ``step`` lines must be
arguments ``lever hw ep`` accepts."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "hw").glob("*_on_device.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_device_script_parses_as_bash(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _ep_parser() -> argparse.ArgumentParser:
    from lever.hw.ep import add_args

    p = argparse.ArgumentParser(prog="lever hw ep", exit_on_error=False)
    add_args(p)
    return p


def test_rpg_probe_steps_are_lever_hw_ep_arguments():
    """Every ``step NAME TIMEOUT ARGS`` of hw/run_rpg_on_device.sh, its ``$V2`` expanded, parses
    with ``lever hw ep``'s own argument parser, and the probe covers 1, 2 and 4 ranks a GPU."""
    text = (ROOT / "hw" / "run_rpg_on_device.sh").read_text()
    v2 = next(line for line in text.splitlines() if line.startswith("V2="))
    v2_args = shlex.split(v2.split("=", 1)[1].strip('"').replace("$REC", "/tmp/rec").replace("$ITERS", "60"))
    p = _ep_parser()
    packings = set()
    steps = [line.strip() for line in text.splitlines() if line.strip().startswith("step ")]
    assert len(steps) >= 6
    for line in steps:
        words = shlex.split(line.replace('"$REC"', "/tmp/rec").replace('"$ITERS"', "60"))
        args = [a for w in words[3:] for a in (v2_args if w == "$V2" else [w])]
        ns = p.parse_args(args)
        packings.add(ns.ranks // max(ns.gpus, 1))
    assert packings == {1, 2, 4}


def test_chain_script_steps_are_lever_hw_ep_arguments_and_run_one_warp():
    """hw/run_chain_on_device.sh: its smoke and chain steps (continuation lines joined) parse
    with ``lever hw ep``'s parser; the chain runs one SM of one warp, and its primitives are
    the families whose metrics its comparison reads."""
    text = (ROOT / "hw" / "run_chain_on_device.sh").read_text().replace("\\\n", " ")
    p = _ep_parser()
    steps = [line.strip() for line in text.splitlines() if line.strip().startswith("step ")]
    assert len(steps) == 2
    chains = 0
    for line in steps:
        words = shlex.split(line.replace('"$REC/smoke"', "/tmp/rec").replace('"$REC"', "/tmp/rec")
                            .replace("$gap", "0").replace("$R", ""))
        ns = p.parse_args(words[3:])
        if "chain" in words[1]:
            chains += 1
            assert ns.num_sms == 1 and "design.warps_per_sm=1" in ns.set
    assert chains == 1
    only = text.split("--only ", 1)[1].split()[0].split(",")
    assert {"latency", "wqe_doorbell", "turn_handoff"} <= set(only)


def _script_steps(tmp_path: Path, env: dict[str, str], script: str = "run_staged_on_device.sh") -> list[list[str]]:
    """A device script run here with the device library stubbed: the ``lever hw ep`` arguments
    of every step it would run, in order."""
    hw = tmp_path / "hw"
    hw.mkdir(parents=True)
    (hw / script).write_text((ROOT / "hw" / script).read_text())
    log = tmp_path / "steps.txt"
    (hw / "device_lib.sh").write_text(
        "SMOKE_FAILED=0\n"
        "device_env() { :; }\nuse_carried_wheels() { :; }\nlog_header() { :; }\nbuild_exts() { :; }\n"
        "device_start() { REC=$OUT/rec; mkdir -p \"$REC\"; LOG=$OUT/log.txt; }\n"
        "metric_table() { :; }\ncontrol_tally() { :; }\n"
        f"step() {{ shift 2; printf '%s\\0' \"$@\" >> {shlex.quote(str(log))}; printf '\\n' >> {shlex.quote(str(log))}; }}\n")
    r = subprocess.run(["bash", str(hw / script)], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), **env}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return [[a for a in line.split("\0") if a] for line in log.read_text().splitlines()]


def _emu_runs(p: argparse.ArgumentParser, steps: list[list[str]]) -> list[tuple[str, dict]]:
    """Each step parsed with ``lever hw ep``'s parser and its ``--emu-set``s with the emulator's
    own loader (a bad key or value fails here): (its id prefix, the emulator values it runs)."""
    from lever.hw import emulated_nic

    out = []
    for args in steps:
        ns = p.parse_args(args)
        emu = emulated_nic.load(overrides=emulated_nic.parse_emu_sets(ns.emu_set or []))
        out.append((ns.id_prefix, emu.values))
    return out


def test_staged_script_steps_parse_and_name_the_runs_as_the_records_do(tmp_path):
    """hw/run_staged_on_device.sh: every step parses with ``lever hw ep``'s parser and its
    ``--emu-set``s with the emulator's; run as the first call ran it, its ids are those of the
    committed records of b049be2; with a shared fetch and repeats, each run gets its own id."""
    from lever.hw import emulated_nic

    p = _ep_parser()
    for env in ({}, {"COMBOS": "", "SCAN": "", "LEAD3000": "", "COPIES": "staged", "BATCHES": "2",
                     "FETCHERS": "shared dedicated", "REPEATS": "5"}):
        steps = _script_steps(tmp_path / str(len(env)), env)
        ids = []
        for args in steps:
            ns = p.parse_args(args)
            emulated_nic.load(overrides=emulated_nic.parse_emu_sets(ns.emu_set or []))
            ids.append(ns.id_prefix)
        if not env:
            folder = ROOT / "calibration" / "data" / "testbed" / "h100-b049be2"
            for i in ids[1:-1]:  # the copy runs (the smoke run and the combinations apart)
                assert list(folder.glob(f"{i}2-native-baseline.json")), i
            assert len(ids) == 9 and ids[-1] == "emu-host-"
        else:
            assert len(ids) == 1 + 10 and len(set(ids)) == 11
            assert "emu-copy-staged-mask8000-b2-shared-r5-" in ids and "emu-copy-staged-mask8000-b2-dedicated-r1-" in ids


def test_timer_script_runs_each_setting_with_the_part_timers_on_and_off(tmp_path):
    """hw/run_timer_on_device.sh: every step parses with ``lever hw ep``'s parser and the
    emulator's; the same setting runs with the part timers on and off alternately, each run its
    own id, and nothing else differs between an on run and its off run; last, the combinations
    sealed at 8ec370b with their baselines."""

    p = _ep_parser()
    steps = _script_steps(tmp_path, {"REPEATS": "2"}, "run_timer_on_device.sh")
    combos = p.parse_args(steps.pop())  # the sealed combinations, last: each with its baseline
    assert combos.id_prefix == "emu-host-" and combos.variants.split(";") == [
        "", "lazy-completion-dispatch", "lazy-completion-dispatch,lazy-completion-combine", "put-many",
        "put-many,qp-fanout-fix"]
    runs = _emu_runs(p, steps)
    assert len(runs) == 2 * 2 + 2 and len({i for i, _ in runs}) == len(runs)
    for (_, on), (_, off) in zip(runs[::2], runs[1::2], strict=True):
        assert on["nic_part_timers"] == "on" and off["nic_part_timers"] == "off"
        assert {k: v for k, v in on.items() if k != "nic_part_timers"} == {
            k: v for k, v in off.items() if k != "nic_part_timers"}
    assert runs[0][1]["nic_fetcher"] == "shared" and runs[-1][1]["nic_fetcher"] == "dedicated"


def test_spread_script_runs_each_fence_on_four_and_on_eight_nic_blocks(tmp_path):
    """hw/run_spread_on_device.sh with WHAT=fences (what 587fd95 ran): every step parses with ``lever hw ep``'s parser and the
    emulator's; a faulted smoke run with the release fence first; then the closest setting with
    the fence as fence.sc and as a release fence alternately (nothing else differs between the
    two of a pair), each run its own id; then eight NIC blocks a rank at half the line rate (the
    same bandwidth a rank) at each lead, each fence."""

    p = _ep_parser()
    steps = _script_steps(tmp_path, {"REPEATS": "2", "LEADS8": "4000 6000", "WHAT": "fences", "COMBOS": ""}, "run_spread_on_device.sh")
    smoke = p.parse_args(steps.pop(0))
    assert smoke.faults and "nic_fence=release" in smoke.emu_set
    runs = _emu_runs(p, steps)
    assert len(runs) == 2 * 2 + 2 + 2 * 2 and len({i for i, _ in runs}) == len(runs)
    for (_, sc), (_, rel) in zip(runs[::2], runs[1::2], strict=True):
        assert sc["nic_fence"] == "sc" and rel["nic_fence"] == "release"
        assert {k: v for k, v in sc.items() if k != "nic_fence"} == {k: v for k, v in rel.items() if k != "nic_fence"}
    four, eight = runs[:6], runs[6:]
    assert all(v["nics_per_rank"] == 4 and v["line_rate_gbps"] == 100.0 for _, v in four)
    assert all(v["nics_per_rank"] == 8 and v["line_rate_gbps"] == 50.0 for _, v in eight)
    assert [v["deliver_lead_ns"] for _, v in eight] == [4000.0, 4000.0, 6000.0, 6000.0]
    assert {v["nic_copy"] for _, v in runs} == {"staged"} and {v["nic_claim"] for _, v in runs} == {"mask"}


def _two_smokes(p: argparse.ArgumentParser, steps: list[list[str]], *emu: str) -> None:
    """The spread script's ``smokes``: its first two steps are faulted runs, V1 then V2 hybrid,
    each with every ``KEY=VALUE`` in ``emu`` (taken off ``steps``)."""
    smokes = [p.parse_args(steps.pop(0)) for _ in range(2)]
    assert [s.protocol for s in smokes] == ["v1-ll", "v2-hybrid"] and all(s.faults for s in smokes)
    assert all(kv in s.emu_set for s in smokes for kv in emu)


def _alternated(runs: list[tuple[str, dict]], pairs: int, keys: tuple[str, ...], first: tuple, second: tuple) -> None:
    """The first ``pairs`` pairs of ``runs`` alternate ``keys`` between ``first`` and ``second``
    values and differ in nothing else."""
    for (_, a), (_, b) in zip(runs[:2 * pairs:2], runs[1:2 * pairs:2], strict=True):
        assert tuple(a[k] for k in keys) == first and tuple(b[k] for k in keys) == second
        assert {k: v for k, v in a.items() if k not in keys} == {k: v for k, v in b.items() if k not in keys}


def test_spread_script_runs_one_and_two_blocks_a_nic_alternately(tmp_path):
    """hw/run_spread_on_device.sh with WHAT=blocks (what e630a54 and 7bb366f ran): faulted smoke runs with two blocks a NIC on V1
    native, V1 proxy and V2 hybrid first; then the closest setting with one and two blocks a NIC
    alternately (nothing else differs between the two of a pair), each run its own id; then two
    blocks with the other fetcher, register copies and a shorter lead. Four NICs a rank at
    100 Gb/s throughout: the blocks change who delivers, not the wire."""

    p = _ep_parser()
    steps = _script_steps(tmp_path, {"REPEATS": "2", "WHAT": "blocks", "COMBOS": ""}, "run_spread_on_device.sh")
    smokes = [p.parse_args(steps.pop(0)) for _ in range(3)]
    assert [s.protocol for s in smokes] == ["v1-ll", "v1-ll", "v2-hybrid"]
    assert smokes[0].faults and smokes[1].path == "proxy" and smokes[2].faults
    assert all("blocks_per_nic_count=2" in s.emu_set for s in smokes)
    runs = _emu_runs(p, steps)
    assert len(runs) == 2 * 2 + 4 and len({i for i, _ in runs}) == len(runs)
    _alternated(runs, 2, ("blocks_per_nic_count",), (1,), (2,))
    assert all(v["blocks_per_nic_count"] == 2 for _, v in runs[4:])
    assert {(v["nic_fetcher"], v["nic_copy"], v["deliver_lead_ns"]) for _, v in runs[4:]} == {
        ("dedicated", "staged", 8000.0), ("shared", "one", 8000.0), ("dedicated", "one", 8000.0),
        ("shared", "staged", 6000.0)}
    assert all(v["nics_per_rank"] == 4 and v["line_rate_gbps"] == 100.0 for _, v in runs)


def test_spread_script_runs_one_block_a_nic_and_two_splitting_its_wqes_alternately(tmp_path):
    """hw/run_spread_on_device.sh with WHAT=wqes (and WHAT=lanes, each block its own lane of the wire): faulted smoke runs with two blocks a NIC
    splitting its WQEs (V1 native, V1 proxy, V2 hybrid) first; then the closest setting with one
    block a NIC and two splitting its WQEs alternately (nothing else differs within a pair), each
    run its own id; then two blocks with the dedicated fetcher and 6 us ahead, four blocks, and the
    file's own setting with one and two. p5's four 100 Gb/s NICs throughout."""

    p = _ep_parser()
    for what in ("wqes", "lanes"):
        steps = _script_steps(tmp_path / what, {"REPEATS": "2", "WHAT": what, "COMBOS": ""}, "run_spread_on_device.sh")
        smokes = [p.parse_args(steps.pop(0)) for _ in range(3)]
        assert [s.protocol for s in smokes] == ["v1-ll", "v1-ll", "v2-hybrid"]
        assert smokes[0].faults and smokes[1].path == "proxy" and smokes[2].faults
        assert all({"blocks_per_nic_count=2", f"nic_share={what}"} <= set(s.emu_set) for s in smokes)
        runs = _emu_runs(p, steps)
        assert len(runs) == 2 * 2 + 5 and len({i for i, _ in runs}) == len(runs)
        assert all(i.startswith(f"emu-{what}-blocks") for i, _ in runs)
        _alternated(runs, 2, ("blocks_per_nic_count",), (1,), (2,))
        assert all(v["nic_share"] == what for _, v in runs)
        assert [(v["blocks_per_nic_count"], v["nic_fetcher"], v["deliver_lead_ns"], v["nic_claim"]) for _, v in runs[4:]] == [
            (2, "dedicated", 8000.0, "mask"), (2, "shared", 6000.0, "mask"), (4, "shared", 8000.0, "mask"),
            (1, "dedicated", 900.0, "scan"), (2, "dedicated", 900.0, "scan")]
        assert all(v["nics_per_rank"] == 4 and v["line_rate_gbps"] == 100.0 for _, v in runs)


def test_spread_script_runs_the_nic_kernel_shared_and_its_own_in_rounds(tmp_path):
    """hw/run_spread_on_device.sh with WHAT=kernel: faulted smoke runs with the NIC blocks in a
    kernel of their own at 16 warps (V1 native, V2 hybrid, V1 proxy) first; then rounds of the
    closest setting with the one kernel's 8 NIC warps, the own kernel's 8 and its 16, nothing else
    differing within a round, each run its own id; then the own kernel at 12 warps, and at 16 with
    the dedicated fetcher, 6 us ahead and register copies. Every emulator value checks (16 warps
    only in the own kernel)."""

    p = _ep_parser()
    steps = _script_steps(tmp_path, {"REPEATS": "2", "WHAT": "kernel", "COMBOS": ""}, "run_spread_on_device.sh")
    _two_smokes(p, steps, "nic_kernel=own", "nic_warps_count=16")
    proxy = p.parse_args(steps.pop(0))
    assert proxy.path == "proxy" and "nic_kernel=own" in proxy.emu_set and "nic_warps_count=16" in proxy.emu_set
    runs = _emu_runs(p, steps)
    assert len(runs) == 2 * 3 + 4 and len({i for i, _ in runs}) == len(runs)
    kw = [(v["nic_kernel"], v["nic_warps_count"]) for _, v in runs]
    assert kw[:6] == [("shared", 8), ("own", 8), ("own", 16)] * 2
    for r in (runs[0:3], runs[3:6]):
        rest = [{k: x for k, x in v.items() if k not in ("nic_kernel", "nic_warps_count")} for _, v in r]
        assert rest[0] == rest[1] == rest[2]
    assert kw[6:] == [("own", 12), ("own", 16), ("own", 16), ("own", 16)]
    assert [(v["nic_fetcher"], v["deliver_lead_ns"], v["nic_copy"]) for _, v in runs[6:]] == [
        ("shared", 8000.0, "staged"), ("dedicated", 8000.0, "staged"), ("shared", 6000.0, "staged"),
        ("shared", 8000.0, "one")]
    assert {v["deliver_batch_count"] for _, v in runs} == {2}
    # KBATCH=1: every run a packet a batch, its id saying so
    b1 = _emu_runs(p, _script_steps(tmp_path / "b1", {"REPEATS": "1", "WHAT": "kernel", "COMBOS": "", "KBATCH": "1"},
                                    "run_spread_on_device.sh")[3:])
    assert {v["deliver_batch_count"] for _, v in b1} == {1} and all("-b1-" in i for i, _ in b1)


def test_spread_script_runs_the_mask_and_earliest_due_first_alternately(tmp_path):
    """hw/run_spread_on_device.sh with WHAT=edf (what e46346f ran): faulted smoke runs claiming earliest
    due first on V1 and V2 hybrid; then the due mask in table order and earliest due first
    alternately (nothing else differs between the two of a pair), each run its own id; then
    earliest due first with the dedicated fetcher and at 6 and 10 us ahead."""

    p = _ep_parser()
    steps = _script_steps(tmp_path, {"REPEATS": "2", "WHAT": "edf", "COMBOS": ""}, "run_spread_on_device.sh")
    _two_smokes(p, steps, "nic_claim=edf")
    runs = _emu_runs(p, steps)
    assert len(runs) == 2 * 2 + 3 and len({i for i, _ in runs}) == len(runs)
    _alternated(runs, 2, ("nic_claim",), ("mask",), ("edf",))
    assert [(v["nic_fetcher"], v["deliver_lead_ns"]) for _, v in runs[4:]] == [
        ("dedicated", 8000.0), ("shared", 6000.0), ("shared", 10000.0)]
    assert all(v["nic_claim"] == "edf" for _, v in runs[4:])
    assert all(v["blocks_per_nic_count"] == 1 and v["nic_copy"] == "staged" for _, v in runs)


def test_spread_script_runs_staged_and_bulk_copies_alternately(tmp_path):
    """hw/run_spread_on_device.sh with WHAT=bulk (what 3d80107 and bce0d7b ran): faulted smoke
    runs with bulk copies on V1 and V2 hybrid; then staged and bulk copies alternately (nothing
    else differs between the two of a pair), each run its own id; then bulk copies with the
    dedicated fetcher and 6 us ahead; one block a NIC, the due mask, batches of two throughout."""

    p = _ep_parser()
    steps = _script_steps(tmp_path, {"REPEATS": "2", "WHAT": "bulk", "COMBOS": ""}, "run_spread_on_device.sh")
    _two_smokes(p, steps, "nic_copy=bulk")
    runs = _emu_runs(p, steps)
    assert len(runs) == 2 * 2 + 2 and len({i for i, _ in runs}) == len(runs)
    _alternated(runs, 2, ("nic_copy",), ("staged",), ("bulk",))
    assert [(v["nic_fetcher"], v["deliver_lead_ns"]) for _, v in runs[4:]] == [("dedicated", 8000.0), ("shared", 6000.0)]
    assert all(v["nic_claim"] == "mask" and v["deliver_batch_count"] == 2 and v["blocks_per_nic_count"] == 1
               for _, v in runs)


def test_spread_script_runs_volatile_and_wide_claim_loads_alternately(tmp_path):
    """hw/run_spread_on_device.sh with WHAT=loads and the combinations a72025c ran: faulted
    smoke runs with the wide claim loads on V1 and V2 hybrid; then volatile and wide loads
    alternately (nothing else differs between the two of a pair), each run its own id; then wide
    loads with the dedicated fetcher and 6 and 4 us ahead; the due mask, staged copies, batches of
    two, one block a NIC throughout; last, the sealed EP2 combinations, each with its baseline in
    the same step."""

    p = _ep_parser()
    combos = ";".join(v for pair in SEALED_5462B22.values() for v in pair)
    steps = _script_steps(tmp_path, {"REPEATS": "2", "WHAT": "loads", "COMBOS": combos}, "run_spread_on_device.sh")
    _two_smokes(p, steps, "nic_claim_loads=wide")
    last = p.parse_args(steps.pop())
    variants = last.variants.split(";")
    assert last.id_prefix == "emu-host-" and variants[0] == ""
    for name, (base, run) in SEALED_5462B22.items():
        assert base in variants and run in variants, name
    runs = _emu_runs(p, steps)
    assert len(runs) == 2 * 2 + 3 and len({i for i, _ in runs}) == len(runs)
    _alternated(runs, 2, ("nic_claim_loads",), ("volatile",), ("wide",))
    assert [(v["nic_fetcher"], v["deliver_lead_ns"]) for _, v in runs[4:]] == [
        ("dedicated", 8000.0), ("shared", 6000.0), ("shared", 4000.0)]
    assert all(v["nic_claim"] == "mask" and v["nic_copy"] == "staged" and v["deliver_batch_count"] == 2
               and v["blocks_per_nic_count"] == 1 for _, v in runs)


def test_spread_script_runs_the_volatile_mask_and_the_wide_earliest_due_first_alternately(tmp_path):
    """hw/run_spread_on_device.sh as it ships (WHAT=wide-edf, no combinations): faulted smoke
    runs with wide loads claiming earliest due first on V1 and V2 hybrid; then the due mask with
    volatile loads and edf with wide loads alternately, the pair differing in those two keys
    only; then wide edf with the dedicated fetcher and 6 and 4 us ahead; staged copies, batches of
    two, one block a NIC throughout."""

    p = _ep_parser()
    steps = _script_steps(tmp_path, {"REPEATS": "2"}, "run_spread_on_device.sh")
    _two_smokes(p, steps, "nic_claim_loads=wide", "nic_claim=edf")
    runs = _emu_runs(p, steps)
    assert len(runs) == 2 * 2 + 3 and len({i for i, _ in runs}) == len(runs)
    _alternated(runs, 2, ("nic_claim", "nic_claim_loads"), ("mask", "volatile"), ("edf", "wide"))
    assert [(v["nic_fetcher"], v["deliver_lead_ns"], v["nic_claim"]) for _, v in runs[4:]] == [
        ("dedicated", 8000.0, "edf"), ("shared", 6000.0, "edf"), ("shared", 4000.0, "edf")]
    assert all(v["nic_copy"] == "staged" and v["deliver_batch_count"] == 2 and v["blocks_per_nic_count"] == 1
               for _, v in runs)


def test_spread_script_runs_the_host_engine_pause_against_none_alternately(tmp_path):
    """hw/run_spread_on_device.sh with WHAT=gap: the host engine pausing 2 us after an empty
    pass against none, REPEATS pairs, each step the baseline and lazy completion's dispatch,
    every other emulator value the file's (the shipped setting), each run its own id."""
    p = _ep_parser()
    steps = _script_steps(tmp_path, {"REPEATS": "3", "WHAT": "gap", "COMBOS": ""}, "run_spread_on_device.sh")
    runs = _emu_runs(p, steps)
    assert [v["mirror_poll_gap_ns"] for _, v in runs] == [0.0, 2000.0] * 3 and len({i for i, _ in runs}) == 6
    shipped = dict(_emu_runs(p, [["--id-prefix", "x"]])[0][1])
    for _, v in runs:
        assert {k: x for k, x in v.items() if k != "mirror_poll_gap_ns"} == {
            k: x for k, x in shipped.items() if k != "mirror_poll_gap_ns"}
    assert all(p.parse_args(s).variants == ";lazy-completion-dispatch" for s in steps)


def test_spread_script_runs_the_negative_control_at_each_pause_and_length(tmp_path):
    """hw/run_spread_on_device.sh with WHAT=control: the unsafe-ordered negative control (faults
    on, flags ordered on the wire) REPEATS times at 5 and 20 iterations, polling back to back
    and pausing 2 us alternately, each run with its own record and outcome file."""
    p = _ep_parser()
    steps = _script_steps(tmp_path, {"REPEATS": "2", "WHAT": "control", "COMBOS": ""}, "run_spread_on_device.sh")
    runs = _emu_runs(p, steps)
    ns = [p.parse_args(s) for s in steps]
    assert [v["mirror_poll_gap_ns"] for _, v in runs] == [0.0, 2000.0] * 4
    assert [n.iters for n in ns] == [5, 5, 20, 20] * 2
    assert all(n.unsafe_ordered and n.faults for n in ns)
    assert len({n.outcome for n in ns}) == len({n.out for n in ns}) == 8


def test_the_control_tally_counts_the_runs_that_failed_as_they_must(tmp_path):
    """hw/device_lib.sh's ``control_tally``: per (pause, iterations), how many outcome files say
    the run failed (exit code not 0) of how many there are."""
    for name, code in (("control-gap0-i5-r1", 1), ("control-gap0-i5-r2", 1), ("control-gap2000-i5-r1", 0),
                       ("control-gap2000-i5-r2", 1), ("control-gap2000-i20-r1", 1)):
        (tmp_path / f"{name}-outcome.json").write_text(json.dumps({"exit_code": code}))
    (tmp_path / "control-gap0-i5-r1.json").write_text("{}")  # a record, not an outcome: not read
    body = f"set -u; . {shlex.quote(str(ROOT / 'hw' / 'device_lib.sh'))}; LOG={tmp_path}/log; control_tally {tmp_path}"
    r = subprocess.run(["bash", "-c", body], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert [line.split() for line in r.stdout.splitlines()[1:]] == [
        ["0", "5", "2", "2"], ["2000", "5", "1", "2"], ["2000", "20", "1", "1"]]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_a_device_script_starts_from_an_empty_records_folder(script):
    """A warm device machine keeps /tmp between calls: a script's records folder is emptied
    before its first step, or a record an earlier call left (a run that passed where this
    call's failed and wrote none) comes back in this call's tarball as if it were its own."""
    text = script.read_text()
    lines = [x for x in text.splitlines() if x.startswith("REC=/tmp/")]
    for line in lines:
        assert 'rm -rf "$REC"; mkdir -p "$REC"' in line, line
    if "device_start " in text:  # the library's start does it (held below)
        assert not lines
    lib = (ROOT / "hw" / "device_lib.sh").read_text()
    start = lib.split("device_start() {", 1)[1].split("\n}", 1)[0]
    assert 'REC=/tmp/$1_rec; rm -rf "$REC"; mkdir -p "$REC"' in start


SEALED_5462B22 = {  # the combinations a72025c measured: (baseline, run) as hw/ep names them
    "qp-fanout-fix-on-lazy-completion-both-emu-ep2": (
        "lazy-completion-dispatch,lazy-completion-combine", "lazy-completion-dispatch,lazy-completion-combine,qp-fanout-fix"),
    "batched-doorbells-on-lazy-completion-dispatch-qp-fanout-fix-emu-ep2": (
        "lazy-completion-dispatch,qp-fanout-fix", "lazy-completion-dispatch,qp-fanout-fix,batched-doorbells"),
}


def test_the_metric_table_reads_each_record_and_resolves_the_nic_parts(tmp_path):
    """hw/device_lib.sh's ``metric_table``: a line a record with its dispatch and combine and
    each key's median, an emulator part named short (``late`` is nic_late_per_packet_ns), a
    record metric named in full, nan for a key the record lacks; into $LOG too."""
    rec = {"latency_us": {"dispatch": {"median": 1234.5}, "combine": {"median": 678.9}},
           "metrics": {"nic_late_per_packet_ns": {"median": 812.0}, "dispatch_credit_read_ns": {"median": 4491.0}}}
    (tmp_path / "emu-x-2-native-baseline.json").write_text(json.dumps(rec))
    (tmp_path / "other.json").write_text("{}")  # not a run record: not read
    body = (f"set -u; . {shlex.quote(str(ROOT / 'hw' / 'device_lib.sh'))}; LOG={tmp_path}/log; "
            f"metric_table {tmp_path} late dispatch_credit_read_ns fence")
    r = subprocess.run(["bash", "-c", body], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    head, line = r.stdout.splitlines()
    assert head.split() == ["record", "disp", "comb", "late", "dispatch", "fence"]  # keys cut to 8 characters
    assert line.split() == ["emu-x-2-native-baseline", "1234.5", "678.9", "812", "4491", "nan"]
    assert (tmp_path / "log").read_text() == r.stdout


def test_a_step_passes_the_emu_sets_ahead_of_its_own(tmp_path):
    """hw/device_lib.sh's ``step``: ``$EMU_SETS`` reaches ``lever hw ep`` as ``--emu-set`` flags
    ahead of the step's own, so a step's own setting wins (a must-fail step keeps its loss) and
    every other step runs on the new setting; without it (under ``set -u``) nothing is added."""
    from lever.hw import emulated_nic

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    (fake / "python3").chmod(0o755)
    body = (f"set -u; . {shlex.quote(str(ROOT / 'hw' / 'device_lib.sh'))}; LOG={tmp_path}/log; OUT={tmp_path}/out; "
            f"REC={tmp_path}/rec; mkdir -p $OUT $REC; step s 10 --ranks 2 --emu-set deliver_lead_ns=3000")
    p = _ep_parser()
    for sets, want in (("nic_claim=mask deliver_lead_ns=8000", ("mask", 3000.0)), ("", ("scan", 3000.0))):
        out = tmp_path / f"args{len(sets)}.txt"
        r = subprocess.run(["bash", "-c", body], capture_output=True, text=True,
                           env={"PATH": f"{fake}:/usr/bin:/bin", "EMU_SETS": sets, "ARGS_OUT": str(out)})
        assert r.returncode == 0, r.stderr
        args = out.read_text().split("\n")[:-1]
        assert args[:4] == ["-m", "lever.cli", "hw", "ep"]
        ns = p.parse_args(args[4:])
        emu = emulated_nic.load(overrides=emulated_nic.parse_emu_sets(ns.emu_set))
        assert (emu.nic_claim, emu.deliver_lead_ns) == want
        assert len(ns.emu_set) == 1 + len(sets.split())
