"""``lever calibrate RECORD... --out PLATFORM`` and ``lever validate`` (docs/cli.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lever.calibration.records import (
    BASE_PLATFORM,
    RecordError,
    RunRecord,
    check_nic,
    load_record,
    shipped_record_paths,
)
from lever.commands.options import count, output_file, seeds_option, workers_option
from lever.reports.jsonout import print_json
from lever.reports.progress import progress_bar
from lever.reports.tables import console, show
from lever.sim.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="fit a platform's free parameters to run records")
    p.add_argument("records", nargs="*", metavar="RECORD",
                   help="run-record JSON files (--joint: default every shipped record with a sim link)")
    p.add_argument("--out", metavar="PLATFORM", type=output_file(".toml"),
                   help="calibrated platform TOML to write (required without --joint)")
    p.add_argument("--joint", action="store_true",
                   help="fit the records of every NIC together, GPU-class parameters shared "
                        "(calibration/joint.py); writes one calibrated platform per NIC")
    p.add_argument("--out-dir", metavar="DIR", type=Path,
                   help="--joint: where the calibrated platforms go (default: a dry run, nothing written)")
    p.add_argument("--base", action="append", default=[], metavar="NIC=TOML",
                   help="--joint: the base platform of a NIC's records (default per NIC)")
    p.add_argument("--warm", action="store_true",
                   help="--joint: start from each platform's shipped calibrated values")
    p.add_argument("--platform", metavar="TOML",
                   help="base platform (its values and [platform.free]) swapped into every record's "
                        "scenario; default: the platform of the first record's scenario")
    seeds_option(p, 1, "common random numbers: seeds 0..N-1")
    p.add_argument("--max-nfev", type=count(1, 100_000), default=10,
                   help="least-squares function evaluations")
    p.add_argument("--starts", type=count(1, 64), default=1,
                   help="N local fits (from the platform's values and N-1 seeded draws within a "
                        "decade of them); the lowest cost wins")
    workers_option(p, "processes (default: all cores)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=main_calibrate)

    v = sub.add_parser("validate", help="leave-one-out over the shipped records of one platform; "
                                        "--levers: over every lever record")
    v.add_argument("--levers", action="store_true",
                   help="hold out each lever record (and the records of the same lever), refit on the "
                        "rest of its NIC's records, predict its delta with a band and judge it")
    v.add_argument("--nic", choices=sorted(BASE_PLATFORM), default=None,
                   help="which shipped records (default: efa; with --levers every NIC with lever records)")
    v.add_argument("--records", nargs="*", metavar="RECORD", help="default: calibration/data/*.json of --nic")
    v.add_argument("--platform", metavar="TOML", help="base (uncalibrated) platform; default per NIC")
    v.add_argument("--max-nfev", type=count(1, 100_000), default=None,
                   help="evaluations per fit (default 3; with --levers: per fold's refit, default 6)")
    v.add_argument("--start-nfev", type=count(1, 100_000), default=6,
                   help="--levers: evaluations of the start fit on the records without levers")
    v.add_argument("--pred-seeds", type=count(1, 1000), default=3,
                   help="--levers: paired seeds of each held-out prediction")
    v.add_argument("--param-samples", type=count(0, 1000), default=8,
                   help="--levers: parameter draws from each fold's covariance (0: noise-only band)")
    v.add_argument("--no-discrepancy", dest="discrepancy", action="store_false",
                   help="--levers: bands from seed noise and parameter draws only, without the refit's "
                        "model discrepancy")
    v.add_argument("--no-run-noise", dest="run_noise", action="store_false",
                   help="--levers: bands without the measured run-to-run noise of a delta "
                        "(repeated configurations among the shipped records, calibration/repro.py)")
    v.add_argument("--fits-out", metavar="FITS.json", type=output_file(".json"),
                   help="--levers: also write the start fits and every fold's refit (parameters, "
                        "identifiability, discrepancy, training records)")
    v.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="--levers: where the folds run")
    v.add_argument("--address", help="--levers --executor ray: cluster address (default: a local Ray)")
    workers_option(v)
    v.add_argument("--include-superseded", action="store_true",
                   help="default records: also those marked superseded_by (left out by default)")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=main_validate)


def load_records_any(paths: list[str]) -> list[RunRecord]:
    """Records by path, ids unique (of any NICs)."""
    recs = [load_record(p) for p in paths]
    ids: dict[str, str] = {}
    for p, r in zip(paths, recs, strict=True):
        if r.id in ids:
            raise RecordError(f"{p}: id: '{r.id}' already used by {ids[r.id]}")
        ids[r.id] = p
    return recs


def load_records(paths: list[str]) -> list[RunRecord]:
    """Records of one NIC (one platform per fit)."""
    recs = load_records_any(paths)
    nics = {r.nic for r in recs}
    if len(nics) > 1:
        raise RecordError(f"{paths[0]}: nic: records mix NIC kinds {sorted(nics)} (one platform per fit)")
    return recs


def resolve_platform(records: list[RunRecord], platform: str | None):
    """(Platform, base_sets): the platform fitted and the overrides that install it everywhere."""
    from lever.calibration.fit import flatten_platform

    if platform is None:
        link = records[0].sim
        if link is None:
            raise RecordError(f"record {records[0].id}: sim: missing")
        plat = link.load().platform
        return plat, {}
    from lever.calibration.paramtable import load_platform

    plat = load_platform(platform).platform
    return plat, flatten_platform(plat.model_dump(mode="json"))


def main_calibrate(args: argparse.Namespace) -> int:
    if args.joint:
        from lever.commands.calibrate_joint import main_joint

        return main_joint(args)
    if not args.records or args.out is None:
        raise UserError("calibrate: give RECORD... and --out PLATFORM (or --joint)")
    if args.out_dir is not None or args.base or args.warm:
        raise UserError("calibrate: --out-dir, --base and --warm go with --joint")
    from lever.calibration.fit import (
        FitError,
        calibrated_platform,
        fit,
        platform_toml,
        write_atomic,
    )

    out = Path(args.out)
    recs = load_records(args.records)
    plat, base_sets = resolve_platform(recs, args.platform)
    check_nic(plat.nic_kind, recs, f"platform '{plat.name}'", "calibrate")
    t0 = time.perf_counter()
    with progress_bar(sys.stderr.isatty(), "simulations") as bar:
        task = bar.add_task(f"calibrating {plat.name}", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        try:
            res = fit(recs, plat, base_sets, seeds=args.seeds, max_nfev=args.max_nfev,
                      workers=args.workers, progress=progress, starts=args.starts)
        except FitError as e:
            raise UserError(str(e)) from None
    name = out.stem
    cal = calibrated_platform(plat, res, recs, name)
    cmd = ("lever calibrate " + " ".join(args.records) + f" --out {args.out} --seeds {args.seeds}"
           + f" --max-nfev {args.max_nfev}" + (f" --starts {args.starts}" if args.starts > 1 else "")
           + (f" --platform {args.platform}" if args.platform else ""))
    header = (f"{name}: written by `{cmd}`\n"
              f"{len(res.names)} free parameters, {res.evaluations} model evaluations, "
              f"{res.wall_s:.0f} s; do not edit by hand, re-run the command")
    write_atomic(out, platform_toml(cal, header))
    wall = time.perf_counter() - t0
    if args.json:
        print_json({"out": str(out), "platform": name, **res.as_dict(), "wall_s": round(wall, 2)})
    else:
        print_fit(res, out, wall)
    return 0


def print_fit(res, out: Path, wall: float) -> None:
    from rich.table import Table

    c = console()
    t = Table(title=f"calibrated -> {out}  ({res.evaluations} model evaluations, {wall:.0f} s)")
    for h in ("parameter", "estimate", "± se", "flag"):
        t.add_column(h, justify="right" if h != "parameter" else "left")
    for p in res.params():
        flag = ", ".join(f for f, on in (("unidentifiable", p["unidentifiable"]), ("at bound", p["at_bound"])) if on)
        se = f"{p['se']:.4g}" if p["se"] is not None else "-"
        t.add_row(p["name"], f"{p['estimate']:.4g}", se, flag)
    stopped = "the least-squares solver stopped at --max-nfev before converging: raise it to go on" \
        if "maximum number of function evaluations" in res.status else f"solver: {res.status}"
    show(t, c, caption=f"{res.nfev} solver iterations; {stopped}")
    print_rows(res.rows, "fit vs records")


def print_rows(rows, title: str, predicted_label: str = "simulated") -> None:
    from rich.table import Table

    t = Table(title=title)
    for h in ("record", "quantity", "measured", predicted_label, "% err", "% of level"):
        t.add_column(h, justify="left" if h in ("record", "quantity") else "right")
    for r in rows:
        d = r.as_dict() if hasattr(r, "as_dict") else r
        t.add_row(d["record"], d["quantity"], f"{d['measured']:.4g}", f"{d['predicted']:.4g}",
                  f"{d['pct_err']:+.1f}", f"{d['level_pct_err']:+.1f}")
    show(t)


def shipped_records(nic: str, include_superseded: bool = False) -> list[str]:
    """The shipped records of one NIC kind (superseded ones only when asked)."""
    return [str(p) for p in shipped_record_paths(include_superseded) if load_record(p).nic == nic]


def main_validate(args: argparse.Namespace) -> int:
    """Leave-one-out: fit on all records but one (from the uncalibrated platform), predict it."""
    import numpy as np

    from lever.calibration.fit import FitError, fit, predict

    if args.levers:
        return main_validate_levers(args)
    args.nic = args.nic or "efa"
    args.max_nfev = args.max_nfev or 3
    paths = args.records if args.records is not None else shipped_records(args.nic, args.include_superseded)
    if len(paths) < 2:
        raise UserError(f"validate: needs at least 2 records of nic '{args.nic}', found {len(paths)}")
    recs = load_records(paths)
    plat, base_sets = resolve_platform(recs, args.platform or BASE_PLATFORM[recs[0].nic])
    check_nic(plat.nic_kind, recs, f"platform '{plat.name}'", "calibrate")
    t0 = time.perf_counter()
    rows = []
    # one simulation cache for every fold: a simulation is a pure function of its job and
    # values, and every fold starts from the same point, so a record's start and Jacobian
    # runs are made once for all the folds that train on it (results unchanged)
    cache: dict = {}
    with progress_bar(sys.stderr.isatty(), "folds") as bar:
        outer = bar.add_task("leave-one-out", total=len(recs))
        for i, held in enumerate(recs):
            train = recs[:i] + recs[i + 1:]
            try:
                res = fit(train, plat, base_sets, seeds=1, max_nfev=args.max_nfev,
                          workers=args.workers, cache=cache)
            except FitError as e:
                raise UserError(str(e)) from None
            vals = dict(zip(res.names, (float(v) for v in res.x), strict=True))
            for r in predict([held], base_sets, vals, workers=args.workers):
                if r.unit == "us":
                    rows.append(r)
            bar.advance(outer)
    errs = np.abs([r.level_pct_err for r in rows]) if rows else np.array([np.nan])
    summary = {"median_abs_pct_err": round(float(np.median(errs)), 2),
               "max_abs_pct_err": round(float(np.max(errs)), 2)}
    wall = time.perf_counter() - t0
    if args.json:
        print_json({"nic": args.nic, "records": [r.id for r in recs], "rows": [r.as_dict() for r in rows],
                   **summary, "wall_s": round(wall, 2)})
    else:
        print_rows(rows, f"leave-one-out ({args.nic}, {len(recs)} records, {wall:.0f} s)", "predicted")
        print(f"median |% err| {summary['median_abs_pct_err']}  max |% err| {summary['max_abs_pct_err']} "
              "(deltas in % of their latency level)")
    return 0


def main_validate_levers(args: argparse.Namespace) -> int:
    """``lever validate --levers``: leave-one-out over lever records (calibration/validate.py)."""
    from lever.calibration.fit import FitError
    from lever.calibration.validate import validate_levers

    if args.records is not None:
        if not args.records:
            raise UserError("validate --levers: --records needs at least one record")
        recs = [load_record(p) for p in args.records]
    else:
        recs = [load_record(p) for p in shipped_record_paths(args.include_superseded)]
    if args.nic:
        recs = [r for r in recs if r.nic == args.nic]
    ids: dict[str, int] = {}
    for r in recs:
        ids[r.id] = ids.get(r.id, 0) + 1
        if ids[r.id] > 1:
            raise RecordError(f"record {r.id}: id: used twice")
    by_nic: dict[str, list[RunRecord]] = {}
    for r in recs:
        if r.nic in BASE_PLATFORM and r.sim is not None:
            by_nic.setdefault(r.nic, []).append(r)
    groups = {}
    for nic, rs in sorted(by_nic.items()):
        if not any(r.what.levers for r in rs):
            continue
        if args.platform and len(by_nic) > 1:
            raise UserError("validate --levers: --platform needs --nic (one base platform per NIC kind)")
        plat, base_sets = resolve_platform(rs, args.platform or BASE_PLATFORM[nic])
        check_nic(plat.nic_kind, rs, f"platform '{plat.name}'", "calibrate")
        groups[nic] = (rs, plat, base_sets)
    if not groups:
        raise UserError("validate --levers: no lever records (records with what.levers) among the records")
    t0 = time.perf_counter()
    with progress_bar(sys.stderr.isatty(), "folds") as bar:
        task = bar.add_task("leave one lever out", total=None)

        def progress(label: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=label[:60])

        try:
            noise = None
            if args.run_noise:
                from lever.calibration.repro import repeat_records, run_noise
                noise = run_noise(repeat_records())
            res = validate_levers(groups, max_nfev=args.max_nfev or 6, start_nfev=args.start_nfev,
                                  pred_seeds=args.pred_seeds, param_samples=args.param_samples,
                                  with_discrepancy=args.discrepancy, run_noise=noise,
                                  workers=args.workers, executor=args.executor, address=args.address,
                                  progress=progress)
        except FitError as e:
            raise UserError(str(e)) from None
    wall = time.perf_counter() - t0
    if args.fits_out:
        from lever.calibration.fit import write_atomic

        write_atomic(Path(args.fits_out), json.dumps(res.fits(wall), indent=1) + "\n")
    if args.json:
        print_json(res.as_json())
    else:
        print_lever_rows(res, wall)
    return 0


def print_lever_rows(res, wall: float) -> None:
    from rich.table import Table

    from lever.calibration.validate import tally

    t = Table(title=f"leave one lever out ({len(res.folds)} refits, {wall:.0f} s)")
    for h in ("record", "op", "predicted us", "band us", "measured us", "measured band", "verdict", "sign"):
        t.add_column(h, justify="left" if h in ("record", "op", "verdict", "sign") else "right")
    for r in res.rows:
        band = "-" if r.band_us is None else f"[{r.band_us[0]:+.1f}, {r.band_us[1]:+.1f}]"
        pred = "-" if r.predicted_delta_us is None else f"{r.predicted_delta_us:+.1f}"
        mb = "-" if any(v != v for v in r.measured_band_us) else \
            f"[{r.measured_band_us[0]:+.1f}, {r.measured_band_us[1]:+.1f}]"
        t.add_row(r.record, r.op, pred, band, f"{r.measured_delta_us:+.1f}", mb, r.verdict, r.sign)
    show(t)
    for nic in sorted({r.nic for r in res.rows}):
        k = tally([r for r in res.rows if r.nic == nic])
        right = sum(r.sign == "right" for r in res.rows if r.nic == nic)
        print(f"{nic}: {k['validated']} of {k['total']} validated, {k['wrong_sign']} wrong sign, "
              f"{right} with the right sign claimed")
    for rec, why in dict((r.record, r.reason) for r in res.rows if r.verdict == "refused").items():
        print(f"refused {rec}: {why}")
    for f in res.folds:
        print(f"fold without {', '.join(f.excluded)}: {len(f.train)} training records, cost {f.cost:.1f}, "
              f"{f.evaluations} simulations, model discrepancy {100 * f.discrepancy:.1f}%")
