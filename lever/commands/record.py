"""``lever record import FORMAT LOG --out RECORD``: a benchmark log from the user's own
cluster (DeepEP, UCCL-EP, pplx-garden prints) becomes a run record for ``lever compare``.

The parsing is pure (``lever.calibration.importers``); this module owns the files: it
checks the output path before reading anything, so a typo in ``--out`` costs nothing,
and writes with ``dump_record`` (atomic), never over an existing record unless ``--force``.
Every bad input is a one-line ``RecordError``/``UserError`` (``lever.cli`` prints it, exit 2).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
from pathlib import Path

from lever.calibration.records import RecordError, RunRecord, check_nic, dump_record
from lever.sim.errors import UserError

# --workload option -> Workload field
WORKLOAD_OPTS = {"ranks": "ep_ranks", "nodes": "nodes", "tokens": "tokens_per_rank",
                 "hidden": "hidden", "top_k": "top_k", "experts": "num_experts"}


def register(sub: argparse._SubParsersAction) -> None:
    from lever.calibration.importers import FORMATS

    p = sub.add_parser("record", help="run records: bring measurements in")
    rsub = p.add_subparsers(dest="record_command", required=True)
    i = rsub.add_parser("import",
                        help="turn a public EP benchmark's printed output into a run record",
                        description="Formats: " + "; ".join(
                            f"{k} ({f.repo} {f.path})" for k, f in sorted(FORMATS.items())))
    # FORMAT and --nic are checked in main_import, not by argparse choices, so a bad value
    # is one 'lever: error:' line like every other bad input.
    i.add_argument("format", metavar="FORMAT", help=", ".join(sorted(FORMATS)))
    i.add_argument("log", metavar="LOG", help="the benchmark's captured stdout/stderr")
    i.add_argument("--out", required=True, metavar="RECORD", help="run-record JSON file to write")
    i.add_argument("--force", action="store_true", help="replace an existing RECORD")
    i.add_argument("--id", help="record id (default: FORMAT-<LOG file stem>, or the stem "
                                "when it starts with FORMAT)")
    i.add_argument("--nic", required=True, metavar="{efa,ib}", help="the NIC the run used")
    i.add_argument("--design", help="what.design (default: the format's system)")
    i.add_argument("--lever", action="append", default=[], metavar="NAME", dest="levers",
                   help="a lever the run had on (repeatable; a name in scenarios/levers)")
    i.add_argument("--instance", default="", help="e.g. p5.48xlarge")
    i.add_argument("--gpu", default="", help="e.g. H100")
    i.add_argument("--scenario", help="the model scenario that reproduces this run (sim link)")
    i.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", dest="sets",
                   help="how the run was configured, as scenario overrides "
                        "(repeatable; needs --scenario)")
    i.add_argument("--date", default="", help="when the run was measured (provenance.date)")
    w = i.add_argument_group("workload (what.workload is written when all are known from the "
                             "log or these options)")
    for opt, fld in WORKLOAD_OPTS.items():
        w.add_argument(f"--{opt.replace('_', '-')}", type=int, dest=opt, metavar="N",
                       help=f"workload.{fld}")
    i.add_argument("--json", action="store_true",
                   help="print the record as one JSON object on stdout")
    i.set_defaults(func=main_import)


def _command_line(args: argparse.Namespace) -> str:
    """The invocation, rebuilt from the parsed options (sys.argv may be a test runner's)."""
    parts = ["lever", "record", "import", args.format, args.log, "--out", args.out,
             "--nic", args.nic]
    for opt in ("id", "design", "instance", "gpu", "scenario", "date"):
        if getattr(args, opt):
            parts += [f"--{opt}", getattr(args, opt)]
    for opt in WORKLOAD_OPTS:
        if getattr(args, opt) is not None:
            parts += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
    parts += [x for lev in args.levers for x in ("--lever", lev)]
    parts += [x for s in args.sets for x in ("--set", s)]
    parts += ["--force"] * args.force + ["--json"] * args.json
    return shlex.join(parts)


def _check_out(out: Path, force: bool) -> None:
    """Refuse a bad output path up front (dump_record would create missing directories)."""
    if out.suffix != ".json":
        raise UserError(f"--out {out}: a run record ends in .json")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: directory {out.parent} does not exist")
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory")
    if out.exists() and not force:
        raise UserError(f"--out {out}: exists (pass --force to replace it)")


def _check_sim(rec: RunRecord, label: str) -> None:
    """The sim link must load, be of the record's NIC kind, and agree with the workload the
    log and options state: a record judged against another shape than what ran is wrong."""
    from lever.calibration.importers import WORKLOAD_KEYS
    from lever.sim.scenario import ScenarioError

    assert rec.sim is not None
    try:
        scn = rec.sim.load()
    except ScenarioError as e:
        raise UserError(str(e)) from None
    check_nic(scn.platform.nic_kind, [rec], f"{label}: scenario '{rec.sim.scenario}'", "judge")
    if rec.what.workload is None:
        return
    wl = rec.what.workload
    for k in (k for k in WORKLOAD_KEYS if k in type(scn.workload).model_fields):
        got, want = getattr(wl, k), getattr(scn.workload, k)
        if got != want:
            raise UserError(f"{label}: workload.{k}: the run had {got}, scenario "
                            f"'{rec.sim.scenario}' has {want} (pass --set workload.{k}={got})")


def main_import(args: argparse.Namespace) -> int:
    from lever.calibration.importers import FORMATS, IMPORT_NICS, parse_log, to_record
    from lever.sim.levers import all_levers
    from lever.sim.scenario import ScenarioError, parse_sets

    if args.format not in FORMATS:
        raise UserError(f"unknown format '{args.format}' (known: {', '.join(sorted(FORMATS))})")
    if args.nic not in IMPORT_NICS:
        raise UserError(f"--nic {args.nic}: one of {', '.join(IMPORT_NICS)} (an imported log is "
                        "of a real NIC, never 'emulated-srd')")
    out = Path(args.out)
    _check_out(out, args.force)
    if args.sets and not args.scenario:
        raise UserError("--set needs --scenario (it configures the model's scenario)")
    try:
        sets = parse_sets(args.sets)
    except ScenarioError as e:
        raise UserError(str(e)) from None
    known = set(all_levers())
    for lev in args.levers:
        if lev not in known:
            raise UserError(f"--lever {lev}: no such lever (known: {', '.join(sorted(known))})")
    for opt in WORKLOAD_OPTS:
        v = getattr(args, opt)
        if v is not None and v < 1:
            raise UserError(f"--{opt.replace('_', '-')}: must be >= 1")

    log = Path(args.log)
    try:
        raw = log.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{log}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{log}: is a directory, not a log file") from None
    # Undecodable bytes become U+FFFD: such a line then fails to match and is reported.
    parsed = parse_log(args.format, raw.decode("utf-8", errors="replace"), label=str(log),
                       sha256=hashlib.sha256(raw).hexdigest())
    rec = to_record(
        parsed, record_id=args.id or _default_id(args.format, log), nic=args.nic,
        design=args.design, levers=args.levers, instance=args.instance, gpu=args.gpu,
        scenario=args.scenario,
        sim_set=sets, date=args.date, command=_command_line(args),
        workload={WORKLOAD_OPTS[o]: getattr(args, o) for o in WORKLOAD_OPTS},
        tool_version=_tool_version())
    if rec.sim is not None:
        _check_sim(rec, str(log))
    if out.exists() and not args.force:  # appeared while we parsed
        raise RecordError(f"--out {out}: exists (pass --force to replace it)")
    dump_record(rec, out)
    if args.json:
        print(json.dumps(rec.model_dump(mode="json", exclude_none=True), separators=(",", ":")))
    else:
        ops = ", ".join(f"{op} median {d.median:.2f} us (n={d.n if d.n else '?'})"
                        for op, d in rec.latency_us.items())
        print(f"wrote {out}: {rec.id}: {ops}")
    return 0


def _default_id(fmt: str, log: Path) -> str:
    """FORMAT-<log stem>, without repeating the format when the file is already named by it."""
    return log.stem if log.stem.startswith(fmt) else f"{fmt}-{log.stem}"


def _tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"lever-efa {version('lever-efa')}"
    except PackageNotFoundError:
        return ""
