"""``lever params PLATFORM [--json]``: every parameter with its value, uncertainty, kind and
source, and the model defects that provenance shows (``calibration/paramtable.py``)."""

from __future__ import annotations

import argparse

from lever.reports.jsonout import print_json
from lever.reports.tables import console, show


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("params", help="a platform's parameters: value, uncertainty, kind, source, defects")
    p.add_argument("platform", metavar="PLATFORM", help="a platform under scenarios/platforms/ or a path")
    p.add_argument("--no-compare", action="store_true",
                   help="do not check shared parameters against the other platforms of the GPU class")
    p.add_argument("--defects", action="store_true", help="exit 1 when any defect is reported")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from lever.calibration.paramtable import parameter_table, table_dict

    lp, rows = parameter_table(args.platform, compare=not args.no_compare)
    out = table_dict(lp, rows)
    if args.json:
        print_json(out)
    else:
        print_table(out)
    return 1 if args.defects and out["defects"] else 0


WIDE_COLUMNS = 140
"""Terminal width from which the source column fits beside the numbers."""


def print_table(out: dict) -> None:
    from rich.table import Table

    c = console()
    title = f"{out['platform']} ({out['nic_kind']}, GPU class {out['gpu_class'] or 'none'})"
    t = Table(title=title)
    # the sources are long sentences: beside the numbers only where the terminal is wide
    # enough for them; otherwise (piped output is 80 columns) listed under the table, one a line
    inline = c.width >= WIDE_COLUMNS
    heads = ("parameter", "value", "unit", "± 1σ", "kind") + (("source",) if inline else ())
    for h in heads:
        t.add_column(h, justify="right" if h in ("value", "± 1σ") else "left",
                     overflow="fold", ratio=4 if h == "source" else None)
    for r in out["params"]:
        sig = "" if r["rel_sigma"] is None else f"{100 * r['rel_sigma']:.0f}%"
        kind = r["kind"] + (f", shared ({r['shared']})" if r["shared"] else "")
        style = "red" if r["defects"] else None
        t.add_row(r["path"], f"{r['value']:.6g}", r["unit"], sig, kind,
                  *((r["source"],) if inline else ()), style=style)
    show(t, c, caption="± 1σ: relative, from the calibration's covariance (fitted) or the source")
    if not inline:
        c.print("sources:")
        for r in out["params"]:
            c.print(f"  {r['path']}: {r['source']}", markup=False, highlight=False)
    if out["defects"]:
        c.print(f"[bold red]{len(out['defects'])} model defects[/bold red]")
        for d in out["defects"]:
            c.print(f"  - {d}", markup=False)
    else:
        c.print("no model defects reported")
