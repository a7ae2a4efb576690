"""Every primitive kernel source compiles with nvcc for sm_90 (CI has nvcc, no GPU).

Why: no GPU in CI, so a broken kernel must be stopped at compile time. Sources are
compiled in parallel (each a few seconds) so the whole check stays well under a
minute on two cores. A deliberately broken copy proves the check can fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.cuda import NVCC

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "hw" / "primitives"
# bindings.cpp needs Python and pybind11 headers; it is built on the GPU machine only.
SOURCES = sorted(p for p in [*SRC.glob("*.cu"), *SRC.glob("*.cpp")] if p.name != "bindings.cpp")
FAMILIES = {
    "latency",
    "stores_fences",
    "wqe_doorbell",
    "cq_poll",
    "proxy_ring",
    "shared_queue",
    "host_read",
    "fence_reads",
    "warp_copy",
    "turn_handoff",
    "nvlink",
}

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")


def _nvcc(src: Path, out: Path) -> subprocess.CompletedProcess:
    # host -O0 keeps it fast; ptxas still optimises device code (its default is -O3)
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-c", str(src), "-o", str(out / (src.name + ".o"))]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=170)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("prim_obj")
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as ex:
        return dict(
            zip([s.name for s in SOURCES], ex.map(lambda s: _nvcc(s, out), SOURCES), strict=True)
        )


def test_one_source_per_family():
    assert {p.stem for p in SRC.glob("*.cu")} == FAMILIES


@pytest.mark.parametrize("name", [s.name for s in SOURCES])
def test_source_compiles_for_sm90(compiled, name):
    r = compiled[name]
    assert r.returncode == 0, f"{name} failed to compile:\n{r.stderr[-3000:]}"


def test_kernels_use_no_torch():
    for p in [*SRC.glob("*.cu"), *SRC.glob("*.cuh"), *SRC.glob("*.h")]:
        text = p.read_text()
        assert "#include <torch" not in text and "ATen" not in text, p.name


def test_broken_kernel_fails_to_compile(tmp_path):
    """The check above can fail: a kernel with a type error does not compile."""
    bad = tmp_path / "broken.cu"
    bad.write_text(
        (SRC / "latency.cu").read_text().replace("uint64_t idx = start;", "uint64_t idx = start")
    )
    shutil.copy(SRC / "common.cuh", tmp_path)
    shutil.copy(SRC / "prim.h", tmp_path)
    r = _nvcc(bad, tmp_path)
    assert r.returncode != 0


def test_wqe_and_cqe_layouts_mirror_efa():
    # the EFA layouts live in hw/efa_io_defs.h, shared with hw/ep; common.cuh includes it
    common = (SRC / "common.cuh").read_text()
    assert '#include "../efa_io_defs.h"' in common
    text = common + (SRC.parent / "efa_io_defs.h").read_text()
    for needle in (
        "struct efa_io_tx_meta_desc",
        "struct efa_io_tx_wqe",
        "struct efa_io_remote_mem_addr",
        "sizeof(efa_io_tx_meta_desc) == 32",
        "sizeof(efa_io_tx_wqe) == 64",
        "immediate_data",
        "dest_qp_num",
        "struct alignas(16) Cqe",
    ):
        assert needle in text, needle
