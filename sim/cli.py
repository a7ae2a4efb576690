"""``lever simulate`` (being built)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a scenario")
    p.add_argument("scenario")
    p.set_defaults(func=lambda a: 0)
