"""The device scripts (``hw/run_*_on_device.sh``) run only on the GPU machine, where a typo costs
device time: here they must parse as bash, and the ranks-per-GPU probe's ``step`` lines must be
arguments ``lever hw ep`` accepts."""

from __future__ import annotations

import argparse
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
                            .replace("$gap", "0"))
        ns = p.parse_args(words[3:])
        if "chain" in words[1]:
            chains += 1
            assert ns.num_sms == 1 and "design.warps_per_sm=1" in ns.set
    assert chains == 1
    only = text.split("--only ", 1)[1].split()[0].split(",")
    assert {"latency", "wqe_doorbell", "turn_handoff"} <= set(only)
