"""The user-facing error type: every bad input ends in one of these.

Its message is the whole story, printed by the command line as one line on
stderr with exit 2. Text the user gave (a path, a value) may carry newlines or
control characters; they are shown escaped so the message stays one line.
"""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """An error whose message is the whole story: printed as one line, exit 2."""

    def __init__(self, message: object = "") -> None:
        text = str(message)
        if any(c in text for c in "\n\r\t\x0b\x0c") or not text.isprintable():
            text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
        super().__init__(text)


def read_user_file(path: Path, error: type[UserError], kind: str) -> str:
    """A user's input file as text, or ``error`` with one line saying why it can not be read
    (missing, a directory, not UTF-8, unreadable); ``kind`` names what was expected."""
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {kind} file") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start}): not a {kind} file") from None
    except OSError as e:
        raise error(f"{path}: can not be read: {e.strerror}") from None
