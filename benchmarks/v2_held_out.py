"""Held-out check of the emulated platform on DeepEP V2: the testbed's V2 records
(``calibration/data/v2``, never fitted) predicted by ``emulated-nvlink-calibrated``, which the
joint fit calibrated on the testbed's V1 records only.

    python benchmarks/v2_held_out.py [--seeds 1] [--out benchmarks/v2_held_out.json]

Each record's run configuration (its ``sim`` block) is simulated with the calibrated emulated
platform in place of the uncalibrated one its scenario names; a lever record is also judged
as a delta against the baseline record of the same protocol, path and faults. Records whose
lever reading the model can not run are listed as refused. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from lever.calibration.records import DATA_DIR, load_record
from lever.sim import scenario as scn_mod
from lever.sim.errors import UserError
from lever.sim.levers import load_with_levers
from lever.sim.model import simulate_op

CAL = scn_mod.SCENARIO_DIR / "platforms" / "emulated-nvlink-calibrated.toml"


def calibrated_scenario(name: str, tmp: Path) -> Path:
    """The record's scenario file with the calibrated emulated platform included instead."""
    src = scn_mod.resolve(name)
    text = src.read_text().replace('"platforms/emulated-nvlink.toml"', f'"{CAL}"')
    for d in ("workloads", "designs"):
        text = text.replace(f'"{d}/', f'"{scn_mod.SCENARIO_DIR / d}/')
    out = tmp / f"{src.stem}-calibrated.toml"
    out.write_text(text)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--out", default="benchmarks/v2_held_out.json")
    p.add_argument("--tmp", default="/tmp")
    a = p.parse_args(argv)
    recs = [load_record(f) for f in sorted((DATA_DIR / "v2").glob("emu-*.json"))]
    rows: dict[str, dict] = {}
    for r in recs:
        sc = calibrated_scenario(r.sim.scenario, Path(a.tmp))
        try:
            scn = load_with_levers(sc, r.sim.levers, base=dict(r.sim.set), base_source="record sim.set")
            model = {op: float(np.median([x for s in range(a.seeds)
                                          for x in simulate_op(scn, op, s).latency_us]))
                     for op in ("dispatch", "combine")}
        except UserError as e:
            rows[r.id] = {"refused": str(e).splitlines()[0][:160]}
            continue
        rows[r.id] = {"measured": {op: r.latency_us[op].median for op in ("dispatch", "combine")},
                      "model": model, "levers": r.what.levers}
    print("| record | dispatch measured / model us | combine measured / model us |")
    print("|---|---|---|")
    errs = []
    for rid, x in rows.items():
        if "refused" in x:
            print(f"| {rid} | refused: {x['refused'][:70]} | |")
            continue
        cells = []
        for op in ("dispatch", "combine"):
            m, s = x["measured"][op], x["model"][op]
            errs.append(abs(s - m) / m * 100)
            cells.append(f"{m:.1f} / {s:.1f} ({100 * (s - m) / m:+.0f}%)")
        print(f"| {rid} | {cells[0]} | {cells[1]} |")
    # lever deltas against the baseline of the same configuration
    deltas = []
    for rid, x in rows.items():
        if "refused" in x or not x["levers"]:
            continue
        base_id = rid.replace("-" + "-".join(x["levers"]), "-baseline")
        b = rows.get(base_id)
        if b is None or "refused" in b:
            continue
        for op in ("dispatch", "combine"):
            md = x["measured"][op] - b["measured"][op]
            sd = x["model"][op] - b["model"][op]
            deltas.append({"record": rid, "op": op, "measured_delta_us": round(md, 1),
                           "model_delta_us": round(sd, 1),
                           "same_sign": bool(np.sign(md) == np.sign(sd)) if abs(md) > 5 else None})
    signed = [d for d in deltas if d["same_sign"] is not None]
    print(f"latency: median |error| {np.median(errs):.1f}% over {len(errs)} numbers; lever deltas "
          f"beyond 5 us measured: {sum(d['same_sign'] for d in signed)} of {len(signed)} with the model's sign")
    Path(a.out).write_text(json.dumps({
        "command": "python benchmarks/v2_held_out.py " + " ".join(argv or sys.argv[1:]),
        "platform": "emulated-nvlink-calibrated", "rows": rows, "deltas": deltas,
        "median_abs_error_pct": round(float(np.median(errs)), 2)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
