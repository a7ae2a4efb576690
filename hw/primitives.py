"""Harness for `lever hw primitives` (being built; see the issue tracker)."""

from __future__ import annotations

import argparse


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="record path to write")


def main(args: argparse.Namespace) -> int:
    from hw.device import require_cuda

    require_cuda()
    raise NotImplementedError("lever hw primitives is not built yet")
