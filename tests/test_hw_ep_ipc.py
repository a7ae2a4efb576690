"""V2 over EFA's IPC path (hw/ep_ipc.py, hw/ep/ipc.h, hw/ep/ipc_binding.inc), without a GPU.

Why these tests: on EFA each rank is a process, and V2's same-node traffic (forwarded
tokens, arrival counters, combine partials and flags, the node barrier) is stores into the
node peers' buffers, so every rank must map its node peers' V2 allocation (CUDA IPC) and
hand the kernels the same per-rank tables the one-process emulated runs build. CI has nvcc
and no GPU: the binding with the IPC calls and the device probe are compiled; the exchange
runs over a fake IPC layer (handles that name their exporter, mappings that remember who
opened them) and a fake all_gather, as tests/test_hw_efa_wire.py runs the EFA wiring on fake
devices. They show: rank r's table entry for node peer p is p's buffer through r's mapping of
p's allocation (the same offset), its own entries are its own, another node's ranks' are
their own addresses (RDMA only); every opened mapping is closed once, the last first, also
when an open or a later step fails, and before the exporter frees; the layouts the kernels
can not run are refused in one line before any handle is opened.
"""

from __future__ import annotations

import platform
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from lever.hw import ep_ipc
from lever.hw.ep_ipc import IpcError, NodeShape

from tests.cuda import NVCC

ROOT = Path(__file__).resolve().parents[1]
EP = ROOT / "hw" / "ep"
NAMES = (*ep_ipc.NVLINK_BUFFERS, "so_recv", "slot")  # the NVLink ones and two more a rank exports


# ============================================================ the compiled side
def _torch_include() -> list[str]:
    torch = pytest.importorskip("torch", reason="the binding's pybind11 headers come with torch")
    return [f"-I{Path(torch.__file__).parent / 'include'}", f"-I{sysconfig.get_paths()['include']}"]


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_the_ep_binding_compiles_with_the_ipc_calls_registered(tmp_path):
    """hw/ep/binding.cpp as the extension builds it (pybind11, CUDA runtime), the IPC layer
    included and registered: the object holds the five names the exchange calls."""
    obj = tmp_path / "binding.o"
    r = subprocess.run([NVCC, "-x", "cu", "-arch=sm_90", "-std=c++17", "-O1", "-c", *_torch_include(),
                        "-DTORCH_EXTENSION_NAME=lever_hw_ep", str(EP / "binding.cpp"), "-o", str(obj)],
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    data = obj.read_bytes()
    for name in (b"ipc_alloc", b"ipc_free", b"ipc_handle", b"ipc_open", b"ipc_close"):
        assert name + b"\0" in data, name


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_the_device_probe_builds_as_the_device_script_builds_it(tmp_path):
    """hw/ep/ipc_probe.cu (the same hw/ep/ipc.h) as a shared library with its C entries."""
    so = tmp_path / "probe.so"
    r = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC", f"-I{EP}",
                        str(EP / "ipc_probe.cu"), "-o", str(so)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    syms = subprocess.run(["nm", "-D", str(so)], capture_output=True, text=True).stdout
    for s in ("alloc", "free", "handle", "open", "close", "run"):
        assert f" T lever_ipc_probe_{s}" in syms, s


def test_ipc_sources_are_plain_cuda():
    for name in ("ipc.h", "ipc_binding.inc", "ipc_probe.cu"):
        text = (EP / name).read_text()
        for bad in ("#include <torch", "#include <ATen", "#include <c10", "torch::", "at::Tensor"):
            assert bad not in text, (name, bad)
    assert '#include "ipc_binding.inc"' in (EP / "binding.cpp").read_text()
    assert "register_ipc(m);" in (EP / "binding.cpp").read_text()


# ============================================================ the fake IPC layer
class FakeIpc:
    """One process's CUDA IPC as the runtime behaves: a handle names its exporter's
    allocation; opening it maps that allocation at an address of the importer's own; a
    process can not open its own handle nor one it already opened; close needs an open
    mapping. ``log`` is shared by the world: ("open"/"close"/"free", importer, exporter)."""

    def __init__(self, rank: int, log: list[tuple], fail_open: int | None = None,
                 fail_close: int | None = None) -> None:
        self.rank, self.log = rank, log
        self.fail_open, self.fail_close = fail_open, fail_close
        self.maps: dict[int, int] = {}  # mapped address -> exporter

    @staticmethod
    def base_of(rank: int) -> int:
        return 0x7F0000000000 + (rank << 32)

    def ipc_handle(self, base: int) -> bytes:
        return b"H" + self.rank.to_bytes(1, "little") + base.to_bytes(8, "little") + bytes(54)

    def ipc_open(self, handle: bytes, gpu: int = 0) -> int:
        exporter = handle[1]
        if exporter == self.rank:
            raise RuntimeError("cudaIpcOpenMemHandle failed: invalid device context")
        if exporter in self.maps.values():
            raise RuntimeError("cudaIpcOpenMemHandle failed: already mapped")
        if exporter == self.fail_open:
            raise RuntimeError("cudaIpcOpenMemHandle failed:\n  peer access is not supported")
        addr = 0x500000000000 + (self.rank << 36) + (exporter << 32)
        self.maps[addr] = exporter
        self.log.append(("open", self.rank, exporter))
        return addr

    def ipc_close(self, addr: int) -> int:
        exporter = self.maps.pop(addr)  # KeyError: closing what is not open
        self.log.append(("close", self.rank, exporter))
        return 1 if exporter == self.fail_close else 0

    def ipc_free(self, base: int) -> int:
        self.log.append(("free", self.rank, self.rank))
        return 0


def _bufs(rank: int) -> dict[str, int]:
    base = FakeIpc.base_of(rank)
    return {k: base + 0x10000 * (i + 1) + 64 * rank for i, k in enumerate(NAMES)}


def _entries(P: int, N: int, hosts: list[str] | None = None, **override: Any) -> list[dict[str, Any]]:
    out = []
    for r in range(P * N):
        shape = NodeShape(P=P, N=N, node=r // P, local=r % P)
        h = hosts[r] if hosts else f"node{r // P}"
        out.append(ep_ipc.local_entry(shape, r, h, FakeIpc(r, []).ipc_handle(FakeIpc.base_of(r)),
                                      FakeIpc.base_of(r), 1 << 24, _bufs(r)))
    for r, kv in override.items():
        out[int(r[1:])].update(kv)
    return out


def _exchange(rank: int, P: int, N: int, log: list[tuple], entries: list[dict[str, Any]] | None = None, **kw):
    entries = entries or _entries(P, N)
    ext = FakeIpc(rank, log, **kw)
    shape = ep_ipc.node_shape({"rank": rank, "world_size": P * N, "local_rank": rank % P, "local_world_size": P})

    def gather(obj):
        assert obj == entries[rank]  # what this rank sent is its entry
        return entries

    tables, maps, got = ep_ipc.exchange(ext, gather, shape, rank, base=FakeIpc.base_of(rank), length=1 << 24,
                                        buffers=_bufs(rank), host=f"node{rank // P}")
    return tables, maps, ext, got


# ============================================================ the tables
@pytest.mark.parametrize("P, N", [(2, 2), (3, 2), (4, 1), (1, 4)])
def test_each_ranks_table_points_at_its_node_peers_buffers_through_its_mappings(P, N):
    """Rank r's entry for node peer p is r's mapping of p's allocation plus the buffer's
    offset in it; its own entry is its own addresses; another node's rank's entry is that
    rank's own addresses (the kernels use them as RDMA raddr only). Each process maps its
    node peers and nobody else."""
    for r in range(P * N):
        log: list[tuple] = []
        tables, maps, ext, entries = _exchange(r, P, N, log)
        assert len(tables) == P * N
        node = set(range((r // P) * P, (r // P + 1) * P))
        assert set(maps.mapped) == node - {r}
        assert sorted(e for _, _, e in log) == sorted(node - {r})
        for p in range(P * N):
            for k in NAMES:
                mine = _bufs(p)[k]
                if p == r or p not in node:
                    assert tables[p][k] == mine
                else:
                    assert tables[p][k] == maps.mapped[p] + (mine - FakeIpc.base_of(p))
                    assert ext.maps[maps.mapped[p]] == p  # the mapping is p's allocation
        assert maps.close() == 0


def test_tables_are_what_make_v2_takes():
    """One map per rank in rank order, every V2 buffer name the rank exported, integers."""
    tables, maps, _, _ = _exchange(1, 2, 2, [])
    assert [set(t) for t in tables] == [set(NAMES)] * 4
    assert all(isinstance(v, int) for t in tables for v in t.values())
    maps.close()


# ============================================================ teardown
def test_teardown_closes_every_mapping_once_the_last_first():
    log: list[tuple] = []
    _, maps, ext, _ = _exchange(0, 4, 1, log)
    log.clear()
    assert maps.close() == 0
    assert log == [("close", 0, 3), ("close", 0, 2), ("close", 0, 1)]
    assert ext.maps == {} and maps.mapped == {}
    assert maps.close() == 0 and len(log) == 3  # nothing closed twice


def test_a_failed_open_closes_those_opened_and_refuses_in_one_line():
    log: list[tuple] = []
    with pytest.raises(IpcError) as ei:
        _exchange(0, 4, 1, log, fail_open=3)
    msg = str(ei.value)
    assert msg == ("V2 over EFA: rank 0 mapping rank 3's V2 buffers: cudaIpcOpenMemHandle failed: peer access "
                   "is not supported")
    assert log == [("open", 0, 1), ("open", 0, 2), ("close", 0, 2), ("close", 0, 1)]


def test_a_step_failing_after_the_opens_closes_them(monkeypatch):
    log: list[tuple] = []

    def broken(*a, **k):
        raise IpcError("V2 over EFA: broken after the opens")

    monkeypatch.setattr(ep_ipc, "rank_tables", broken)
    with pytest.raises(IpcError, match="broken after the opens"):
        _exchange(2, 3, 1, log)
    assert log == [("open", 2, 0), ("open", 2, 1), ("close", 2, 1), ("close", 2, 0)]


def test_one_failing_close_does_not_keep_the_others_open():
    log: list[tuple] = []
    _, maps, ext, _ = _exchange(0, 4, 1, log, fail_close=2)
    assert maps.close() == 1
    assert [x for x in log if x[0] == "close"] == [("close", 0, 3), ("close", 0, 2), ("close", 0, 1)]
    assert ext.maps == {}


def test_release_closes_then_waits_for_every_rank_then_frees():
    """The exporter frees only after a barrier every rank reaches after closing its own
    mappings; a failed barrier (a peer gone) still frees."""
    log: list[tuple] = []
    _, maps, ext, _ = _exchange(1, 3, 1, log)
    log.clear()
    assert ep_ipc.release(maps, ext, FakeIpc.base_of(1), lambda: log.append(("barrier", 1, 1))) == 0
    assert log == [("close", 1, 2), ("close", 1, 0), ("barrier", 1, 1), ("free", 1, 1)]
    log.clear()
    _, maps, ext, _ = _exchange(1, 3, 1, log)
    log.clear()

    def gone():
        raise RuntimeError("gloo: connection closed by peer")

    assert ep_ipc.release(maps, ext, FakeIpc.base_of(1), gone) == 0
    assert log == [("close", 1, 2), ("close", 1, 0), ("free", 1, 1)]


# ============================================================ one-line refusals
def _env(rank: int, world: int, local: int, lws: int) -> dict[str, int]:
    return {"rank": rank, "world_size": world, "local_rank": local, "local_world_size": lws}


@pytest.mark.parametrize("env, msg", [
    (_env(0, 6, 0, 4), "LOCAL_WORLD_SIZE 4 does not divide the world's 6 ranks"),
    (_env(0, 32, 0, 8), "32 ranks; the V2 kernels take at most 16"),
    (_env(5, 8, 0, 4), "rank 5 has LOCAL_RANK 0, not 1"),
])
def test_node_shape_refuses_what_the_kernels_can_not_run(env, msg):
    with pytest.raises(IpcError) as ei:
        ep_ipc.node_shape(env)
    assert msg in str(ei.value) and "\n" not in str(ei.value)


def test_node_shape_from_torchrun():
    assert ep_ipc.node_shape(_env(5, 8, 1, 4)) == NodeShape(P=4, N=2, node=1, local=1)
    assert list(NodeShape(P=4, N=2, node=1, local=1).node_ranks()) == [4, 5, 6, 7]


@pytest.mark.parametrize("over, msg", [
    ({"r3": {"P": 4}}, "ranks per node differ (LOCAL_WORLD_SIZE 2 on rank 0, 4 on rank 3)"),
    ({"r2": {"local": 1}}, "rank 2 has LOCAL_RANK 1, not 0"),
    ({"r1": {"host": "elsewhere"}}, "node 0's ranks run on 2 hosts (elsewhere, node0)"),
    ({"r1": {"rank": 2}}, "the gather's entry 1 is rank 2"),
])
def test_a_world_of_unequal_or_scattered_nodes_is_refused_before_any_open(over, msg):
    log: list[tuple] = []
    with pytest.raises(IpcError) as ei:
        _exchange(0, 2, 2, log, entries=_entries(2, 2, **over))
    assert msg in str(ei.value) and "\n" not in str(ei.value)
    assert log == []  # nothing opened


def test_an_allocation_without_the_nvlink_buffers_or_a_buffer_outside_it_is_refused():
    shape = NodeShape(P=2, N=1, node=0, local=0)
    with pytest.raises(IpcError, match="buffer final_x at .* is outside the exported allocation"):
        ep_ipc.local_entry(shape, 0, "h", bytes(64), 0x1000, 0x1000, {"final_x": 0x3000})
    with pytest.raises(IpcError, match="a CUDA IPC handle is 64 bytes, got 3"):
        ep_ipc.local_entry(shape, 0, "h", b"abc", 0x1000, 0x1000, {})
    ents = [ep_ipc.local_entry(NodeShape(2, 1, 0, r), r, "h", bytes(64), 0x1000, 0x1000, {"final_x": 0x1000})
            for r in range(2)]
    with pytest.raises(IpcError, match="the exported allocation lacks arrived, expect"):
        ep_ipc.check_world(ents, shape)


def test_node_visible_devices_puts_the_ranks_gpu_first_and_keeps_the_nodes():
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert ep_ipc.node_visible_devices(_env(6, 8, 2, 4), env) == "6,4,5,7"
    env = {}
    assert ep_ipc.node_visible_devices(_env(1, 2, 1, 2), env) == "1,0"
    with pytest.raises(IpcError, match="LOCAL_RANK 2 but CUDA_VISIBLE_DEVICES lists 2 GPUs"):
        ep_ipc.node_visible_devices(_env(2, 4, 2, 4), {"CUDA_VISIBLE_DEVICES": "0,1"})


def test_the_probe_exports_every_nvlink_buffer_inside_its_window():
    from lever.hw import ipc_probe

    b = ipc_probe.buffers_of(1 << 40)
    assert set(b) == set(ep_ipc.NVLINK_BUFFERS)
    assert all(1 << 40 <= a < (1 << 40) + ipc_probe.WINDOW for a in b.values())
    assert b["final_x"] == 1 << 40  # the probe's region
    assert (ROOT / "hw" / "run_v2_ipc_on_device.sh").stat().st_mode & 0o111


# ============================================================ the V2 EFA runner (hw/efa/ep_v2_run.py)
def _v2_runner(log: list[tuple], me: int = 1, P: int = 2, N: int = 2, fail_open: int | None = None):
    """An EfaV2Runner up to its wiring, on CPU: its window one allocation holding V1's and
    the V2 buffers (the real plan), the IPC layer faked, the other ranks' entries made as
    theirs would be (the same offsets in their own windows), the EFA wiring stubbed."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from lever.hw import ep_v2
    from lever.hw import reference as ref
    from lever.hw.efa.ep_run import window_offsets
    from lever.hw.efa.ep_v2_run import EfaV2Runner

    R = P * N
    s = ref.Shape(num_ranks=R, tokens=16, hidden=256, top_k=4, num_experts=8)
    r = object.__new__(EfaV2Runner)
    r.t = SimpleNamespace(uint8=torch.uint8, cuda=SimpleNamespace(synchronize=lambda: None))
    r.shape, r.R, r.me, r.node, r.P, r.N = s, R, me, NodeShape(P=P, N=N, node=me // P, local=me % P), P, N
    r.Cv, r.Fv, r.S, r.NW, r.tails, r.so_warps, r.fwd_warps = 4, 2, 4, 8, s.tokens + 2, 2, 1
    r.rows = [torch.zeros(R, s.tokens, s.hidden, dtype=torch.bfloat16) + q for q in range(R)]
    plan = [(f"v2.{n}", k, dt) for n, k, dt in ep_v2.v2_buffer_plan(s, R, P, N, r.Cv, r.S, r.NW, r.tails, 64)]
    off, length = window_offsets(plan)
    raw = torch.zeros(length, dtype=torch.uint8)
    r.ipc_base, r.ipc_len = raw.data_ptr(), length
    size = {"uint8": 1, "int32": 4, "int64": 8}
    dt = {"uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64}
    r.bufs = [{n: raw[off[n]:off[n] + k * size[d]].view(dt[d]) for n, k, d in plan}]
    r.bufs[0]["comb_out"] = torch.zeros(1)
    r.raw = raw
    made: list[Any] = []

    class Ext(FakeIpc):
        def make_v2(self, h, cfg, tables):
            made.append((h, cfg, tables))

    r.ext = Ext(me, log, fail_open=fail_open)
    mine = {n[3:]: raw.data_ptr() + off[n] for n, _, _ in plan}
    entries = []
    for q in range(R):
        base = r.ipc_base if q == me else FakeIpc.base_of(q)
        bufs = {k: base + (a - r.ipc_base) for k, a in mine.items()}
        host = platform.node() if q // P == me // P else f"node{q // P}"  # the runner names its own host
        entries.append(ep_ipc.local_entry(NodeShape(P, N, q // P, q % P), q, host,
                                          r.ext.ipc_handle(base) if q == me else FakeIpc(q, []).ipc_handle(base),
                                          base, length, bufs))

    class Dist:
        def all_gather(self, obj):
            assert obj == entries[me]
            return entries

        def barrier(self):
            log.append(("barrier", me, me))

    r.dist = Dist()
    r.ipc_maps = None
    return r, made, entries


def test_the_v2_runner_hands_make_v2_the_tables_of_its_node_through_ipc(monkeypatch):
    """_wire: the V2 buffers leave V1's window map, the combine input rows go in, the IPC
    exchange runs before V1's EFA wiring, and rebuild gives make_v2 one map per rank: its
    own, its node peer's through the mapping (same offset), the other node's own addresses."""
    from lever.hw.efa.ep_run import EfaRunner

    log: list[tuple] = []
    r, made, entries = _v2_runner(log)
    monkeypatch.setattr(EfaRunner, "_wire", lambda self: log.append(("efa wire", 1, 1)))

    def world(self, scn, seed):
        self.handles = [7]

    monkeypatch.setattr(EfaRunner, "rebuild", world)
    r._wire()
    assert log == [("open", 1, 0), ("efa wire", 1, 1)]
    assert not [k for k in r.bufs[0] if k.startswith("v2.")] and "final_x" in r.v2[0]
    assert float(r.v2[0]["comb_in"].view(4, 16, -1)[0, 0, 16:18].view(r.rows[0].dtype)[0]) == 1.0  # rank 1's rows
    r.rebuild(None, 0)
    (h, cfg, tables), = made
    assert h == 7 and cfg == {"P": 2, "N": 2, "C": 4, "F": 2, "so_warps": 2, "fwd_warps": 1, "S": 4, "NW": 8,
                              "tails": 18}
    assert tables[1] == {k: v.data_ptr() for k, v in r.v2[0].items()}
    mapped = r.ipc_maps.mapped[0]
    assert tables[0] == {k: mapped + (a - entries[0]["base"]) for k, a in entries[0]["buffers"].items()}
    assert tables[2] == entries[2]["buffers"] and tables[3] == entries[3]["buffers"]


def test_the_v2_runner_closes_efa_then_its_mappings_then_waits_then_frees(monkeypatch):
    from lever.hw.efa.ep_run import EfaRunner

    log: list[tuple] = []
    r, _, _ = _v2_runner(log, me=2, P=4, N=1)
    monkeypatch.setattr(EfaRunner, "_wire", lambda self: None)
    r._wire()
    log.clear()
    monkeypatch.setattr(EfaRunner, "close", lambda self: log.append(("efa close", 2, 2)) or 0)
    assert r.close() == 0
    assert log == [("efa close", 2, 2), ("close", 2, 3), ("close", 2, 1), ("close", 2, 0), ("barrier", 2, 2),
                   ("free", 2, 2)]
    assert r.ipc_maps is None and r.ipc_base == 0


def test_the_v2_runner_closes_its_mappings_when_the_efa_wiring_fails_and_frees_the_window(monkeypatch):
    from lever.hw.efa.ep_run import EfaRunner
    from lever.hw.efa.wire import WireError

    log: list[tuple] = []
    r, _, _ = _v2_runner(log, me=0, P=3, N=1)

    def broken(self):
        raise WireError("address exchange: rank 1 drives 1 EFA device(s), rank 0 2")

    monkeypatch.setattr(EfaRunner, "_wire", broken)
    with pytest.raises(WireError):
        r._wire()
    assert log == [("open", 0, 1), ("open", 0, 2), ("close", 0, 2), ("close", 0, 1)]
    assert r.ipc_maps is None
    # the same failure seen from _alloc (the whole build): the window goes too
    log.clear()
    r, _, _ = _v2_runner(log, me=0, P=3, N=1)

    def alloc(self):
        self._wire()

    monkeypatch.setattr(EfaRunner, "_alloc", alloc)
    with pytest.raises(WireError):
        r._alloc()
    assert log[-1] == ("free", 0, 0) and r.ipc_base == 0
    assert [x for x in log if x[0] == "close"] == [("close", 0, 2), ("close", 0, 1)]


def test_a_failed_open_in_the_runner_leaves_nothing_mapped(monkeypatch):
    from lever.hw.efa.ep_run import EfaRunner

    log: list[tuple] = []
    r, _, _ = _v2_runner(log, me=0, P=4, N=1, fail_open=2)
    monkeypatch.setattr(EfaRunner, "_wire", lambda self: log.append(("efa wire", 0, 0)))
    with pytest.raises(IpcError, match="^V2 over EFA: rank 0 mapping rank 2's V2 buffers"):
        r._wire()
    assert log == [("open", 0, 1), ("close", 0, 1)]  # EFA never wired


# ============================================================ the command and the record
TORCHRUN_V2 = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("env, argv, msg", [
    ({"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"}, ["--ranks", "6"],
     "V2 over EFA: LOCAL_WORLD_SIZE 4 does not divide the world's 6 ranks"),
    ({"LOCAL_RANK": "0"}, ["--ranks", "4"], "V2 over EFA: rank 1 has LOCAL_RANK 0, not 1"),
    ({"WORLD_SIZE": "32", "LOCAL_WORLD_SIZE": "8"}, ["--ranks", "32"], "V2 over EFA: 32 ranks; the V2 kernels"),
    ({}, ["--ranks", "4", "--ranks-per-node", "4"], "--ranks-per-node 4: on EFA the ranks per node are torchrun's"),
])
def test_v2_on_efa_refuses_a_node_layout_the_kernels_can_not_run_before_cuda(monkeypatch, tmp_path, env, argv, msg):
    from lever.hw.efa import ep_run, wire
    from lever.hw.efa import run as efa_run

    from tests.test_hw_efa_wire import _ep_args, _libs_ok

    e = {**TORCHRUN_V2, **env}
    monkeypatch.setattr(efa_run, "preflight", lambda what: {"libs": _libs_ok(), "devices": {"rdmap17s0": "/x"},
                                                             "torchrun": wire.torchrun_env(e)})

    def no_cuda():
        raise AssertionError("CUDA reached")

    monkeypatch.setattr("lever.hw.device.require_cuda", no_cuda)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ep_ipc.UserError) as ei:
        ep_run.main_efa(_ep_args("--protocol", "v2-hybrid", *argv, "--out", "r.json"))
    assert msg in str(ei.value) and "\n" not in str(ei.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("protocol, visible", [("v2-hybrid", "3,2"), ("v2-direct", "3,2"), ("v1-ll", "3")])
def test_v2_on_efa_is_no_longer_refused_and_keeps_the_nodes_gpus_visible(monkeypatch, tmp_path, protocol, visible):
    """A world the kernels can run goes on to CUDA (where this machine stops), with the
    rank's GPU first and its node's other GPUs visible (CUDA IPC), not V1's one GPU. (V1 gets
    that far too: before this, it stopped at run_options' 5-tuple unpacked as 6.)"""
    from lever.hw.efa import ep_run, wire
    from lever.hw.efa import run as efa_run

    from tests.test_hw_efa_wire import _ep_args, _libs_ok

    monkeypatch.setattr(efa_run, "preflight", lambda what: {"libs": _libs_ok(), "devices": {"rdmap17s0": "/x"},
                                                             "torchrun": wire.torchrun_env(TORCHRUN_V2)})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")

    class Reached(Exception):
        pass

    def cuda():
        raise Reached

    monkeypatch.setattr("lever.hw.device.require_cuda", cuda)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Reached):
        ep_run.main_efa(_ep_args("--protocol", protocol, "--ranks", "4", "--out", "r.json"))
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == visible


def test_an_efa_v2_record_names_the_protocol_and_node_shape_and_links_the_v2_design_on_the_instance():
    from lever.calibration.records import parse_record
    from lever.hw import ep_v2
    from lever.hw.efa.ep_run import efa_record
    from lever.hw.efa.ep_v2_run import efa_v2_record, v2_sets
    from lever.hw.ep import build_record

    from tests.test_hw_efa_wire import _FakeRunner

    class Runner(_FakeRunner):
        R, N, P, Cv, Fv, S = 16, 2, 8, 24, 24, 6
        env = {"local_world_size": 8}
        run = {"proto": 1, "interval": 1}

    base = ep_v2.load_scenario("v2-hybrid", "native", 16, 8, False, {}, [])
    sets = v2_sets(base, "v2-hybrid", "native", 16, 8, {})
    rec = build_record(rid="efa-v2-hybrid-n2x8-native-baseline", path="native", ranks=16, gpus=1, levers=[],
                       sets=sets, hidden=7168, scn=base,
                       lat={"dispatch": [100.0 + i for i in range(60)], "combine": [200.0] * 60},
                       gate={"passed": True, "checks": ["x"], "detail": "packets 0"}, attribution=None,
                       samples=None, metrics={"wqes_per_iteration_count": {"median": 99.0}},
                       how={"repetitions": 60, "warmup": 10, "notes": "24 EP blocks; flags dispatch={} x"},
                       platform_info={"gpu": "NVIDIA H200"}, command="lever hw ep --nic efa")
    rec = efa_record(rec, runner=Runner(), path="native", facts={"instance": "p5en.48xlarge"},
                     platform_info={"gpu": "NVIDIA H200"})
    rec = efa_v2_record(rec, runner=Runner(), protocol="v2-hybrid", path="native")
    r = parse_record(rec)
    assert r.nic == "efa" and r.what.protocol == "v2-hybrid" and r.what.workload.nodes == 2
    assert "2 nodes x 8 ranks" in r.what.design and "ranks per node 8" in r.how.notes
    assert r.gate.checks == ep_v2.V2_CHECKS
    assert r.sim.scenario == "platforms/p5en"
    scn = r.sim.load()  # the model runs the V2 design on the instance's platform, this node shape
    assert scn.design.protocol == "v2-hybrid" and scn.workload.gpus_per_node == 8 and scn.workload.ep_ranks == 16
    assert scn.platform.name == "p5en" and scn.design.forward_warps_per_sm == base.design.forward_warps_per_sm


@pytest.mark.parametrize("nproc, brk", [(2, ""), (3, ""), (2, "offset")])
def test_the_device_probe_flow_runs_across_processes_on_shared_memory(tmp_path, nproc, brk):
    """hw/ipc_probe.py end to end under torchrun (gloo), its CUDA faked by shared-memory files
    (tests/ipc_probe_fake.py): every step passes on every rank and the outcome is written;
    with the tables' offset broken, the probe itself says FAILED (exit 1)."""
    pytest.importorskip("torch")
    import os
    import sys

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    out = tmp_path / "outcome.json"
    env = {**os.environ, "LEVER_FAKE_BREAK": brk, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                        str(nproc), str(ROOT / "tests" / "ipc_probe_fake.py"), "--out", str(out), "--timeout-s", "30"],
                       capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    import json

    o = json.loads(out.read_text())
    steps = [s for pr in o["per_rank"] for s in pr["steps"].values()]
    if brk:
        assert r.returncode != 0 and not o["passed"]
        assert not o["per_rank"][0]["steps"]["tables"]["passed"]
        assert not o["per_rank"][0]["steps"]["put_check"]["passed"]
    else:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert o["passed"] and o["ranks"] == nproc and o["ranks_per_node"] == nproc and len(o["per_rank"]) == nproc
        assert all(s["passed"] for s in steps)
        assert all(pr["steps"]["teardown"]["opened"] == nproc - 1 == pr["steps"]["teardown"]["closed"]
                   for pr in o["per_rank"])


def test_the_v2_gate_of_one_rank_passes_the_reference_and_fails_a_wrong_byte():
    """V2Runner.gate_v2_rank (the emulated runs' gate per rank, which the EFA runner runs on
    its own rank and gathers): the reference's own outputs pass, one wrong payload byte, one
    wrong count or one wrong combine element fail with the rank named."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from lever.hw import ep as v1
    from lever.hw import reference as ref
    from lever.hw.ep_v2 import V2Runner

    R = 4
    s = ref.Shape(num_ranks=R, tokens=16, hidden=256, top_k=4, num_experts=8)
    inp = ref.make_inputs(s, 0, exact=True)
    lay = ref.dispatch_layout(s, inp)
    y = ref.make_expert_outputs(s, lay, 1, exact=True)
    run = SimpleNamespace(t=torch, shape=s, R=R, inputs=inp, layouts=lay, rlayouts=ref.rank_layout(s, inp),
                          ref_comb=ref.combine(s, inp, lay, y))
    r = 2
    rl = run.rlayouts[r]
    x, sc = ref.rank_payload(s, inp, rl)
    fx = torch.zeros(R, s.tokens, v1.DMSG, dtype=torch.uint8)
    fx[..., :s.hidden] = x
    fx[..., s.hidden:s.hidden + 4 * s.scales] = sc.contiguous().view(torch.uint8).view(R, s.tokens, 4 * s.scales)
    b = {"out_cnt": rl["counts"].to(torch.int32).clone(), "out_src": rl["src"].to(torch.int32).reshape(-1).clone(),
         "final_x": fx.reshape(-1)}
    comb = run.ref_comb[r].clone()

    def gate():
        return V2Runner.gate_v2_rank(run, r, b, comb)

    assert gate() == []
    src0 = int(torch.nonzero(rl["counts"])[0])
    fx[src0, 0, 5] ^= 1
    assert gate() == [f"rank {r}: FP8 payload differs"]
    fx[src0, 0, 5] ^= 1
    comb.view(-1)[7] += 1
    assert gate() == [f"rank {r}: combine output differs in 1 elements"]
    comb.view(-1)[7] -= 1
    b["out_cnt"][src0] += 1
    assert gate() == [f"rank {r}: tokens per source differ"]


def test_an_op_resets_then_crosses_the_barrier_then_launches_its_protocols_kernel():
    """EfaRunner.run_op, shared by V1 and V2 on EFA: the per-op reset, the cross-node EFA
    barrier, then the op's own launch (launch_op for V1, launch_v2 for V2), each on the rank's
    stream and in that order; a failed launch names which."""
    pytest.importorskip("torch")
    from lever.hw import ep as v1
    from lever.hw.efa.ep_run import EfaRunner
    from lever.hw.efa.ep_v2_run import EfaV2Runner

    calls: list[str] = []

    class Ext:
        def __init__(self, rc: int = 0) -> None:
            self.rc = rc

        def launch_barrier(self, h, seq, s):
            calls.append(f"reset{seq}")
            return 0

        def barrier_launch(self, cfg, seq, s):
            calls.append(f"barrier{seq}")
            return 0

        def launch_op(self, h, op, epoch, flags, s):
            calls.append("v1")
            return self.rc

        def launch_v2(self, h, op, epoch, flags, run, s):
            calls.append("v2")
            return self.rc

        def err_string(self, rc):
            return f"code {rc}"

    class Stream:
        cuda_stream = 0

    for cls, kernel in ((EfaRunner, "v1"), (EfaV2Runner, "v2")):
        for rc in (0, 3):
            calls.clear()
            r = object.__new__(cls)
            r.seq, r.me, r.epoch, r.run, r.bcfg = 0, 0, 1, {}, {}
            r.streams, r.handles = [Stream()], [0]
            r.ext = r.efa_ext = Ext(rc)
            if rc:
                with pytest.raises(v1.EpError, match=f"{r.op_kind} launch failed: code 3"):
                    r.run_op(0, {}, None)
            else:
                r.run_op(0, {}, None)
            assert calls == ["reset1", "barrier1", kernel]
