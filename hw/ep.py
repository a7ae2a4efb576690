"""Harness for `lever hw ep` (being built; see the issue tracker)."""

from __future__ import annotations

import argparse


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="record path to write")


def main(args: argparse.Namespace) -> int:
    from hw.device import require_cuda

    require_cuda()
    raise NotImplementedError("lever hw ep is not built yet")
