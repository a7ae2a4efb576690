"""The run-record schema shared by ``hw/`` (writes), ``calibration/`` (fits) and
``lever compare`` (judges).

A record says what ran, how, what was measured and where it came from. It is
JSON with ``schema_version``; loading goes through :func:`load_record`, which
turns every problem into one line naming the file, the field and why.

Two kinds of measurement:
- ``latency_us``: per op (``dispatch``, ``combine``) a :class:`Distribution` in
  microseconds; or ``latency_delta_us`` when only a change against a named
  baseline was measured (campaign facts such as "lazy completion: -30 us").
- ``metrics``: named scalar distributions of microbenchmarks; every name ends
  in its unit (``_ns``, ``_us``, ``_gbytes_per_s``, ``_mops``, ``_ratio``), so
  a number can not be read in the wrong unit.

Records from the emulated NIC carry ``nic = "emulated-srd"`` and can never
pass for EFA: :func:`check_nic` refuses such a mix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from lever.sim.errors import UserError, read_user_file
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SCHEMA_VERSION = 1
UNIT_SUFFIXES = ("_ns", "_us", "_gbytes_per_s", "_gbps", "_mops", "_ratio", "_count")
OPS = ("dispatch", "combine")
NicKind = Literal["efa", "ib", "emulated-srd", "none"]


class RecordError(UserError, ValueError):
    """A record that can not be used; ``str()`` is the one-line message."""


class _Strict(BaseModel):
    """Unknown keys and non-finite numbers are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Distribution(_Strict):
    """One measured quantity: median and spread, ideally the samples."""

    median: float
    p10: float | None = None
    p90: float | None = None
    mean: float | None = None
    std: float | None = None
    n: int | None = Field(None, ge=1)
    samples: list[float] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Distribution:
        if self.p10 is not None and self.p10 > self.median:
            raise ValueError(f"p10 ({self.p10}) above median ({self.median})")
        if self.p90 is not None and self.p90 < self.median:
            raise ValueError(f"p90 ({self.p90}) below median ({self.median})")
        if self.std is not None and self.std < 0:
            raise ValueError("std must be >= 0")
        if self.samples is not None and self.n is not None and len(self.samples) != self.n:
            raise ValueError(f"n ({self.n}) differs from len(samples) ({len(self.samples)})")
        return self

    def spread(self) -> float:
        """A robust standard deviation of one sample: from p10/p90, std or samples."""
        if self.samples and len(self.samples) >= 3:
            import numpy as np

            q10, q90 = np.percentile(self.samples, [10, 90])
            return float(q90 - q10) / 2.563
        if self.p10 is not None and self.p90 is not None:
            return (self.p90 - self.p10) / 2.563
        if self.std is not None:
            return self.std
        return 0.0

    def median_se(self) -> float:
        """Standard error of the median (1.2533 sigma / sqrt(n)); 0 when unknown."""
        n = self.n or (len(self.samples) if self.samples else None)
        s = self.spread()
        if not n or s == 0:
            return 0.0
        return 1.2533 * s / n**0.5


class LatencyDist(Distribution):
    """A latency in microseconds: positive and below ten seconds (unit sanity)."""

    @field_validator("median")
    @classmethod
    def _plausible(cls, v: float) -> float:
        if not 0 < v < 1e7:
            raise ValueError(f"latency {v} us is outside (0, 1e7): wrong unit?")
        return v


class DeltaDist(Distribution):
    """A change of latency in microseconds against a baseline (may be negative)."""

    @field_validator("median")
    @classmethod
    def _plausible(cls, v: float) -> float:
        if abs(v) >= 1e7:
            raise ValueError(f"delta {v} us is beyond 1e7: wrong unit?")
        return v


class Workload(_Strict):
    ep_ranks: int = Field(ge=1)
    nodes: int = Field(1, ge=1)
    tokens_per_rank: int = Field(128, ge=1)
    hidden: int = Field(7168, ge=1)
    top_k: int = Field(8, ge=1)
    num_experts: int = Field(256, ge=1)


class PlatformInfo(_Strict):
    gpu: str = ""
    nic: str = ""
    driver: str = ""
    cuda: str = ""
    torch: str = ""
    instance: str = ""
    host: str = ""


class What(_Strict):
    """What ran."""

    design: str = Field(description="e.g. 'v2-hybrid native', 'primitives'")
    path: Literal["native", "proxy"] | None = None
    protocol: str | None = None
    levers: list[str] = Field(default_factory=list)
    workload: Workload | None = None
    platform: PlatformInfo = Field(default_factory=PlatformInfo)
    emulated_fabric: dict[str, Any] | None = Field(
        None, description="the emulated NIC's fabric parameters (platform.fabric of the model)"
    )


class How(_Strict):
    repetitions: int | None = Field(None, ge=1)
    warmup: int | None = Field(None, ge=0)
    timer: str = ""
    notes: str = ""


class SimLink(_Strict):
    """How to reproduce this record in the model: the scenario, then ``set`` (how the run
    was configured), then ``levers`` (what the run changed on top of that)."""

    scenario: str
    levers: list[str] = Field(default_factory=list)
    set: dict[str, Any] = Field(default_factory=dict)

    def load(self, overrides: Mapping[str, Any] | None = None):
        """The model's scenario for this run (``overrides`` last, e.g. fitted values)."""
        from lever.sim.levers import load_with_levers

        return load_with_levers(self.scenario, self.levers, overrides, base=self.set,
                                base_source="record sim.set")


class Gate(_Strict):
    """The correctness gate: output equal to a reference, landing proven at the receiver."""

    passed: bool | None = Field(None, description="None when the source did not report one")
    checks: list[str] = Field(default_factory=list)
    detail: str = ""


class Provenance(_Strict):
    source: str = Field(min_length=1, description="where the numbers came from")
    date: str = ""
    git_rev: str = ""
    tool_version: str = ""
    command: str = ""
    # what exactly ran (hw/provenance.py; empty in records older than these fields)
    dirty: bool = Field(False, description="written with --allow-dirty from a tree with local changes")
    kernel_sha256: str = Field("", description="sha256 of the kernel/binding sources built")
    build_flags: str = ""
    gpu_topology: str = Field("", description="nvidia-smi topo -m, rows joined with ' | '")


class RunRecord(_Strict):
    schema_version: int
    id: str = Field(min_length=1)
    nic: NicKind
    what: What
    how: How = Field(default_factory=How)
    sim: SimLink | None = None
    baseline: SimLink | None = Field(None, description="for latency_delta_us: what the delta is against")
    latency_us: dict[Literal["dispatch", "combine"], LatencyDist] = Field(default_factory=dict)
    latency_delta_us: dict[Literal["dispatch", "combine"], DeltaDist] = Field(default_factory=dict)
    attribution: dict[Literal["dispatch", "combine"], dict[str, float]] = Field(
        default_factory=dict, description="profiler shares per category, 0..1"
    )
    attribution_samples: int | None = Field(None, ge=0)
    attribution_scope: Literal["profiler", "put_path"] = Field(
        "profiler", description="what the shares are of: all warp time, or the issue-side put path"
    )
    baseline_latency_us: dict[Literal["dispatch", "combine"], LatencyDist] = Field(
        default_factory=dict,
        description="for latency_delta_us: the baseline's measured level when the source gave it; "
        "the fit then compares relative changes (the campaign's baseline may differ from today's)",
    )
    baseline_attribution: dict[Literal["dispatch", "combine"], dict[str, float]] = Field(
        default_factory=dict, description="profiler shares of the baseline run, 0..1"
    )
    metrics: dict[str, Distribution] = Field(default_factory=dict)
    gate: Gate
    provenance: Provenance
    superseded_by: str | None = Field(
        None, description="why this record is no longer used by default and what replaces it "
        "(e.g. the testbed it ran on changed); shipped_record_paths leaves it out unless asked")

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"schema_version {v} is not supported (this tool reads {SCHEMA_VERSION})")
        return v

    @field_validator("metrics")
    @classmethod
    def _units(cls, v: dict[str, Distribution]) -> dict[str, Distribution]:
        for name in v:
            if not name.endswith(UNIT_SUFFIXES):
                raise ValueError(f"metric '{name}' has no unit suffix (one of {', '.join(UNIT_SUFFIXES)})")
        return v

    @field_validator("attribution", "baseline_attribution")
    @classmethod
    def _shares(cls, v: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for op, rows in v.items():
            for cat, share in rows.items():
                if not 0.0 <= share <= 1.0:
                    raise ValueError(f"{op}.{cat}: share {share} outside [0, 1] (percent given?)")
            if sum(rows.values()) > 1.0 + 1e-6:
                raise ValueError(f"{op}: shares sum to {sum(rows.values()):.3f} > 1")
        return v

    @model_validator(mode="after")
    def _coherent(self) -> RunRecord:
        emulated = self.nic == "emulated-srd"
        if emulated != (self.what.emulated_fabric is not None):
            raise ValueError(
                "nic 'emulated-srd' and what.emulated_fabric go together (an emulated record must "
                "carry its fabric; a real one must not)"
            )
        if self.latency_delta_us and self.baseline is None:
            raise ValueError("latency_delta_us needs 'baseline' (what the delta is against)")
        if not (self.latency_us or self.latency_delta_us or self.metrics or self.attribution):
            raise ValueError("record measures nothing (no latency_us, latency_delta_us, metrics or attribution)")
        return self

    def digest(self) -> str:
        # what was measured: marking a record superseded does not change it
        blob = json.dumps(self.model_dump(mode="json", exclude={"superseded_by"}), sort_keys=True,
                          separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def parse_record(data: Any, label: str = "<record>") -> RunRecord:
    """Validate a decoded record; errors become one line naming ``label`` and the field."""
    if not isinstance(data, dict):
        raise RecordError(f"{label}: (top level): a record is a JSON object")
    try:
        return RunRecord.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = "unknown field (wrong unit or schema?)" if err["type"] == "extra_forbidden" else err["msg"]
        raise RecordError(f"{label}: {field}: {msg}") from None


def load_record(path: str | Path) -> RunRecord:
    """Read and validate a record file."""
    p = Path(path)
    text = read_user_file(p, RecordError, "JSON record")
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise RecordError(f"{p}: not valid JSON (truncated?): {e.msg} at line {e.lineno}") from None
    except ValueError as e:
        raise RecordError(f"{p}: {e}") from None
    return parse_record(data, str(p))


def _no_constant(name: str) -> None:
    """JSON has no NaN or Infinity; Python's reader accepts them unless told not to."""
    raise ValueError(f"'{name}' is not a JSON number (records hold finite numbers only)")


def dump_record(rec: RunRecord, path: str | Path) -> None:
    """Write atomically: a temp file renamed into place, so nothing is half-written."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(rec.model_dump(mode="json", exclude_none=True), indent=2) + "\n")
    tmp.replace(p)


def check_nic(nic_kind: str, records: list[RunRecord], label: str, use: str) -> None:
    """Records serve only a platform of their own NIC kind (``any`` takes every kind but an
    emulated one): an emulated-NIC record never calibrates or judges an EFA platform, nor an
    EFA record an emulated one. ``use`` says what for ("calibrate", "judge")."""
    for r in records:
        ok = r.nic == nic_kind or (nic_kind == "any" and r.nic != "emulated-srd")
        if not ok:
            raise RecordError(f"{label}: record {r.id} is nic '{r.nic}', the platform is nic_kind "
                              f"'{nic_kind}': records {use} only a platform of their own NIC kind")


BASE_PLATFORM: dict[str, str] = {
    "efa": "platforms/efa-p5.toml",
    "ib": "platforms/ib-cx7.toml",
    "emulated-srd": "platforms/emulated-nvlink.toml",
}
"""The uncalibrated platform each NIC's records are fitted on (lever calibrate --joint, validate)."""

DATA_DIR = Path(str(resources.files("lever.calibration.data")))  # shipped records (package data)


def shipped_record_paths(include_superseded: bool = False) -> list[Path]:
    """The shipped records (calibration/data/*.json) that calibrate, validate and the joint fit
    use by default: a record marked ``superseded_by`` is kept for its history and left out
    unless ``include_superseded``."""
    out = []
    for p in sorted(DATA_DIR.glob("*.json")):
        if include_superseded or load_record(p).superseded_by is None:
            out.append(p)
    return out
