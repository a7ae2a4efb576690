"""Progress on stderr, so ``--json`` output on stdout stays one clean object."""

from __future__ import annotations


class _NoBar:
    """What a disabled bar does (nothing), without importing rich: most runs are not on a
    terminal (``--json``, pipes, the tests), and rich costs ~0.05 s of start-up."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, *args: object, **kwargs: object) -> int:
        return 0

    def update(self, *args: object, **kwargs: object) -> None:
        return None

    def advance(self, *args: object, **kwargs: object) -> None:
        return None


def progress_bar(enabled: bool, unit: str = ""):
    """A rich progress bar on stderr; ``unit`` names what it counts (simulations, folds...)."""
    if not enabled:
        return _NoBar()
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
