"""Progress on stderr, so ``--json`` output on stdout stays one clean object."""

from __future__ import annotations


def progress_bar(enabled: bool):
    """A rich progress bar on stderr (stdout stays clean for ``--json``)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled,
                    transient=False)
