"""Same scenario, same seed: the same numbers as the committed golden file, to the last bit."""

from __future__ import annotations

import json

import pytest

from tests.golden_cases import GOLDEN, compute


@pytest.fixture(scope="module")
def now():
    return compute()


def test_golden_bit_for_bit(now):
    want = json.loads(GOLDEN.read_text())
    assert set(now) == set(want)
    for key in want:
        assert now[key]["latency_us"] == want[key]["latency_us"], key
        assert now[key]["counters"] == want[key]["counters"], key
        assert now[key]["events"] == want[key]["events"], key
