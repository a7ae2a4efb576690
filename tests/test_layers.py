"""The import contract: each top-level folder is one layer, and imports point down.

    lever (command line, reports)  ->  lever.hw  ->  lever.calibration  ->  lever.sim

A module may import its own layer and the layers below it, never one above; the
model and the calibration never import torch (it is the ``hw`` extra's). Every
import counts, including those inside functions and ``importlib.import_module``
of a literal name. The checker runs on the real tree, and on a copy with one
wrong-way import planted, which it must catch.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# folder -> (package it installs as, rank); higher ranks may import lower ones
LAYERS: dict[str, tuple[str, int]] = {
    "sim": ("lever.sim", 0),
    "calibration": ("lever.calibration", 1),
    "hw": ("lever.hw", 2),
    "lever": ("lever", 3),
}
DATA_PACKAGES = ("lever.scenarios", "lever.calibration.data")
NO_TORCH = ("sim", "calibration")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, relative imports resolved to absolute names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}:{node.lineno}: relative import (use lever.<layer>...)")
            out.append((node.lineno, node.module or ""))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def layer_of_module(name: str) -> int | None:
    """Rank of the layer an absolute module name belongs to (None: outside the project)."""
    if name in DATA_PACKAGES or any(name.startswith(d + ".") for d in DATA_PACKAGES):
        return -1  # data, importable from anywhere
    best = None
    for pkg, rank in LAYERS.values():
        if name == pkg or name.startswith(pkg + "."):
            if best is None or len(pkg) > len(best[0]):
                best = (pkg, rank)
    return None if best is None else best[1]


def violations(root: Path) -> list[str]:
    """Every wrong-way or forbidden import under the layer folders of ``root``."""
    bad = []
    for folder, (_pkg, rank) in LAYERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            for line, mod in _imports(path):
                top = mod.split(".")[0]
                where = f"{path.relative_to(root)}:{line}"
                if top in ("sim", "calibration", "hw"):
                    bad.append(f"{where}: imports '{mod}' (the installed name is lever.{mod})")
                    continue
                if folder in NO_TORCH and top == "torch":
                    bad.append(f"{where}: {folder}/ imports torch")
                    continue
                r = layer_of_module(mod)
                if r is not None and r > rank:
                    bad.append(f"{where}: {folder}/ (layer {rank}) imports '{mod}' (layer {r})")
    return bad


def test_the_tree_keeps_the_import_contract():
    assert violations(ROOT) == []


@pytest.mark.parametrize("folder, line", [
    ("sim", "from lever.calibration.records import RunRecord\n"),
    ("sim", "def f():\n    import lever.cli\n"),
    ("calibration", "import importlib\nimportlib.import_module('lever.hw.ep')\n"),
    ("calibration", "import torch\n"),
    ("hw", "from lever.commands import simulate\n"),
    ("sim", "from sim.params import Platform\n"),
])
def test_a_planted_wrong_way_import_is_caught(tmp_path, folder, line):
    for f in LAYERS:
        shutil.copytree(ROOT / f, tmp_path / f, ignore=shutil.ignore_patterns("data", "*.cu*", "ep"))
    (tmp_path / folder / "planted.py").write_text(line)
    found = violations(tmp_path)
    assert len(found) == 1 and "planted.py" in found[0], found


def test_installed_names_map_to_the_folders():
    """pyproject maps every layer folder under the one ``lever`` name."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = cfg["package-dir"]
    for folder, (pkg, _rank) in LAYERS.items():
        assert dirs[pkg] == folder
    assert dirs["lever.scenarios"] == "scenarios"
    assert not any(p.split(".")[0] != "lever" for p in cfg["packages"])
