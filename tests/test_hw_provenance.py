"""Records say exactly what ran (issue 17 item 6): a clean 40-hex revision or a refusal,
the kernel sources' hash, build flags, GPU topology (hw/provenance.py).

Why: a record with ``git_rev: "HEAD"`` or the revision of a tree with local changes names
the wrong code. These tests build throw-away git repositories and check that a clean tree
gives its commit, a dirty one is refused with one line unless allowed (then recorded as
dirty), a copy inside another checkout is not given that checkout's commit, and the
environment override of the device runner is validated. No GPU, no torch.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from lever.calibration.records import Provenance
from lever.hw import provenance as pv
from lever.sim.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("LEVER_GIT_REV", raising=False)
    monkeypatch.delenv("LEVER_GIT_DIRTY", raising=False)
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    _git(r, "config", "user.email", "t@example.com")
    _git(r, "config", "user.name", "t")
    (r / "k.cu").write_text("__global__ void k() {}\n")
    _git(r, "add", "k.cu")
    _git(r, "commit", "-q", "-m", "one")
    return r


def test_clean_tree_gives_its_40_hex_commit(repo):
    got = pv.require_revision(False, repo)
    assert got == {"git_rev": _git(repo, "rev-parse", "HEAD"), "dirty": False}
    assert pv.HEX40.match(got["git_rev"])


def test_dirty_tree_is_refused_unless_allowed(repo):
    (repo / "k.cu").write_text("__global__ void k2() {}\n")
    with pytest.raises(UserError) as ei:
        pv.require_revision(False, repo)
    msg = str(ei.value)
    assert "\n" not in msg and "uncommitted changes (M k.cu" in msg and "--allow-dirty" in msg
    got = pv.require_revision(True, repo)
    assert got["dirty"] is True and got["git_rev"] == _git(repo, "rev-parse", "HEAD")


def test_untracked_files_do_not_make_it_dirty(repo):
    (repo / "out.json").write_text("{}")  # a record being written into the tree
    assert pv.require_revision(False, repo)["dirty"] is False


def test_a_copy_inside_another_checkout_is_not_given_its_commit(repo):
    inner = repo / ".wt-copy"
    inner.mkdir()
    with pytest.raises(UserError, match="lies inside the checkout .*set \\$LEVER_GIT_REV"):
        pv.require_revision(False, inner)


def test_no_git_needs_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("LEVER_GIT_REV", raising=False)
    with pytest.raises(UserError, match="not a git checkout and \\$LEVER_GIT_REV is not set"):
        pv.require_revision(False, tmp_path)
    assert pv.require_revision(True, tmp_path) == {"git_rev": "", "dirty": True}
    monkeypatch.setenv("LEVER_GIT_REV", "HEAD")
    with pytest.raises(UserError, match="'HEAD' is not a 40-hex commit"):
        pv.require_revision(False, tmp_path)
    rev = "6a638a10157ab3bcbb5de6f02677f0eafa493d72"
    monkeypatch.setenv("LEVER_GIT_REV", rev)
    assert pv.require_revision(False, tmp_path) == {"git_rev": rev, "dirty": False}
    monkeypatch.setenv("LEVER_GIT_DIRTY", "1")
    with pytest.raises(UserError, match="uncommitted changes"):
        pv.require_revision(False, tmp_path)


def test_sources_hash_changes_with_content_and_name(tmp_path):
    a, b = tmp_path / "a.cu", tmp_path / "b.cuh"
    a.write_text("x")
    b.write_text("y")
    h = pv.sources_sha256([a, b], tmp_path)
    assert h == pv.sources_sha256([b, a], tmp_path) and len(h) == 64
    b.write_text("y2")
    assert pv.sources_sha256([a, b], tmp_path) != h
    b.write_text("y")
    b.rename(tmp_path / "c.cuh")
    assert pv.sources_sha256([a, tmp_path / "c.cuh"], tmp_path) != h


def test_the_harnesses_hash_every_kernel_source_they_build():
    from lever.hw import ep, primitives

    ep_files = {p.name for p in ep.kernel_sources()}
    assert {"ep_kernels.cu", "binding.cpp", "efa_emu.cuh", "emu_nic.h", "wqe.h", "nic_layout.h",
            "efa_io_defs.h"} <= ep_files
    prim = {p.name for p in primitives.kernel_files()}
    assert {p.name for p in primitives.sources()} <= prim and {"common.cuh", "wqe.h"} <= prim
    assert len(ep.kernel_sources_sha256()) == 64


def test_provenance_schema_carries_the_new_fields_and_reads_old_records():
    p = Provenance(source="x", git_rev="a" * 40, dirty=True, kernel_sha256="b" * 64,
                   build_flags="nvcc -O3", gpu_topology="GPU0 X")
    assert p.dirty and p.kernel_sha256 == "b" * 64
    old = Provenance(source="x", git_rev="HEAD")  # records older than the fields still load
    assert old.dirty is False and old.kernel_sha256 == ""


def test_topology_and_flags_are_one_line():
    topo = pv.gpu_topology()
    assert "\n" not in topo and topo
    assert "TORCH_CUDA_ARCH_LIST=" in pv.build_flags()
