"""What exactly ran: the revision, the kernel sources, the build flags and the GPU topology.

Why: a record is evidence only if it names the code that produced it. ``git_rev: "HEAD"``
(what older records carry) names nothing, and a revision of a tree with local changes
names the wrong code. So the hardware harnesses (``lever hw ep``, ``lever hw
primitives``) take their provenance from here, before any GPU work:

* ``git_rev`` is a 40-hex commit. A tree with changes to tracked files is refused with
  one line unless ``--allow-dirty`` is given, and then ``dirty = true`` is recorded. A
  tree copied without ``.git`` (the device runner's copy) names its commit in
  ``$LEVER_GIT_REV`` (40 hex; ``$LEVER_GIT_DIRTY=1`` when the copy was not clean). A copy
  that sits inside another checkout is not that checkout's commit: git's top level must
  be the tree itself.
* ``kernel_sha256`` hashes the sources the extension is built from, so two records with
  the same hash ran the same device code whatever the revision says.
* ``build_flags`` and ``gpu_topology`` say how it was compiled and on what.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lever.sim.errors import UserError

HEX40 = re.compile(r"^[0-9a-f]{40}$")
ROOT = Path(__file__).resolve().parent.parent


def _git(root: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                           timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def git_state(root: Path = ROOT) -> tuple[str, bool, str]:
    """(40-hex revision or "", dirty, why it is unknown). Environment first, then git."""
    env = os.environ.get("LEVER_GIT_REV", "").strip()
    if env:
        if not HEX40.match(env):
            return "", False, f"$LEVER_GIT_REV {env!r} is not a 40-hex commit"
        return env, os.environ.get("LEVER_GIT_DIRTY", "") not in ("", "0"), ""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None:
        return "", False, f"{root} is not a git checkout and $LEVER_GIT_REV is not set"
    if Path(top.strip()).resolve() != root.resolve():
        return "", False, (f"{root} lies inside the checkout {top.strip()}, whose commit is not "
                           "this tree's: set $LEVER_GIT_REV")
    rev = (_git(root, "rev-parse", "HEAD") or "").strip()
    if not HEX40.match(rev):
        return "", False, f"git rev-parse HEAD gave {rev!r}"
    changed = _git(root, "status", "--porcelain", "--untracked-files=no")
    return rev, bool(changed and changed.strip()), ""


def require_revision(allow_dirty: bool, root: Path = ROOT) -> dict[str, Any]:
    """``{"git_rev", "dirty"}`` for a record, or a one-line UserError: an unknown revision or
    a dirty tree is refused unless ``allow_dirty`` (then recorded as such)."""
    rev, dirty, why = git_state(root)
    if why:
        if not allow_dirty:
            raise UserError(f"no clean revision to record: {why} (or pass --allow-dirty)")
        return {"git_rev": rev, "dirty": True}
    if dirty and not allow_dirty:
        changed = (_git(root, "status", "--porcelain", "--untracked-files=no") or "").split("\n")
        first = changed[0].strip() if changed and changed[0].strip() else "?"
        raise UserError(f"the tree at {rev[:12]} has uncommitted changes ({first} ...): commit "
                        "them, or pass --allow-dirty to record a dirty run")
    return {"git_rev": rev, "dirty": dirty}


def sources_sha256(files: Iterable[Path], base: Path = ROOT) -> str:
    """sha256 over (relative path, contents) of the files, in sorted order."""
    h = hashlib.sha256()
    for f in sorted(Path(p) for p in files):
        if f.is_file():
            rel = f.resolve().relative_to(base.resolve()).as_posix()
            h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def gpu_topology() -> str:
    """The GPUs and their links as ``nvidia-smi topo -m`` prints them (one line per row,
    joined with ' | '), or what could not be read."""
    try:
        r = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi topo -m failed: {type(e).__name__}"
    rows = []
    for ln in r.stdout.splitlines():
        ln = re.sub(r"\x1b\[[0-9;]*m", "", ln).strip()
        if not ln or ln.startswith("Legend"):
            if ln.startswith("Legend"):
                break
            continue
        rows.append(" ".join(ln.split()))
    return " | ".join(rows) or "nvidia-smi topo -m printed nothing"


def build_flags(extra: Iterable[str] = ()) -> str:
    """How hw/build.py compiles an extension (its fixed flags and the architecture list)."""
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0 (hw/build.py default)")
    return " ".join(["nvcc -O3", *extra, f"TORCH_CUDA_ARCH_LIST={arch}",
                     "host -O3 (torch.utils.cpp_extension.load)"])
