"""The README's leave-one-lever-out table from `lever validate --levers --json` output.

    python benchmarks/lever_table.py [benchmarks/validate_levers.json]

Prints the summary line and one markdown row per (record, op): predicted delta, band,
measured delta, verdict and the row's sign (validate's rule: right, wrong or none), so the
table in the README is the JSON's, not retyped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(d: dict) -> str:
    """Markdown: summary line, header, rows."""
    lines = [f"validated {d['validated']} of {d['total']}, wrong sign {d['wrong_sign']}", "",
             "| record | op | predicted us | band us | measured us | verdict | sign |",
             "|---|---|---|---|---|---|---|"]
    for r in d["levers"]:
        p, b = r.get("predicted_delta_us"), r.get("band_us")
        ps = "-" if p is None or r["verdict"] == "refused" else f"{p:+.1f}"
        bs = "-" if not b else f"[{b[0]:+.1f}, {b[1]:+.1f}]"
        lines.append(f"| `{r['record']}` | {r['op']} | {ps} | {bs} | {r['measured_delta_us']:+.1f} | "
                     f"{r['verdict']} | {r['sign']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else Path(__file__).with_name("validate_levers.json"))
    print(table(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
