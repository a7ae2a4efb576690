"""The host side of the EFA path (hw/efa), without an EFA device.

Why these tests: no machine here or in CI has an EFA device, so what can be proven
without one is proven here: discovery fails with one line naming what is missing;
queue queries in the ``efa`` package's shape become the kernels' NIC layout, and
bad ones are refused; the project's WQE/CQE structs match rdma-core v59's at
compile time (and a shifted field fails to compile, so the check can fail); the
host setup compiles against v59 and, linked with a fake libibverbs/libefa, makes
and tears down its objects in reverse order on every failure path.

The v59 headers come from the pyverbs 59.0 sdist on PyPI, cached under
``$LEVER_RDMA_CORE_DIR`` or ``~/.cache/lever/rdma-core-59`` (hw/efa/rdma_core.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from lever.hw.efa import cli as efa_cli
from lever.hw.efa import device as efa_device
from lever.hw.efa import rdma_core
from lever.hw.efa.device import LayoutError
from lever.sim.errors import UserError

from tests.cuda import NVCC
from tests.efa_fake import v59_headers

ROOT = Path(__file__).resolve().parents[1]
EFA = ROOT / "hw" / "efa"
DATA = ROOT / "tests" / "data" / "efa"
CXX = shutil.which("g++") or shutil.which("c++")
CC = shutil.which("gcc") or shutil.which("cc")
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler")


def _run(cmd: list[str], timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="session")
def headers() -> rdma_core.Headers:
    """rdma-core v59 headers, fetched once into the cache (skipped only without PyPI)."""
    return v59_headers()


@pytest.fixture()
def recorded() -> dict[str, Any]:
    return json.loads((DATA / "query_v59.json").read_text())


def _one_line(msg: str) -> str:
    assert msg and "\n" not in msg, repr(msg)
    return msg


# ============================================================ (a) discovery without a device
def test_discover_here_raises_one_line():
    with pytest.raises(UserError) as ei:
        efa_device.discover()
    msg = _one_line(str(ei.value))
    assert msg.startswith(("no EFA device:", "rdma-core")), msg


def test_missing_libibverbs(monkeypatch):
    monkeypatch.setattr(efa_device, "_load_library", lambda soname: None)
    with pytest.raises(UserError, match=r"^no EFA device: libibverbs\.so\.1 not found$"):
        efa_device.discover()


def test_missing_libefa(monkeypatch):
    monkeypatch.setattr(efa_device, "_load_library",
                        lambda s: SimpleNamespace() if s == efa_device.IBVERBS else None)
    with pytest.raises(UserError) as ei:
        efa_device.discover()
    assert _one_line(str(ei.value)).startswith("no EFA device: libefa.so.1 not found")


def _libs_present(monkeypatch, efa_symbols: tuple[str, ...], version: int | None) -> None:
    libefa = SimpleNamespace(**{s: object() for s in efa_symbols})
    monkeypatch.setattr(efa_device, "_load_library",
                        lambda s: SimpleNamespace() if s == efa_device.IBVERBS else libefa)
    monkeypatch.setattr(efa_device, "_rdma_core_version", lambda soname: version)


def test_rdma_core_too_old(monkeypatch):
    _libs_present(monkeypatch, ("efadv_query_device", "efadv_create_qp_ex"), 44)
    with pytest.raises(UserError) as ei:
        efa_device.discover()
    assert _one_line(str(ei.value)) == "rdma-core 44 is too old for efadv_query_qp_wqs (needs 59)"


def test_rdma_core_too_old_version_unknown(monkeypatch):
    _libs_present(monkeypatch, ("efadv_query_qp_wqs",), None)  # efadv_query_cq missing
    with pytest.raises(UserError) as ei:
        efa_device.discover()
    assert _one_line(str(ei.value)) == (
        "rdma-core is too old for efadv_query_cq: libefa.so.1 lacks it (needs 59)")


def test_rdma_core_version_from_library_file_name():
    maps = ("7f1c2d000000-7f1c2d020000 r-xp 00000000 08:01 131 "
            "/usr/lib/x86_64-linux-gnu/libefa.so.1.3.44.0\n"
            "7f1c2e000000-7f1c2e001000 rw-p 00000000 00:00 0\n")
    assert efa_device._rdma_core_version("libefa.so.1", maps) == 44
    assert efa_device._rdma_core_version("libibverbs.so.1", maps) is None


def test_efa_package_missing(monkeypatch):
    _libs_present(monkeypatch, efa_device.NEEDED_SYMBOLS, 59)
    monkeypatch.setitem(sys.modules, "efa", None)  # import efa -> ModuleNotFoundError
    with pytest.raises(UserError) as ei:
        efa_device.discover()
    assert _one_line(str(ei.value)) == (
        "no EFA device: the efa package is not installed (pip install efa)")


# ---------------------------------------------------------------- a fake `efa` package
def _num(v: Any) -> int:
    return int(v, 0) if isinstance(v, str) else int(v)


def fake_efa(rec: dict[str, Any], devices: tuple[str, ...] = ("efa_0",),
             efa_devices: tuple[str, ...] = ("efa_0",), log: list[str] | None = None):
    """A module with the efa package's API surface, answering from a recorded query."""
    log = log if log is not None else []
    m = types.ModuleType("efa")
    m.__version__ = "2026.10.22"
    m.EfaError = type("EfaError", (OSError,), {})
    m.QPInitAttr = lambda **kw: SimpleNamespace(**kw)

    class Closable:
        kind = "?"

        def __init__(self) -> None:
            log.append(f"create {self.kind}")

        def close(self) -> None:
            log.append(f"destroy {self.kind}")

    class QP(Closable):
        kind = "qp"
        qp_num = rec["qp_num"]

        def __init__(self, attr: Any) -> None:
            super().__init__()
            self.attr = attr

        def query_wqs(self):
            w = rec["wqs"]
            return tuple(SimpleNamespace(**{k: _num(v) for k, v in w[q].items()})
                         for q in ("sq", "rq"))

    class CQ(Closable):
        kind = "cq"

        def query_efa(self):
            return SimpleNamespace(**{k: _num(v) for k, v in rec["cq"].items()})

    class PD(Closable):
        kind = "pd"

        def create_qp(self, attr: Any) -> QP:
            return QP(attr)

    class Ctx(Closable):
        kind = "ctx"

        def query_efa_device(self):
            return SimpleNamespace(**rec["efa_device_attr"])

        def query_device(self):
            return SimpleNamespace(fw_ver="0.0.0.0", vendor_id=0x1D0F, max_qp=256, max_cq=512,
                                   max_cqe=32768, max_mr=262144, max_mr_size=1 << 40)

        def query_port(self, port: int):
            return SimpleNamespace(state=4, active_mtu=5, max_mtu=5, max_msg_sz=8928, link_layer=0)

        def query_gid(self, port: int, index: int) -> bytes:
            return bytes(range(0xF0, 0x100))

        def alloc_pd(self) -> PD:
            return PD()

        def create_cq(self, cqe: int) -> CQ:
            return CQ()

    class Device:
        def __init__(self, name: str) -> None:
            self.name, self.guid = name, 0x0A0B0C0D0E0F1011

        def open(self) -> Ctx:
            return Ctx()

    m.get_device_list = lambda: [Device(n) for n in devices]
    m.get_efa_device_list = lambda: [Device(n) for n in efa_devices]
    return m


def test_no_ibv_device(monkeypatch, recorded):
    _libs_present(monkeypatch, efa_device.NEEDED_SYMBOLS, 59)
    monkeypatch.setitem(sys.modules, "efa", fake_efa(recorded, devices=(), efa_devices=()))
    with pytest.raises(UserError) as ei:
        efa_device.discover()
    assert _one_line(str(ei.value)).startswith("no EFA device: no ibv device (")


def test_no_device_of_the_efa_provider(monkeypatch, recorded):
    _libs_present(monkeypatch, efa_device.NEEDED_SYMBOLS, 59)
    monkeypatch.setitem(sys.modules, "efa", fake_efa(recorded, devices=("mlx5_0",), efa_devices=()))
    with pytest.raises(UserError) as ei:
        efa_device.discover()
    assert _one_line(str(ei.value)) == (
        "no EFA device: no ibv device of the EFA provider (found: mlx5_0)")


def test_discover_on_a_fake_device(monkeypatch, recorded):
    """The whole discovery path on the recorded answers: capabilities, the probe's
    layout, and the probe objects destroyed in reverse order."""
    log: list[str] = []
    _libs_present(monkeypatch, efa_device.NEEDED_SYMBOLS, 59)
    monkeypatch.setitem(sys.modules, "efa", fake_efa(recorded, log=log))
    info = efa_device.discover()
    assert info["device"] == "efa_0" and info["rdma_core"] == 59
    assert info["max_sq_wr"] == 4096 and info["max_rdma_size"] == 1 << 30
    assert info["caps"] == {"rdma_read": True, "rnr_retry": True, "cq_with_sgid": True,
                            "rdma_write": True, "unsolicited_write_recv": True,
                            "cq_with_ext_mem_dmabuf": False, "comp_cntr": False}
    # the v59 library of the recording: none of the newer generations
    assert info["lib_features"] == {"wqe128_inline_write": False, "comp_cntr": False}
    assert info["inline_buf_size_ex"] == 0 and info["inline_write_size"] == 32
    assert info["max_tx_batch"] == 16
    assert info["probe"]["layout"]["sq_num_entries"] == 1024
    assert info["probe"]["layout"]["qp_num"] == 18
    assert log == ["create ctx", "create pd", "create cq", "create qp",
                   "destroy qp", "destroy cq", "destroy pd", "destroy ctx"]
    json.dumps(info)  # JSON-ready
    with pytest.raises(UserError, match="no EFA device named efa_9"):
        efa_device.discover(device="efa_9")


# ============================================================ (b) layout from a query
def _expected_layout(rec: dict[str, Any]) -> dict[str, int]:
    sq, cq = rec["wqs"]["sq"], rec["cq"]
    return {
        "version": 2, "qp_num": 18,
        "sq_buffer": _num(sq["buffer_addr"]), "sq_buffer_dev": 0,
        "sq_doorbell": _num(sq["doorbell_addr"]), "sq_doorbell_dev": 0,
        "sq_entry_size": 64, "sq_num_entries": 1024, "sq_max_batch": 16,
        "sq_buffer_mem": 1, "sq_doorbell_mem": 1, "sq_phase_first": 0,
        "cq_buffer": _num(cq["buffer_addr"]), "cq_buffer_dev": 0, "cq_doorbell": 0,
        "cq_entry_size": 32, "cq_num_entries": 4096, "cq_buffer_mem": 2, "cq_phase_first": 1,
        "qkey": 0x11111111, "lkey": 0x1234, "local_addr": 0x7E0000000000,
        "inline_buf_size": 32, "max_rdma_size": 1 << 30, "device_caps": 31,
        "num_peers": 0, "peers": 0, "peers_mem": 0, "reserved": 0,
        "inline_write_size": 0, "cntr_mem": 0, "send_cntr": 0, "send_cntr_dev": 0,
        "send_err_cntr_dev": 0, "rwrite_cntr": 0, "rwrite_cntr_dev": 0,
    }


def _layout(rec: dict[str, Any], wqs: Any = None, cq: Any = None, **kw: Any) -> dict[str, int]:
    args = {"qp_num": rec["qp_num"], "qkey": 0x11111111, "lkey": 0x1234,
            "local_addr": 0x7E0000000000, "inline_buf_size": 32, "max_rdma_size": 1 << 30,
            "device_caps": 31, **kw}
    return efa_device.layout_from_query(rec["wqs"] if wqs is None else wqs,
                                        rec["cq"] if cq is None else cq, **args)


def test_layout_from_recorded_query(recorded):
    assert _layout(recorded) == _expected_layout(recorded)


def test_layout_from_package_objects(recorded):
    """The same from the objects the package returns ((sq, rq) WQAttr, CQAttr)."""
    w = recorded["wqs"]
    wqs = tuple(SimpleNamespace(**{k: _num(v) for k, v in w[q].items()}) for q in ("sq", "rq"))
    cq = SimpleNamespace(**{k: _num(v) for k, v in recorded["cq"].items()})
    assert _layout(recorded, wqs, cq) == _expected_layout(recorded)


def test_layout_accepts_rdma_core_names(recorded):
    sq = {("buffer" if k == "buffer_addr" else "doorbell" if k == "doorbell_addr" else k): v
          for k, v in recorded["wqs"]["sq"].items()}
    cq = {("buffer" if k == "buffer_addr" else k): v for k, v in recorded["cq"].items()}
    assert _layout(recorded, {"sq": sq}, cq) == _expected_layout(recorded)


def test_layout_bounds_no_batch_limit_by_the_ring(recorded):
    recorded["wqs"]["sq"]["max_batch"] = 65535  # v59: the device set no max_tx_batch
    assert _layout(recorded)["sq_max_batch"] == 1024


def test_layout_gpu_memory_cq(recorded):
    lay = _layout(recorded, cq_buffer_mem="gpu")
    assert lay["cq_buffer"] == 0 and lay["cq_buffer_dev"] == _num(recorded["cq"]["buffer_addr"])
    assert lay["cq_buffer_mem"] == efa_device.MEM["gpu"]


BAD = [
    ("sq", "entry_size", 96, "sq.entry_size: 96 is not 64 or 128 bytes"),
    ("sq", "entry_size", "sixty-four", "sq.entry_size: 'sixty-four' is not an integer"),
    ("sq", "entry_size", True, "sq.entry_size: True is not an integer"),
    ("sq", "num_entries", 1000, "sq.num_entries: 1000 is not a power of two in [2, 65536]"),
    ("sq", "num_entries", 131072, "sq.num_entries: 131072 is not a power of two"),
    ("sq", "num_entries", 1, "sq.num_entries: 1 is not a power of two"),
    ("sq", "buffer_addr", 0, "sq.buffer_addr: null"),
    ("sq", "buffer_addr", "0x7f5a2c6e1008", "sq.buffer_addr: 0x7f5a2c6e1008 is not 64-byte aligned"),
    ("sq", "doorbell_addr", 0, "sq.doorbell_addr: null"),
    ("sq", "doorbell_addr", "0x7f5a2c6f0006", "sq.doorbell_addr: 0x7f5a2c6f0006 is not 4-byte"),
    ("sq", "max_batch", 0, "sq.max_batch: 0"),
    ("sq", "max_batch", -1, "sq.max_batch: -1 is outside [0, 2^64)"),
    ("cq", "entry_size", 24, "cq.entry_size: 24 is not 16, 32 or 64 bytes"),
    ("cq", "entry_size", 128, "cq.entry_size: 128 is not 16, 32 or 64 bytes"),
    ("cq", "num_entries", 3000, "cq.num_entries: 3000 is not a power of two"),
    ("cq", "buffer_addr", 0, "cq.buffer_addr: null"),
    ("cq", "buffer_addr", "0x7f5a2c200008", "cq.buffer_addr: 0x7f5a2c200008 is not 16-byte"),
]


@pytest.mark.parametrize(("queue", "field", "value", "msg"), BAD,
                         ids=[f"{q}.{f}={v}" for q, f, v, _ in BAD])
def test_layout_refuses_bad_values(recorded, queue, field, value, msg):
    target = recorded["wqs"]["sq"] if queue == "sq" else recorded["cq"]
    target[field] = value
    with pytest.raises(LayoutError) as ei:
        _layout(recorded)
    assert isinstance(ei.value, UserError)
    assert _one_line(str(ei.value)).startswith(msg)


def test_layout_refuses_missing_fields_and_bad_keys(recorded):
    del recorded["wqs"]["sq"]["max_batch"]
    with pytest.raises(LayoutError, match=r"^sq: no field 'max_batch'"):
        _layout(recorded)
    rec = json.loads((DATA / "query_v59.json").read_text())
    with pytest.raises(LayoutError, match="16-bit dest_qp_num"):
        _layout(rec, qp_num=0x10000)
    with pytest.raises(LayoutError, match="24-bit lkey"):
        _layout(rec, lkey=1 << 24)
    with pytest.raises(LayoutError, match="cq_buffer_mem: 'bar' is not one of"):
        _layout(rec, cq_buffer_mem="bar")
    with pytest.raises(LayoutError, match=r"query_wqs result is \(sq, rq\)"):
        _layout(rec, wqs=[rec["wqs"]["sq"]])


C_LAYOUT_PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include "nic_layout.h"
int main(int argc, char** argv) {
  lever_efa_nic_layout l;
  FILE* f = argc > 1 ? fopen(argv[1], "rb") : NULL;
  if (argc < 2 || !f || fread(&l, sizeof(l), 1, f) != 1) return 3;
  fclose(f);
  printf("size %zu\n", sizeof(lever_efa_nic_layout));
/*OFFSETS*/
  const char* why = lever_efa_layout_problem(&l);
  printf("problem %s\n", why ? why : "none");
  printf("phase %u %u %u %u\n", lever_efa_sq_phase(0, 1024), lever_efa_sq_phase(1024, 1024),
         lever_efa_cq_phase(0, 4096), lever_efa_cq_phase(4096, 4096));
  printf("doorbell %u slot %u\n", lever_efa_sq_doorbell_value(65537), lever_efa_slot(1025, 1024));
  return 0;
}
"""


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_ctypes_mirror_and_rules_match_the_c_header(tmp_path, recorded):
    """nic_layout.h compiles as C11; the ctypes mirror has its offsets; pack_layout's
    bytes read back field by field; and the header's own rules agree with Python's."""
    names = [f[0] for f in efa_device.NicLayout._fields_]
    lines = "\n".join(
        f'  printf("field {n} %zu %llu\\n", offsetof(lever_efa_nic_layout, {n}), '
        f"(unsigned long long)l.{n});" for n in names)
    src = tmp_path / "probe.c"
    src.write_text(C_LAYOUT_PROBE.replace("/*OFFSETS*/", lines))
    exe = tmp_path / "probe"
    r = _run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{EFA}", str(src), "-o", str(exe)])
    assert r.returncode == 0, r.stderr

    def probe(layout: dict[str, int]) -> dict[str, list[str]]:
        blob = tmp_path / "layout.bin"
        blob.write_bytes(efa_device.pack_layout(layout))
        out = _run([str(exe), str(blob)])
        assert out.returncode == 0, out.stderr
        rows: dict[str, list[str]] = {}
        for ln in out.stdout.splitlines():
            key, *rest = ln.split()
            rows[key + (" " + rest[0] if key == "field" else "")] = rest[1:] if key == "field" else rest
        return rows

    good = _layout(recorded)
    rows = probe(good)
    assert rows["size"] == [str(efa_device.ctypes.sizeof(efa_device.NicLayout))] == ["200"]
    for n in names:
        off, val = rows[f"field {n}"]
        assert int(off) == getattr(efa_device.NicLayout, n).offset, n
        assert int(val) == good[n], n
    assert rows["problem"] == ["none"]
    assert rows["phase"] == ["0", "1", "1", "0"]  # SQ first lap 0, CQ first lap 1
    assert rows["doorbell"] == ["1", "slot", "1"]
    bad = dict(good, sq_entry_size=96)  # bypassing the Python check: C refuses it too
    assert " ".join(probe(bad)["problem"]) == "sq_entry_size: not 64 or 128"


# ============================================================ (c) compiled offset check
def _offsets_cmd(headers: rdma_core.Headers, *extra: str) -> list[str]:
    return [CXX, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", *headers.cflags(),
            *extra, str(EFA / "offsets_check.cpp")]


@needs_cxx
def test_offsets_check_compiles_against_v59(headers):
    assert (headers.efa_provider / "efa_io_defs.h").exists()
    assert 'set(PACKAGE_VERSION "59.0")' in (headers.tree / "CMakeLists.txt").read_text()
    r = _run(_offsets_cmd(headers))
    assert r.returncode == 0, r.stderr


@needs_cxx
def test_shifted_field_fails_the_offset_check(headers):
    r = _run(_offsets_cmd(headers, "-DLEVER_EFA_SKEW=2"))
    assert r.returncode != 0
    assert "efa_io_tx_meta_desc.ah: offset differs" in r.stderr


@needs_cxx
def test_drifted_project_header_fails_the_offset_check(headers, tmp_path):
    """A project header with two fields swapped (same size, wrong offsets) is caught."""
    text = (ROOT / "hw" / "efa_io_defs.h").read_text()
    old = "uint16_t dest_qp_num;\n  uint16_t length;"
    assert old in text, "hw/efa_io_defs.h changed: update this test's mutation"
    bad = tmp_path / "efa_io_defs.h"
    bad.write_text(text.replace(old, "uint16_t length;\n  uint16_t dest_qp_num;"))
    r = _run(_offsets_cmd(headers, f'-DLEVER_EFA_PROJECT_HEADER="{bad}"'))
    assert r.returncode != 0
    assert "efa_io_tx_meta_desc.dest_qp_num: offset differs" in r.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_offset_check_and_layout_helpers_compile_with_nvcc(headers, tmp_path):
    """The same check as CUDA, plus a kernel using nic_layout.h's device helpers."""
    src = tmp_path / "layout_kernel.cu"
    src.write_text(
        f'#include "{EFA / "offsets_check.cpp"}"\n'
        "__global__ void k(lever_efa_nic_layout l, unsigned long long* out) {\n"
        "  unsigned pc = threadIdx.x;\n"
        "  out[0] = lever_efa_sq_slot_dev(&l, pc) + lever_efa_sq_phase(pc, l.sq_num_entries);\n"
        "  out[1] = lever_efa_cq_entry_dev(&l, pc) + lever_efa_cq_phase(pc, l.cq_num_entries);\n"
        "  out[2] = lever_efa_sq_doorbell_value(pc) + (lever_efa_layout_problem(&l) != 0);\n"
        "}\n")
    r = _run([NVCC, "-std=c++17", "-arch=sm_90", *headers.cflags(), f"-I{EFA}", "-c", str(src),
              "-o", str(tmp_path / "k.o")])
    assert r.returncode == 0, r.stderr[-3000:]


# ============================================================ (d) host setup code
@needs_cxx
def test_host_compiles_against_v59(headers):
    r = _run([CXX, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
              *headers.cflags(), f"-I{EFA}", str(EFA / "host.cpp")])
    assert r.returncode == 0, r.stderr


@needs_cxx
def test_host_header_needs_no_rdma_core_headers():
    r = _run([CXX, "-std=c++17", "-Wall", "-Werror", "-fsyntax-only", f"-I{EFA}", "-x", "c++",
              "-"], input='#include "host.h"\nint main() { return 0; }\n')
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def mock_host(headers, tmp_path_factory) -> Path:
    """host.cpp linked with a fake libibverbs/libefa that logs every object."""
    exe = tmp_path_factory.mktemp("efa_mock") / "mock_host"
    r = _run([CXX, "-std=c++17", "-O0", "-rdynamic", *headers.cflags(), f"-I{EFA}", str(EFA / "host.cpp"),
              str(DATA / "mock_verbs.cpp"), "-o", str(exe), "-ldl"])
    assert r.returncode == 0, r.stderr
    return exe


def _mock(exe: Path, mode: str = "open", fail: str = "", max_batch: int = 16) -> dict[str, Any]:
    r = _run([str(exe), mode, fail, str(max_batch)])
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = {"log": [], "layout": {}}
    for ln in r.stdout.splitlines():
        key, _, rest = ln.partition(" ")
        if key == "log":
            out["log"].append(rest)
        elif key == "layout":
            name, val = rest.split()
            out["layout"][name] = int(val)
        else:
            out[key] = rest
    return out


def _assert_reverse_teardown(log: list[str]) -> None:
    def kind(s: str) -> str:
        return s.split(" ", 1)[1].split("(")[0]

    made = [kind(s) for s in log if s.startswith("create ") and kind(s) != "devlist"]
    gone = [kind(s) for s in log if s.startswith("destroy ") and kind(s) != "devlist"]
    assert gone == made[::-1], log
    assert log.count("create devlist") == log.count("destroy devlist")


@needs_cxx
def test_host_setup_runs_on_fake_verbs(mock_host):
    r = _mock(mock_host)
    assert r["rc"] == "0" and r["live"] == "0", r
    assert r["peer"] == "0 ahn 7 qpn 17 rkey 39612"
    lay = r["layout"]
    assert lay["version"] == 2 and lay["qp_num"] == 42
    assert lay["sq_num_entries"] == 1024 and lay["sq_entry_size"] == 64 and lay["sq_max_batch"] == 16
    assert lay["sq_buffer_mem"] == lay["sq_doorbell_mem"] == efa_device.MEM["device_bar"]
    assert lay["sq_buffer_dev"] == lay["sq_buffer"] + (1 << 44)  # mapped, offset in page kept
    assert lay["sq_doorbell_dev"] == lay["sq_doorbell"] + (1 << 44)
    assert lay["cq_entry_size"] == 32 and lay["cq_num_entries"] == 4096
    assert lay["cq_buffer_mem"] == efa_device.MEM["host"] and lay["cq_buffer_dev"] != 0
    assert lay["sq_phase_first"] == 0 and lay["cq_phase_first"] == 1
    assert lay["lkey"] == 0x1234 and lay["num_peers"] == 1 and lay["peers_mem"] == 4
    assert "mr via ibv_reg_dmabuf_mr" in r["log"]
    assert ["modify INIT", "modify RTR", "modify RTS"] == [s for s in r["log"] if "modify" in s]
    assert "map not page-aligned" not in r["log"]
    _assert_reverse_teardown(r["log"])


FAIL_AT = ["ibv_get_device_list", "ibv_open_device", "efadv_query_device", "ibv_alloc_pd",
           "ibv_reg_dmabuf_mr,ibv_reg_mr", "efadv_create_cq", "efadv_create_qp_ex",
           "ibv_modify_qp", "ibv_modify_qp:RTS", "efadv_query_qp_wqs", "ibv_create_ah",
           "efadv_query_ah", "efadv_query_cq"]


@needs_cxx
@pytest.mark.parametrize("fail", FAIL_AT)
def test_host_setup_tears_down_on_every_failure(mock_host, fail):
    r = _mock(mock_host, fail=fail)
    assert r["rc"] != "0" and r["live"] == "0", r
    assert _one_line(r["err"])
    _assert_reverse_teardown(r["log"])


@needs_cxx
def test_host_setup_variants(mock_host):
    r = _mock(mock_host, fail="ibv_reg_dmabuf_mr")  # falls back to ibv_reg_mr
    assert r["rc"] == "0" and "mr via ibv_reg_mr" in r["log"]
    r = _mock(mock_host, max_batch=65535)  # no device batch limit: the ring bounds it
    assert r["layout"]["sq_max_batch"] == r["layout"]["sq_num_entries"]
    r = _mock(mock_host, fail="map:host")  # the GPU can't map the CQ: a host thread polls
    assert r["rc"] == "0" and r["layout"]["cq_buffer_mem"] == efa_device.MEM["host_only"]
    assert r["layout"]["cq_buffer_dev"] == 0 and r["live"] == "0"
    r = _mock(mock_host, mode="open-gpucq")  # CQ ring in GPU memory by dma-buf
    assert r["layout"]["cq_buffer_mem"] == efa_device.MEM["gpu"] and r["layout"]["cq_buffer"] == 0
    r = _mock(mock_host, mode="caps")
    assert r["caps"].startswith("efa_0 max_sq_wr 4096 device_caps 127")
    assert "max_tx_batch 16" in r["caps"] and r["live"] == "0"
    _assert_reverse_teardown(r["log"])


def _world(exe: Path, fail: str = "", nqp: int = 3) -> dict[str, Any]:
    r = _run([str(exe), "world", fail, "16", str(nqp)])
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = {"log": [], "peer": [], "qp": []}
    for ln in r.stdout.splitlines():
        key, _, rest = ln.partition(" ")
        if key in ("log", "peer", "qp"):
            out[key].append(rest)
        else:
            out[key] = rest
    return out


@needs_cxx
def test_a_ranks_qps_share_one_device_and_its_ahs(mock_host):
    """Several QPs on one device, a peer table of two ranks x two queues: one AH per peer GID,
    every QP's layout counts the whole table, a receive-only QP's SQ is not mapped, one QP
    closes on its own and the rest with the device, nothing left alive."""
    r = _world(mock_host)
    assert r["rc"] == "0" and r["live"] == "0", r
    assert r["ahs"] == "2"
    ahn = [p.split()[2] for p in r["peer"]]
    assert ahn[0] == ahn[1] != ahn[2] == ahn[3]  # one AH per rank's GID
    qps = [q.split() for q in r["qp"]]
    assert [q[2] for q in qps] == ["42", "43", "44"] and all(q[4] == "4" for q in qps)
    assert qps[0][6] != "0" and qps[2][6] == "0"  # the receive-only QP's SQ is not mapped
    assert r["closed"] == "qp 0 rc 0"
    assert r["log"].count("create ah") == 2 and r["log"].count("destroy ah") == 2
    assert r["log"].count("create qp") == r["log"].count("destroy qp") == 3
    assert r["log"][-3:] == ["destroy mr", "destroy pd", "destroy ctx"]


@needs_cxx
@pytest.mark.parametrize("fail", ["efadv_create_qp_ex@2", "efadv_create_cq@3", "ibv_modify_qp:RTS@1",
                                  "ibv_create_ah@2", "efadv_query_ah@1", "map:any@4", "efadv_query_cq@2"])
def test_a_failure_mid_world_tears_everything_down(mock_host, fail):
    """A QP (or AH, or mapping) failing after others were made: the call fails with one line,
    what it made is undone, and closing the device undoes the rest; nothing stays alive."""
    r = _world(mock_host, fail=fail)
    assert r["live"] == "0", r
    if fail.startswith("map:"):  # a mapping the GPU refused: the CQ is left to a host poller
        assert r["rc"] == "0" and r["qp"], r
        return
    assert r["rc"] != "0", r
    assert _one_line(r["err"])
    assert r["log"].count("create qp") == r["log"].count("destroy qp")
    assert r["log"].count("create cq") == r["log"].count("destroy cq")
    assert r["log"][-1] == "destroy ctx"


@needs_cxx
def test_device_teardown_is_the_reverse_of_a_ranks_build(mock_host):
    """QPs, then AHs, then mappings: the device undoes mappings, AHs, QPs+CQs, MR, PD, context."""
    r = _world(mock_host, nqp=2)
    log = [s for s in r["log"] if s.split()[0] in ("create", "destroy") and "devlist" not in s]
    # drop the QP closed on its own (QP 0: its mappings, QP and CQ) before the device close
    first_close = log.index("destroy map")
    own = log[first_close:first_close + 5]
    assert own == ["destroy map", "destroy map", "destroy map", "destroy qp", "destroy cq"]
    rest = log[first_close + 5:]
    assert rest == ["destroy map", "destroy ah", "destroy ah", "destroy qp", "destroy cq",
                    "destroy mr", "destroy pd", "destroy ctx"]


# ============================================================ the EFA extension compiles
def _torch_include() -> list[str]:
    import sysconfig

    torch = pytest.importorskip("torch", reason="the binding's pybind11 headers come with torch")
    return [f"-I{Path(torch.__file__).parent / 'include'}", f"-I{sysconfig.get_paths()['include']}"]


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_efa_binding_compiles_against_v59(headers, tmp_path):
    """hw/efa/binding.cpp (pybind11 + CUDA runtime + host.h) as the extension builds it, with
    rdma-core v59's headers (CI: nvcc and g++, no rdma-core, no GPU)."""
    r = _run([NVCC, "-std=c++17", "-c", "-Xcompiler", "-Wall,-Wextra", *_torch_include(), f"-I{headers.include}",
              f"-I{EFA}", "-DTORCH_EXTENSION_NAME=lever_hw_efa", str(EFA / "binding.cpp"),
              "-o", str(tmp_path / "binding.o")], timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    r = _run([CXX or "g++", "-std=c++17", "-c", *headers.cflags(), f"-I{EFA}", str(EFA / "host.cpp"),
              "-o", str(tmp_path / "host.o")])
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_efa_kernels_compile_for_sm90(tmp_path):
    """The cross-node barrier and the primitives kernels (plain CUDA C++, no torch)."""
    text = (EFA / "efa_kernels.cu").read_text() + (EFA / "efa_kernels.h").read_text()
    for bad in ("#include <torch", "#include <ATen", "torch::"):
        assert bad not in text
    r = _run([NVCC, "-std=c++17", "-arch=sm_90", "-O3", f"-I{EFA}", "-c", str(EFA / "efa_kernels.cu"),
              "-o", str(tmp_path / "k.o")], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


# ============================================================ the command and the fetcher
def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    efa_cli.add_args(p)
    return p.parse_args(argv)


def test_cli_without_a_device_raises_one_line():
    with pytest.raises(UserError) as ei:
        efa_cli.main(_args([]))
    _one_line(str(ei.value))


def test_cli_report_and_json(monkeypatch, recorded, tmp_path, capsys):
    from lever.calibration.records import PlatformInfo

    _libs_present(monkeypatch, efa_device.NEEDED_SYMBOLS, 59)
    monkeypatch.setitem(sys.modules, "efa", fake_efa(recorded))
    assert efa_cli.main(_args([])) == 0
    text = capsys.readouterr().out
    assert "max_tx_batch" in text and "16" in text and "rdma_write" in text
    out = tmp_path / "efa-info.json"
    assert efa_cli.main(_args(["--out", str(out)])) == 0
    rep = json.loads(out.read_text())
    assert rep["kind"] == "lever-efa-info" and rep["record"]["nic"] == "efa"
    assert rep["capabilities"]["max_tx_batch"] == 16
    plat = PlatformInfo.model_validate(rep["record"]["what"]["platform"])
    assert plat.nic.startswith("EFA efa_0 (rdma-core 59;")


def test_fetcher_reads_the_simple_index_and_names_an_unreachable_one(tmp_path, monkeypatch):
    """The archive comes from the index page pip reads (PEP 503), found among other files by
    its name; no build of the sdist's metadata. A dead index is 'unreachable' (tests skip),
    an index without the archive is not."""
    import functools
    import http.server
    import threading

    root = tmp_path / "index"
    (root / "pyverbs").mkdir(parents=True)
    (root / "files").mkdir()
    (root / "files" / rdma_core.SDIST).write_bytes(b"the archive")
    (root / "pyverbs" / "index.html").write_text(
        '<a href="../files/pyverbs-58.0.tar.gz#sha256=00">pyverbs-58.0.tar.gz</a>\n'
        f'<a href="../files/{rdma_core.SDIST}#sha256={rdma_core.SDIST_SHA256}">{rdma_core.SDIST}</a>\n')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{srv.server_address[1]}"
        assert rdma_core.sdist_url(index).endswith(f"/files/{rdma_core.SDIST}#sha256={rdma_core.SDIST_SHA256}")
        monkeypatch.setenv(rdma_core.INDEX_ENV, index)
        got = rdma_core.download(tmp_path)
        assert got == tmp_path / rdma_core.SDIST and got.read_bytes() == b"the archive"
        (root / "pyverbs" / "index.html").write_text('<a href="../files/pyverbs-58.0.tar.gz">x</a>')
        with pytest.raises(rdma_core.FetchError, match="no pyverbs-59.0.tar.gz listed") as e:
            rdma_core.download(tmp_path)
        assert not e.value.unreachable
    finally:
        srv.shutdown()
        srv.server_close()
    monkeypatch.setenv(rdma_core.INDEX_ENV, index)  # the server is gone: connection refused
    with pytest.raises(rdma_core.FetchError) as e:
        rdma_core.download(tmp_path, timeout=5.0)
    assert e.value.unreachable


def test_fetcher_refuses_a_wrong_archive(tmp_path):
    import tarfile

    tb = tmp_path / rdma_core.SDIST
    with tarfile.open(tb, "w:gz"):
        pass
    with pytest.raises(rdma_core.FetchError, match="is not the pinned"):
        rdma_core.ensure_headers(tmp_path / "cache", tarball=tb)
    assert rdma_core._wanted("pyverbs-59.0/rdma-core/providers/efa/efadv.h") == "providers/efa/efadv.h"
    assert rdma_core._wanted("pyverbs-59.0/rdma-core/providers/efa/../../x.h") is None
    assert rdma_core._wanted("pyverbs-59.0/rdma-core/providers/mlx5/mlx5dv.h") is None
