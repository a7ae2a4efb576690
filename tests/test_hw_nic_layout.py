"""One device-side path for both NICs (issue 18), checked without a GPU or an EFA device.

Why these tests: the EP kernels reach their queues only through ``lever_efa_nic_layout``
tables and a peer table, and build WQEs with ``hw/efa/wqe.h``. What must hold is that
the tables the emulated NIC fills (``hw/ep/emu_nic.h``) and tables built from a real
device's queue queries (``layout_from_query`` on a recorded ``query_wqs``/``query_cq``
result, the ``efa`` package's shape) pass the same entry of the compiled kernels
(``lever_ep_check_nic`` in ``hw/ep/ep_kernels.cu``, linked here by nvcc and run on the
host), that the entry refuses tables the kernels could not drive, and that the WQE the
builder makes from either reads back through rdma-core v59's own struct and masks the
way the v59 provider writes it (first-lap phase 0, req_id the slot, MBZ bytes 0, 24-bit
lkey, qkey/AH/QPN from the peer). The emulator's layout constants are compared by the
compiler, not by reading source text. ``--nic efa`` fails with one line without EFA, and
the tables the EFA wiring (hw/efa/wire.py) builds pass the same entry.

None of this needs torch: nothing here is skipped when torch is missing.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from lever.hw.efa import device as efa_device
from lever.hw.efa import rdma_core

from tests.cuda import NVCC
from tests.efa_fake import v59_headers

ROOT = Path(__file__).resolve().parents[1]
EP = ROOT / "hw" / "ep"
EFA = ROOT / "hw" / "efa"
DATA = ROOT / "tests" / "data" / "efa"
CXX = shutil.which("g++") or shutil.which("c++")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")


def _run(cmd: list[str], timeout: float = 300, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def headers() -> rdma_core.Headers:
    return v59_headers()


@pytest.fixture(scope="module")
def entry(headers, tmp_path_factory) -> Path:
    """tests/data/efa/nic_entry_check.cu linked with the real hw/ep/ep_kernels.cu (nvcc)."""
    if NVCC is None:
        pytest.skip("nvcc not installed")
    out = tmp_path_factory.mktemp("nic_entry")
    exe = out / "nic_entry_check"
    r = _run([NVCC, "-std=c++17", "-arch=sm_90", "-O2", f"-I{EP}", *headers.cflags(),
              str(DATA / "nic_entry_check.cu"), str(EP / "ep_kernels.cu"), "-o", str(exe)], timeout=400)
    assert r.returncode == 0, r.stderr[-4000:]
    return exe


def _rows(out: str) -> dict[str, str]:
    rows = {}
    for ln in out.splitlines():
        key, _, rest = ln.partition(" ")
        rows[key] = rest
    return rows


def _recorded() -> dict[str, Any]:
    return json.loads((DATA / "query_v59.json").read_text())


def _num(v: Any) -> int:
    return int(v, 0) if isinstance(v, str) else int(v)


def device_tables(nq: int = 2, nrx: int = 3, ranks: int = 2, **over: Any) -> dict[str, Any]:
    """NIC tables as the EFA host setup would hand them to the kernels: layouts from the
    recorded v59 queue queries (one SRD QP per queue, each mapped for the GPU), and the
    peer table every rank gathers (AH, QPN, qkey, rkey of each destination queue)."""
    rec = _recorded()
    dev = rec["efa_device_attr"]
    mapped = 0x7e0000000000  # where cudaHostRegister / cuMemHostGetDevicePointer put them
    lay = []
    for q in range(nq + nrx):
        sq, cq = dict(rec["wqs"]["sq"]), dict(rec["cq"])
        args = dict(qp_num=rec["qp_num"] + q, qkey=0x5eed0000 | q, lkey=0x00a1b2,
                    local_addr=0x7f3000000000, inline_buf_size=dev["inline_buf_size"],
                    max_rdma_size=dev["max_rdma_size"], device_caps=dev["device_caps"],
                    sq_buffer_dev=mapped + _num(sq["buffer_addr"]) % (1 << 32),
                    sq_doorbell_dev=mapped + _num(sq["doorbell_addr"]) % (1 << 32),
                    cq_buffer_dev=mapped + _num(cq["buffer_addr"]) % (1 << 32),
                    peers=0x7f4000000000, num_peers=ranks * nrx, peers_mem="gpu")
        args.update(over.get("layout", {}))
        sq.update(over.get("sq", {}))
        cq.update(over.get("cq", {}))
        lay.append(efa_device.layout_from_query({"sq": sq, "rq": rec["wqs"]["rq"]}, cq, **args))
    for k, v in over.get("raw", {}).items():  # bypass Python's checks: the C entry must refuse
        lay[0][k] = v
    peers = [{"ahn": 3 + r, "remote_qpn": 40 + r * nrx + i, "remote_qkey": 0x5eed0000 | i,
              "rkey": 0x00c0ffee + r, "remote_addr": 0x7f5000000000 + r} for r in range(ranks)
             for i in range(nrx)]
    peers = [dict(p, **over.get("peer", {})) for p in peers]
    return {"send": lay[:nq], "recv": lay[nq:], "peers": peers, "nq": nq, "nrx": nrx, "R": ranks}


def run_device(exe: Path, tmp: Path, t: dict[str, Any]) -> dict[str, str]:
    files = []
    for name, blob in (("send", b"".join(efa_device.pack_layout(x) for x in t["send"])),
                       ("recv", b"".join(efa_device.pack_layout(x) for x in t["recv"])),
                       ("peers", efa_device.pack_peers(t["peers"]))):
        f = tmp / f"{name}.bin"
        f.write_bytes(blob)
        files.append(str(f))
    r = _run([str(exe), "dev", files[0], str(t["nq"]), files[1], str(t["nrx"]), files[2],
              str(t["R"])], timeout=60)
    assert r.returncode == 0, r.stderr
    return _rows(r.stdout)


# ============================================================ the same entry for both NICs
@needs_nvcc
def test_emulated_and_device_tables_pass_the_same_kernel_entry(entry, tmp_path):
    emu = _rows(_run([str(entry), "emu", "2", "96"], timeout=60).stdout)
    dev = run_device(entry, tmp_path, device_tables())
    for who, rows in (("emulated", emu), ("device", dev)):
        assert "check" in rows and rows["check"] == "ok", (who, rows)
        assert rows["wqe"].startswith("ok first-lap-phase 0 second-lap-phase 1"), (who, rows)
    # the device's own numbers went into the WQE: the peer table's AH/QPN/qkey (last rank,
    # last queue), req_id the slot of the 1024-entry SQ the query reported
    assert "req_id@n+5 5 ah 4 qpn 45 qkey 0x5eed0002" in dev["wqe"]
    assert "ah 257 qpn 16575 qkey 0x11110001" in emu["wqe"]  # emu_nic.h numbering, rank 1


@needs_nvcc
@pytest.mark.parametrize("over, why", [
    ({"layout": {"sq_buffer_dev": 0}}, "send QP 0: SQ, doorbell or CQ not mapped for the GPU"),
    ({"layout": {"cq_buffer_dev": 0}}, "not mapped for the GPU"),
    ({"raw": {"sq_entry_size": 96}}, "sq_entry_size: not 64 or 128"),
    ({"raw": {"inline_write_size": 80}}, "inline_write_size: inline RDMA writes need 128-byte WQEs"),
    ({"sq": {"entry_size": 128}, "raw": {"inline_write_size": 96}}, "above the 80 bytes a 128-byte WQE holds"),
    ({"raw": {"send_cntr_dev": 0x7E0000001000, "send_err_cntr_dev": 0x7E0000001008, "cntr_mem": 3}},
     "cntr_mem: a counter mapped for the GPU must live in GPU or host memory"),
    ({"raw": {"send_cntr_dev": 0x7E0000001000, "cntr_mem": 4}}, "send_cntr_dev: needs its error count"),
    ({"cq": {"num_entries": 512}}, "CQ shallower than the SQ"),
    ({"raw": {"lkey": 0x1000000}}, "lkey wider than 24 bits"),
    ({"raw": {"sq_phase_first": 1}}, "sq_phase_first: not 0"),
    ({"raw": {"num_peers": 5}}, "peers: not the peer table"),
    ({"raw": {"peers": 0}}, "peers: not the peer table"),
    ({"raw": {"max_rdma_size": 4096}}, "max_rdma_size below the largest message"),
    ({"peer": {"remote_qkey": 0}}, "peer 0: qkey 0"),
])
def test_the_entry_refuses_tables_the_kernels_can_not_drive(entry, tmp_path, over, why):
    rows = run_device(entry, tmp_path, device_tables(**over))
    assert rows.get("check", "").startswith("refused:"), rows
    assert why in rows["check"], rows


@needs_nvcc
def test_emulated_numbering_that_does_not_fit_16_bit_qpns_is_refused(entry):
    rows = _rows(_run([str(entry), "emu", "4096", "96"], timeout=60).stdout)
    assert "do not fit its 16-bit QP numbers" in rows["check"]


@needs_nvcc
@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_layout_filled_by_the_host_setup_passes_the_kernel_entry(entry, headers, tmp_path):
    """hw/efa/host.cpp, linked with the fake libibverbs/libefa of tests/data/efa/mock_verbs.cpp,
    opens an SRD endpoint, adds a peer, queries its queues and fills the layout; that layout
    (and the peer it made) goes through the kernels' entry and builds a v59-correct WQE."""
    exe = tmp_path / "mock_host"
    r = _run([CXX, "-std=c++17", "-O0", "-rdynamic", *headers.cflags(), f"-I{EFA}", str(EFA / "host.cpp"),
              str(DATA / "mock_verbs.cpp"), "-o", str(exe), "-ldl"], timeout=120)
    assert r.returncode == 0, r.stderr
    # v59's QP; v63's inline-write QP (128-byte WQEs) with after-v64 counters in GPU memory
    for mode, inline, credit in (("open", "none", "cq"), ("open-128-cntrgpu", "ok words 16 max 80", "counter")):
        out = _run([str(exe), mode, "", "16"], timeout=60).stdout
        lay = {ln.split()[1]: int(ln.split()[2]) for ln in out.splitlines() if ln.startswith("layout ")}
        peer = next(ln.split() for ln in out.splitlines() if ln.startswith("peer "))
        assert lay["version"] == efa_device.LAYOUT_VERSION and lay["num_peers"] == 1
        t = {"send": [dict(lay, reserved=0)], "recv": [dict(lay, reserved=0)], "nq": 1, "nrx": 1, "R": 1,
             "peers": [{"ahn": int(peer[3]), "remote_qpn": int(peer[5]), "remote_qkey": 0x11111111,
                        "rkey": int(peer[7])}]}
        rows = run_device(entry, tmp_path, t)
        assert rows["check"] == "ok", (mode, rows)
        assert rows["wqe"].startswith("ok first-lap-phase 0 second-lap-phase 1"), rows
        assert "ah 7 qpn 17 qkey 0x11111111" in rows["wqe"]
        assert rows["inline"].startswith(inline) and rows["credit"] == credit, (mode, rows)


@needs_nvcc
def test_128_byte_and_counter_tables_of_either_nic_pass_the_same_entry(entry, tmp_path):
    """The newer generation through the same kernel entry: the emulated NIC's tables with
    128-byte WQEs, 80 inline bytes and counters (emu_nic.h set_generation, what hw/ep.py's
    --emu-set wqe_size_bytes=128 inline_write_bytes=80 send_completions=counter fill), and a
    device's from a queue query reporting 128-byte entries with a counter in GPU memory: the
    check accepts both, the WQE builder writes 16 words with the payload inline from byte 48
    (read back through efa_io_tx_wqe_128), and the credit is the counter's."""
    emu = _rows(_run([str(entry), "emu", "2", "96", "128", "80", "1"], timeout=60).stdout)
    dev = run_device(entry, tmp_path, device_tables(
        sq={"entry_size": 128}, layout={"inline_write_size": 80, "cntr_mem": "gpu",
                                        "send_cntr_dev": 0x7E0000001000, "send_err_cntr_dev": 0x7E0000001008}))
    for who, rows in (("emulated", emu), ("device", dev)):
        assert rows.get("check") == "ok", (who, rows)
        assert rows["wqe"].startswith("ok first-lap-phase 0 second-lap-phase 1"), (who, rows)
        assert rows["inline"] == "ok words 16 max 80 payload@48", (who, rows)
        assert rows["credit"] == "counter", (who, rows)
    # a counter without inline writes, and 128-byte WQEs without inline writes, are generations too
    only_cntr = _rows(_run([str(entry), "emu", "2", "96", "64", "0", "1"], timeout=60).stdout)
    assert only_cntr["check"] == "ok" and only_cntr["inline"] == "none" and only_cntr["credit"] == "counter"
    only_128 = _rows(_run([str(entry), "emu", "2", "96", "128", "0", "0"], timeout=60).stdout)
    assert only_128["check"] == "ok" and only_128["inline"].startswith("ok words 16 max 0") and only_128["credit"] == "cq"
    refused = _rows(_run([str(entry), "emu", "2", "96", "64", "80", "0"], timeout=60).stdout)
    assert refused["check"] == "refused: send QP 0: inline_write_size: inline RDMA writes need 128-byte WQEs"


@needs_nvcc
def test_newer_generation_tables_the_efa_wiring_makes_pass_the_kernel_entry(entry, tmp_path):
    """hw/efa/wire.py's tables for send QPs made with the inline-write flag and counters (fake
    devices of a v63+/after-v64 library) go through lever_ep_check_nic_rails as make_world hands
    them, and each send QP's WQE is built through its own table."""
    from lever.hw.efa import wire

    from tests.test_hw_efa128 import _world

    R, nrx, rank = 2, 4, 1
    _devs, plan, _qs, tables = _world(R, inline_write=True, send_counters=True)
    t = tables[rank]
    (table_of,) = t["send_table"]
    send = _as_make_world(t["send"][0], table_of)
    lay = efa_device.NicLayout.from_buffer_copy(bytes(send[:efa_device.LAYOUT_BYTES]))
    assert lay.sq_entry_size == 128 and lay.inline_write_size > 0 and lay.send_cntr_dev != 0
    recv = t["recv"][rank * nrx * wire.LAYOUT_BYTES:(rank + 1) * nrx * wire.LAYOUT_BYTES]
    out = _rails_entry(entry, tmp_path, bytes(send), table_of, recv, nrx, t["peers"], R)
    assert out[0] == "check ok", out
    assert all(out[1 + q].startswith(f"wqe {q} ok table 0") for q in range(wire.NQ_MAX)), out


# ============================================================ compiled layout constants
LAYOUT_PROBE = r"""
#include <stddef.h>
#include "efa_emu.cuh"
static_assert(sizeof(emu::efa_io_tx_wqe) == LEVER_EFA_WQE_SIZE_V59, "WQE");
static_assert(sizeof(lever_efa_nic_layout) == 200 && sizeof(lever_efa_peer) == 24, "tables");
static_assert(emu_nic::CQE_SIZE == LEVER_EFA_CQE_SIZE_V59, "CQ entry stride is v59's");
static_assert(emu_nic::CQE_SIZE == PY_CQE_BYTES, "hw/ep.py allocates CQs at another stride");
static_assert(sizeof(emu::efa_io_tx_cdesc) <= emu_nic::CQE_SIZE &&
              sizeof(emu::efa_io_rx_cdesc) <= emu_nic::CQE_SIZE, "a CQE fits its entry");
static_assert(offsetof(emu::efa_io_rx_cdesc, imm) == 12, "RX CQE imm is the 4th word of a 16-byte load");
static_assert(offsetof(emu::efa_io_cdesc_common, flags) == 3, "flags in byte 3 of the first word");
static_assert(sizeof(emu::ProxyDesc) == 128 && sizeof(emu::QpIssuer) == 128 && sizeof(emu::NicQp) == 128,
              "128-byte lines");
static_assert(offsetof(emu::ProxyDesc, seq) == 0, "the proxy polls the first word");
static_assert(emu_nic::lkey(65535) <= LEVER_EFA_LKEY_MASK, "emulated lkeys fit 24 bits");
static_assert(LEVER_EFA_SQ_PHASE_FIRST_LAP == 0 && LEVER_EFA_CQ_PHASE_FIRST_LAP == 1, "v59 phases");
int main() { return 0; }
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
@pytest.mark.parametrize("cqe", ["ok", "drift"])
def test_emulator_layout_constants_are_compiled_checks(tmp_path, cqe):
    """The emulator's strides and sizes (and hw/ep.py's CQ stride) agree at compile time;
    a drifted Python stride fails to compile, so the check can fail."""
    from lever.hw import ep as hw_ep

    src = tmp_path / "probe.cpp"
    src.write_text(LAYOUT_PROBE)
    stride = hw_ep.CQE_BYTES if cqe == "ok" else 16
    r = _run([CXX, "-std=c++17", "-fsyntax-only", f"-I{EP}", f"-DPY_CQE_BYTES={stride}", str(src)],
             timeout=60)
    if cqe == "ok":
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode != 0 and "hw/ep.py allocates CQs at another stride" in r.stderr


def test_sq_phase_helpers_match_the_provider_rule():
    """nic_layout.h's bit-test phase equals v59's counter (phase += 1 when pc wraps), on the
    host compiler too (the kernels' copy is checked above through nvcc)."""
    for n in (2, 32, 1024):
        phase = 0
        for pc in range(3 * n + 7):
            assert ((pc & n) != 0) == bool(phase & 1) == bool((pc // n) & 1)
            if not (pc + 1) & (n - 1):
                phase += 1


# ============================================================ --nic efa without a device
@pytest.mark.parametrize("argv", [
    ["hw", "ep", "--nic", "efa", "--out", "x.json"],
    ["hw", "ep", "--nic", "efa", "--path", "proxy", "--out", "x.json"],
    ["hw", "primitives", "--nic", "efa", "--out", "x.json"],
])
def test_nic_efa_without_a_device_exits_2_with_one_line(argv, tmp_path):
    r = _run([sys.executable, "-m", "lever.cli", *argv], timeout=120, cwd=tmp_path,
             env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(("lever: error: no EFA device:", "lever: error: rdma-core")), lines[0]
    assert not (tmp_path / "x.json").exists()


RAILS_PEERS_DEV, RAILS_PEERS_STRIDE = 0x7F4000000000, 1 << 32
"""Where tests/data/efa/nic_entry_check.cu's rails mode puts each peer table's device copy."""


def _rails_entry(entry: Path, tmp: Path, send: bytes, table_of: list[int], recv: bytes, nrx: int,
                 peers: list[bytes], R: int) -> list[str]:
    files = []
    for name, blob in (("send", send), ("table_of", struct.pack(f"<{len(table_of)}i", *table_of)),
                       ("recv", recv), ("peers", b"".join(peers))):
        f = tmp / f"{name}.bin"
        f.write_bytes(blob)
        files.append(str(f))
    r = _run([str(entry), "rails", files[0], str(len(table_of)), files[1], files[2], str(nrx), files[3],
              str(len(peers)), str(R)], timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def _as_make_world(send: bytes, table_of: list[int]) -> bytearray:
    """What make_world does to a rank's send layouts: each points at the device copy of the
    peer table its send_table entry names (its device's)."""
    out = bytearray(send)
    for i, t in enumerate(table_of):
        efa_device.NicLayout.from_buffer(out, i * efa_device.LAYOUT_BYTES).peers = RAILS_PEERS_DEV + t * RAILS_PEERS_STRIDE
    return out


@needs_nvcc
@pytest.mark.parametrize("proxy, imm, ndev", [(False, False, 1), (False, True, 1), (True, False, 1),
                                              (False, False, 2), (False, True, 2), (True, True, 2)])
def test_tables_the_efa_wiring_makes_pass_the_kernel_entry(entry, tmp_path, proxy, imm, ndev):
    """The tables hw/efa/wire.py builds for a rank of a torchrun world (fake devices answering
    from the recorded v59 queries, tests/efa_fake.py; one or two EFA devices per rank) go
    through the kernels' entry as make_world hands them (every send layout pointed at the
    device copy of its own device's peer table) and build v59-correct WQEs: each send QP's
    towards the last rank's last receive queue carries its own device's lkey and the AH its
    own device made for the peer device that slot is written through, with that device's
    rkey."""
    from lever.hw.efa import wire

    from tests.test_hw_efa_wire import world

    R, nrx = 3, 4
    devs, plan, _qs, gathered, tables = world(R, ndev=ndev, imm=imm, proxy=proxy)
    rank = 1
    t = tables[rank]
    (table_of,) = t["send_table"]
    send = _as_make_world(t["psend"][0] if proxy else t["send"][0], table_of)
    recv = t["recv"][rank * nrx * wire.LAYOUT_BYTES:(rank + 1) * nrx * wire.LAYOUT_BYTES]
    out = _rails_entry(entry, tmp_path, bytes(send), table_of, recv, nrx, t["peers"], R)
    assert out[0] == "check ok", out
    last = gathered[rank][R - 1]
    for q in range(wire.NQ_MAX):
        rail = (q if q < plan.send else 0) % ndev
        assert table_of[q] == rail
        dst_rail, dst = wire.peer_entry(last, rail, nrx - 1)
        dev = devs[rank][rail]
        want = (f"wqe {q} ok table {rail} lkey {dev.local()['lkey']:#x} ah {dev.ahs[bytes.fromhex(dst['gid'])]} "
                f"qpn {dst['rx_qpns'][nrx - 1]} qkey {wire.QKEY:#x} rkey {dst['rkey']:#x}")
        assert out[1 + q] == want, (out[1 + q], want)
        assert dst_rail == ((nrx - 1) % ndev if imm else rail)
    if ndev == 2:  # a send layout left at the other device's table is refused, in one line
        wrong = _as_make_world(bytes(send), [0] * wire.NQ_MAX)
        out = _rails_entry(entry, tmp_path, bytes(wrong), table_of, recv, nrx, t["peers"], R)
        assert out == ["check refused: send QP 1: peers: not the device copy of its own device's peer table"]
        out = _rails_entry(entry, tmp_path, bytes(send), [2] + table_of[1:], recv, nrx, t["peers"], R)
        assert out == ["check refused: send QP 0: names no peer table of this world"]
        bad = bytearray(t["peers"][1])
        efa_device.NicPeer.from_buffer(bad, 5 * wire.PEER_BYTES).remote_qkey = 0
        out = _rails_entry(entry, tmp_path, bytes(send), table_of, recv, nrx, [t["peers"][0], bytes(bad)], R)
        assert out == ["check refused: peer table 1: peer 5: qkey 0 (a QP's qkey comes from the peer, never 0 here)"]


def test_pack_peers_mirrors_lever_efa_peer():
    import ctypes

    assert ctypes.sizeof(efa_device.NicPeer) == 24
    assert efa_device.NicPeer.remote_addr.offset == 16
    blob = efa_device.pack_peers([{"ahn": 1, "remote_qpn": 2, "remote_qkey": 3, "rkey": 4,
                                   "remote_addr": 5}])
    assert blob == bytes([1, 0, 2, 0, 3, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0])
    with pytest.raises(efa_device.LayoutError, match="remote_qpn 0x10000 does not fit 16 bits"):
        efa_device.pack_peers([{"ahn": 1, "remote_qpn": 1 << 16, "remote_qkey": 3, "rkey": 4}])


# ============================================================ the committed H200 outcome
LAYOUT_RECORDS = ROOT / "calibration" / "data" / "layout-path"


def test_committed_layout_path_records_passed_their_gate_through_the_layout():
    """The H200 runs through the shared layout path: every EP record passed its gate, names a
    40-hex revision and the kernel sources' hash, and its notes show the v59 conventions the
    kernels posted with; the unsafe-ordered negative control failed (logged, no record)."""
    from lever.calibration.records import load_record

    paths = sorted(LAYOUT_RECORDS.glob("emu-layout-*.json"))
    assert len(paths) >= 15
    paths_seen, hashes = set(), set()
    for p in paths:
        r = load_record(p)
        assert r.nic == "emulated-srd" and r.gate.passed, p.name
        assert len(r.provenance.git_rev) == 40 and int(r.provenance.git_rev, 16) >= 0, p.name
        notes = r.how.notes
        assert '"sq_phase_first": 0' in notes and '"cq_entry_size": 32' in notes, p.name
        assert not r.provenance.dirty and len(r.provenance.kernel_sha256) == 64, p.name
        hashes.add(r.provenance.kernel_sha256)
        paths_seen.add(r.what.path)
    assert paths_seen == {"native", "proxy"}
    assert len(hashes) == 1  # one build of one set of sources produced them all
    log = (LAYOUT_RECORDS / "device-log.txt").read_text()
    assert "=== unsafe-ordered-must-fail rc=1" in log and "gate failed" in log
    assert not (LAYOUT_RECORDS / "unsafe-ordered.json").exists()
    prim = load_record(LAYOUT_RECORDS / "h200-primitives-layout.json")
    assert prim.gate.passed and "wqe_fence_doorbell_host_ns" in prim.metrics
