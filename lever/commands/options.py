"""Command-line options checked where they are read: counts in range, output paths usable.

Everything here runs while the arguments are parsed, so a bad option ends the
command before any simulation starts, with one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from lever.sim.errors import UserError

MAX_SEEDS = 10_000
"""Seeds one command may run: each seed is a full simulation of every op, so 10,000 is
already hours; more is refused rather than left to run out of memory."""
MAX_WORKERS = 1024


class Parser(argparse.ArgumentParser):
    """argparse whose errors are a :class:`UserError`: the command line prints them as one
    line (``lever: error: ...``, exit 2) like every other bad input."""

    def error(self, message: str) -> NoReturn:
        cmd = self.prog.removeprefix("lever").strip()
        hint = f" (lever {cmd} --help)" if cmd else " (lever --help)"
        raise UserError(f"{message}{hint}")


def count(lo: int, hi: int) -> Callable[[str], int]:
    """An integer option in ``[lo, hi]``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer from {lo} to {hi}, got '{text}'") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be from {lo} to {hi}, got {v}")
        return v

    parse.__name__ = f"integer {lo}..{hi}"
    return parse


def output_file(suffix: str = "") -> Callable[[str], Path]:
    """A file the command will write: its folder exists and is writable, it is not a folder,
    and (when ``suffix`` is given) it ends in ``suffix``. Checked before the run starts."""

    def parse(text: str) -> Path:
        p = Path(text)
        if suffix and p.suffix != suffix:
            raise argparse.ArgumentTypeError(f"'{text}': expected a {suffix} file")
        if p.is_dir():
            raise argparse.ArgumentTypeError(f"'{text}' is a directory, not a file")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            raise argparse.ArgumentTypeError(f"'{text}': directory '{parent}' does not exist")
        if not os.access(parent, os.W_OK):
            raise argparse.ArgumentTypeError(f"'{text}': directory '{parent}' is not writable")
        return p

    parse.__name__ = f"output file{' ' + suffix if suffix else ''}"
    return parse


def seeds_option(p: argparse.ArgumentParser, default: int | None, help_: str, *,
                 flag: str = "--seeds") -> None:
    p.add_argument(flag, type=count(1, MAX_SEEDS), default=default, metavar="N", help=help_)


def workers_option(p: argparse.ArgumentParser, help_: str = "processes (default: CPU count; 1 = serial)") -> None:
    p.add_argument("--workers", type=count(1, MAX_WORKERS), default=None, metavar="N", help=help_)
