"""Golden results: the model's exact numbers for a few small cases, committed as data.

A change meant to make the model faster must leave these bit for bit
(``tests/test_golden.py``). A change meant to alter the model regenerates them
on purpose, in the same commit, and says so:

    python -m tests.golden_cases --write
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_sim.json"
SMALL = ["workload.tokens_per_rank=16"]
CASES: dict[str, tuple[str, list[str]]] = {
    "hybrid-native-flush": ("decode-ep16-efa-native", SMALL),
    "hybrid-proxy": ("decode-ep16-efa-proxy", SMALL),
    "hybrid-native-unordered-loss": ("decode-ep16-efa-native", [
        *SMALL, 'design.signal_mode="unordered-counting"', "platform.fabric.loss_prob=0.05"]),
    "direct-native-imm": ("decode-ep16-efa-native", [
        *SMALL, 'design.protocol="v2-direct"', 'design.signal_mode="imm-counting"']),
    "v1-ll-ib": ("decode-ep16-ib", SMALL),
    "v1-ll-native-lazy-b8": ("decode-ep16-efa-native", [
        *SMALL, 'design.protocol="v1-ll"', "design.lazy_completion_dispatch=true",
        "design.doorbell_batch=8"]),
}


def compute() -> dict:
    from sim import scenario
    from sim.model import simulate_op

    out = {}
    for name, (scn_name, sets) in CASES.items():
        scn = scenario.load(scn_name, sets)
        for op in ("dispatch", "combine"):
            r = simulate_op(scn, op, 0)
            out[f"{name}/{op}"] = {
                "latency_us": [float(x).hex() for x in r.latency_us],
                "events": r.events,
                "counters": dict(sorted(r.counters.items())),
            }
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    data = compute()
    if a.write:
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN}")
    else:
        print(json.dumps(data, indent=1)[:2000])
