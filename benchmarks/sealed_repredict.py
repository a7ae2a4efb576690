"""Out-of-sample drift: every sealed prediction that has been measured, predicted again by the
shipped model, beside what was sealed and what was measured.

    python benchmarks/sealed_repredict.py [--seeds 3] [--workers 2] [--out benchmarks/sealed_repredict.json]

A sealed prediction (``calibration/data/predictions/NAME.json``, made by ``lever predict --out``
before the testbed ran it) and its judgement (``NAME.compare.json``, the measured delta) are
the only numbers the model never saw. Later fits are judged by leave-one-out on their own
training records (``lever validate --levers``); this asks the other question: does the model
as shipped now predict the held-out runs better or worse than the model that sealed them?
Each case is predicted on its prereg's baseline, sets and seeds, and where the lever has
several readings, on the one the testbed builds (the variant its run measured), as a point (no parameter draws: the bands are the sealed files'). The
table gives, per (case, op), the sealed, the re-predicted and the measured delta, and the
summary the median and mean absolute miss of each, their wrong-signed points and how often
each is the closer. Seconds to minutes on two cores (``lever predict`` keeps its simulations).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREDICTIONS = ROOT / "calibration" / "data" / "predictions"
OPS = ("dispatch", "combine")


def measured_cases(folder: Path = PREDICTIONS) -> list[tuple[str, dict, dict]]:
    """(name, prereg, judgement) for every prereg that has a ``.compare.json`` beside it."""
    out = []
    for comp in sorted(folder.glob("*.compare.json")):
        name = comp.name[: -len(".compare.json")]
        out.append((name, json.loads((folder / f"{name}.json").read_text()), json.loads(comp.read_text())))
    return out


def built_variant(prereg: dict) -> str | None:
    """The variant of the lever the testbed's kernels build (``lever.hw.ep.HW_VARIANTS``),
    where the lever file has several readings: the one its measurement judges."""
    from lever.hw.ep import HW_VARIANTS

    return HW_VARIANTS.get(prereg["lever"]) if prereg.get("variants") else None


def repredict(prereg: dict, seeds: int, workers: int) -> tuple[dict[str, float], str]:
    """The shipped model's point delta per op for ``prereg``'s case (the variant the testbed
    builds where the lever has several, else its primary), and the platform digest it ran on."""
    from lever.calibration.predict import predict

    sets = {**prereg.get("sets", {}), **prereg.get("lever_only_sets", {})}
    j = predict(prereg["lever"], seeds=seeds, sets=sets, param_samples=0, with_cp=False,
                baseline=prereg["baseline"], workers=workers)
    ops = j["ops"]
    name = built_variant(prereg) or j.get("primary")
    if name:
        ops = j["variants"][name]["ops"]
    return {op: float(ops[op]["delta_us"]) for op in ops}, j["platform_digest"]


def summarise(rows: list[dict]) -> dict:
    """Median and mean absolute miss (us) and wrong-signed points, sealed against now."""
    out: dict = {"rows": len(rows)}
    for key in ("sealed", "now"):
        miss = [abs(r[f"{key}_delta_us"] - r["measured_delta_us"]) for r in rows]
        out[key] = {"median_miss_us": round(statistics.median(miss), 1),
                    "mean_miss_us": round(statistics.fmean(miss), 1),
                    "wrong_sign": sum(1 for r in rows if r[f"{key}_delta_us"] * r["measured_delta_us"] < 0),
                    "closer": sum(1 for r in rows if abs(r[f"{key}_delta_us"] - r["measured_delta_us"])
                                  < abs(r[f"{'now' if key == 'sealed' else 'sealed'}_delta_us"]
                                        - r["measured_delta_us"]))}
    return out


def table(res: dict) -> str:
    s = res["summary"]
    lines = [f"{s['rows']} measured (case, op); median miss sealed {s['sealed']['median_miss_us']} us, "
             f"now {s['now']['median_miss_us']} us; mean {s['sealed']['mean_miss_us']} / "
             f"{s['now']['mean_miss_us']}; wrong-signed points {s['sealed']['wrong_sign']} / "
             f"{s['now']['wrong_sign']}; closer {s['sealed']['closer']} / {s['now']['closer']}", "",
             "| case (variant built) | op | sealed (rev) | now | measured | sealed verdict |", "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        case = f"`{r['case']}`" + (f" ({r['variant']})" if r.get("variant") else "")
        lines.append(f"| {case} | {r['op']} | {r['sealed_delta_us']:+.1f} ({r['sealed_rev'][:7]}) | "
                     f"{r['now_delta_us']:+.1f} | {r['measured_delta_us']:+.1f} | {r['sealed_verdict']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    rows, digests = [], set()
    for name, pre, comp in measured_cases():
        now, dig = repredict(pre, args.seeds, args.workers)
        digests.add(dig)
        var = built_variant(pre)
        judged = comp["variants"][var]["ops"] if var and var in comp.get("variants", {}) else comp["ops"]
        for op in OPS:
            if op not in judged:
                continue
            c = judged[op]
            rows.append({"case": name, "op": op, "lever": pre["lever"], "variant": var, "sealed_rev": pre["git_rev"],
                         "sealed_delta_us": round(float(c["predicted_delta_us"]), 4),
                         "sealed_verdict": c["verdict"], "now_delta_us": round(now[op], 4),
                         "measured_delta_us": round(float(c["measured_delta_us"]), 4)})
        print(f"{name}: {', '.join(f'{op} {now[op]:+.1f}' for op in now)}", file=sys.stderr, flush=True)
    res = {"command": "python benchmarks/sealed_repredict.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "seeds": args.seeds, "platform_digests": sorted(digests), "wall_s": round(time.monotonic() - t0, 1),
           "rows": rows}
    res["summary"] = summarise(rows)
    print(table(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
