"""Every mutant of ``benchmarks/mutants.py`` still applies: its old text occurs exactly once in
its file. A refactor that moves a mechanism's code must move its mutant with it, or the mutation
run (about 30 min, not part of CI) stops at that mutant."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mutants():
    spec = importlib.util.spec_from_file_location("lever_mutants", ROOT / "benchmarks" / "mutants.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["lever_mutants"] = mod
    spec.loader.exec_module(mod)
    return mod.MUTANTS


MUTANTS = _mutants()


@pytest.mark.parametrize("m", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_edits_one_place(m):
    text = (ROOT / m.file).read_text()
    assert text.count(m.old) == 1, f"{m.name}: {text.count(m.old)} matches in {m.file}"
    assert m.old != m.new
