"""``lever designs --platform P --ep 8,16,32,64 [--design D ...]``: every design on one platform.

Each design file under ``scenarios/designs/`` is composed with the platform and a
workload at each EP size (``scenario.compose``, as ``lever simulate --design --platform
--ep`` does) and simulated; the table shows dispatch and combine p50 side by side
with the attribution category that dominates each (the largest profiler share over
the issuing, polling and forwarding warps). A design the model refuses at some EP
size (a shape it can not run) gets a row saying why, not a crash.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from lever.commands.options import count, output_file, seeds_option, workers_option
from lever.reports.jsonout import print_json
from lever.reports.tables import console, show
from lever.sim import scenario as scn_mod
from lever.sim.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("designs", help="every design on one platform at several EP sizes, side by side")
    p.add_argument("--platform", required=True, metavar="P", help="a platform under scenarios/platforms/")
    p.add_argument("--ep", default="8,16,32,64", metavar="N,N,...", help="EP sizes (default 8,16,32,64)")
    p.add_argument("--design", action="append", default=[], metavar="D",
                   help="a design under scenarios/designs/ (repeatable; default: every design file)")
    p.add_argument("--workload", default="decode-ep16", metavar="W", help="workload (its ep_ranks is replaced)")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="override on every run")
    seeds_option(p, 1, "seeds per run")
    workers_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--plot", metavar="OUT.png", type=output_file(".png"), help="latency against EP, a line per design")
    p.set_defaults(func=main)


def parse_eps(text: str) -> list[int]:
    parse = count(2, 4096)
    try:
        eps = [parse(t.strip()) for t in text.split(",") if t.strip()]
    except argparse.ArgumentTypeError as e:
        raise UserError(f"--ep: {e}") from None
    if not eps:
        raise UserError("--ep: give at least one EP size, e.g. 8,16,32")
    return list(dict.fromkeys(eps))


def all_designs() -> list[str]:
    return sorted(p.stem for p in (scn_mod.SCENARIO_DIR / "designs").glob("*.toml"))


def run_point(job: tuple[str, str, str, int, dict, int]) -> dict[str, Any]:
    """One (design, EP) run in a worker: the row of the table (or why it could not run)."""
    from lever.sim.model import ModelError
    from lever.sim.results import simulate

    platform, design, workload, ep, sets, seeds = job
    row: dict[str, Any] = {"design": design, "platform": platform, "ep": ep}
    try:
        scn = scn_mod.compose(platform, design, workload, ep, sets)
        res = simulate(scn, seeds=seeds, with_critical_path=False)
    except (scn_mod.ScenarioError, ModelError) as e:
        return {**row, "error": str(e)}
    for op in ("dispatch", "combine"):
        if op in res.ops:
            row[f"{op}_p50_us"] = round(res.ops[op].p50_us, 3)
            prof = res.attribution[op].profiler
            row[f"{op}_dominant"] = max(prof, key=prof.get) if prof else ""
    return row


def main(args: argparse.Namespace) -> int:
    import os

    from lever.calibration.pool import imap_unordered
    from lever.reports.progress import progress_bar

    eps = parse_eps(args.ep)
    designs = list(dict.fromkeys(args.design)) or all_designs()
    sets = scn_mod.parse_sets(args.set)
    for d in designs:  # bad names fail before any run
        scn_mod.compose(args.platform, d, args.workload, None, sets)
    jobs = [(args.platform, d, args.workload, ep, sets, args.seeds) for d in designs for ep in eps]
    rows: list[dict[str, Any] | None] = [None] * len(jobs)
    with progress_bar(sys.stderr.isatty(), "runs") as bar:
        task = bar.add_task(f"designs on {args.platform}", total=len(jobs))
        for i, row in imap_unordered(run_point, jobs, "local", args.workers or os.cpu_count() or 1):
            rows[i] = row
            bar.advance(task)
    done = [r for r in rows if r is not None]
    if args.plot:
        from lever.reports.plot import plot_designs

        plot_designs(done, Path(args.plot))
    if args.json:
        print_json({"platform": args.platform, "workload": args.workload, "seeds": args.seeds, "rows": done})
    else:
        print_designs(done)
    return 0


def print_designs(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    t = Table(title=f"designs on {rows[0]['platform'] if rows else ''}")
    for col in ("design", "EP", "dispatch p50 us", "dominant", "combine p50 us", "dominant "):
        t.add_column(col, justify="left" if col.startswith(("design", "dominant")) else "right")
    refused = []
    for r in rows:
        if "error" in r:
            refused.append(f"{r['design']} at EP{r['ep']}: {r['error']}")
            t.add_row(r["design"], str(r["ep"]), "refused", f"[{len(refused)}]", "refused", "")
            continue
        t.add_row(r["design"], str(r["ep"]), f"{r.get('dispatch_p50_us', float('nan')):.1f}",
                  r.get("dispatch_dominant", ""), f"{r.get('combine_p50_us', float('nan')):.1f}",
                  r.get("combine_dominant", ""))
    con = console()
    show(t, con, caption="p50 over every rank and seed; dominant = largest profiler share "
                         "(busy time of the issuing, polling and forwarding warps)")
    for i, why in enumerate(refused, 1):
        con.print(f"[{i}] {why}", soft_wrap=True)
