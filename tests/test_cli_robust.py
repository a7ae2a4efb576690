"""Bad input to any command: one line on stderr naming the option or file, exit 2, nothing run."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console
from rich.table import Table

from lever.cli import main
from lever.reports.jsonout import print_json
from lever.reports.tables import show


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lever: error: "), err
    return err


@pytest.mark.parametrize("argv, words", [
    (["simulate", "decode-ep8-efa-native", "--seeds", "0"], ["--seeds", "1 to 10000"]),
    (["simulate", "decode-ep8-efa-native", "--seeds", "1000000000"], ["--seeds", "10000"]),
    (["simulate", "decode-ep8-efa-native", "--cp-seeds", "0"], ["--cp-seeds"]),
    (["predict", "batched-doorbells", "--seeds", "0"], ["--seeds"]),
    (["simulate", "decode-ep8-efa-native", "--workers", "0"], ["--workers"]),
    (["simulate", "decode-ep8-efa-native", "--trace", "/no/such/dir/t.json"], ["--trace", "does not exist"]),
    (["simulate", "decode-ep8-efa-native", "--plot", "/tmp"], ["--plot"]),
    (["predict", "batched-doorbells", "--out", "/no/such/dir/p.json"], ["--out", "does not exist"]),
    (["calibrate", "x.json", "--out", "/no/such/dir/p.toml"], ["--out"]),
    (["sweep", "decode-ep8-efa-native", "--grid", "seed=1,2", "--out", "/no/dir/r.csv"], ["--out"]),
    (["simulate", "decode-ep8-efa-native", "--set", "platform.gpu.fence_ns=inf"], ["fence_ns", "finite"]),
    (["simulate", "decode-ep8-efa-native", "--set", "platform.gpu.fence_ns=nan"], ["fence_ns"]),
    (["simulate", "decode-ep8-efa-native", "--set", "ops=[]"], ["ops"]),
    (["simulate", "decode-ep8-efa-native", "--set", "novalue"], ["--set", "PATH=VALUE"]),
])
def test_bad_options_end_in_one_line_before_any_run(argv, words, capsys, monkeypatch):
    import lever.sim.results as results

    def never(*a, **k):
        raise AssertionError("a simulation ran")

    monkeypatch.setattr(results, "simulate", never)
    assert main(argv) == 2
    err = _err(capsys)
    for w in words:
        assert w in err, err


def test_a_directory_or_binary_record_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bin.json"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    pre = tmp_path / "p.json"
    pre.write_text("{}")
    for rec in (tmp_path, bad):
        assert main(["calibrate", str(rec), "--out", str(tmp_path / "o.toml")]) == 2
        err = _err(capsys)
        assert ("directory" in err) or ("UTF-8" in err), err
    assert not (tmp_path / "o.toml").exists()


def test_a_lever_files_bad_set_names_the_lever_file(tmp_path, capsys):
    lev = tmp_path / "bad-lever.toml"
    lev.write_text('name = "bad"\nbaseline = "decode-ep8-efa-native"\ndescription = "x"\n'
                   '[set]\n"design.doorbell_batch" = -3\n')
    assert main(["predict", str(lev), "--seeds", "1", "--workers", "1", "--no-critical-path"]) == 2
    err = _err(capsys)
    assert "bad-lever.toml" in err and "design.doorbell_batch" in err and "--set" not in err


def test_a_bad_baseline_is_reported_before_a_missing_description(tmp_path, capsys):
    lev = tmp_path / "l.toml"
    lev.write_text('name = "l"\nbaseline = "no-such-scenario"\n')
    assert main(["predict", str(lev), "--seeds", "1"]) == 2
    assert "baseline" in _err(capsys)


def test_bare_dotted_keys_in_a_lever_set_mean_the_dotted_path(tmp_path):
    from lever.sim.levers import load_lever, load_with_levers

    lev = tmp_path / "l.toml"
    lev.write_text('name = "l"\nbaseline = "decode-ep8-efa-native"\ndescription = "x"\n'
                   '[set]\ndesign.doorbell_batch = 4\n')
    assert load_lever(lev).set == {"design.doorbell_batch": 4}
    scn = load_with_levers("decode-ep8-efa-native", [str(lev)])
    assert scn.design.doorbell_batch == 4 and scn.design.num_sms > 1  # the rest of design stays


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    import lever.commands.simulate as sim_cmd

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim_cmd, "main", interrupted)
    assert main(["simulate", "decode-ep8-efa-native"]) == 130
    err = capsys.readouterr().err
    assert err == "lever: interrupted\n"


def test_json_output_is_strict(capsys):
    print_json({"a": math.nan, "b": [1.0, math.inf], "c": {"d": -math.inf}})
    out = capsys.readouterr().out
    assert json.loads(out) == {"a": None, "b": [1.0, None], "c": {"d": None}}
    assert "NaN" not in out and "Infinity" not in out


def test_tables_keep_names_whole_at_80_columns():
    buf = io.StringIO()
    con = Console(file=buf, width=80)
    t = Table(title="levers")
    for c in ("lever", "gain us", "dispatch delta us", "dispatch band", "combine delta us",
              "combine band", "main shift"):
        t.add_column(c)
    for name in ("lazy-completion-dispatch", "lazy-completion-combine"):
        t.add_row(name, "+1.0", "-1.0", "[-2.0, -0.5]", "-1.0", "[-2.0, -0.5]", "d: fence 4%->0%")
    show(t, con, caption="delta = lever - baseline")
    text = buf.getvalue()
    assert "…" not in text
    assert "lazy-completion-dispatch" in text and "lazy-completion-combine" in text
    assert "delta = lever - baseline" in text


def test_a_table_wider_than_80_columns_folds_instead_of_losing_its_right_edge():
    # a 32-character first column once made rich crop the table's right side at 80 columns
    buf = io.StringIO()
    con = Console(file=buf, width=80)
    t = Table(title="params")
    for c in ("parameter", "value", "unit", "± 1σ", "kind"):
        t.add_column(c)
    t.add_row("nvlink.self_copy_loads_in_flight", "41934.4", "ns/KiB", "48%", "fitted, shared (hopper)")
    show(t, con)
    rows = [ln for ln in buf.getvalue().splitlines() if ln.startswith(("│", "┃"))]
    assert rows and all(ln.rstrip().endswith(("│", "┃")) for ln in rows)
    assert "nvlink.self_copy_loads_in_flight" in buf.getvalue()
    assert "(hopper)" in buf.getvalue()


def test_params_at_80_columns_lists_each_source_under_the_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["params", "ib-cx7-calibrated", "--no-compare"]) == 0
    out = capsys.readouterr().out
    assert "sources:" in out
    assert max(len(ln) for ln in out.splitlines()) <= 80
    assert "  gpu.pcie_read_ns: " in out


def test_sensitivity_ranges_stay_inside_the_free_bounds():
    from lever.calibration.sensitivity import parameter_space
    from lever.sim.params import Calibrated, FreeParam
    from lever.sim.scenario import load

    scn = load("decode-ep8-efa-native")
    scn.platform.free = {"nic.line_rate_gbps": FreeParam(lo=50.0, hi=200.0)}
    scn.platform.calibrated = Calibrated(names=["nic.line_rate_gbps"], log_mean=[math.log(100.0)],
                                         log_cov=[[4.0]])  # sigma of a factor e^2: 1.8 .. 5500
    (p,) = parameter_space(scn, sigmas=2.0)
    assert (p["lo"], p["hi"]) == pytest.approx((50.0, 200.0)) and "clipped" in p["source"]
