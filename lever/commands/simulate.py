"""``lever simulate SCENARIO [--set PATH=VALUE ...] [--seeds N] [--json] [--trace OUT] [--plot OUT]``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lever.commands.options import MAX_SEEDS, count, output_file, seeds_option, workers_option
from lever.reports.jsonout import print_json
from lever.sim import scenario as scenario_mod
from lever.sim.errors import UserError

if TYPE_CHECKING:  # the command line registers without simpy (the GPU machine's hw commands)
    from lever.sim.results import SimulationResult


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a scenario: latency per op and both attributions")
    p.add_argument("scenario", nargs="?", help="scenario file or name under scenarios/ "
                   "(or compose one with --design and --platform)")
    p.add_argument("--design", metavar="D", help="compose: a design under scenarios/designs/")
    p.add_argument("--platform", metavar="P", help="compose: a platform under scenarios/platforms/")
    p.add_argument("--workload", metavar="W", default="decode-ep16",
                   help="compose: a workload under scenarios/workloads/ (default decode-ep16)")
    p.add_argument("--ep", type=count(2, 4096), metavar="N", help="compose: EP ranks")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="override a field, e.g. design.doorbell_batch=8 (repeatable)")
    seeds_option(p, 3, f"seeds 0..N-1 (at most {MAX_SEEDS})")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--trace", metavar="OUT.json", type=output_file(".json"),
                   help="Chrome trace-event JSON of seed 0 (Perfetto)")
    p.add_argument("--plot", metavar="OUT.png", type=output_file(".png"),
                   help="timeline and the two attributions")
    p.add_argument("--no-critical-path", action="store_true",
                   help="do not record the one-run critical path (a run is ~10-30%% faster)")
    p.add_argument("--what-if", action="store_true",
                   help="also the what-if column: p50 drop with each category's costs zeroed "
                        "(one rerun per category, op and --cp-seeds seed)")
    seeds_option(p, 1, "seeds of the what-if reruns (at most --seeds)", flag="--cp-seeds")
    workers_option(p, "processes for the independent runs (default: CPU count; 1 = serial)")
    p.set_defaults(func=main)


def load_scenario(args: argparse.Namespace):
    """The scenario named, or the one composed from --design, --platform (and --workload, --ep)."""
    sets = scenario_mod.parse_sets(args.set)
    composing = args.design or args.platform
    if args.scenario and composing:
        raise UserError("give a SCENARIO or --design and --platform, not both")
    if composing:
        if not (args.design and args.platform):
            raise UserError("composing a scenario needs both --design and --platform")
        return scenario_mod.compose(args.platform, args.design, args.workload, args.ep, sets)
    if not args.scenario:
        raise UserError("give a SCENARIO, or --design D --platform P [--ep N]")
    if args.ep is not None:
        sets = {"workload.ep_ranks": args.ep, **sets}
    return scenario_mod.load(args.scenario, sets)


def main(args: argparse.Namespace) -> int:
    from lever.sim.model import ModelError
    from lever.sim.results import simulate

    scn = load_scenario(args)
    try:
        from lever.reports.progress import progress_bar

        with progress_bar(sys.stderr.isatty(), "runs") as bar:
            task = bar.add_task(f"simulate {scn.name}", total=None)
            res = simulate(scn, seeds=args.seeds, with_critical_path=not args.no_critical_path,
                           what_if=args.what_if, cp_seeds=args.cp_seeds,
                           trace=bool(args.trace or args.plot),
                           workers=args.workers or os.cpu_count() or 1,
                           progress=lambda done, total: bar.update(task, completed=done, total=total))
    except ModelError as e:
        raise UserError(f"{scn.name}: {e}") from None
    if args.trace:
        from lever.reports.trace import write_trace

        write_trace(res.traces, Path(args.trace))
    if args.plot:
        from lever.reports.plot import plot_simulation

        plot_simulation(res, Path(args.plot))
    if args.json:
        print_json(res.to_json())
    else:
        print_table(res)
    return 0


def print_table(res: SimulationResult) -> None:
    from rich.table import Table

    from lever.reports.tables import console, show  # rich: imported only for the tables

    con = console()
    t = Table(title=f"{res.scenario}  ({res.seeds} seeds, {res.events} events, {res.wall_s} s)")
    for col in ("op", "p50 us", "p99 us", "mean us"):
        t.add_column(col, justify="right")
    for op, s in res.ops.items():
        t.add_row(op, f"{s.p50_us:.1f}", f"{s.p99_us:.1f}", f"{s.mean_us:.1f}")
    show(t, con)
    for op, att in res.attribution.items():
        a = Table(title=f"{op}: attribution")
        a.add_column("category")
        a.add_column("profiler share", justify="right")
        a.add_column("put-path share", justify="right")
        a.add_column("critical path us", justify="right")
        wi = att.what_if_us
        if wi is not None:
            a.add_column("what-if us", justify="right")
        cp = att.critical_path or {}
        cats = sorted(set(att.profiler) | set(cp) | set(wi or {}), key=lambda c: -abs(cp.get(c, 0.0)))
        for c in cats:
            cells = [c, f"{att.profiler.get(c, 0):.1%}", f"{att.put_path.get(c, 0):.1%}",
                     f"{cp[c]:.1f}" if c in cp else "-"]
            if wi is not None:
                cells.append(f"{wi[c]:.1f}" if c in wi else "-")
            a.add_row(*cells)
        show(a, con, caption=CAPTION + (WHAT_IF if wi is not None else ""))


CAPTION = ("profiler: share of the warps' busy time; critical path: us of the p50 rank's chain of "
           "releasing events (sums to its latency)")
WHAT_IF = "; what-if: p50 drop when the category's costs are zeroed (categories overlap)"
