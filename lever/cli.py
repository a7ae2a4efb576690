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

# The module that registers each subcommand, in help order.
COMMANDS = {
    "simulate": "lever.commands.simulate",
    "hw": "lever.commands.hw",
    "calibrate": "lever.commands.calibrate",
    "validate": "lever.commands.calibrate",
    "predict": "lever.commands.predict",
    "compare": "lever.commands.predict",
    "sweep": "lever.commands.sweep",
    "sensitivity": "lever.commands.sweep",
    "record": "lever.commands.record",
    "designs": "lever.commands.designs",
    "params": "lever.commands.params",
}
REGISTRARS = list(dict.fromkeys(COMMANDS.values()))
"""Modules that contribute subcommands, in help order."""


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command line. Given ``argv``, only the module of the command it names is
    imported (a command's start-up then pays for its own imports, not every command's:
    the calibration, record and rich modules cost ~0.15 s); without one, or for a name
    that is not a command (``--help``, a typo), every module registers."""
    p = Parser(prog="lever", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    first = next((a for a in argv or [] if not a.startswith("-")), None)
    mods = [COMMANDS[first]] if first in COMMANDS else REGISTRARS
    for mod in mods:
        importlib.import_module(mod).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)
        rc = args.func(args)
    except UserError as e:  # ScenarioError, RecordError... are UserErrors
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
