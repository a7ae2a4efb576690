"""Turn the printed output of public MoE expert-parallel benchmarks into run records.

``lever record import`` (``lever.commands.record``) reads a log a user captured on their
own cluster and hands it here; the record then goes to ``lever compare`` like any other.
Everything here is pure (text in, objects out: no files, no printing, no torch), so the
parsers are testable on strings and the command owns all I/O.

Each format reads exactly the lines its script prints (checked against the public
repositories; see ``FORMATS``) and nothing it does not print: an unknown workload size is
left unknown rather than filled with a default. A log that stops early or has a line cut
mid-way is refused (one-line :class:`RecordError` naming the file and line), because a
truncated log silently drops ranks and would bias the median.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from hashlib import sha256 as _sha256
from typing import Any

from lever.calibration.records import SCHEMA_VERSION, RecordError, RunRecord, parse_record

OPS = ("dispatch", "combine")
IMPORT_NICS = ("efa", "ib")  # a real NIC only: an import never claims "emulated-srd"
WORKLOAD_KEYS = ("ep_ranks", "nodes", "tokens_per_rank", "hidden", "top_k", "num_experts")


@dataclass(frozen=True)
class Values:
    """One measured quantity as the log gives it.

    Either every value (one per rank, or per best-config line) in ``values``, or, when the
    script prints only its own summary (pplx-garden), ``median``/``mean``/``std``.
    """

    values: tuple[float, ...] = ()
    median: float | None = None
    mean: float | None = None
    std: float | None = None
    lines: tuple[int, ...] = ()  # 1-based log lines the numbers came from

    def distribution(self) -> dict[str, Any]:
        """The record's Distribution fields: n always, spread and samples from 2 values on."""
        if not self.values:
            d = {"median": self.median, "mean": self.mean, "std": self.std}
            return {k: v for k, v in d.items() if v is not None}
        xs = list(self.values)
        med = statistics.median(xs)
        d: dict[str, Any] = {"median": med, "n": len(xs)}
        if len(xs) >= 2:
            q = statistics.quantiles(xs, n=10, method="inclusive")  # = numpy's linear p10/p90
            d.update(p10=min(q[0], med), p90=max(q[-1], med), mean=statistics.fmean(xs),
                     std=statistics.stdev(xs), samples=xs)
        return d


@dataclass
class ParsedLog:
    """What one benchmark log says: latencies per op, side metrics, and what ran."""

    fmt: str
    source: str  # "owner/repo path" of the script whose prints were parsed
    label: str  # the log file, for messages and provenance
    sha256: str  # of the log's bytes
    variant: str  # which print version of the script matched
    latency_us: dict[str, Values]
    metrics: dict[str, Values] = field(default_factory=dict)  # names end in their unit
    what: dict[str, Any] = field(default_factory=dict)  # facts the log states, e.g. hidden
    gate_passed: bool | None = None
    gate_checks: list[str] = field(default_factory=list)
    gate_detail: str = ""
    timer: str = ""


@dataclass(frozen=True)
class Format:
    """A supported log format: where its print statements live and how to read them."""

    repo: str
    path: str
    design: str  # what.design when the user gives none
    timer: str
    parse: Callable[[str, list[tuple[int, str]]], ParsedLog]


# --- shared line handling -------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
# A number-shaped token: matched loosely, then parsed strictly by _num, so "nan" or
# "12.3.4" is reported as a bad number rather than as an unrecognised line.
T = r"[^\s,|±]+"


def _lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) with colour codes and trailing blanks/CRs removed."""
    return [(i, _ANSI.sub("", s).rstrip()) for i, s in enumerate(text.splitlines(), start=1)]


def _err(label: str, line: int | None, msg: str) -> RecordError:
    where = f"{label}: line {line}: " if line else f"{label}: "
    return RecordError((where + msg).replace("\n", " "))


def _show(s: str, width: int = 60) -> str:
    """A log line quoted in a message (shortened: messages stay one line)."""
    s = s.strip()
    return repr(s if len(s) <= width else s[: width - 3] + "...")


def _num(label: str, line: int, token: str, what: str) -> float:
    if not _NUMBER.fullmatch(token):
        raise _err(label, line, f"{token!r} is not a number (expected {what})")
    v = float(token)
    if not math.isfinite(v):
        raise _err(label, line, f"{token!r} is not a finite number (expected {what})")
    return v


def _match_full(label: str, line: int, s: str, prefix: re.Match[str],
                patterns: Iterable[re.Pattern[str]], expected: str) -> re.Match[str]:
    """The first full pattern matching ``s`` from where its recognised prefix starts; a line
    that starts like a result but matches no full form was cut off or garbled."""
    tail = s[prefix.start():]
    for pat in patterns:
        m = pat.fullmatch(tail)
        if m:
            return m
    raise _err(label, line, f"cut off or garbled: expected {expected!r}, got {_show(tail)}")


def _sha(text: str) -> str:
    return _sha256(text.encode("utf-8")).hexdigest()


# --- DeepEP / UCCL-EP low-latency test ------------------------------------------------
# [rank R] Dispatch + combine bandwidth: B GB/s, avg_t=A us, min_t=m us, max_t=M us
# [rank R] Dispatch bandwidth: B GB/s, avg_t=D us | Combine bandwidth: B GB/s, avg_t=C us
# [rank R] Dispatch send/recv time: S + R us | Combine send/recv time: S + R us
#   (before 2025-07-02: "T us | ... T us"; on 2025-07-02 briefly "T = S + R us | ...")

_LL_PREFIX = re.compile(
    r"\[rank (\d+)\] (Dispatch \+ combine bandwidth|Dispatch bandwidth|Dispatch send/recv time)")
_LL_BW = rf"(?P<{{0}}>{T}) (?P<{{0}}_unit>[GM])B/s"
_LL_BOTH = re.compile(
    r"\[rank (?P<rank>\d+)\] Dispatch \+ combine bandwidth: " + _LL_BW.format("bw")
    + rf", avg_t=(?P<avg>{T}) us, min_t=(?P<min>{T}) us, max_t=(?P<max>{T}) us")
_LL_OPS = re.compile(
    r"\[rank (?P<rank>\d+)\] Dispatch bandwidth: " + _LL_BW.format("dbw")
    + rf", avg_t=(?P<d>{T}) us \| Combine bandwidth: " + _LL_BW.format("cbw")
    + rf", avg_t=(?P<c>{T}) us")
_LL_HOOK = (  # newest first
    ("send + recv", re.compile(
        rf"\[rank (?P<rank>\d+)\] Dispatch send/recv time: (?P<ds>{T}) \+ (?P<dr>{T}) us \| "
        rf"Combine send/recv time: (?P<cs>{T}) \+ (?P<cr>{T}) us")),
    ("total = send + recv", re.compile(
        rf"\[rank (?P<rank>\d+)\] Dispatch send/recv time: {T} = (?P<ds>{T}) \+ (?P<dr>{T}) us \| "
        rf"Combine send/recv time: {T} = (?P<cs>{T}) \+ (?P<cr>{T}) us")),
    ("total", re.compile(
        rf"\[rank (?P<rank>\d+)\] Dispatch send/recv time: (?P<dt>{T}) us \| "
        rf"Combine send/recv time: (?P<ct>{T}) us")),
)
_LL_EXPECT = {
    "Dispatch + combine bandwidth": "[rank R] Dispatch + combine bandwidth: <x> GB/s, "
                                    "avg_t=<t> us, min_t=<t> us, max_t=<t> us",
    "Dispatch bandwidth": "[rank R] Dispatch bandwidth: <x> GB/s, avg_t=<t> us | "
                          "Combine bandwidth: <x> GB/s, avg_t=<t> us",
    "Dispatch send/recv time": "[rank R] Dispatch send/recv time: <send> + <recv> us | "
                               "Combine send/recv time: <send> + <recv> us",
}
_UCCL_PASS = "✓ All correctness tests passed!"


def _gbps(label: str, line: int, m: re.Match[str], key: str) -> float:
    v = _num(label, line, m[key], "a bandwidth")
    return v / 1000.0 if m[key + "_unit"] == "M" else v  # early UCCL-EP printed MB/s (1e6 B)


def _parse_ll(label: str, lines: list[tuple[int, str]], fmt: str) -> ParsedLog:
    """Per-rank values of the low-latency test; latency_us from the per-op kineto line."""
    vals: dict[str, list[float]] = {}
    at: dict[str, list[int]] = {}
    per_rank: dict[str, dict[int, list[int]]] = {"both": {}, "ops": {}, "hook": {}}
    hook_variants: set[str] = set()
    passes = 0

    def add(name: str, line: int, v: float) -> None:
        vals.setdefault(name, []).append(v)
        at.setdefault(name, []).append(line)

    for ln, s in lines:
        if s.endswith(_UCCL_PASS):
            passes += 1
            continue
        p = _LL_PREFIX.search(s)
        if not p:
            continue
        kind = p[2]
        if kind == "Dispatch + combine bandwidth":
            m = _match_full(label, ln, s, p, [_LL_BOTH], _LL_EXPECT[kind])
            add("dispatch_combine_gbytes_per_s", ln, _gbps(label, ln, m, "bw"))
            for k in ("avg", "min", "max"):
                add(f"dispatch_combine_{k}_us", ln, _num(label, ln, m[k], f"{k}_t in us"))
            per_rank["both"].setdefault(int(m["rank"]), []).append(ln)
        elif kind == "Dispatch bandwidth":
            m = _match_full(label, ln, s, p, [_LL_OPS], _LL_EXPECT[kind])
            add("dispatch", ln, _num(label, ln, m["d"], "the dispatch avg_t in us"))
            add("combine", ln, _num(label, ln, m["c"], "the combine avg_t in us"))
            add("dispatch_gbytes_per_s", ln, _gbps(label, ln, m, "dbw"))
            add("combine_gbytes_per_s", ln, _gbps(label, ln, m, "cbw"))
            per_rank["ops"].setdefault(int(m["rank"]), []).append(ln)
        else:
            m = _match_full(label, ln, s, p, [pat for _, pat in _LL_HOOK], _LL_EXPECT[kind])
            hook_variants.add(next(name for name, pat in _LL_HOOK if pat is m.re))
            for op, o in (("dispatch", "d"), ("combine", "c")):
                if m.re is _LL_HOOK[2][1]:  # oldest print: the send+recv total only
                    add(f"{op}_send_recv_us", ln, _num(label, ln, m[o + "t"], f"{op} time in us"))
                    continue
                snd = _num(label, ln, m[o + "s"], f"{op} send time in us")
                rcv = _num(label, ln, m[o + "r"], f"{op} recv time in us")
                add(f"{op}_send_us", ln, snd)
                add(f"{op}_recv_us", ln, rcv)
                add(f"{op}_send_recv_us", ln, snd + rcv)
            per_rank["hook"].setdefault(int(m["rank"]), []).append(ln)

    ops_ranks = per_rank["ops"]
    if not ops_ranks:
        hint = ("the log has 'Dispatch + combine' lines but none with the per-op times "
                "(truncated log, or kineto profiling failed)" if per_rank["both"] else
                f"not a {fmt} log?")
        raise _err(label, None, f"no line {_LL_EXPECT['Dispatch bandwidth']!r}: {hint}")
    # The script prints these lines in this order for every rank: a rank with fewer of a
    # later kind than of an earlier one is where the log was cut (or, in UCCL-EP, where
    # kineto profiling failed and the script skipped the line).
    order = [k for k in ("both", "ops", "hook") if per_rank[k]]
    names = {"both": "'Dispatch + combine'", "ops": "'Dispatch bandwidth'",
             "hook": "'Dispatch send/recv time'"}
    for first, then in zip(order, order[1:], strict=False):
        for r in sorted(set(per_rank[first]) | set(per_rank[then])):
            a, b = per_rank[first].get(r, []), per_rank[then].get(r, [])
            if len(a) != len(b):
                raise _err(label, max(a + b), f"rank {r} printed {len(a)} {names[first]} but "
                                              f"{len(b)} {names[then]} line(s): truncated log?")
    spec = FORMATS[fmt]
    ranks = sorted(ops_ranks)
    what: dict[str, Any] = {"ranks_in_log": len(ranks),
                            "rank_ids": _ranges(ranks),
                            "results_per_rank": max(len(v) for v in ops_ranks.values())}
    metrics = {k: Values(tuple(v), lines=tuple(at[k])) for k, v in vals.items() if k not in OPS}
    parsed = ParsedLog(
        fmt=fmt, source=f"{spec.repo} {spec.path}", label=label, sha256="",
        variant="per-op avg_t line; send/recv line: "
                + (", ".join(sorted(hook_variants)) or "absent"),
        latency_us={op: Values(tuple(vals[op]), lines=tuple(at[op])) for op in OPS},
        metrics=metrics, what=what, timer=spec.timer)
    if fmt == "uccl-ep" and passes:
        parsed.gate_passed = True
        parsed.gate_checks = [f"'{_UCCL_PASS}' printed {passes} time(s)"]
    else:
        parsed.gate_detail = ("the log prints no pass line (the script asserts its checks before "
                              "benchmarking)")
    return parsed


def _ranges(xs: list[int]) -> str:
    """[0,1,2,3,8] -> '0-3,8': which ranks the log holds, compactly."""
    out: list[str] = []
    start = prev = xs[0]
    for x in [*xs[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(out)


# --- DeepEP internode (normal mode) test ---------------------------------------------
# [config] num_tokens=N, hidden=H, num_topk_groups=G, num_topk=K
# since 2025-09-16 (2012e31):
# [tuning] Best dispatch (FP8): SMs 24, NVL chunk 8, RDMA chunk 16: 12 + 345 us,
#     X GB/s (RDMA), Y GB/s (NVL)                                        (one line; BF16 too)
# [tuning] Best combine: SMs 24, NVL chunk 1, RDMA chunk 12, 1.23 + 456.78 us,
#     X GB/s (RDMA), Y GB/s (NVL)
# 2025-07-14 (eb155da) .. 2025-09-10 (ef70b83):
# [tuning] Best dispatch (FP8): SMs 24, NVL chunk 8, RDMA chunk 16, transmit: 345.67 us,
#     notify: 12.34 us, BW: X GB/s (RDMA), Y GB/s (NVL)                  (combine alike)
# before: GB/s only, no time (refused)

_IN_PREFIX = re.compile(r"\[tuning\] Best (dispatch|combine)|\[config\] ")
_IN_CFG = re.compile(r"\[tuning\] Best (?:dispatch \((?P<dtype>FP8|BF16)\)|(?P<comb>combine)): "
                     r"SMs (?P<sms>\d+), NVL chunk (?P<nvl>\d+), RDMA chunk (?P<rdma>\d+)")
_IN_BW = rf"(?P<rbw>{T}) GB/s \(RDMA\), (?P<nbw>{T}) GB/s \(NVL\)"
_IN_PLUS = re.compile(_IN_CFG.pattern + rf"[:,] (?P<notify>{T}) \+ (?P<t>{T}) us, " + _IN_BW)
_IN_TRANSMIT = re.compile(_IN_CFG.pattern
                          + rf", transmit: (?P<t>{T}) us, notify: (?P<notify>{T}) us, BW: "
                          + _IN_BW)
_IN_BW_ONLY = re.compile(_IN_CFG.pattern + ": " + _IN_BW)
_IN_CONFIG = re.compile(r"\[config\] num_tokens=(?P<tokens>\d+), hidden=(?P<hidden>\d+), "
                        r"num_topk_groups=(?P<groups>\d+), num_topk=(?P<topk>\d+)")
_IN_EXPECT = ("[tuning] Best dispatch (FP8|BF16): SMs <n>, NVL chunk <n>, RDMA chunk <n>: "
              "<notify> + <t> us, <x> GB/s (RDMA), <y> GB/s (NVL)")
_IN_EXPECT_C = ("[tuning] Best combine: SMs <n>, NVL chunk <n>, RDMA chunk <n>, "
                "<notify> + <t> us, <x> GB/s (RDMA), <y> GB/s (NVL)")
_IN_TESTED = re.compile(r"\[testing\] Running with .* \.\.\. passed$")


def _parse_internode(label: str, lines: list[tuple[int, str]]) -> ParsedLog:
    """Best-config lines of local rank 0 of each node: dispatch (FP8) and combine times."""
    groups: dict[str, list[tuple[int, re.Match[str]]]] = {"FP8": [], "BF16": [], "combine": []}
    variants: set[str] = set()
    config: tuple[int, dict[str, int]] | None = None
    tested = 0
    for ln, s in lines:
        if _IN_TESTED.search(s):
            tested += 1
            continue
        p = _IN_PREFIX.search(s)
        if not p:
            continue
        if p[0].startswith("[config]"):
            m = _match_full(label, ln, s, p, [_IN_CONFIG], "[config] num_tokens=<n>, hidden=<n>, "
                            "num_topk_groups=<n>, num_topk=<n>")
            cfg = {k: int(m[k]) for k in ("tokens", "hidden", "groups", "topk")}
            if config is not None and config[1] != cfg:
                raise _err(label, ln, f"[config] differs from line {config[0]} "
                                      "(several runs in one log? import one at a time)")
            config = (ln, cfg)
            continue
        if _IN_BW_ONLY.fullmatch(s[p.start():]):
            raise _err(label, ln, "this DeepEP version prints bandwidth only, no time, in its "
                                  "'Best' lines (test_internode.py before 2025-07-14): no latency "
                                  "to import")
        expected = _IN_EXPECT_C if p[1] == "combine" else _IN_EXPECT
        m = _match_full(label, ln, s, p, [_IN_PLUS, _IN_TRANSMIT], expected)
        variants.add("notify + t" if m.re is _IN_PLUS else "transmit/notify")
        groups["combine" if m["comb"] else m["dtype"]].append((ln, m))

    names = {"FP8": "'[tuning] Best dispatch (FP8): ...'",
             "BF16": "'[tuning] Best dispatch (BF16): ...'",
             "combine": "'[tuning] Best combine: ...'"}
    for key in ("FP8", "combine"):
        if not groups[key]:
            last = max((ln for g in groups.values() for ln, _ in g), default=None)
            hint = "truncated log?" if last else "not a deepep-internode log?"
            raise _err(label, last, f"no {names[key]} line: {hint}")
    # Each test run prints FP8, then BF16, then combine: unequal counts mean a cut log.
    counts = {k: len(v) for k, v in groups.items()}
    if len(set(counts.values())) > 1:
        last = max(ln for g in groups.values() for ln, _ in g)
        raise _err(label, last, "unequal numbers of best-config lines (" + ", ".join(
            f"{counts[k]} {names[k]}" for k in groups) + "): truncated log?")

    def values(key: str, g: str) -> Values:
        rows = groups[key]
        return Values(tuple(_num(label, ln, m[g], "a number") for ln, m in rows),
                      lines=tuple(ln for ln, _ in rows))

    metrics: dict[str, Values] = {}
    what: dict[str, Any] = {"best_lines_per_op": counts["FP8"]}
    for key, name in (("FP8", "dispatch"), ("BF16", "dispatch_bf16"), ("combine", "combine")):
        metrics[f"{name}_notify_us"] = values(key, "notify")
        metrics[f"{name}_rdma_gbytes_per_s"] = values(key, "rbw")
        metrics[f"{name}_nvl_gbytes_per_s"] = values(key, "nbw")
        configs = sorted({f"sms={m['sms']}/nvl_chunk={m['nvl']}/rdma_chunk={m['rdma']}"
                          for _, m in groups[key]})
        what[f"{name}_best_config"] = " or ".join(configs)
    metrics["dispatch_bf16_us"] = values("BF16", "t")
    if config is not None:
        c = config[1]
        what.update(tokens_per_rank=c["tokens"], hidden=c["hidden"], num_topk_groups=c["groups"],
                    top_k=c["topk"])
    spec = FORMATS["deepep-internode"]
    parsed = ParsedLog(
        fmt="deepep-internode", source=f"{spec.repo} {spec.path}", label=label, sha256="",
        variant="best-config lines: " + ", ".join(sorted(variants)),
        latency_us={"dispatch": values("FP8", "t"), "combine": values("combine", "t")},
        metrics=metrics, what=what, timer=spec.timer)
    if tested:
        parsed.gate_passed = True
        parsed.gate_checks = [f"{tested} '[testing] Running with ... passed' line(s)"]
    else:
        parsed.gate_detail = "the log has no '[testing] ... passed' line"
    return parsed


# --- pplx-garden all-to-all benchmark --------------------------------------------------
# (logging prefix "[date time.ms] pid INFO     bench_all_to_all ", ANSI colours unless DD_ENV)
# Dispatch both time: mean=M±S μs, min=.. μs, p01=.. μs, p25=.. μs, p50=.. μs, p75=.. μs,
#     p95=.. μs, p99=.. μs, max=.. μs, B GB/s                           (one line)
# Dispatch send time: mean=M±S μs, min=.. μs, ..., max=.. μs      (likewise recv, and Combine)
# then --output (default /dev/stdout) gets json.dumps({"dispatch": {"both": {...}, ...}, ...})

_PP_STATS = ("min", "p01", "p25", "p50", "p75", "p95", "p99", "max")
_US = "[μµu]s"  # the script prints U+03BC; terminals and copies may turn it into µ or u
_PP_STAT = rf"mean=(?P<mean>{T})±(?P<stddev>{T}) {_US}" + "".join(
    rf", {k}=(?P<{k}>{T}) {_US}" for k in _PP_STATS)
_PP_PREFIX = re.compile(r"(Dispatch|Combine) (both|send|recv) time:")
_PP_BOTH = re.compile(rf"(?P<op>Dispatch|Combine) both time: {_PP_STAT}, (?P<bw>{T}) GB/s")
_PP_PART = re.compile(rf"(?P<op>Dispatch|Combine) (?P<part>send|recv) time: {_PP_STAT}")
_PP_JSON = '{"dispatch"'
_PP_ITER = re.compile(r"Iteration (\d+)/(\d+)$")
_PP_KEYS = ("mean", "stddev", *_PP_STATS)


def _parse_pplx(label: str, lines: list[tuple[int, str]]) -> ParsedLog:
    """Rank 0's summary over all ranks and iterations (the script prints no per-sample values)."""
    logged: dict[tuple[str, str], tuple[int, dict[str, float]]] = {}
    bw: dict[str, tuple[int, float]] = {}
    summary: tuple[int, dict[str, Any]] | None = None
    passed: bool | None = None
    iterations = 0
    for ln, s in lines:
        if s.endswith("Correctness check passed"):
            passed = True
        if (it := _PP_ITER.search(s)) is not None:
            iterations = max(iterations, int(it[2]))
        if (j := s.find(_PP_JSON)) >= 0:
            try:
                data, _ = json.JSONDecoder().raw_decode(s[j:])
            except json.JSONDecodeError:
                raise _err(label, ln, "the JSON summary is cut off or garbled") from None
            if summary is not None:
                raise _err(label, ln, f"a second JSON summary (first on line {summary[0]}): "
                                      "several runs in one log? import one at a time")
            summary = (ln, data)
            s = s[:j]
        p = _PP_PREFIX.search(s)
        if not p:
            continue
        exp = f"{p[1]} {p[2]} time: mean=<t>±<t> μs, min=<t> μs, ..., max=<t> μs"
        m = _match_full(label, ln, s, p, [_PP_BOTH if p[2] == "both" else _PP_PART],
                        exp + (", <x> GB/s" if p[2] == "both" else ""))
        key = (p[1].lower(), p[2])
        if key in logged:
            raise _err(label, ln, f"a second '{p[1]} {p[2]} time' line (first on line "
                                  f"{logged[key][0]}): several runs in one log? "
                                  "import one at a time")
        logged[key] = (ln, {k: _num(label, ln, m[k], f"{k} in us") for k in _PP_KEYS})
        if p[2] == "both":
            bw[key[0]] = (ln, _num(label, ln, m["bw"], "a bandwidth in GB/s"))

    stats: dict[tuple[str, str], tuple[int, dict[str, float]]] = {}
    if summary is not None:
        ln, data = summary
        for op in OPS:
            for part in ("both", "send", "recv"):
                row = data.get(op, {}).get(part) if isinstance(data.get(op), dict) else None
                if not isinstance(row, dict) or any(
                        not isinstance(row.get(k), int | float) for k in _PP_KEYS):
                    raise _err(label, ln, f"the JSON summary lacks numbers for {op}.{part} "
                                          f"({', '.join(_PP_KEYS)})")
                stats[(op, part)] = (ln, {k: float(row[k]) for k in _PP_KEYS})
                if (op, part) in logged:  # both present: they must be the same run
                    lln, lrow = logged[(op, part)]
                    if abs(lrow["p50"] - row["p50"]) > 0.05 + 1e-9:
                        raise _err(label, lln, f"p50 {lrow['p50']} differs from the JSON summary's "
                                               f"{row['p50']} (line {ln}): two runs mixed?")
    else:
        stats = logged
        for op in OPS:
            if (op, "both") not in stats:
                last = max((v[0] for v in stats.values()), default=None)
                hint = "truncated log?" if last else "not a pplx-garden log?"
                raise _err(label, last, f"no '{op.capitalize()} both time: ...' line and no JSON "
                                        f"summary: {hint}")
    latency: dict[str, Values] = {}
    metrics: dict[str, Values] = {}
    for (op, part), (ln, row) in stats.items():
        if row["p50"] <= 0:
            raise _err(label, ln, f"{op} {part} p50 is {row['p50']}: "
                                  "the benchmark measured nothing")
        v = Values(median=row["p50"], mean=row["mean"], std=row["stddev"], lines=(ln,))
        if part == "both":
            latency[op] = v
            for k in _PP_STATS:
                if k != "p50":
                    metrics[f"{op}_{k}_us"] = Values(median=row[k], lines=(ln,))
        else:
            metrics[f"{op}_{part}_us"] = v
    for op, (ln, b) in bw.items():
        metrics[f"{op}_gbytes_per_s"] = Values((b,), lines=(ln,))
    spec = FORMATS["pplx-garden"]
    what: dict[str, Any] = {"summary_from": "JSON summary" if summary else "log lines"}
    if iterations:
        what["iterations_incl_warmup"] = iterations
    parsed = ParsedLog(
        fmt="pplx-garden", source=f"{spec.repo} {spec.path}", label=label, sha256="",
        variant=what["summary_from"], latency_us=latency, metrics=metrics, what=what,
        timer=spec.timer, gate_passed=passed)
    if passed:
        parsed.gate_checks = ["'Correctness check passed' (token counts and tokens on every rank)"]
    else:
        parsed.gate_detail = ("the benchmark skipped its correctness check" if any(
            s.endswith("Skipping correctness check") for _, s in lines)
            else "the log has no 'Correctness check passed' line")
    return parsed


FORMATS: dict[str, Format] = {
    "deepep-ll": Format(
        repo="deepseek-ai/DeepEP",
        path="tests/test_low_latency.py (tests/legacy/test_low_latency.py since 2026-04-30)",
        design="DeepEP low-latency",
        timer="per op: kineto kernel time (bench_kineto), one average per rank; "
              "dispatch+combine: CUDA events (bench)",
        parse=lambda label, lines: _parse_ll(label, lines, "deepep-ll")),
    "deepep-internode": Format(
        repo="deepseek-ai/DeepEP",
        path="tests/test_internode.py (tests/legacy/test_internode.py since 2026-04-30)",
        design="DeepEP normal (internode)",
        timer="kineto kernel time (bench_kineto) of the best tuned config, local rank 0 per node",
        parse=_parse_internode),
    "uccl-ep": Format(
        repo="uccl-project/uccl", path="ep/bench/test_low_latency.py",
        design="UCCL-EP low-latency",
        timer="per op: kineto kernel time (bench_kineto), one average per rank; "
              "dispatch+combine: CUDA events (bench)",
        parse=lambda label, lines: _parse_ll(label, lines, "uccl-ep")),
    "pplx-garden": Format(
        repo="perplexityai/pplx-garden", path="benchmarks/bench_all_to_all.py",
        design="pplx-garden p2p all-to-all",
        timer="CUDA events per iteration on every rank, gathered; summary printed by rank 0",
        parse=_parse_pplx),
}


def parse_log(fmt: str, text: str, *, label: str = "<log>", sha256: str | None = None) -> ParsedLog:
    """Parse one benchmark log. ``label`` names the file in messages; ``sha256`` is of the
    file's bytes (default: of ``text`` as UTF-8)."""
    spec = FORMATS.get(fmt)
    if spec is None:
        raise RecordError(f"unknown format '{fmt}' (known: {', '.join(sorted(FORMATS))})")
    parsed = spec.parse(label, _lines(text))
    parsed.sha256 = sha256 or _sha(text)
    return parsed


# --- record ---------------------------------------------------------------------------


def workload_facts(parsed: ParsedLog, given: Mapping[str, int | None] | None,
                   label: str | None = None) -> dict[str, int]:
    """Workload fields known from the log and from the user; a clash is an error, since a
    record describing another shape than what ran would be judged against the wrong model."""
    label = label or parsed.label
    facts = {k: parsed.what[k] for k in WORKLOAD_KEYS if k in parsed.what}
    for k, v in (given or {}).items():
        if k not in WORKLOAD_KEYS:
            raise RecordError(f"{label}: workload: unknown field '{k}' "
                              f"(one of {', '.join(WORKLOAD_KEYS)})")
        if v is None:
            continue
        if k in facts and facts[k] != v:
            raise RecordError(f"{label}: workload.{k}: the log says {facts[k]}, the options {v}")
        facts[k] = v
    return facts


def to_record(parsed: ParsedLog, *, record_id: str, nic: str, design: str | None = None,
              levers: Iterable[str] = (), instance: str = "", gpu: str = "",
              scenario: str | None = None, sim_set: Mapping[str, Any] | None = None,
              date: str = "", command: str = "", workload: Mapping[str, int | None] | None = None,
              tool_version: str = "") -> RunRecord:
    """A validated run record from a parsed log and what the user says about the run.

    ``what.workload`` is written only when every field is known (from the log or
    ``workload``): the schema's defaults would otherwise claim a shape nobody measured.
    """
    label = parsed.label
    if nic not in IMPORT_NICS:
        raise RecordError(f"{label}: nic: '{nic}': an imported log is of a real NIC, 'efa' or 'ib' "
                          "(never 'emulated-srd')")
    if sim_set and not scenario:
        raise RecordError(f"{label}: sim.set given without a scenario")
    levers = list(levers)
    facts = workload_facts(parsed, workload, label)
    said = "; ".join(f"{k}={v}" for k, v in parsed.what.items()) or "nothing more"
    notes = f"imported from a {parsed.fmt} log ({parsed.variant}); the log says: {said}"
    if not all(k in facts for k in WORKLOAD_KEYS):
        have = ", ".join(f"{k}={v}" for k, v in facts.items()) or "none"
        notes += f"; what.workload omitted (known: {have}; needs {', '.join(WORKLOAD_KEYS)})"
    spec = FORMATS[parsed.fmt]
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "id": record_id,
        "nic": nic,
        "what": {
            "design": design or spec.design,
            "levers": levers,
            "platform": {"gpu": gpu, "instance": instance,
                         "nic": {"efa": "EFA", "ib": "InfiniBand"}[nic]},
        },
        "how": {"timer": parsed.timer, "notes": notes},
        "latency_us": {op: parsed.latency_us[op].distribution() for op in OPS},
        "metrics": {k: v.distribution() for k, v in sorted(parsed.metrics.items())},
        "gate": {"passed": parsed.gate_passed, "checks": parsed.gate_checks,
                 "detail": parsed.gate_detail},
        "provenance": {
            "source": f"lever record import {parsed.fmt}: prints of {parsed.source}; "
                      f"log {label} sha256 {parsed.sha256}",
            "date": date, "command": command, "tool_version": tool_version,
        },
    }
    if all(k in facts for k in WORKLOAD_KEYS):
        data["what"]["workload"] = facts
    if scenario:
        data["sim"] = {"scenario": scenario, "levers": levers, "set": dict(sim_set or {})}
    return parse_record(data, label)
