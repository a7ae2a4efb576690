"""Loading scenarios from TOML: includes, overrides, validation with provenance.

A scenario file is a fragment: top-level tables ``[platform]``, ``[workload]``,
``[design]`` (and keys ``name``, ``description``, ``seed``, ``ops``) plus an
optional ``include = [...]`` list of other fragments, paths relative to the
including file. Includes merge first, in order; the file's own tables win.
Each leaf remembers which file set it, so a validation error names the file
that holds the bad value, not just the scenario that pulled it in.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from lever.sim.errors import UserError, read_user_file
from lever.sim.params import Scenario
from pydantic import ValidationError

# Shipped scenarios are package data (lever.scenarios): found the same way from a checkout,
# an editable install or a wheel, whatever the working directory.
SCENARIO_DIR = Path(str(resources.files("lever.scenarios")))


class ScenarioError(UserError, ValueError):
    """Bad scenario input; ``str()`` is the one-line message for the user."""


def resolve(name_or_path: str | Path, kind: str = "") -> Path:
    """Find a scenario by path, or by name under ``scenarios/`` (``kind`` a subfolder)."""
    p = Path(name_or_path)
    candidates = [p]
    if p.suffix != ".toml":
        candidates.append(p.with_suffix(".toml"))
    base = SCENARIO_DIR / kind if kind else SCENARIO_DIR
    candidates += [base / p, base / p.with_suffix(".toml"), SCENARIO_DIR / p.with_suffix(".toml")]
    for c in candidates:
        try:
            if c.is_file():
                return c
        except (OSError, ValueError):  # a name no file can have (too long, a NUL byte)
            break
    raise ScenarioError(f"{name_or_path}: no such scenario file (looked in {base})")


def _read_toml(path: Path) -> dict[str, Any]:
    text = read_user_file(path, ScenarioError, "TOML")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path}: not valid TOML: {e}") from None


def _merge(dst: dict, src: dict, origin: dict, src_file: str, prefix: tuple = ()) -> None:
    """Deep-merge ``src`` into ``dst``; record the file of every leaf in ``origin``."""
    for k, v in src.items():
        key = (*prefix, k)
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v, origin, src_file, key)
        else:
            dst[k] = copy.deepcopy(v)
            origin[key] = src_file
            if isinstance(v, dict):
                for sub in _leaves(v, key):
                    origin[sub] = src_file


def _leaves(d: dict, prefix: tuple) -> list[tuple]:
    out = []
    for k, v in d.items():
        out.append((*prefix, k))
        if isinstance(v, dict):
            out += _leaves(v, (*prefix, k))
    return out


def load_fragment(path: Path, origin: dict, _stack: tuple = ()) -> dict[str, Any]:
    """Read a fragment with its includes resolved (cycles are errors)."""
    path = path.resolve()
    if path in _stack:
        raise ScenarioError(f"{path}: include cycle")
    raw = _read_toml(path)
    includes = raw.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ScenarioError(f"{path}: include: must be a list of file paths")
    merged: dict[str, Any] = {}
    for inc in includes:
        inc_path = (path.parent / inc).resolve()
        if not inc_path.is_file():
            raise ScenarioError(f"{path}: include: missing file {inc}")
        _merge(merged, load_fragment(inc_path, origin, (*_stack, path)), {}, str(inc_path))
    _merge(merged, raw, origin, _display(path))
    return merged


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


Overrides = Mapping[str, Any]
"""Typed overrides: dotted path (``design.doorbell_batch``) -> value, applied to a scenario's
data before validation. Inside the program overrides travel in this form; the text form
``PATH=VALUE`` exists only on the command line (:func:`parse_set`)."""


def parse_value(text: str) -> Any:
    """The value of a ``PATH=VALUE`` override: a TOML literal (number, bool, string, array),
    else the text itself as a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_set(text: str, source: str = "--set") -> tuple[str, Any]:
    """One command-line override ``PATH=VALUE`` -> ``(path, value)``."""
    if "=" not in text:
        raise ScenarioError(f"{source}: '{text}': expected PATH=VALUE")
    path, value = text.split("=", 1)
    path = path.strip()
    if not path or any(not k for k in path.split(".")):
        raise ScenarioError(f"{source}: '{text}': expected PATH=VALUE with a dotted PATH")
    return path, parse_value(value.strip())


def parse_sets(texts: Iterable[str], source: str = "--set") -> dict[str, Any]:
    """Command-line overrides in order (a later one for the same path wins)."""
    out: dict[str, Any] = {}
    for t in texts:
        k, v = parse_set(t, source)
        out.pop(k, None)
        out[k] = v
    return out


TIED_OVERRIDES: dict[str, str] = {"design.signal_mode": "design.signal_mode_with_counters"}
"""Setting the first also sets the second, where the design sets the second and the same
overrides do not: a signalling mode chosen by a lever or ``--set`` holds on every NIC, also
where the design would otherwise switch to the device's completion counters."""


def _get_path(data: dict, path: str) -> Any:
    cur: Any = data
    for k in path.split("."):
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return cur


def apply_overrides(data: dict, overrides: Overrides, origin: dict, source: str = "--set") -> None:
    """Set each dotted path of ``overrides`` in nested ``data``; ``origin`` remembers ``source``."""
    overrides = dict(overrides)
    for path, tied in TIED_OVERRIDES.items():
        if path in overrides and tied not in overrides and _get_path(data, tied) is not None:
            overrides[tied] = overrides[path]
    for path, value in overrides.items():
        keys = path.split(".")
        cur = data
        for k in keys[:-1]:
            cur = cur.setdefault(k, {})
            if not isinstance(cur, dict):
                raise ScenarioError(f"{source}: {path}: {k} is not a table")
        cur[keys[-1]] = copy.deepcopy(value)
        origin[tuple(keys)] = source


def validate(data: dict, origin: dict, label: str) -> Scenario:
    """Validate merged data; the first error becomes a one-line message."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(str(x) for x in err["loc"])
        field = ".".join(loc) or "(top level)"
        where = label
        for n in range(len(loc), 0, -1):
            if loc[:n] in origin:
                where = origin[loc[:n]]
                break
        got = f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], dict) else ""
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "missing (no file set it: is an include missing?)"
        raise ScenarioError(f"{where}: {field}: {msg}{got}") from None


def load(name_or_path: str | Path, overrides: Overrides | None = None,
         layers: Iterable[tuple[str, Overrides]] = ()) -> Scenario:
    """Load, merge, override and validate a scenario.

    ``layers`` are ``(source, overrides)`` applied first, in order (a lever file's
    ``[set]`` names that file as its source); ``overrides`` last, as ``--set``.
    """
    path = resolve(name_or_path)
    origin: dict = {}
    data = load_fragment(path, origin)
    data.setdefault("name", path.stem)
    for source, ov in layers:
        apply_overrides(data, ov, origin, source)
    apply_overrides(data, overrides or {}, origin)
    return validate(data, origin, _display(path))


def compose(platform: str, design: str, workload: str = "decode-ep16", ep: int | None = None,
            overrides: Overrides | None = None) -> Scenario:
    """A scenario built from named files: ``platforms/PLATFORM``, ``workloads/WORKLOAD`` and
    ``designs/DESIGN`` (names or paths), at ``ep`` ranks when given, then ``overrides``.

    This is what a scenario file's ``include`` list does, from the command line; a scenario
    file stays the way to save one."""
    origin: dict = {}
    data: dict[str, Any] = {}
    for kind, name, opt in (("platforms", platform, "--platform"), ("workloads", workload, "--workload"),
                            ("designs", design, "--design")):
        try:
            path = resolve(name, kind=kind)
        except ScenarioError:
            known = ", ".join(sorted(p.stem for p in (SCENARIO_DIR / kind).glob("*.toml")))
            raise ScenarioError(f"{opt} {name}: no such file in {kind}/ (known: {known})") from None
        _merge(data, load_fragment(path, origin), {}, _display(path))
    if ep is not None:
        data.setdefault("workload", {})["ep_ranks"] = ep
        origin[("workload", "ep_ranks")] = "--ep"
    label = f"{Path(design).stem}@{Path(platform).stem}-ep{data.get('workload', {}).get('ep_ranks', '?')}"
    data["name"] = label
    apply_overrides(data, overrides or {}, origin)
    return validate(data, origin, label)


def digest(obj: Any) -> str:
    """sha256 of a JSON-able object in canonical form."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def platform_digest(scn: Scenario) -> str:
    return digest(scn.platform.model_dump(mode="json"))
