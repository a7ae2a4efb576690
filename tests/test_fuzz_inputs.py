"""Any input to the loaders gives a validated object or the one-line error, never another exception."""

from __future__ import annotations

import json
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lever.calibration.records import RecordError, RunRecord, load_record, parse_record
from lever.sim.levers import Lever, load_lever
from lever.sim.params import Scenario
from lever.sim.scenario import ScenarioError, load, parse_set

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# paths the loader knows, and some it does not
PATHS = ["design.doorbell_batch", "design.signal_mode", "design.num_sms", "design.path",
         "workload.ep_ranks", "workload.tokens_per_rank", "workload.num_experts", "ops", "seed",
         "platform.gpu.fence_ns", "platform.fabric.loss_prob", "platform.fabric.jitter.sigma",
         "platform.nic.mtu_bytes", "platform.free", "design", "platform.gpu", "bogus.key",
         "design.bogus", "workload.ep_ranks.x"]
VALUES = st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
                   st.booleans(), st.text(max_size=12), st.none(),
                   st.lists(st.integers(-5, 5), max_size=3), st.sampled_from(["dispatch", "combine"]),
                   st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


def _one_line(e: Exception) -> None:
    msg = str(e)
    assert msg and "\n" not in msg, msg


@FAST
@given(st.text(max_size=60))
def test_set_parser_gives_a_pair_or_one_line(text):
    try:
        path, _value = parse_set(text)
    except ScenarioError as e:
        _one_line(e)
    else:
        assert path and "=" in text


@FAST
@given(st.dictionaries(st.sampled_from(PATHS), VALUES, max_size=4))
def test_any_overrides_give_a_scenario_or_one_line(overrides):
    try:
        scn = load("decode-ep8-efa-native", overrides)
    except ScenarioError as e:
        _one_line(e)
    else:
        assert isinstance(scn, Scenario)


TOML_CHARS = string.ascii_letters + string.digits + ' =[]{}"\'.,_-#\n\t+:'


@FAST
@given(st.text(alphabet=TOML_CHARS, max_size=200), st.binary(max_size=8))
def test_any_scenario_file_gives_a_scenario_or_one_line(tmp_path, text, junk):
    f = tmp_path / "s.toml"
    body = 'include = ["platforms/efa-p5.toml", "workloads/decode-ep8.toml", "designs/v2-hybrid-native.toml"]\n'
    f.write_bytes(body.encode() + text.encode() + junk)
    try:
        from lever.sim import scenario

        inc = scenario.SCENARIO_DIR
        f.write_bytes(body.replace('"platforms', f'"{inc}/platforms').replace('"workloads', f'"{inc}/workloads')
                      .replace('"designs', f'"{inc}/designs').encode() + text.encode() + junk)
        scn = load(f)
    except ScenarioError as e:
        _one_line(e)
    else:
        assert isinstance(scn, Scenario)


@FAST
@given(st.text(alphabet=TOML_CHARS, max_size=200))
def test_any_lever_file_gives_a_lever_or_one_line(tmp_path, text):
    f = tmp_path / "lev.toml"
    f.write_text('name = "x"\nbaseline = "decode-ep8-efa-native"\n' + text)
    try:
        lev = load_lever(f)
    except ScenarioError as e:
        _one_line(e)
    else:
        assert isinstance(lev, Lever)


JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)


@FAST
@given(st.one_of(JSONISH, st.fixed_dictionaries({
    "schema_version": st.sampled_from([1, 2, "1"]), "id": st.text(max_size=8),
    "nic": st.sampled_from(["efa", "ib", "emulated-srd", "x"]),
    "latency_us": st.dictionaries(st.sampled_from(["dispatch", "combine", "x"]),
                                  st.dictionaries(st.sampled_from(["median", "p10", "p90", "n"]),
                                                  st.floats(), max_size=4), max_size=2)})))
def test_any_record_data_gives_a_record_or_one_line(data):
    try:
        rec = parse_record(data, "fuzz")
    except RecordError as e:
        _one_line(e)
    else:
        assert isinstance(rec, RunRecord)


@FAST
@given(st.binary(max_size=64))
def test_any_record_file_gives_a_record_or_one_line(tmp_path, blob):
    f = tmp_path / "r.json"
    f.write_bytes(blob)
    try:
        load_record(f)
    except RecordError as e:
        _one_line(e)


def test_record_loader_refuses_a_directory_and_non_finite_numbers(tmp_path):
    for bad in (tmp_path, ):
        try:
            load_record(bad)
        except RecordError as e:
            assert "directory" in str(e)
    f = tmp_path / "nan.json"
    f.write_text(json.dumps({"schema_version": 1, "id": "x", "nic": "efa",
                             "latency_us": {"dispatch": {"median": float("nan")}}}))
    try:
        load_record(f)
        raise AssertionError("NaN accepted")
    except RecordError as e:
        assert "NaN" in str(e)
