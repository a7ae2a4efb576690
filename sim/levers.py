"""Lever files: a named change to a baseline scenario.

``scenarios/levers/NAME.toml``::

    name = "lazy-completion-dispatch"
    baseline = "decode-ep16-efa-native"      # scenario name or path
    description = "why it should help (the mechanism)"
    [set]                                    # dotted paths into the scenario
    "design.lazy_completion_dispatch" = true

A lever only sets model fields: where a lever needs a mechanism the model
lacks, the mechanism goes into the model, never a constant into the file.

Where a lever's real implementation is not fully known, the file lists named
alternatives (structural uncertainty), each with its source, and says which one
``[set]`` is::

    primary = "provider-posts-tail"          # top-level keys come before the tables
    primary_why = "why this one is taken as the lever"

    [variants.provider-posts-tail]
    description = "what this alternative does"
    source = "where it comes from (repository and path, document, record)"
    [variants.provider-posts-tail.set]
    "design.provider_batched_tail" = true

    [variants.signals-in-one-doorbell]
    description = "..."
    source = "..."
    needs = "the model mechanism it needs and does not have yet (not runnable)"

A variant has either ``set`` (runnable: it replaces the lever's ``[set]``) or
``needs`` (not runnable yet: a description, never a faked value). The primary's
``set`` is the lever's ``[set]`` (written once: ``[set]`` may be left out, and if
both are written they must agree), so every reader of the lever (records'
``sim.levers``, sweeps) applies the primary, unless it names a variant:
``NAME@VARIANT`` (``provider-batched-tail@signals-in-one-doorbell``) applies that
variant's ``set``. A record names the variant its run built this way, so it is
judged against what ran, not against the lever's primary reading.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lever.sim import scenario as scn_mod
from lever.sim.params import Scenario
from lever.sim.scenario import Overrides
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

LEVER_DIR = scn_mod.SCENARIO_DIR / "levers"


def _flatten_dotted(v: Any) -> Any:
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


VARIANT_NAME = r"^[a-z0-9][a-z0-9-]*$"


class Variant(BaseModel):
    """One named alternative of how a lever is really implemented, with its source."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    description: str = Field(min_length=1)
    source: str = Field(min_length=1, description="where this alternative comes from")
    set: dict[str, Any] | None = Field(None, description="runnable: replaces the lever's [set]")
    needs: str | None = Field(None, min_length=1,
                              description="not runnable yet: the model mechanism it needs")

    @field_validator("set", mode="before")
    @classmethod
    def _dotted(cls, v: Any) -> Any:
        return _flatten_dotted(v)

    @model_validator(mode="after")
    def _one_of(self) -> Variant:
        if (self.set is None) == (self.needs is None):
            raise ValueError("a variant has either 'set' (runnable) or 'needs' (not runnable yet), "
                             "not both and not neither")
        return self

    @property
    def runnable(self) -> bool:
        return self.set is not None


class Lever(BaseModel):
    """A named change to a baseline: ``set`` maps dotted paths to values; ``variants`` are
    the named alternatives of what the lever really is, ``primary`` the one ``set`` is."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str
    baseline: str
    description: str = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict)
    primary: str | None = None
    primary_why: str | None = Field(None, min_length=1)
    variants: dict[str, Variant] = Field(default_factory=dict)
    path: str = ""

    @field_validator("set", mode="before")
    @classmethod
    def _dotted(cls, v: Any) -> Any:
        return _flatten_dotted(v)

    @model_validator(mode="before")
    @classmethod
    def _primary_set(cls, data: Any) -> Any:
        """``[set]`` left out of a file with variants is the primary variant's ``set``."""
        if isinstance(data, dict) and "set" not in data and isinstance(data.get("variants"), dict):
            prim = data["variants"].get(data.get("primary"))
            if isinstance(prim, dict) and isinstance(prim.get("set"), dict):
                data = {**data, "set": prim["set"]}
        return data

    @model_validator(mode="after")
    def _variants(self) -> Lever:
        for n in self.variants:
            if not re.match(VARIANT_NAME, n):
                raise ValueError(f"variants.{n}: a variant name is lower-case letters, digits and '-'")
        if not self.variants:
            if self.primary is not None or self.primary_why is not None:
                raise ValueError("primary: 'primary' and 'primary_why' go with [variants.*]; there are none")
            return self
        if self.primary is None:
            raise ValueError("primary: missing (a lever with [variants.*] names the one [set] is)")
        if self.primary not in self.variants:
            raise ValueError(f"primary: '{self.primary}' is not one of the variants "
                             f"({', '.join(sorted(self.variants))})")
        if not self.primary_why:
            raise ValueError(f"primary_why: missing (why '{self.primary}' is taken as the lever)")
        prim = self.variants[self.primary]
        if prim.set is None:
            raise ValueError(f"primary: '{self.primary}' is not runnable (it has 'needs'): "
                             "the primary must be a variant the model can run")
        if prim.set != self.set:
            raise ValueError(f"set: differs from the set of the primary variant '{self.primary}' "
                             "(write it once, in the variant)")
        return self

    def variant_set(self, variant: str | None) -> dict[str, Any]:
        """The changes of one variant (None: the primary, i.e. ``[set]``)."""
        if variant is None:
            return self.set
        if variant not in self.variants:
            raise scn_mod.ScenarioError(f"{self.path}: variants: no variant '{variant}' "
                                        f"(have: {', '.join(sorted(self.variants)) or 'none'})")
        v = self.variants[variant]
        if v.set is None:
            raise scn_mod.ScenarioError(f"{self.path}: variants.{variant}: not runnable yet "
                                        f"(needs {v.needs})")
        return v.set


VARIANT_SEP = "@"
"""``NAME@VARIANT``: a lever reference that applies one variant instead of ``[set]``."""


def split_ref(ref: str) -> tuple[str, str | None]:
    """``NAME@VARIANT`` -> (NAME, VARIANT); a plain name or path -> (it, None)."""
    name, sep, variant = str(ref).rpartition(VARIANT_SEP)
    if not sep or not variant or "/" in variant:
        return str(ref), None
    return name, variant


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
        msg = err["msg"].removeprefix("Value error, ")
        # a whole-lever check names its field at the start of its message
        raise scn_mod.ScenarioError(f"{p}: {field}: {msg}" if field else f"{p}: {msg}") from None
    return lev


def load_with_levers(scenario: str | Path, levers: Sequence[str] = (),
                     overrides: Overrides | None = None, *,
                     base: Overrides | None = None, base_source: str = "run configuration",
                     variants: Mapping[str, str] | None = None) -> Scenario:
    """The scenario, then ``base`` (how a run was configured before its levers, as a
    record's ``sim.set``), then each lever's ``[set]`` in order, then ``overrides``.
    ``variants`` maps a lever name to the variant applied in place of its ``[set]``; a
    reference ``NAME@VARIANT`` in ``levers`` does the same for that lever.

    A bad value in a lever's ``[set]`` is reported against the lever file."""
    layers: list[tuple[str, Overrides]] = [(base_source, base)] if base else []
    variants = variants or {}
    for ref in levers:
        name, v = split_ref(ref)
        lev = load_lever(name)
        v = v or variants.get(name)
        layers.append((lev.path if v is None else f"{lev.path} [variants.{v}]", lev.variant_set(v)))
    return scn_mod.load(scenario, overrides, layers)


def all_levers() -> list[str]:
    return sorted(p.stem for p in LEVER_DIR.glob("*.toml"))
