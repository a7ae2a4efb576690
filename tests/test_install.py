"""A non-editable install is one ``lever`` package that finds its scenarios from any directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = out.glob("*.whl")
    site = out / "site"
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
    return site


def test_the_wheel_holds_one_package_and_its_data(wheel_dir):
    tops = {p.name for p in wheel_dir.iterdir() if not p.name.endswith(".dist-info")}
    assert tops == {"lever"}, tops  # no generic top-level sim/, hw/, calibration/
    lev = wheel_dir / "lever"
    assert (lev / "scenarios" / "decode-ep16-efa-native.toml").is_file()
    assert len(list((lev / "scenarios" / "levers").glob("*.toml"))) >= 10
    assert len(list((lev / "scenarios" / "platforms").glob("*.toml"))) >= 4
    assert len(list((lev / "calibration" / "data").glob("*.json"))) >= 10
    assert list((lev / "hw" / "ep").glob("*.cu"))


def _run(wheel_dir: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(wheel_dir)}
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def test_installed_lever_simulates_the_default_scenario_by_name_from_elsewhere(wheel_dir, tmp_path):
    r = _run(wheel_dir, tmp_path, "-m", "lever", "simulate", "decode-ep16-efa-native", "--seeds", "1",
             "--no-critical-path", "--workers", "1", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["scenario"] == "decode-ep16-efa-native" and res["ops"]["dispatch"]["p50_us"] > 0
    where = _run(wheel_dir, tmp_path, "-c", "import lever.sim, lever.scenarios; "
                 "print(lever.sim.__file__); print(lever.scenarios.__file__)")
    assert where.returncode == 0 and all(line.startswith(str(wheel_dir)) for line in where.stdout.split())
    bare = _run(wheel_dir, tmp_path, "-c", "import sim")
    assert bare.returncode != 0 and "No module named 'sim'" in bare.stderr


def test_nothing_to_do_exits_non_zero_with_one_line(tmp_path, monkeypatch, capsys):
    from lever.sim import levers

    from lever.cli import main

    monkeypatch.setattr(levers, "LEVER_DIR", tmp_path)
    assert main(["predict", "--all", "--seeds", "1", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "no lever files" in err and err.count("\n") == 1
    assert main(["validate", "--records"]) == 2
    err = capsys.readouterr().err
    assert "needs at least 2 records" in err and err.count("\n") == 1
