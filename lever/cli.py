"""Entry point of the ``lever`` command.

Each area registers its own subcommands (``register(subparsers)`` in its
``cli`` module) so the command line grows without one file owning all of it.
User errors (bad scenario, bad record) are one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from lever.commands.options import Parser
from lever.sim.errors import UserError  # re-exported: subcommands raise lever.cli.UserError

# Modules that contribute subcommands, in help order.
REGISTRARS = [
    "lever.commands.simulate",
    "lever.commands.hw",
    "lever.commands.calibrate",
    "lever.commands.predict",
    "lever.commands.sweep",
    "lever.commands.record",
    "lever.commands.designs",
    "lever.commands.params",
]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="lever", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for mod in REGISTRARS:
        importlib.import_module(mod).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from lever.calibration.records import RecordError
    from lever.sim.scenario import ScenarioError

    try:
        args = build_parser().parse_args(argv)
        rc = args.func(args)
    except (ScenarioError, RecordError, UserError) as e:
        print(f"lever: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outputs are written atomically: nothing half-written stays
        print("lever: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
