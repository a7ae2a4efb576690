"""The ``lever`` command: simulate, predict, calibrate, compare, validate, hw, sweep."""

__version__ = "0.1.0"
