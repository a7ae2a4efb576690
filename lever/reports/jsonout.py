"""``--json``: one strict JSON object on stdout, and nothing else there.

JSON has no NaN or Infinity. A number the command could not compute (a band
from a record with no spread, say) is written as ``null``, never as the
``NaN`` token that Python would emit and strict parsers reject.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (recursively)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def print_json(obj: Any) -> None:
    """One line of strict JSON on stdout."""
    sys.stdout.write(json.dumps(finite(obj), allow_nan=False) + "\n")
