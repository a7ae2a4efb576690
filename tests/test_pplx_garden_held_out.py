"""The pplx-garden held-out benchmark's bookkeeping (benchmarks/pplx_garden_held_out.py): signed
errors against the published numbers, and whether the model puts EFA on the same side of
ConnectX-7 as the publication does. The model runs themselves are the benchmark's, not a test's."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_benchmark


def _bench():
    return load_benchmark("pplx_garden_held_out")


def _row(nic: str, ep: int, model: tuple[float, float], published: tuple[float, float]) -> dict:
    return {"nic": nic, "ep": ep, "model": dict(zip(("dispatch", "combine"), model, strict=True)),
            "published": dict(zip(("dispatch", "combine"), published, strict=True))}


def test_errors_are_signed_and_ratios_compare_sides_of_one():
    b = _bench()
    rows = [_row("efa", 16, (220.0, 200.0), (200.0, 250.0)),
            _row("cx7", 16, (100.0, 250.0), (110.0, 200.0))]
    s = b.summarise(rows)
    assert rows[0]["error_pct"] == pytest.approx({"dispatch": 10.0, "combine": -20.0})
    assert s["median_abs_error_pct"]["efa"] == pytest.approx(15.0)
    assert s["max_abs_error_pct"]["cx7"] == pytest.approx(25.0)
    ratio = {x["op"]: x for x in s["efa_over_cx7"]}
    assert ratio["dispatch"]["published"] == pytest.approx(200.0 / 110.0)
    assert ratio["combine"]["model"] == pytest.approx(200.0 / 250.0)
    # dispatch: EFA slower in both; combine: slower published (1.25), faster modelled (0.8)
    assert s["efa_over_cx7_same_side_of_1"] == "1 of 2"


def test_the_published_table_is_pplx_gardens_decode_table():
    b = _bench()
    assert b.PUBLISHED["efa"][16] == (214.8, 241.5) and b.PUBLISHED["cx7"][64] == (187.5, 309.1)
    assert set(b.PUBLISHED["efa"]) == set(b.PUBLISHED["cx7"]) == {8, 16, 32, 64}
    assert b.PLATFORM == {"efa": "p5en", "cx7": "ib-cx7-calibrated"}
