"""``lever simulate``: the JSON contract, trace and plot outputs, and bad-input errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lever.sim.params import CATEGORIES

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--set", "workload.tokens_per_rank=16"]


def lever(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lever.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_json_contract_trace_and_plot(tmp_path):
    trace = tmp_path / "t.json"
    plot = tmp_path / "p.png"
    r = lever("simulate", "decode-ep16-efa-native", *SMALL, "--seeds", "2", "--json",
              "--trace", str(trace), "--plot", str(plot), "--cp-seeds", "1")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # stdout is one JSON object and nothing else
    assert out["scenario"] == "decode-ep16-efa-native" and out["seeds"] == 2
    assert out["events"] > 1000 and out["wall_s"] > 0
    for op in ("dispatch", "combine"):
        s = out["ops"][op]
        assert 0 < s["p50_us"] <= s["p99_us"]
        att = out["attribution"][op]
        assert set(att["profiler"]) <= set(CATEGORIES)
        assert abs(sum(att["profiler"].values()) - 1) < 1e-3
        assert set(att["critical_path"]) == set(CATEGORIES)
    tr = json.loads(trace.read_text())
    tracks = {e["args"]["name"] for e in tr["traceEvents"] if e.get("name") == "thread_name"}
    assert any(t.startswith("sm") for t in tracks) and any(t.startswith("fwd") for t in tracks)
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_set_changes_the_result():
    a = json.loads(lever("simulate", "decode-ep16-efa-native", *SMALL, "--seeds", "1", "--json",
                         "--no-critical-path").stdout)
    b = json.loads(lever("simulate", "decode-ep16-efa-native", *SMALL, "--seeds", "1", "--json",
                         "--no-critical-path", "--set", "platform.fabric.base_latency_ns=200000").stdout)
    assert b["ops"]["dispatch"]["p50_us"] > a["ops"]["dispatch"]["p50_us"] + 20


BASE = '''include = ["{root}/scenarios/platforms/efa-p5.toml", "{root}/scenarios/workloads/decode-ep16.toml",
           "{root}/scenarios/designs/v2-hybrid-native.toml"]
'''


@pytest.mark.parametrize("body, field, why", [
    ("[design]\nbogus_knob = 3\n", "design.bogus_knob", "unknown key"),
    ("[design]\nnum_sms = \"many\"\n", "design.num_sms", "integer"),
    ("[platform.fabric]\nbase_latency_ns = -5.0\n", "platform.fabric.base_latency_ns", "greater than or equal"),
    ("include = [\"nowhere/missing.toml\"]\n", "include", "missing file"),
])
def test_bad_scenarios_fail_with_one_line(tmp_path, body, field, why):
    f = tmp_path / "bad.toml"
    text = body if body.startswith("include") else BASE.format(root=ROOT) + body
    f.write_text(text)
    r = lever("simulate", str(f), "--seeds", "1", "--no-critical-path")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "bad.toml" in lines[0] and field in lines[0] and why in lines[0], lines[0]
    assert r.stdout == ""


def test_error_names_the_included_file_that_holds_the_bad_value(tmp_path):
    plat = tmp_path / "plat.toml"
    plat.write_text("[platform.gpu]\nfence_ns = -1.0\n")
    f = tmp_path / "scn.toml"
    f.write_text(BASE.format(root=ROOT).replace("]\n", f', "{plat}"]\n', 1))
    r = lever("simulate", str(f), "--no-critical-path")
    assert r.returncode == 2
    assert "plat.toml" in r.stderr and "platform.gpu.fence_ns" in r.stderr


def test_trace_not_half_written_on_error(tmp_path):
    out = tmp_path / "t.json"
    r = lever("simulate", "decode-ep16-efa-native", "--set", "design.num_sms=0", "--trace", str(out))
    assert r.returncode == 2 and not out.exists()
