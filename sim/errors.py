"""The user-facing error type, in its own module so ``python -m lever.cli`` and
``import lever.cli`` share one class."""


class UserError(Exception):
    """An error whose message is the whole story: printed as one line, exit 2."""
