"""Held-out check of another EFA system's design: pplx-garden's published decode latencies,
on EFA and on ConnectX-7, predicted by the shipped platforms (nothing fitted to pplx-garden).

    python benchmarks/pplx_garden_held_out.py [--seeds 1] [--workers 2] [--out benchmarks/pplx_garden_held_out.json]

Source: perplexityai/pplx-garden docs/fabric-lib.md, "All-to-All Performance Results",
decode (128 tokens) dispatch and combine, EP8 to EP64, pplx-EFA (its benchmark runs with
``--nets-per-gpu 2``: two EFA devices per GPU, as on p5en) and pplx-CX7 (one 400 Gb/s ConnectX-7
per GPU). The model runs ``scenarios/designs/pplx-garden.toml`` composed with the ``p5en``
platform (p5's EFA calibration, p5en's published NIC count and rate) and with
``ib-cx7-calibrated``, on the decode workload (128 tokens a rank, hidden 7168, top-8 of 256
experts), as ``lever simulate --design pplx-garden --platform P --ep N`` does. The table gives
model, published and the error per (NIC, EP, op), and the EFA / CX7 ratio of each, published
and modelled: the model was calibrated on one EFA system (the campaign's DeepEP V2 through
GIN) and one IB system (DeepEP LL), so a second system on both NICs checks both platforms and
the difference between them. A benchmark, not a test: about two minutes of CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SOURCE = ("perplexityai/pplx-garden docs/fabric-lib.md (commit 2446003), All-to-All Performance "
          "Results, decode (128 tokens), median latency")
# EP -> (dispatch us, combine us)
PUBLISHED = {
    "efa": {8: (49.7, 64.2), 16: (214.8, 241.5), 32: (229.1, 335.0), 64: (266.7, 391.2)},
    "cx7": {8: (50.5, 65.3), 16: (110.2, 185.5), 32: (153.9, 266.3), 64: (187.5, 309.1)},
}
PLATFORM = {"efa": "p5en", "cx7": "ib-cx7-calibrated"}
OPS = ("dispatch", "combine")


def run_case(args: tuple[str, int, int]) -> dict:
    nic, ep, seeds = args
    from lever.sim import scenario
    from lever.sim.results import simulate

    scn = scenario.compose(PLATFORM[nic], "pplx-garden", "decode-ep16", ep, {})
    t0 = time.process_time()
    res = simulate(scn, seeds=seeds, with_critical_path=False)
    model = {op: float(res.ops[op].p50_us) for op in OPS}
    return {"nic": nic, "platform": PLATFORM[nic], "ep": ep, "model": model,
            "published": dict(zip(OPS, PUBLISHED[nic][ep], strict=True)),
            "cpu_s": round(time.process_time() - t0, 1)}


def summarise(rows: list[dict]) -> dict:
    """Errors per row, their median and max per NIC, and the EFA / CX7 ratios."""
    errs: dict[str, list[float]] = {}
    for r in rows:
        r["error_pct"] = {op: 100.0 * (r["model"][op] - r["published"][op]) / r["published"][op]
                          for op in OPS}
        errs.setdefault(r["nic"], []).extend(abs(e) for e in r["error_pct"].values())
    by = {(r["nic"], r["ep"]): r for r in rows}
    ratios = []
    for ep in sorted({r["ep"] for r in rows}):
        e, c = by.get(("efa", ep)), by.get(("cx7", ep))
        if e is None or c is None:
            continue
        for op in OPS:
            ratios.append({"ep": ep, "op": op,
                           "published": e["published"][op] / c["published"][op],
                           "model": e["model"][op] / c["model"][op]})
    same_side = sum((x["published"] > 1.0) == (x["model"] > 1.0) for x in ratios)
    return {"median_abs_error_pct": {k: statistics.median(v) for k, v in errs.items()},
            "max_abs_error_pct": {k: max(v) for k, v in errs.items()},
            "efa_over_cx7": ratios,
            "efa_over_cx7_same_side_of_1": f"{same_side} of {len(ratios)}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default="benchmarks/pplx_garden_held_out.json")
    a = p.parse_args(argv)
    todo = [(nic, ep, a.seeds) for nic in PUBLISHED for ep in PUBLISHED[nic]]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.workers) as ex:
        rows = sorted(ex.map(run_case, todo), key=lambda r: (r["nic"], r["ep"]))
    summary = summarise(rows)
    print("| NIC | EP | dispatch published / model | combine published / model |")
    print("|---|---|---|---|")
    for r in rows:
        cells = [f"{r['published'][op]:.1f} / {r['model'][op]:.1f} ({r['error_pct'][op]:+.0f}%)"
                 for op in OPS]
        print(f"| {r['nic']} ({r['platform']}) | {r['ep']} | {cells[0]} | {cells[1]} |")
    print("\nEFA / CX7, published vs model:")
    for x in summary["efa_over_cx7"]:
        print(f"  EP{x['ep']} {x['op']}: {x['published']:.2f} vs {x['model']:.2f}")
    for nic in PUBLISHED:
        print(f"{nic}: median |error| {summary['median_abs_error_pct'][nic]:.1f}%, "
              f"max {summary['max_abs_error_pct'][nic]:.1f}%")
    print(f"EFA slower than CX7 on the same side of 1: {summary['efa_over_cx7_same_side_of_1']}")
    out = {"command": "python benchmarks/pplx_garden_held_out.py " + " ".join(argv or sys.argv[1:]),
           "source": SOURCE, "seeds": a.seeds, "wall_s": round(time.perf_counter() - t0, 1),
           "rows": rows, **summary}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
