"""The scripts of benchmarks/ loaded as modules (they are not a package), for the tests that
exercise them: one loader for all of them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/{name}.py`` as a module, registered in ``sys.modules`` under
    ``bench_{name}`` (its dataclasses resolve their module there)."""
    mod_name = f"bench_{name}"
    spec = importlib.util.spec_from_file_location(mod_name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod
