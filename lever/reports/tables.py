"""Tables on the terminal that stay readable at any width.

A name is never cut to an ellipsis (two levers would read alike): columns fold
their text onto the next line instead. Piped output is 80 columns wide, as
rich sees it; ``--wide`` prints as wide as the table needs.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def console(wide: bool = False) -> Console:
    return Console(width=240) if wide else Console()


def show(table: Table, con: Console | None = None, caption: str | None = None) -> None:
    """Print ``table`` with every column folding rather than truncating; ``caption`` says
    what the numbers are (shown under the table)."""
    con = con or console()
    for i, col in enumerate(table.columns):
        col.overflow = "fold"
        col.no_wrap = False
        if i == 0:  # the row's name: whole on one line where it takes at most 40% of the width
            # (no_wrap, not min_width: rich does not count a min_width when it narrows the
            # other columns, and crops the table's right edge instead)
            longest = max([len(str(c)) for c in col._cells] + [len(str(col.header))])
            col.no_wrap = longest <= 0.4 * con.width
    if caption:
        table.caption = caption
        table.caption_justify = "left"
    con.print(table)
