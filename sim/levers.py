"""Lever files: a named change to a baseline scenario.

``scenarios/levers/NAME.toml``::

    name = "lazy-completion-dispatch"
    baseline = "decode-ep16-efa-native"      # scenario name or path
    description = "why it should help (the mechanism)"
    [set]                                    # dotted paths into the scenario
    "design.lazy_completion_dispatch" = true

A lever only sets model fields: where a lever needs a mechanism the model
lacks, the mechanism goes into the model, never a constant into the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lever.sim import scenario as scn_mod
from lever.sim.params import Scenario
from lever.sim.scenario import Overrides
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

LEVER_DIR = scn_mod.SCENARIO_DIR / "levers"


class Lever(BaseModel):
    """A named change to a baseline: ``set`` maps dotted paths to values."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str
    baseline: str
    description: str = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict)
    path: str = ""

    @field_validator("set", mode="before")
    @classmethod
    def _dotted(cls, v: Any) -> Any:
        """``[set]`` written with bare dotted keys (``design.x = 1``) reads as nested tables
        in TOML: flatten them back to the dotted paths they name."""
        if not isinstance(v, dict):
            return v
        out: dict[str, Any] = {}

        def walk(d: dict, prefix: str) -> None:
            for k, x in d.items():
                key = f"{prefix}.{k}" if prefix else str(k)
                if isinstance(x, dict):
                    walk(x, key)
                else:
                    out[key] = x

        walk(v, "")
        return out


def load_lever(name_or_path: str | Path) -> Lever:
    p = scn_mod.resolve(name_or_path, kind="levers")
    raw = scn_mod._read_toml(p)
    base = raw.get("baseline")
    if isinstance(base, str):  # the baseline first: every other field is about a change to it
        try:
            scn_mod.resolve(base)
        except scn_mod.ScenarioError:
            raise scn_mod.ScenarioError(f"{p}: baseline: no such scenario '{base}'") from None
    try:
        lev = Lever.model_validate({**raw, "path": str(p)})
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        raise scn_mod.ScenarioError(f"{p}: {field}: {err['msg']}") from None
    return lev


def load_with_levers(scenario: str | Path, levers: Sequence[str] = (),
                     overrides: Overrides | None = None, *,
                     base: Overrides | None = None, base_source: str = "run configuration") -> Scenario:
    """The scenario, then ``base`` (how a run was configured before its levers, as a
    record's ``sim.set``), then each lever's ``[set]`` in order, then ``overrides``.

    A bad value in a lever's ``[set]`` is reported against the lever file."""
    layers: list[tuple[str, Overrides]] = [(base_source, base)] if base else []
    for name in levers:
        lev = load_lever(name)
        layers.append((lev.path, lev.set))
    return scn_mod.load(scenario, overrides, layers)


def all_levers() -> list[str]:
    return sorted(p.stem for p in LEVER_DIR.glob("*.toml"))
