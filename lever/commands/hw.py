"""``lever hw primitives`` and ``lever hw ep``: thin dispatch to the harness modules.

Each harness module exposes ``add_args(parser)`` and ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib

SUBCOMMANDS = {
    "primitives": ("lever.hw.primitives", "microbenchmarks of the GPU-initiated networking primitives"),
    "ep": ("lever.hw.ep", "native/proxy dispatch+combine kernels over the emulated SRD NIC"),
    "efa-info": ("lever.hw.efa.cli", "what the EFA device here can do (capability report)"),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hw", help="run the real kernels on a CUDA machine, write run records")
    hw_sub = p.add_subparsers(dest="hw_command", required=True)
    for name, (mod, help_) in SUBCOMMANDS.items():
        m = importlib.import_module(mod)
        sp = hw_sub.add_parser(name, help=help_)
        m.add_args(sp)
        sp.set_defaults(func=m.main)
