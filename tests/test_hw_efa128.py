"""128-byte WQEs with inline writes (rdma-core v63) and completion counters (after v64) on
the EFA path, without an EFA device or a GPU.

Why these tests: the kernels, the emulated NIC and the EFA host setup gained a second
device generation (hw/efa/README.md, "Newer device generations"). What can be shown
here is shown here: the project's 128-byte WQE and its declarations of the newer verbs
match a newer rdma-core's own headers at compile time (where a tree is given: no
registry carries one newer than v59, so ``$LEVER_RDMA_CORE_TREE`` names it), and a v59
header can not pass for one; the host setup, linked with fake libraries of either
generation, makes 128-byte inline-write QPs and counters in the right order, refuses a
too-old library or a device without the capability in one line and tears everything
down; the wiring plans and fills those layouts on fake devices and refuses what the
device or library lacks; ``lever hw ep --nic efa`` refuses a too-old rdma-core before
CUDA with one line; the emulated NIC's generation settings are checked. The kernel entry
(``lever_ep_check_nic``) and the WQE read-back for these layouts are in
tests/test_hw_nic_layout.py (nvcc).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from lever.hw import emulated_nic
from lever.hw import ep as v1
from lever.hw.efa import device as efa_device
from lever.hw.efa import rdma_core, wire
from lever.hw.efa import run as efa_run
from lever.hw.efa.wire import WireError
from lever.sim.errors import UserError

from tests.efa_fake import GPU_MAP_OFFSET, FakeDevice, v59_headers, wire_world
from tests.test_hw_efa import _assert_reverse_teardown, _mock

ROOT = Path(__file__).resolve().parents[1]
EFA = ROOT / "hw" / "efa"
DATA = ROOT / "tests" / "data" / "efa"
CXX = shutil.which("g++") or shutil.which("c++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler")
NEWER = {"wqe128_inline_write": True, "comp_cntr": True}
CAPS_V59_PLUS_CNTR = 31 | efa_device.CAP_BITS["comp_cntr"]


def _run(cmd: list[str], timeout: float = 180, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _one_line(msg: str) -> str:
    assert msg and "\n" not in msg, repr(msg)
    return msg


@pytest.fixture(scope="module")
def headers() -> rdma_core.Headers:
    return v59_headers()


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> rdma_core.Headers:
    """A newer rdma-core tree's headers ($LEVER_RDMA_CORE_TREE: a checkout of v63 or later)."""
    src = os.environ.get(rdma_core.NEWER_ENV)
    if not src:
        pytest.skip(f"${rdma_core.NEWER_ENV} names no rdma-core tree newer than v59 (no registry carries one)")
    h = rdma_core.headers_from_tree(src, tmp_path_factory.mktemp("rdma-core-newer"))
    if int(h.version.split(".")[0]) < 63:
        pytest.skip(f"${rdma_core.NEWER_ENV} is rdma-core {h.version}: the 128-byte WQE needs 63+")
    return h


# ============================================================ compiled checks against the provider
def _offsets(h: rdma_core.Headers, *extra: str) -> subprocess.CompletedProcess:
    return _run([CXX, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", *h.cflags(), *extra,
                 str(EFA / "offsets_check.cpp")])


def _newer(h: rdma_core.Headers, *extra: str) -> subprocess.CompletedProcess:
    return _run([CXX, "-std=c++17", "-Wall", "-Werror", "-fsyntax-only", f"-I{h.include}", f"-I{EFA}", *extra,
                 str(EFA / "newer_verbs_check.cpp")])


@needs_cxx
def test_a_v59_header_can_not_pass_for_the_128_byte_check(headers):
    """The 128-byte checks run only where the provider header has the 128-byte WQE; asking
    for them against v59 is an error, so a test given v59 can not pass silently."""
    r = _offsets(headers, "-DLEVER_EFA_REQUIRE_128")
    assert r.returncode != 0 and "not rdma-core v63+" in r.stderr
    assert _newer(headers).returncode != 0  # v59 has no inline-write flag nor inline_buf_size_ex


@needs_cxx
def test_the_projects_128_byte_wqe_puts_the_payload_where_wqe_h_writes_it(headers, tmp_path):
    """Without a v63 header the project's own efa_io_tx_wqe_128 is still checked against
    nic_layout.h's payload offset: a header that moves it fails to compile."""
    text = (ROOT / "hw" / "efa_io_defs.h").read_text()
    old = "struct efa_io_rdma_req_128 {\n  efa_io_remote_mem_addr remote_mem;\n"
    assert old in text, "hw/efa_io_defs.h changed: update this test's mutation"
    bad = tmp_path / "efa_io_defs.h"
    bad.write_text(text.replace(old, old + "  uint64_t pad;\n"))
    r = _offsets(headers, f'-DLEVER_EFA_PROJECT_HEADER="{bad}"')
    assert r.returncode != 0 and "inline payload not at LEVER_EFA_INLINE_WRITE_OFFSET" in r.stderr
    assert _offsets(headers).returncode == 0


@needs_cxx
def test_the_128_byte_wqe_matches_a_v63_plus_provider(tree):
    r = _offsets(tree, "-DLEVER_EFA_REQUIRE_128")
    assert r.returncode == 0, r.stderr[-3000:]
    r = _offsets(tree, "-DLEVER_EFA_REQUIRE_128", "-DLEVER_EFA_SKEW_INLINE=8")
    assert r.returncode != 0 and "LEVER_EFA_INLINE_WRITE_OFFSET is not where the provider puts" in r.stderr


@needs_cxx
def test_newer_verbs_declarations_match_the_trees_headers(tree):
    """newer_verbs.h (what host.cpp resolves at run time) against the tree's efadv.h/verbs.h:
    the inline-write flag and inline_buf_size_ex (v63); the counter API where the tree has it."""
    r = _newer(tree)
    assert r.returncode == 0, r.stderr[-3000:]
    cntr = "efadv_create_comp_cntr" in (tree.include / "infiniband" / "efadv.h").read_text()
    if not cntr:
        pytest.skip(f"rdma-core {tree.version} has no completion counters (after v64)")
    r = _newer(tree, "-DLEVER_EFA_CHECK_COMP_CNTR")
    assert r.returncode == 0, r.stderr[-3000:]
    r = _newer(tree, "-DLEVER_EFA_CHECK_COMP_CNTR", "-DLEVER_EFA_SKEW_CNTR=8")
    assert r.returncode != 0 and "err_cntr_ext_mem: offset differs" in r.stderr


@needs_cxx
def test_host_setup_compiles_against_the_newer_tree(tree, tmp_path):
    """host.cpp builds against v59 (tests/test_hw_efa.py) and against a newer tree alike: its
    own declarations of the newer verbs do not clash with the tree's."""
    r = _run([CXX, "-std=c++17", "-Wall", "-c", *tree.cflags(), f"-I{EFA}", str(EFA / "host.cpp"),
              "-o", str(tmp_path / "host.o")])
    assert r.returncode == 0, r.stderr[-3000:]


# ============================================================ host setup on fake libraries
@pytest.fixture(scope="module")
def mocks(headers, tmp_path_factory) -> dict[str, Path]:
    """host.cpp with a fake libibverbs/libefa: 'new' exports the v63 and after-v64 entry points,
    'v59' does not (and refuses QP flags it does not know)."""
    out = tmp_path_factory.mktemp("efa128_mock")
    exes = {}
    for name, extra in (("new", []), ("v59", ["-DMOCK_V59"])):
        exe = out / f"mock_{name}"
        r = _run([CXX, "-std=c++17", "-O0", "-rdynamic", *extra, *headers.cflags(), f"-I{EFA}",
                  str(EFA / "host.cpp"), str(DATA / "mock_verbs.cpp"), "-o", str(exe), "-ldl"])
        assert r.returncode == 0, r.stderr
        exes[name] = exe
    return exes


@needs_cxx
def test_an_inline_write_qp_has_128_byte_wqes_and_80_inline_bytes(mocks):
    r = _mock(mocks["new"], "open-128")
    assert r["rc"] == "0" and r["live"] == "0", r
    lay = r["layout"]
    assert "create qp(128)" in r["log"]  # made with the inline-write flag
    assert lay["sq_entry_size"] == 128 and lay["version"] == efa_device.LAYOUT_VERSION
    # the device's inline_buf_size_ex (256 in the fake) bounded by the 80 bytes beside the descriptor
    assert lay["inline_write_size"] == 80 and lay["cntr_mem"] == 0 and lay["send_cntr_dev"] == 0
    plain = _mock(mocks["new"], "open")
    assert plain["layout"]["sq_entry_size"] == 64 and plain["layout"]["inline_write_size"] == 0
    _assert_reverse_teardown(r["log"])


@needs_cxx
def test_counters_are_made_before_the_qp_attached_in_reset_and_destroyed_after_it(mocks):
    r = _mock(mocks["new"], "open-cntr")
    assert r["rc"] == "0" and r["live"] == "0", r
    log = [s for s in r["log"] if "devlist" not in s]
    i = log.index
    assert i("create cntr(va)") < i("create qp") < i("attach cntr ops 16") < i("attach cntr ops 32") < i("modify INIT")
    assert i("destroy qp") < i("destroy cntr") < i("destroy cq")
    _assert_reverse_teardown(r["log"])
    lay = r["layout"]  # a host page of host.cpp's, mapped for the GPU: send count, errors, remote writes
    assert lay["cntr_mem"] == efa_device.MEM["host"]
    assert lay["send_cntr_dev"] == lay["send_cntr"] + GPU_MAP_OFFSET and lay["send_cntr"] % 4096 == 0
    assert lay["send_err_cntr_dev"] == lay["send_cntr_dev"] + 8
    assert lay["rwrite_cntr_dev"] == lay["send_cntr_dev"] + 16 and lay["rwrite_cntr"] == lay["send_cntr"] + 16
    assert r["log"].count("create map(host)") == 2  # the CQ and the counter page
    gpu = _mock(mocks["new"], "open-128-cntrgpu")
    assert gpu["rc"] == "0" and gpu["live"] == "0", gpu
    assert "create cntr(dmabuf)" in gpu["log"] and gpu["log"].count("create map(host)") == 1
    assert gpu["layout"]["cntr_mem"] == efa_device.MEM["gpu"] and gpu["layout"]["send_cntr"] == 0
    assert gpu["layout"]["send_cntr_dev"] == 0x7E0000100000 and gpu["layout"]["sq_entry_size"] == 128
    # the GPU can not map the counter page: no counter in the layout, the credit comes from the CQ
    r = _mock(mocks["new"], "open-cntr", "map:host@2")
    assert r["rc"] == "0" and r["layout"]["send_cntr_dev"] == 0 and r["layout"]["cntr_mem"] == 0


@needs_cxx
@pytest.mark.parametrize("exe, mode, fail, msg", [
    ("v59", "open-128", "", "128-byte WQEs with inline writes: rdma-core too old (libefa lacks "
                            "efadv_get_max_sq_depth, needs 63)"),
    ("v59", "open-cntr", "", "completion counters: rdma-core too old (no efadv_create_comp_cntr / "
                             "ibv_qp_attach_comp_cntr, needs a release after 64)"),
    ("new", "open-cntr", "nocap:comp_cntr", "completion counters: device lacks COMP_CNTR"),
    ("new", "open-128", "entry64", "QP made with the inline-write flag reports 64-byte WQEs (want 128)"),
    ("new", "open-128-cntr", "efadv_create_comp_cntr@2", "efadv_create_comp_cntr(remote write, host memory)"),
    ("new", "open-128-cntr", "ibv_qp_attach_comp_cntr", "ibv_qp_attach_comp_cntr(RDMA_WRITE)"),
    ("new", "open-128-cntr", "ibv_qp_attach_comp_cntr@2", "ibv_qp_attach_comp_cntr(REMOTE_RDMA_WRITE)"),
])
def test_what_the_library_or_device_lacks_is_refused_in_one_line(mocks, exe, mode, fail, msg):
    r = _mock(mocks[exe], mode, fail)
    assert r["rc"] != "0" and r["live"] == "0", r
    assert _one_line(r["err"]).startswith(msg), r["err"]
    _assert_reverse_teardown(r["log"])


@needs_cxx
def test_caps_report_the_librarys_generation(mocks):
    new = _mock(mocks["new"], "caps")["caps"]
    old = _mock(mocks["v59"], "caps")["caps"]
    assert "device_caps 127" in new and "lib_features 3 inline_ex 256" in new
    assert "lib_features 0 inline_ex 0" in old


# ============================================================ wiring on fake devices
def _world(R: int = 2, lib: dict[str, bool] | None = None, caps_bits: int = CAPS_V59_PLUS_CNTR, **plan_kw: Any):
    devs = [[FakeDevice(r, window=0x7F3000000000 + (r << 32), caps_bits=caps_bits,
                        lib_features=NEWER if lib is None else lib)] for r in range(R)]
    caps = devs[0][0].caps()
    args = dict(num_qps=3, imm=False, nrx=4, sq_depth=1024, rx_depth=4096, proxy=False, caps=caps)
    plan = wire.plan_queues(**{**args, **plan_kw})
    qs, _gathered, tables = wire_world(devs, plan)
    return devs, plan, qs, tables


def _lay(blob: bytes, i: int = 0) -> efa_device.NicLayout:
    return efa_device.NicLayout.from_buffer_copy(blob[i * wire.LAYOUT_BYTES:(i + 1) * wire.LAYOUT_BYTES])


def test_send_qps_of_the_newer_generation_carry_128_byte_wqes_and_counters():
    devs, plan, qs, tables = _world(inline_write=True, send_counters=True)
    assert plan.inline_write and plan.send_counters
    for r in range(2):
        qps = devs[r][0].qps
        sends = [qps[h.handle] for h in qs[r].send]
        assert all(s["inline_write"] and s["send_cntr"] for s in sends)
        recv_and_barrier = [qps[h.handle] for h in (*qs[r].recv, qs[r].barrier)]
        assert not any(s["inline_write"] or s["send_cntr"] for s in recv_and_barrier)
        for i in range(plan.send):
            s = _lay(tables[r]["send"][0], i)
            assert s.sq_entry_size == 128 and s.inline_write_size == 32  # the recording's inline_buf_size
            assert s.sq_max_batch == 8  # max_tx_batch counts 64-byte units
            assert s.cntr_mem == efa_device.MEM["host"] and s.send_cntr_dev == s.send_cntr + GPU_MAP_OFFSET
            assert s.send_err_cntr_dev == s.send_cntr_dev + 8
        assert _lay(tables[r]["barrier"]).sq_entry_size == 64  # the barrier QP stays v59-shaped
    _, plain, _, tables = _world()
    s = _lay(tables[0]["send"][0])
    assert not plain.inline_write and s.sq_entry_size == 64 and s.send_cntr_dev == 0


@pytest.mark.parametrize("lib, caps_bits, kw, msg", [
    ({}, CAPS_V59_PLUS_CNTR, {"inline_write": True}, "128-byte WQEs with inline writes need rdma-core 63"),
    ({}, CAPS_V59_PLUS_CNTR, {"send_counters": True}, "completion counters need an rdma-core release after 64"),
    (None, 31, {"send_counters": True}, "completion counters: the device lacks COMP_CNTR"),
    (None, CAPS_V59_PLUS_CNTR, {"send_counters": True, "proxy": True}, "the proxy path's host threads poll the CQ"),
])
def test_the_plan_refuses_a_generation_the_library_or_device_lacks(lib, caps_bits, kw, msg):
    with pytest.raises(WireError) as ei:
        _world(lib=lib, caps_bits=caps_bits, **kw)
    assert msg in _one_line(str(ei.value))


def test_layout_from_query_takes_and_checks_the_newer_fields(tmp_path):
    import json

    rec = json.loads((DATA / "query_v59.json").read_text())
    sq128 = dict(rec["wqs"]["sq"], entry_size=128)
    lay = efa_device.layout_from_query({"sq": sq128}, rec["cq"], inline_write_size=80, cntr_mem="gpu",
                                       send_cntr_dev=0x7E0000001000, send_err_cntr_dev=0x7E0000001008)
    blob = efa_device.pack_layout(lay)
    assert len(blob) == efa_device.LAYOUT_BYTES == wire.LAYOUT_BYTES
    back = efa_device.NicLayout.from_buffer_copy(blob)
    assert back.inline_write_size == 80 and back.send_err_cntr_dev == 0x7E0000001008 and back.cntr_mem == 4
    for kw, msg in (({"inline_write_size": 80}, "inline RDMA writes need the 128-byte WQEs"),
                    ({"inline_write_size": 81, "sq": sq128}, "outside [0, 80]"),
                    ({"send_cntr_dev": 0x1000, "cntr_mem": "gpu"}, "needs send_err_cntr_dev beside it"),
                    ({"send_cntr_dev": 0x1000, "send_err_cntr_dev": 0x1008}, "a counter is mapped for the GPU")):
        sq = kw.pop("sq", rec["wqs"]["sq"])
        with pytest.raises(efa_device.LayoutError) as ei:
            efa_device.layout_from_query({"sq": sq}, rec["cq"], **kw)
        assert msg in _one_line(str(ei.value))
    assert efa_device.inline_write_size(32) == 32 and efa_device.inline_write_size(32, 256) == 80


# ============================================================ one line before CUDA
def _libs(*efa_syms: str, ibv_syms: tuple[str, ...] = ()) -> dict[str, Any]:
    return {efa_device.LIBEFA: SimpleNamespace(**{s: object() for s in efa_syms}),
            efa_device.IBVERBS: SimpleNamespace(**{s: object() for s in ibv_syms})}


def test_require_features_names_the_release_it_needs():
    v59 = _libs("efadv_query_qp_wqs", "efadv_query_cq")
    efa_device.require_features(libs=v59, version=59)  # nothing asked: nothing needed
    with pytest.raises(UserError) as ei:
        efa_device.require_features(inline_write=True, libs=v59, version=59)
    assert _one_line(str(ei.value)) == ("rdma-core 59 is too old for 128-byte WQEs with inline writes: "
                                        "libefa.so.1 lacks efadv_get_max_sq_depth (needs 63)")
    v64 = _libs("efadv_query_qp_wqs", "efadv_get_max_sq_depth")
    efa_device.require_features(inline_write=True, libs=v64, version=64)
    with pytest.raises(UserError) as ei:
        efa_device.require_features(counters=True, libs=v64, version=64)
    assert _one_line(str(ei.value)) == ("rdma-core 64 is too old for completion counters: libefa.so.1 lacks "
                                        "efadv_create_comp_cntr (needs a release after 64)")
    half = _libs("efadv_create_comp_cntr")  # a libefa with counters over a libibverbs without them
    with pytest.raises(UserError, match="libibverbs.so.1 lacks ibv_qp_attach_comp_cntr"):
        efa_device.require_features(counters=True, libs=half, version=None)
    newest = _libs("efadv_get_max_sq_depth", "efadv_create_comp_cntr", ibv_syms=("ibv_qp_attach_comp_cntr",))
    efa_device.require_features(inline_write=True, counters=True, libs=newest, version=65)
    assert efa_device.lib_features(newest) == NEWER
    with pytest.raises(UserError, match="has no completion counters"):
        efa_device.require_device({"device": "rdmap16s27", "device_caps": 31}, counters=True)
    efa_device.require_device({"device": "rdmap16s27", "device_caps": CAPS_V59_PLUS_CNTR}, counters=True)


TORCHRUN = {"RANK": "1", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("argv, msg", [
    (["--efa-inline-write"], "rdma-core 59 is too old for 128-byte WQEs with inline writes: libefa.so.1 "
                             "lacks efadv_get_max_sq_depth (needs 63)"),
    (["--efa-counters"], "rdma-core 59 is too old for completion counters: libefa.so.1 lacks "
                         "efadv_create_comp_cntr (needs a release after 64)"),
    (["--efa-counters", "--path", "proxy"], "lever hw ep --nic efa --path proxy --efa-counters: the proxy "
                                             "path's host threads poll the CQ (native path only)"),
])
def test_ep_on_efa_with_a_too_old_rdma_core_exits_2_with_one_line(monkeypatch, tmp_path, capsys, argv, msg):
    from lever import cli

    monkeypatch.setattr(efa_run, "preflight", lambda what: {
        "libs": {"rdma_core": 59, "paths": {}}, "devices": {"rdmap17s0": "/x"},
        "torchrun": wire.torchrun_env(TORCHRUN)})
    v59 = _libs("efadv_query_qp_wqs", "efadv_query_cq")
    monkeypatch.setattr(efa_device, "_load_library", lambda so: v59[so])

    def no_cuda():
        raise AssertionError("CUDA reached")

    monkeypatch.setattr("lever.hw.device.require_cuda", no_cuda)
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["hw", "ep", "--nic", "efa", "--ranks", "16", "--out", "r.json", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and _one_line(err) == f"lever: error: {msg}", err
    assert not list(tmp_path.iterdir())


def test_the_efa_options_are_refused_on_the_emulated_nic():
    p = argparse.ArgumentParser()
    v1.add_args(p)
    with pytest.raises(UserError, match="--efa-counters: an EFA option .*send_completions=counter"):
        v1.main(p.parse_args(["--efa-counters", "--out", "r.json"]))


# ============================================================ the emulated NIC's generation
def test_the_emulated_nic_plays_either_generation():
    emu = emulated_nic.load()
    assert (emu.wqe_size_bytes, emu.inline_write_bytes, emu.send_completions) == (64, 0, "cq")
    assert v1.generation_tag(emu, "native") == "" and v1.generation_overrides(emu, "native") == {}
    new = emulated_nic.load(overrides={"wqe_size_bytes": "128", "inline_write_bytes": "80",
                                       "send_completions": "counter"})
    assert new.record(False, "host", "host")["values"]["wqe_size_bytes"] == 128
    assert v1.generation_tag(new, "native") == "-wqe128-cntr"
    assert v1.generation_tag(new, "proxy") == "-wqe128"  # the proxy's host threads read the CQ
    assert v1.generation_tag(new, "native", v2=True) == "-wqe128"  # V2 flushes count CQEs per slot
    assert v1.generation_overrides(new, "native") == {"platform.nic.hw_counters": True}
    assert v1.generation_overrides(new, "proxy") == {}
    for ov, msg in (({"wqe_size_bytes": "96"}, "wqe_size_bytes = 96: 64 or 128"),
                    ({"inline_write_bytes": "8"}, "inline RDMA writes need wqe_size_bytes = 128"),
                    ({"wqe_size_bytes": "128", "inline_write_bytes": "81"}, "outside [0, 80]"),
                    ({"send_completions": "both"}, "allowed cq, counter")):
        with pytest.raises(UserError, match=msg.replace("[", r"\[").replace("]", r"\]")):
            emulated_nic.load(overrides=ov)


def test_efa_info_names_the_generation_the_library_and_device_have():
    """What `lever hw efa-info` and a run record's nic line say of the newer generations."""
    base = {"device": "rdmap16s27", "rdma_core": 65, "caps": {"rdma_write": True, "comp_cntr": True},
            "max_tx_batch": 16, "max_rdma_size": 1 << 30, "inline_buf_size": 32, "inline_write_size": 80}
    nic = efa_device.record_platform({**base, "lib_features": NEWER})["nic"]
    assert "; 128-byte WQEs, inline write 80; completion counters)" in nic
    v59 = efa_device.record_platform({**base, "lib_features": {"wqe128_inline_write": False, "comp_cntr": False}})
    assert "128-byte" not in v59["nic"] and "counters" not in v59["nic"]
    no_cap = efa_device.record_platform({**base, "caps": {"comp_cntr": False}, "lib_features": NEWER})["nic"]
    assert "inline write 80" in no_cap and "completion counters" not in no_cap
