"""``lever sweep SCENARIO ...`` and ``lever sensitivity LEVER ...``."""

from __future__ import annotations

import argparse
from pathlib import Path

from lever.commands.options import count, output_file, seeds_option, workers_option
from lever.reports.jsonout import print_json
from lever.reports.tables import console, show
from lever.sim.scenario import parse_sets


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="grid/random sweep over scenario paths, levers and workloads")
    p.add_argument("scenario", help="scenario file or name under scenarios/")
    p.add_argument("--grid", action="append", default=[], metavar="PATH=V1,V2,...",
                   help="a grid axis (cartesian product with the others), e.g. workload.ep_ranks=16,32")
    p.add_argument("--random", action="append", default=[], metavar="PATH=LO:HI[:log]",
                   help="a random axis: uniform (or log-uniform) draws, integers when LO and HI are")
    p.add_argument("--samples", type=count(0, 1_000_000), default=0,
                   help="random samples (crossed with the grid)")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the random draws")
    p.add_argument("--lever", action="append", default=[], metavar="NAME",
                   help="run each point with this lever too (the baseline 'none' always runs)")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="fixed override on every point (before the swept values)")
    seeds_option(p, 1, "seeds 0..N-1 per point (common to all levers)")
    p.add_argument("--executor", choices=("local", "ray"), default="local")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    workers_option(p, "processes / Ray CPUs (default: CPU count)")
    p.add_argument("--out", required=True, metavar="RESULTS.csv", type=output_file(".csv"),
                   help="results table; rerunning with the same file resumes")
    p.add_argument("--plot", metavar="OUT.png", type=output_file(".png"),
                   help="p50 against the swept axis, one line per lever")
    p.add_argument("--plot-x", metavar="PATH", help="axis of the plot (default: the first swept path)")
    p.add_argument("--dry-run", action="store_true", help="list the points and exit")
    p.add_argument("--json", action="store_true", help="print a one-object summary on stdout")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=main_sweep)

    s = sub.add_parser("sensitivity",
                       help="global sensitivity (SALib) of a lever's predicted delta to platform parameters")
    s.add_argument("lever", help="lever file or name under scenarios/levers/")
    s.add_argument("--method", choices=("morris", "sobol"), default="morris")
    s.add_argument("--n", type=int, default=None,
                   help="Morris trajectories r (default 4) or Sobol base samples N (power of 2, default 8)")
    seeds_option(s, 1, "paired seeds per sample")
    s.add_argument("--sigmas", type=float, default=2.0, help="calibrated range: log_mean ± this many sigmas")
    s.add_argument("--levels", type=count(2, 100), default=4, help="Morris grid levels")
    s.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="override on both sides (e.g. shrink the workload: workload.tokens_per_rank=32)")
    s.add_argument("--param", action="append", default=[], metavar="PATH=LO:HI",
                   help="also vary this platform parameter, log-uniform in [LO, HI] (e.g. gpu.fence_ns=500:3000)")
    s.add_argument("--params-only", action="store_true",
                   help="vary only the --param ranges, not the platform's calibrated/free ones")
    s.add_argument("--executor", choices=("local", "ray"), default="local")
    s.add_argument("--address")
    workers_option(s)
    s.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    s.add_argument("--plot", metavar="OUT.png", type=output_file(".png"),
                   help="bar chart of the ranking per op")
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=main_sensitivity)


def main_sweep(args: argparse.Namespace) -> int:
    from lever.reports import sweep as sw

    grid = [sw.parse_grid(g) for g in args.grid]
    rnd = [sw.parse_random(r) for r in args.random]
    if not grid and not rnd:
        raise sw.SweepError("sweep: give at least one --grid or --random axis")
    points = sw.enumerate_points(args.scenario, grid, rnd, args.samples, args.lever, args.seeds,
                                 parse_sets(args.set), args.sample_seed)
    if args.dry_run:
        for p in points:
            print(p.key, p.lever, " ".join(f"{k}={v!r}" for k, v in p.applied_sets().items()))
        return 0
    summary = sw.run_sweep(points, Path(args.out), args.executor, args.workers, args.address,
                           progress=not args.no_progress and not args.json)
    if args.plot:
        sw.plot_table(Path(args.out), Path(args.plot), args.plot_x)
    if args.json:
        print_json(summary)
    else:
        print(f"{summary['ran']} points run, {summary['skipped']} already in {summary['out']} "
              f"({summary['points']} in the sweep), {summary['wall_s']} s")
    return 0


def main_sensitivity(args: argparse.Namespace) -> int:
    from lever.calibration import sensitivity as sa
    from lever.reports.plot import plot_sensitivity
    from lever.reports.progress import progress_bar
    from lever.reports.sweep import SweepError, parse_random
    from lever.sim.model import ModelError

    ranges = []
    for text in args.param:
        a = parse_random(text)
        if a.lo <= 0:
            raise SweepError(f"--param: '{text}': LO must be > 0 (log-uniform)")
        ranges.append((a.path, a.lo, a.hi))
    try:
        with progress_bar(not args.no_progress and not args.json) as bar:
            task = bar.add_task(f"sensitivity {args.lever}", total=None)
            res = sa.sensitivity(args.lever, args.method, args.n, args.seeds, parse_sets(args.set),
                                 args.sigmas, args.levels, args.executor, args.workers, args.address,
                                 params=ranges, params_only=args.params_only,
                                 progress=lambda done, total: bar.update(task, completed=done,
                                                                         total=total))
        if args.plot:
            plot_sensitivity(res, Path(args.plot))
    except ModelError as e:
        raise SweepError(f"{args.lever}: {e}") from None
    if args.json:
        print_json(res)
    else:
        print_ranking(res)
    return 0


def print_ranking(res: dict) -> None:
    from rich.table import Table

    con = console(wide=True)
    morris = res["method"] == "morris"
    for op, o in res["ops"].items():
        t = Table(title=f"{res['lever']} / {op}: delta {o['delta_mean_us']:+.2f} us "
                        f"(range {o['delta_range_us'][0]:+.2f}..{o['delta_range_us'][1]:+.2f}) - "
                        f"{res['method']}, {res['evaluations']} samples, {res['wall_s']} s")
        cols = ("rank", "parameter", "lo", "hi") + (("mu* us", "± conf", "mu us", "sigma us") if morris
                                                   else ("ST", "± conf", "S1", "± conf"))
        for c in cols:
            t.add_column(c, justify="right" if c != "parameter" else "left")
        for i, r in enumerate(o["ranking"], 1):
            vals = ((r["mu_star_us"], r["mu_star_conf_us"], r["mu_us"], r["sigma_us"]) if morris
                    else (r["ST"], r["ST_conf"], r["S1"], r["S1_conf"]))
            t.add_row(str(i), r["name"], f"{r['lo']:.4g}", f"{r['hi']:.4g}", *(f"{v:.3f}" for v in vals))
        show(t, con)
