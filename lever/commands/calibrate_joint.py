"""``lever calibrate --joint [RECORD...] [--out-dir DIR]``: every NIC's records in one fit,
GPU-class parameters shared (``calibration/joint.py``); prints which records constrain
which parameter and writes one calibrated platform per NIC into DIR."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lever.calibration.records import load_record, shipped_record_paths
from lever.reports.jsonout import print_json
from lever.reports.progress import progress_bar
from lever.reports.tables import console, show
from lever.sim.errors import UserError


def shipped_fittable() -> list[str]:
    """Every shipped record the model can reproduce: it has a sim link, and the model builds
    its run (a record of a shape the model refuses is left out, with a line on stderr)."""
    from lever.sim.engine import Ledger, Trace
    from lever.sim.model import World
    from lever.sim.routing import Routing

    out = []
    for p in shipped_record_paths():
        rec = load_record(p)
        if rec.sim is None:
            continue
        try:
            for link in filter(None, (rec.sim, rec.baseline)):
                scn = link.load()
                World(scn, scn.ops[0], 0, Ledger(), Trace(), Routing.for_scenario(scn, 0))
        except UserError as e:
            print(f"calibrate --joint: leaving out {rec.id}: {e}", file=sys.stderr)
            continue
        out.append(str(p))
    return out


def main_joint(args: argparse.Namespace) -> int:
    from lever.calibration.fit import FitError, calibrated_platform, platform_toml, write_atomic
    from lever.calibration.joint import (
        GROUP_SEP,
        group_result,
        joint_fit,
        report,
        resolve_groups,
        warm_starts,
    )
    from lever.commands.calibrate import load_records_any

    if args.out is not None:
        raise UserError("calibrate --joint: writes one platform per NIC: give --out-dir DIR, not --out")
    paths = args.records or shipped_fittable()
    recs = load_records_any(paths)
    bases = {}
    for b in args.base:
        nic, sep, path = b.partition("=")
        if not sep or not nic or not path:
            raise UserError(f"--base: '{b}': expected NIC=TOML")
        bases[nic] = path
    t0 = time.perf_counter()
    try:
        groups = resolve_groups(recs, bases)
        with progress_bar(sys.stderr.isatty(), "simulations") as bar:
            task = bar.add_task("joint calibration", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            warm = warm_starts(groups) if args.warm else None
            plan, res = joint_fit(groups, seeds=args.seeds, max_nfev=args.max_nfev,
                                  workers=args.workers, progress=progress, warm=warm)
    except FitError as e:
        raise UserError(str(e)) from None
    rep = report(plan, res)
    written = []
    if args.out_dir is not None:
        cmd = ("lever calibrate --joint " + " ".join(args.records) + f" --out-dir {args.out_dir}"
               f" --seeds {args.seeds} --max-nfev {args.max_nfev}" + (" --warm" if args.warm else "")
               + "".join(f" --base {b}" for b in args.base))
        constrained = {p["name"]: p["constrained_by"] for p in rep["params"]}
        names = [g.name for g in groups]
        for g in groups:
            sub = group_result(res, g, plan.shared)
            name = f"{g.name}-calibrated"
            refs = {}
            for n in sub.names:
                key = n if n in plan.shared else f"{n}{GROUP_SEP}{g.name}"
                by = ", ".join(constrained.get(key, [])) or "none of them (it stays at its prior)"
                tied = (f"; one value for every {g.platform.gpu_class} platform "
                        f"({', '.join(names)})" if n in plan.shared else "")
                refs[n] = (f"lever calibrate --joint on {', '.join(r.id for r in g.records)}"
                           f" (and the other platforms' records); constrained by {by}{tied}")
            cal = calibrated_platform(g.platform, sub, g.records, name, refs, plan.shared)
            header = (f"{name}: written by `{cmd.replace('  ', ' ')}`\n"
                      f"joint fit of {len(recs)} records on {len(groups)} platforms, "
                      f"{len(res.names)} free parameters ({len(plan.shared)} shared), "
                      f"{res.evaluations} model runs, {res.wall_s:.0f} s; do not edit by hand, re-run the command")
            out = Path(args.out_dir) / f"{name}.toml"
            write_atomic(out, platform_toml(cal, header))
            written.append(str(out))
    wall = time.perf_counter() - t0
    if args.json:
        print_json({**res.as_dict(), **rep, "written": written, "wall_s": round(wall, 2)})
    else:
        print_joint(rep, res, written, wall)
    return 0


def print_joint(rep: dict, res, written: list[str], wall: float) -> None:
    from rich.table import Table

    from lever.commands.calibrate import print_rows

    c = console()
    t = Table(title=f"joint calibration ({res.evaluations} model runs, {wall:.0f} s)")
    for h in ("parameter", "estimate", "± se", "shared", "constrained by", "flag"):
        t.add_column(h, justify="right" if h in ("estimate", "± se") else "left", overflow="fold")
    for p in rep["params"]:
        flags = [f for f, on in (("unidentifiable", p["unidentifiable"]), ("at bound", p["at_bound"]),
                                 ("at prior: no record constrains it", p["at_prior"])) if on]
        se = f"{p['se']:.4g}" if p["se"] is not None else "-"
        t.add_row(p["name"], f"{p['estimate']:.4g}", se, "yes" if p["shared"] else "",
                  ", ".join(p["constrained_by"]), ", ".join(flags))
    show(t, c, caption=f"{res.nfev} solver iterations; solver: {res.status}")
    print_rows(res.rows, "fit vs records")
    for w in written:
        c.print(f"wrote {w}")
