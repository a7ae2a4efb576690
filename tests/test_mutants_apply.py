"""Every mutant of ``benchmarks/mutants.py`` still applies: its old text occurs exactly once in
its file. A refactor that moves a mechanism's code must move its mutant with it, or the mutation
run (about 30 min, not part of CI) stops at that mutant."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import ROOT, load_benchmark

MUTANTS = load_benchmark("mutants").MUTANTS


@pytest.mark.parametrize("m", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_edits_one_place(m):
    text = (ROOT / m.file).read_text()
    assert text.count(m.old) == 1, f"{m.name}: {text.count(m.old)} matches in {m.file}"
    assert m.old != m.new
