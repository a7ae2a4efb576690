"""``lever hw efa-info [--out RECORD]``: what the EFA device here can do.

Why: before a prediction is confirmed on EFA, the run must know the device's limits
(doorbell batch, RDMA sizes, which capabilities the levers rely on). This prints
them, or writes them as JSON (``--out``) with the record fields a run on this device
carries. Without a device it fails with the one line of
:func:`lever.hw.efa.device.discover` (exit 2 through the ``lever`` command).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lever.hw.efa import device as efa_device
from lever.sim.errors import UserError


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="", metavar="RECORD",
                   help="write the capability report as JSON to this path")
    p.add_argument("--device", default=None, help="EFA device name (default: the first one)")
    p.add_argument("--port", type=int, default=1, help="port to query (default 1)")
    p.add_argument("--no-probe", action="store_true",
                   help="skip the probe QP (then max_tx_batch and the queue layout are unknown)")


def format_report(info: dict[str, Any]) -> list[str]:
    """The capability report as lines of text."""
    caps = info.get("caps", {})
    rows = [
        ("device", f"{info['device']} (guid {info.get('guid', '?')}, port {info.get('port', 1)})"),
        ("rdma-core", str(info.get("rdma_core") or "unknown")),
        ("efa package", info.get("efa_package") or "unknown"),
        ("max_sq_wr / max_rq_wr", f"{info['max_sq_wr']} / {info['max_rq_wr']}"),
        ("max_sq_sge / max_rq_sge", f"{info['max_sq_sge']} / {info['max_rq_sge']}"),
        ("inline_buf_size", f"{info['inline_buf_size']} B"),
        ("max_rdma_size", f"{info['max_rdma_size']} B"),
        ("max_tx_batch", str(info["max_tx_batch"]) if info.get("max_tx_batch") else "not probed"),
        ("device_caps", f"{info['device_caps']:#x}"),
    ]
    rows += [(f"  {name}", "yes" if on else "no") for name, on in caps.items()]
    lay = info.get("probe", {}).get("layout")
    if lay:
        rows += [
            ("probe SQ", f"{lay['sq_num_entries']} x {lay['sq_entry_size']} B WQEs, "
                         f"max_batch {lay['sq_max_batch']}"),
            ("probe CQ", f"{lay['cq_num_entries']} x {lay['cq_entry_size']} B entries"),
        ]
    width = max(len(k) for k, _ in rows)
    return [f"{k:<{width}}  {v}" for k, v in rows]


def main(args: argparse.Namespace) -> int:
    info = efa_device.discover(device=args.device, port=args.port, probe=not args.no_probe)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(efa_device.capability_report(info), indent=2) + "\n")
        tmp.replace(out)
        print(f"EFA capabilities of {info['device']} -> {out}")
    else:
        for line in format_report(info):
            print(line)
    return 0


def _standalone(argv: list[str] | None = None) -> int:
    """``python3 -m lever.hw.efa.cli``: the same without the rest of the CLI."""

    p = argparse.ArgumentParser(prog="lever hw efa-info", description=__doc__.splitlines()[0])
    add_args(p)
    try:
        return main(p.parse_args(argv))
    except UserError as e:
        print(f"lever: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(_standalone())
