"""Progress on stderr, so ``--json`` output on stdout stays one clean object."""

from __future__ import annotations


def progress_bar(enabled: bool, unit: str = ""):
    """A rich progress bar on stderr; ``unit`` names what it counts (simulations, folds...)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    cols = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn()]
    if unit:
        cols.append(TextColumn(unit))
    cols += [TimeElapsedColumn(), TimeRemainingColumn()]
    return Progress(*cols, console=Console(stderr=True), disable=not enabled, transient=False)
