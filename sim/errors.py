"""The user-facing error type: every bad input ends in one of these.

Its message is the whole story, printed by the command line as one line on
stderr with exit 2. Text the user gave (a path, a value) may carry newlines or
control characters; they are shown escaped so the message stays one line.
"""

from __future__ import annotations


class UserError(Exception):
    """An error whose message is the whole story: printed as one line, exit 2."""

    def __init__(self, message: object = "") -> None:
        text = str(message)
        if any(c in text for c in "\n\r\t\x0b\x0c") or not text.isprintable():
            text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
        super().__init__(text)
