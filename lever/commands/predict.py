"""``lever predict LEVER|--all`` and ``lever compare PREREG RECORD...``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lever.commands.options import MAX_SEEDS, count, output_file, seeds_option, workers_option
from lever.reports.jsonout import print_json
from lever.reports.tables import console, show
from lever.sim.errors import UserError
from lever.sim.scenario import parse_sets


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="predict a lever: baseline vs lever on common random numbers, with a band")
    p.add_argument("lever", nargs="?", help="lever file or name under scenarios/levers/")
    p.add_argument("--all", action="store_true", help="every lever on its baseline, sorted by predicted gain")
    seeds_option(p, None, f"paired seeds (default 3; 2 with --all; at most {MAX_SEEDS})")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="override a field on both sides, after the lever (e.g. design.doorbell_batch=4)")
    p.add_argument("--baseline", metavar="SCENARIO",
                   help="predict the lever on this scenario instead of the lever file's baseline")
    p.add_argument("--param-samples", type=count(0, 1000), default=0, metavar="K",
                   help="draw K parameter vectors from the platform's calibrated covariance")
    p.add_argument("--critical-path", dest="cp", action="store_true", default=None,
                   help="compute the critical-path attribution (default on for one lever, off for --all)")
    p.add_argument("--no-critical-path", dest="cp", action="store_false")
    p.add_argument("--unpaired", action="store_true", help="lever on other seeds than the baseline (for checks)")
    workers_option(p, "process pool size (default: CPU count)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--out", metavar="PREREG.json", type=output_file(".json"),
                   help="write a preregistration (sealed with sha256)")
    p.set_defaults(func=main_predict)

    c = sub.add_parser("compare", help="judge a preregistered prediction against measured run records")
    c.add_argument("prereg", help="preregistration JSON written by 'lever predict --out'")
    c.add_argument("records", nargs="+", help="measured run records: the baseline and the lever's")
    c.add_argument("--json", action="store_true")
    c.add_argument("--plot", metavar="OUT.png", type=output_file(".png"))
    c.add_argument("--sealed-platform", action="store_true",
                   help="judge a prediction sealed on an earlier version of its platform file (the "
                        "platform was re-fitted since): the sealed numbers stand, and the result "
                        "names both digests; without it such a prediction is refused")
    c.set_defaults(func=main_compare)


def main_predict(args: argparse.Namespace) -> int:
    import os

    from lever.calibration import predict as pr
    from lever.sim.model import ModelError

    if args.all == bool(args.lever):
        raise UserError("predict: give a LEVER or --all (not both)")
    seeds = args.seeds or (2 if args.all else 3)
    workers = args.workers or os.cpu_count() or 1
    t0 = time.perf_counter()
    if args.all:
        if args.out:
            raise UserError("--out: preregister one lever at a time")
        with _bar("every lever") as tick:
            rows = pr.predict_all(seeds=seeds, with_cp=bool(args.cp),
                                  sets=parse_sets(args.set), workers=workers, progress=tick)
        wall = round(time.perf_counter() - t0, 2)
        if args.json:
            print_json({"seeds": seeds, "wall_s": wall, "levers": rows})
        else:
            print_all(rows, seeds, wall)
        return 0
    try:
        with _bar(args.lever) as tick:
            res = pr.predict(args.lever, seeds=seeds, sets=parse_sets(args.set),
                             param_samples=args.param_samples, with_cp=args.cp is not False,
                             paired=not args.unpaired,
                             baseline=args.baseline, workers=workers, progress=tick)
    except ModelError as e:
        raise UserError(f"{args.lever}: {e}") from None
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    if args.out:
        obj = pr.preregistration(res)
        p = Path(args.out)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(obj, indent=2) + "\n")
        tmp.replace(p)
    if args.json:
        print_json(res)
    else:
        print_predict(res, args.out)
    return 0


def _band(b: list) -> str:
    if b[0] is None:
        return "n/a"
    return f"[{b[0]:+.2f}, {b[1]:+.2f}]"


@contextmanager
def _bar(what: str):
    """A progress bar on stderr (when it is a terminal) counting baseline/lever sides."""
    from lever.reports.progress import progress_bar

    with progress_bar(sys.stderr.isatty(), "model runs") as bar:
        task = bar.add_task(f"predict {what}", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


DELTA_CAPTION = ("delta = mean over the paired seeds of (lever p50 - baseline p50) on the same "
                 "seed (not the difference of the p50 columns); band = that mean's "
                 "t-interval, widened by the calibrated parameters' spread when sampled")


def print_predict(res: dict, out: str | None) -> None:
    from rich.table import Table

    con = console()
    t = Table(title=f"{res['lever']} on {res['baseline']}  ({res['seeds']} paired seeds, "
                    f"band {int(100 * res['band_level'])}% {res['band_kind']}, {res.get('wall_s', '')} s)")
    for col in ("op", "baseline p50 us", "lever p50 us", "delta us", "band us", "main shift"):
        t.add_column(col, justify="right" if col != "main shift" else "left")
    for op, r in res["ops"].items():
        t.add_row(op, f"{r['baseline_p50_us']:.2f}", f"{r['lever_p50_us']:.2f}", f"{r['delta_us']:+.2f}",
                  _band(r["band_us"]), r["main_shift"])
    show(t, con, caption=DELTA_CAPTION)
    if res.get("variants"):
        print_variants(res, con)
    for op, r in res["ops"].items():
        a = Table(title=f"{op}: attribution, baseline -> lever")
        cols = ["category", "profiler", "put path"] + (["critical path us"] if res["critical_path"] else [])
        for col in cols:
            a.add_column(col, justify="right" if col != "category" else "left")
        for c, row in r["attribution"].items():
            cells = [c, f"{100 * row['profiler_base']:.1f}% -> {100 * row['profiler_lever']:.1f}%",
                     f"{100 * row['put_path_base']:.1f}% -> {100 * row['put_path_lever']:.1f}%"]
            if "cp_base_us" in row:
                cells.append(f"{row['cp_base_us']:+.2f} -> {row['cp_lever_us']:+.2f}")
            a.add_row(*cells)
        show(a, con)
    if out:
        con.print(f"preregistration written to {out}")


def print_variants(res: dict, con) -> None:
    """Each variant of the lever: its delta and band per op, or what it needs to run."""
    from rich.table import Table

    ops = list(res["ops"])
    t = Table(title=f"{res['lever']}: variants (primary: {res['primary']})")
    t.add_column("variant", justify="left")
    for op in ops:
        t.add_column(f"{op} delta us", justify="right")
        t.add_column(f"{op} band us", justify="right")
    for name, v in res["variants"].items():
        label = name + (" (primary)" if name == res["primary"] else "")
        if not v["runnable"]:
            t.add_row(label, *(["not runnable"] + ["-"] * (2 * len(ops) - 1)))
            continue
        cells = []
        for op in ops:
            o = v["ops"].get(op)
            cells += ["-", "-"] if o is None else [f"{o['delta_us']:+.2f}", _band(o["band_us"])]
        t.add_row(label, *cells)
    show(t, con)
    flat = lambda x: " ".join(str(x).split())  # noqa: E731 - the files wrap their text
    con.print(f"primary: {res['primary']}, because {flat(res['primary_why'])}")
    for name, v in res["variants"].items():
        con.print(f"- {name}: {flat(v['description'])} Source: {flat(v['source'])}"
                  + ("" if v["runnable"] else f" Not runnable yet: needs {flat(v['needs'])}"))


def print_all(rows: list[dict], seeds: int, wall: float) -> None:
    from rich.table import Table

    t = Table(title=f"every lever on its baseline, sorted by predicted gain ({seeds} paired seeds, {wall} s)")
    for col in ("lever", "gain us", "dispatch delta us", "dispatch band", "combine delta us", "combine band",
                "main shift"):
        t.add_column(col, justify="left" if col in ("lever", "main shift") else "right")
    for r in rows:
        if "error" in r:
            t.add_row(r["lever"], "error", "", "", "", "", r["error"])
            continue
        cells = [r["lever"], f"{r['gain_us']:+.2f}"]
        shifts = []
        for op in ("dispatch", "combine"):
            o = r["ops"].get(op)
            if o is None:
                cells += ["", ""]
                continue
            cells += [f"{o['delta_us']:+.2f}", _band(o["band_us"])]
            if o["main_shift"] != "none":
                shifts.append(f"{op[0]}: {o['main_shift']}")
        cells.append("; ".join(shifts) or "none")
        t.add_row(*cells)
    show(t, caption=DELTA_CAPTION)


def main_compare(args: argparse.Namespace) -> int:
    from lever.calibration import compare as cmp
    from lever.calibration.records import check_nic, load_record
    from lever.sim import levers as levers_mod
    from lever.sim import scenario as scn_mod

    try:
        prereg = json.loads(Path(args.prereg).read_text())
    except FileNotFoundError:
        raise UserError(f"{args.prereg}: file not found") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{args.prereg}: not valid JSON: {e.msg} at line {e.lineno}") from None
    cmp.check_prereg(prereg, None, args.prereg)
    scn = levers_mod.load_with_levers(prereg["baseline"], [], prereg_sets(prereg, args.prereg))
    digest_now = scn_mod.platform_digest(scn)
    # a sealed prediction outlives a re-fit of its platform only when asked: its numbers were
    # sealed before the measurement and stand as sealed; the result says the file moved since
    if not args.sealed_platform:  # intact already (checked above): now its platform too
        cmp.check_prereg(prereg, digest_now, args.prereg)
    records = [load_record(p) for p in args.records]
    check_nic(scn.platform.nic_kind, records, args.prereg, "judge")
    res = cmp.compare(prereg, records)
    if prereg.get("platform_digest") != digest_now:
        res["platform_digest_now"] = digest_now
        print(f"note: {args.prereg}: sealed on platform digest {str(prereg.get('platform_digest'))[:12]}, "
              f"the platform file is {digest_now[:12]} now: judged as sealed", file=sys.stderr)
    if args.plot:
        from lever.reports.plot import plot_compare

        plot_compare(res, args.plot)
    if args.json:
        print_json(res)
        sys.stdout.write("\n")
    else:
        print_compare(res)
    return 0


def print_compare(res: dict) -> None:
    from rich.table import Table

    style = {"validated": "green", "refuted": "red", "inconclusive": "yellow"}
    t = Table(title=f"{res['lever']} on {res['baseline']}: predicted ({res['band_kind']}) vs measured")
    for col in ("op", "predicted us", "predicted band", "measured us", "measured band", "verdict", "why"):
        t.add_column(col, justify="left" if col in ("op", "verdict", "why") else "right")
    for op, r in res["ops"].items():
        v = r["verdict"] + (" (sign flip)" if r["sign_flip"] else "")
        t.add_row(op, f"{r['predicted_delta_us']:+.2f}", _band(r["predicted_band_us"]),
                  f"{r['measured_delta_us']:+.2f}", _band(r["measured_band_us"]),
                  f"[{style[r['verdict']]}]{v}[/]", r["reason"])
    show(t)
    if res.get("variants"):
        vt = Table(title=f"{res['lever']}: which variant the measurement supports")
        for col in ("variant", "verdict", "per op"):
            vt.add_column(col, justify="left")
        for name, v in res["variants"].items():
            label = name + (" (primary)" if name == res.get("primary") else "")
            per = "; ".join(f"{op}: {o['predicted_delta_us']:+.2f} {_band(o['predicted_band_us'])} -> "
                            f"{o['verdict']}" for op, o in v["ops"].items()) or v.get("needs", "")
            vt.add_row(label, v["verdict"], per)
        sup = ", ".join(res["supported"]) or "none of the runnable variants"
        show(vt, caption=f"supported: {sup}")


def prereg_sets(prereg: dict, label: str) -> dict[str, Any]:
    """The overrides a preregistration was made with: a table, or (files written before
    overrides were typed) a list of ``PATH=VALUE`` texts."""
    sets = prereg.get("sets", {})
    if isinstance(sets, list):
        return parse_sets(sets, f"{label}: sets")
    if not isinstance(sets, dict):

        raise UserError(f"{label}: sets: expected a table of overrides")
    return sets
