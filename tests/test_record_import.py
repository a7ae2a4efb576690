"""``lever record import``: benchmark logs of DeepEP, UCCL-EP and pplx-garden -> run records.

Every log here is written by the test in the script's print format (see
``lever.calibration.importers``), from known numbers, so a parser that reads the wrong
field, drops a rank or rounds fails on exact values.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import pytest
from lever.calibration import importers as imp
from lever.calibration.records import RecordError, dump_record, load_record
from lever.sim.errors import UserError

from lever.commands.record import register

DATA = Path(__file__).parent / "data" / "import_logs"

# --- logs in each script's print format --------------------------------------------------

LL_D = [160.12, 158.4, 161.95, 159.03]
LL_C = [301.44, 298.1, 305.02, 299.87]


def ll_log(d: list[float] = LL_D, c: list[float] = LL_C, hook: str = "send + recv",
           unit: str = "GB", prefix: str = "") -> str:
    """DeepEP/UCCL-EP test_low_latency.py: three lines per rank (ranks interleaved)."""
    out = ["Allocating buffer size: 2116.291072 MB ..."]
    for r, (x, y) in enumerate(zip(d, c, strict=True)):
        a = x + y + 20
        out.append(f"{prefix}[rank {r}] Dispatch + combine bandwidth: 1.40 GB/s, avg_t={a:.2f} us, "
                   f"min_t={a - 15:.2f} us, max_t={a + 25:.2f} us")
    for r, (x, y) in enumerate(zip(d, c, strict=True)):
        out.append(f"{prefix}[rank {r}] Dispatch bandwidth: 46.9{r} {unit}/s, avg_t={x:.2f} us | "
                   f"Combine bandwidth: 48.2{r} {unit}/s, avg_t={y:.2f} us")
    for r, (x, y) in enumerate(zip(d, c, strict=True)):
        ds, dr, cs, cr = x / 4, x / 5, y / 4, y / 6
        body = {
            "send + recv": f"{ds:.2f} + {dr:.2f} us | Combine send/recv time: "
                           f"{cs:.2f} + {cr:.2f} us",
            "total = send + recv": f"{ds + dr:.2f} = {ds:.2f} + {dr:.2f} us | Combine send/recv "
                                   f"time: {cs + cr:.2f} = {cs:.2f} + {cr:.2f} us",
            "total": f"{ds + dr:.2f} us | Combine send/recv time: {cs + cr:.2f} us",
        }[hook]
        out.append(f"{prefix}[rank {r}] Dispatch send/recv time: {body}")
    return "\n".join(out) + "\n"


IN_FP8, IN_BF16, IN_COMB = [345.0, 351.0], [512.0, 520.0], [456.78, 470.12]


def internode_log(fp8: list[float] = IN_FP8, bf16: list[float] = IN_BF16,
                  comb: list[float] = IN_COMB, transmit: bool = False) -> str:
    """DeepEP test_internode.py: local rank 0 of each node prints its best configs."""
    out = []
    for f, b, c in zip(fp8, bf16, comb, strict=True):
        out += ["[config] num_tokens=4096, hidden=7168, num_topk_groups=2, num_topk=8",
                "[testing] Running with FP8, with top-k (async=False, previous=False) ... passed",
                "[tuning] SMs 24, NVL chunk 4, RDMA chunk 4: 12 + 999 us, 1.00 GB/s (RDMA), "
                "2.00 GB/s (NVL) "]
        for dt, t in (("FP8", f), ("BF16", b)):
            if transmit:
                out.append(f"[tuning] Best dispatch ({dt}): SMs 24, NVL chunk 20, RDMA chunk 28, "
                           f"transmit: {t:.2f} us, notify: 11.50 us, BW: 45.67 GB/s (RDMA), "
                           "148.90 GB/s (NVL)")
            else:
                out.append(f"[tuning] Best dispatch ({dt}): SMs 24, NVL chunk 20, RDMA chunk 28: "
                           f"11 + {t:.0f} us, 45.67 GB/s (RDMA), 148.90 GB/s (NVL)")
            out.append("")
        if transmit:
            out.append(f"[tuning] Best combine: SMs 24, NVL chunk 4, RDMA chunk 16, transmit: "
                       f"{c:.2f} us, notify: 10.25 us, BW: 63.51 GB/s (RDMA), 207.05 GB/s (NVL)")
        else:
            out.append(f"[tuning] Best combine: SMs 24, NVL chunk 4, RDMA chunk 16, "
                       f"10.25 + {c:.2f} us, 63.51 GB/s (RDMA), 207.05 GB/s (NVL)")
        out.append("")
    return "\n".join(out) + "\n"


PP_KEYS = ("min", "p01", "p25", "p50", "p75", "p95", "p99", "max")
PP = {  # op -> part -> (mean, stddev, [min, p01, p25, p50, p75, p95, p99, max])
    "dispatch": {"both": (215.3, 8.4, [190.1, 196.2, 209.9, 214.8, 220.4, 231.0, 240.7, 301.2]),
                 "send": (30.2, 2.1, [25.0, 26.0, 28.9, 30.0, 31.4, 34.0, 36.0, 50.0]),
                 "recv": (120.4, 6.3, [100.0, 104.0, 116.0, 120.1, 124.0, 131.0, 140.0, 170.0])},
    "combine": {"both": (242.0, 9.9, [210.0, 219.1, 236.0, 241.5, 248.3, 259.5, 270.4, 330.0]),
                "send": (35.5, 2.5, [30.0, 31.0, 34.0, 35.2, 37.0, 39.5, 42.0, 60.0]),
                "recv": (150.2, 7.7, [130.0, 133.0, 145.0, 149.9, 155.0, 163.0, 171.0, 200.0])},
}


def pplx_log(with_json: bool = False, parts: tuple[str, ...] = ("both", "send", "recv")) -> str:
    """pplx-garden bench_all_to_all.py: rank 0's logging lines, then (stdout) the JSON."""
    pre = "[2025-11-05 10:00:01.123] 4242 INFO     bench_all_to_all "
    out = [pre + "Correctness check passed", pre + "Iteration 20000/20000"]
    for op, rows in PP.items():
        for part in parts:
            mean, sd, xs = rows[part]
            stat = f"mean={mean:.1f}±{sd:.1f} μs" + "".join(
                f", {k}={v:.1f} μs" for k, v in zip(PP_KEYS, xs, strict=True))
            bw = ", 34.0 GB/s" if part == "both" else ""
            out.append(f"{pre}{op.capitalize()} {part} time: {stat}{bw}")
    text = "\n".join(out) + "\n"
    if with_json:
        data = {op: {part: {"mean": m, "stddev": s, **dict(zip(PP_KEYS, xs, strict=True))}
                     for part, (m, s, xs) in rows.items()} for op, rows in PP.items()}
        text += json.dumps(data)  # the script writes no newline after it
    return text


# --- harness ---------------------------------------------------------------------------------


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The command as lever.cli.main runs it: one-line errors, exit 2."""
    p = argparse.ArgumentParser(prog="lever")
    sub = p.add_subparsers(dest="command", required=True)
    register(sub)
    args = p.parse_args(argv)
    try:
        rc = args.func(args)
    except (RecordError, UserError) as e:
        print(f"lever: error: {e}", file=sys.stderr)
        rc = 2
    out, err = capsys.readouterr()
    return rc, out, err


def import_json(tmp_path: Path, capsys, fmt: str, text: str, *extra: str) -> dict:
    log = tmp_path / f"{fmt}.log"
    log.write_text(text)
    out = tmp_path / f"{fmt}.json"
    rc, stdout, err = run(["record", "import", fmt, str(log), "--out", str(out), "--nic", "efa",
                           "--json", *extra], capsys)
    assert rc == 0, err
    assert err == ""
    assert len(stdout.splitlines()) == 1  # one JSON object
    rec = json.loads(stdout)
    # what was written is what was printed, and it validates and round-trips
    loaded = load_record(out)
    assert loaded.model_dump(mode="json", exclude_none=True) == rec
    again = tmp_path / "again.json"
    dump_record(loaded, again)
    assert load_record(again) == loaded
    return rec


def check_dist(d: dict, values: list[float]) -> None:
    assert d["median"] == statistics.median(values)
    assert d["n"] == len(values)
    assert d["samples"] == values
    assert d["p10"] <= d["median"] <= d["p90"]


# --- each format -------------------------------------------------------------------------------


@pytest.mark.parametrize("hook", ["send + recv", "total = send + recv", "total"])
def test_deepep_ll(tmp_path, capsys, hook):
    rec = import_json(tmp_path, capsys, "deepep-ll", ll_log(hook=hook))
    check_dist(rec["latency_us"]["dispatch"], LL_D)
    check_dist(rec["latency_us"]["combine"], LL_C)
    assert rec["nic"] == "efa" and rec["what"]["design"] == "DeepEP low-latency"
    m = rec["metrics"]
    assert m["dispatch_gbytes_per_s"]["samples"] == [46.90, 46.91, 46.92, 46.93]
    both = [round(x + y + 20, 2) for x, y in zip(LL_D, LL_C, strict=True)]
    assert m["dispatch_combine_avg_us"]["samples"] == both
    assert m["dispatch_send_recv_us"]["n"] == 4
    if hook != "total":
        assert m["dispatch_send_us"]["samples"] == [round(x / 4, 2) for x in LL_D]
    assert "deepseek-ai/DeepEP" in rec["provenance"]["source"]
    assert imp._sha(ll_log(hook=hook)) in rec["provenance"]["source"]
    assert "ranks_in_log=4" in rec["how"]["notes"]
    assert "sim" not in rec and "workload" not in rec["what"]


def test_uccl_ep_prefixed_and_mb_per_s(tmp_path, capsys):
    pre = "[default0]:"
    text = pre + "✓ All correctness tests passed!\n" + ll_log(unit="MB", prefix=pre)
    rec = import_json(tmp_path, capsys, "uccl-ep", text)
    check_dist(rec["latency_us"]["dispatch"], LL_D)
    check_dist(rec["latency_us"]["combine"], LL_C)
    gbps = rec["metrics"]["combine_gbytes_per_s"]["samples"]  # printed in MB/s
    assert gbps == pytest.approx([0.0482, 0.04821, 0.04822, 0.04823], abs=1e-12)
    assert rec["gate"]["passed"] is True
    assert "uccl-project/uccl ep/bench/test_low_latency.py" in rec["provenance"]["source"]


@pytest.mark.parametrize("transmit", [False, True])
def test_deepep_internode(tmp_path, capsys, transmit):
    rec = import_json(tmp_path, capsys, "deepep-internode", internode_log(transmit=transmit))
    check_dist(rec["latency_us"]["dispatch"], IN_FP8)  # FP8 dispatch; BF16 goes to metrics
    check_dist(rec["latency_us"]["combine"], IN_COMB)
    assert rec["metrics"]["dispatch_bf16_us"]["samples"] == IN_BF16
    assert rec["metrics"]["combine_notify_us"]["samples"] == [10.25, 10.25]
    assert "tokens_per_rank=4096" in rec["how"]["notes"] and "top_k=8" in rec["how"]["notes"]
    assert rec["gate"]["passed"] is True


@pytest.mark.parametrize("with_json", [False, True])
def test_pplx_garden(tmp_path, capsys, with_json):
    rec = import_json(tmp_path, capsys, "pplx-garden", pplx_log(with_json=with_json))
    for op in ("dispatch", "combine"):
        mean, sd, xs = PP[op]["both"]
        # the script prints a summary only: no samples, no n
        assert rec["latency_us"][op] == {"median": xs[3], "mean": mean, "std": sd}
        assert rec["metrics"][f"{op}_p99_us"]["median"] == xs[6]
        assert rec["metrics"][f"{op}_recv_us"]["median"] == PP[op]["recv"][2][3]
    assert rec["gate"]["passed"] is True


def test_pplx_log_and_json_disagree(tmp_path):
    text = pplx_log(with_json=True).replace("p50=214.8 μs", "p50=299.0 μs")
    with pytest.raises(RecordError, match=r"^x\.log: line \d+: p50 299\.0 differs from the JSON"):
        imp.parse_log("pplx-garden", text, label="x.log")


def test_workload_and_sim_link(tmp_path, capsys):
    rec = import_json(tmp_path, capsys, "deepep-ll", ll_log(),
                      "--scenario", "decode-ep8-efa-native", "--ranks", "8", "--nodes", "1",
                      "--tokens", "128", "--hidden", "7168",
                      "--top-k", "8", "--experts", "256", "--lever", "batched-doorbells",
                      "--set", "workload.tokens_per_rank=128", "--id", "my-run", "--gpu", "H100")
    assert rec["id"] == "my-run"
    assert rec["what"]["workload"] == {"ep_ranks": 8, "nodes": 1, "tokens_per_rank": 128,
                                       "hidden": 7168, "top_k": 8, "num_experts": 256}
    assert rec["sim"] == {"scenario": "decode-ep8-efa-native", "levers": ["batched-doorbells"],
                          "set": {"workload.tokens_per_rank": 128}}
    assert rec["what"]["levers"] == ["batched-doorbells"]
    assert rec["what"]["platform"]["gpu"] == "H100"


def test_example_logs():
    """The shipped example logs (tests/data/import_logs) parse to their known numbers."""
    want = {"deepep-ll": (160.31, 301.81, 8), "uccl-ep": (181.5, 263.0, 4),
            "deepep-internode": (348.0, 463.45, 2), "pplx-garden": (214.83, 241.46, None)}
    for fmt, (d, c, n) in want.items():
        p = imp.parse_log(fmt, (DATA / f"{fmt}.log").read_text(encoding="utf-8"), label=fmt)
        rec = imp.to_record(p, record_id=fmt, nic="ib")
        assert (rec.latency_us["dispatch"].median, rec.latency_us["combine"].median) == (d, c)
        assert rec.latency_us["dispatch"].n == n


# --- bad logs ---------------------------------------------------------------------------------


def _one_line_error(fmt: str, text: str, label: str = "run7.log") -> str:
    with pytest.raises(RecordError) as e:
        imp.parse_log(fmt, text, label=label)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(label + ": ")
    return msg


def _cut(text: str, needle: str) -> str:
    """The log up to the middle of the first line holding ``needle`` (a capture cut off)."""
    i = text.index(needle)
    end = text.index("\n", i) if "\n" in text[i:] else len(text)
    return text[: (i + end) // 2]


@pytest.mark.parametrize("fmt,text,needle,line", [
    ("deepep-ll", ll_log(), "[rank 3] Dispatch bandwidth", 9),
    ("deepep-ll", ll_log(), "[rank 1] Dispatch send/recv", 11),
    ("uccl-ep", ll_log(), "[rank 2] Dispatch + combine", 4),
    ("deepep-internode", internode_log(), "[tuning] Best combine", 8),
    ("pplx-garden", pplx_log(), "Combine both time", 6),
    ("pplx-garden", pplx_log(with_json=True), '{"dispatch"', 9),
])
def test_cut_mid_line(fmt, text, needle, line):
    msg = _one_line_error(fmt, _cut(text, needle))
    assert f"line {line}: " in msg
    assert "cut off" in msg


@pytest.mark.parametrize("fmt,text,drop,expect", [
    # rank 3's per-op line missing (the log stopped before it)
    ("deepep-ll", ll_log(), "[rank 3] Dispatch bandwidth",
     r"rank 3 printed 1 'Dispatch \+ combine'"),
    # the whole per-op line kind missing: no dispatch or combine latency
    ("uccl-ep", ll_log(), "Dispatch bandwidth", r"no line '\[rank R\] Dispatch bandwidth"),
    ("deepep-internode", internode_log(), "Best combine",
     r"no '\[tuning\] Best combine: \.\.\.' line"),
    ("deepep-internode", internode_log(), "Best dispatch (BF16)", r"unequal numbers"),
    ("pplx-garden", pplx_log(), "Combine both", r"no 'Combine both time: \.\.\.' line"),
])
def test_missing_op(fmt, text, drop, expect):
    text = "\n".join(s for s in text.splitlines() if drop not in s)
    assert re.search(expect, _one_line_error(fmt, text))


def test_spliced_lines_refused():
    """Two ranks writing at once can splice prints onto one line: refused, not half-read."""
    lines = ll_log().splitlines()
    lines[2:4] = [lines[2] + lines[3]]  # rank 0's and rank 1's 'Dispatch + combine' lines
    msg = _one_line_error("deepep-ll", "\n".join(lines) + "\n")
    assert msg.startswith("run7.log: line 3: cut off or garbled: expected '[rank R] Dispatch + c")


def test_bad_number_names_line():
    text = ll_log().replace("avg_t=158.40 us | ", "avg_t=nan us | ")
    assert "run7.log: line 7: 'nan' is not a number (expected the dispatch avg_t in us)" == \
        _one_line_error("deepep-ll", text)


def test_internode_bandwidth_only_version_refused():
    text = ("[tuning] Best dispatch (FP8): SMs 24, NVL chunk 8, RDMA chunk 16: 45.67 GB/s (RDMA), "
            "123.45 GB/s (NVL)\n")
    assert "prints bandwidth only" in _one_line_error("deepep-internode", text)


def test_two_pplx_runs_refused():
    assert "several runs" in _one_line_error("pplx-garden", pplx_log() + pplx_log())


def test_unknown_format(tmp_path, capsys):
    with pytest.raises(RecordError, match=r"^unknown format 'nccl-tests' \(known: deepep-inter"):
        imp.parse_log("nccl-tests", "")
    log = tmp_path / "x.log"
    log.write_text(ll_log())
    rc, out, err = run(["record", "import", "nccl-tests", str(log),
                        "--out", str(tmp_path / "r.json"), "--nic", "efa"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("lever: error: unknown format 'nccl-tests'") and err.count("\n") == 1


# --- the command's guards ----------------------------------------------------------------


def test_out_dir_missing_fails_before_anything(tmp_path, capsys):
    missing = tmp_path / "no" / "such"
    # the log does not exist either: the --out check must come first
    rc, out, err = run(["record", "import", "deepep-ll", str(tmp_path / "absent.log"),
                        "--out", str(missing / "r.json"), "--nic", "efa"], capsys)
    assert rc == 2 and out == ""
    assert err == f"lever: error: --out {missing / 'r.json'}: directory {missing} does not exist\n"
    assert not (tmp_path / "no").exists()


def test_no_clobber_without_force(tmp_path, capsys):
    log = tmp_path / "a.log"
    log.write_text(ll_log())
    out = tmp_path / "r.json"
    out.write_text("keep me")
    base = ["record", "import", "deepep-ll", str(log), "--out", str(out), "--nic", "efa"]
    rc, _, err = run(base, capsys)
    assert rc == 2 and "exists (pass --force" in err and out.read_text() == "keep me"
    rc, stdout, err = run([*base, "--force"], capsys)
    assert rc == 0 and load_record(out).latency_us["dispatch"].median == statistics.median(LL_D)
    med = statistics.median(LL_D)
    assert stdout.startswith(f"wrote {out}: deepep-ll-a: dispatch median {med:.2f} us (n=4)")


@pytest.mark.parametrize("extra,expect", [
    (["--nic", "emulated-srd"], "--nic emulated-srd: one of efa, ib"),
    (["--nic", "efa", "--set", "workload.ep_ranks=8"], "--set needs --scenario"),
    (["--nic", "efa", "--lever", "no-such-lever"], "--lever no-such-lever: no such lever"),
    (["--nic", "efa", "--ranks", "0"], "--ranks: must be >= 1"),
    (["--nic", "ib", "--scenario", "decode-ep8-efa-native"], "record deepep-ll-a is nic 'ib'"),
    (["--nic", "efa", "--scenario", "decode-ep8-efa-native", "--ranks", "16", "--nodes", "2",
      "--tokens", "128", "--hidden", "7168", "--top-k", "8", "--experts", "256"],
     "workload.ep_ranks: the run had 16, scenario 'decode-ep8-efa-native' has 8"),
])
def test_bad_options_one_line(tmp_path, capsys, extra, expect):
    log = tmp_path / "a.log"
    log.write_text(ll_log())
    out = tmp_path / "r.json"
    argv = ["record", "import", "deepep-ll", str(log), "--out", str(out), *extra]
    rc, stdout, err = run(argv, capsys)
    assert rc == 2 and stdout == "" and err.count("\n") == 1
    assert err.startswith("lever: error: ") and expect in err
    assert not out.exists()


def test_to_record_refuses_emulated_nic_and_conflicting_workload():
    p = imp.parse_log("deepep-internode", internode_log(), label="n.log")
    with pytest.raises(RecordError, match=r"^n\.log: nic: 'emulated-srd'"):
        imp.to_record(p, record_id="x", nic="emulated-srd")
    with pytest.raises(RecordError, match=r"^n\.log: workload\.hidden: the log says 7168, "
                                          r"the options 4096"):
        imp.to_record(p, record_id="x", nic="efa", workload={"hidden": 4096})
    rec = imp.to_record(p, record_id="x", nic="efa", workload={"ep_ranks": 16, "nodes": 2,
                                                               "num_experts": 256})
    assert rec.what.workload is not None and rec.what.workload.tokens_per_rank == 4096
