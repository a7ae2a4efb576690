"""Every emulated lever measured again: is a refuted verdict the model's miss or the
measurement's noise?

hw/run_noise_on_device.sh (calibration/data/testbed/noise) ran the V1 lever set three times,
each round with its baseline in the same process. This prints, per lever and op, the delta
of the shipped training record (one process against the baseline's, 972e2e1), the three
rounds' deltas (each lever against its own round's baseline, 509a5a8), their mean and sd, and
what the held-out model predicted for it (benchmarks/validate_levers.json). A lever whose
four measurements agree with each other but not with the prediction is a model miss.

    python benchmarks/lever_repeats.py [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path

from lever.calibration.records import DATA_DIR, load_record

ROOT = Path(__file__).resolve().parents[1]
NOISE = DATA_DIR / "testbed" / "noise"
ROUNDS = (1, 2, 3)


@functools.cache
def _record(rec_path: Path):
    return load_record(rec_path)  # each round's baseline is read for every lever and op


def median(rec_path: Path, op: str) -> float | None:
    d = _record(rec_path).latency_us.get(op)
    return None if d is None else float(d.median)


def rows() -> list[dict]:
    pred = {(r["record"], r["op"]): r for r in json.loads((ROOT / "benchmarks" / "validate_levers.json").read_text())["levers"]}
    out = []
    levers = sorted(p.name.split("-2-native-", 1)[1][:-5] for p in NOISE.glob("emu-noise-r1-2-native-*.json"))
    for lever in levers:
        if lever == "baseline":
            continue
        for op in ("dispatch", "combine"):
            deltas = []
            for r in ROUNDS:
                lv = median(NOISE / f"emu-noise-r{r}-2-native-{lever}.json", op)
                base = median(NOISE / f"emu-noise-r{r}-2-native-baseline.json", op)
                if lv is not None and base is not None:
                    deltas.append(lv - base)
            rid = f"emu-bed-ep2-native-{lever}"
            p = pred.get((rid, op), {})
            out.append({"lever": lever, "op": op, "shipped_delta_us": p.get("measured_delta_us"),
                        "round_deltas_us": [round(x, 1) for x in deltas],
                        "mean_us": round(statistics.fmean(deltas), 1),
                        "sd_us": round(statistics.stdev(deltas), 1) if len(deltas) > 1 else None,
                        "predicted_delta_us": p.get("predicted_delta_us"), "band_us": p.get("band_us"),
                        "verdict": p.get("verdict")})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the rows here too")
    a = ap.parse_args()
    rs = rows()
    print("| lever | op | shipped record us | rounds us | mean us | sd us | predicted us | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rs:
        f = lambda x: "-" if x is None else f"{x:+.1f}"  # noqa: E731
        print(f"| `{r['lever']}` | {r['op']} | {f(r['shipped_delta_us'])} | "
              f"{', '.join(f'{x:+.1f}' for x in r['round_deltas_us'])} | {f(r['mean_us'])} | "
              f"{'-' if r['sd_us'] is None else r['sd_us']} | {f(r['predicted_delta_us'])} | {r['verdict'] or '-'} |")
    if a.json:
        a.json.write_text(json.dumps(rs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
