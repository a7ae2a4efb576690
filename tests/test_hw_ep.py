"""CPU tests of hw/ep: kernels compile with nvcc, the reference, records, profiler rows.

Why: no GPU in CI, so what can be checked here is checked here - every kernel
source compiles for sm_90, the gate's reference computes what the kernels
promise (layout, token-order slots, float32 k-order combine), records built by
the harness validate against the schema, and the profiler turns hand-made
rows into the shares the model compares with.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.cuda import NVCC

ROOT = Path(__file__).resolve().parents[1]
EP = ROOT / "hw" / "ep"


def _nvcc(src: Path, tmp: Path) -> subprocess.CompletedProcess | None:
    """Compile one source; the binding (.cpp, pybind11 + torch headers) only where torch is."""
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-O3", "-c", str(src), "-o", str(tmp / (src.stem + ".o"))]
    if src.suffix == ".cpp":
        try:
            import torch
        except ImportError:
            return None
        cmd[1:1] = ["-x", "cu", f"-I{Path(torch.__file__).parent / 'include'}",
                    f"-I{sysconfig.get_paths()['include']}", "-DTORCH_EXTENSION_NAME=lever_hw_ep"]
    # ep_kernels.cu holds V1 and V2 (hw/ep/v2_kernels.cuh): ~80 s of one core at -O3, more when loaded
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_every_ep_source_compiles_for_sm90(tmp_path):
    """Every kernel source compiles (never skipped for want of torch: only the binding needs it)."""
    srcs = sorted([*EP.glob("*.cu"), *EP.glob("*.cpp")])
    assert any(s.name == "ep_kernels.cu" for s in srcs)
    with ThreadPoolExecutor(max_workers=len(srcs)) as ex:
        results = list(ex.map(lambda s: (s, _nvcc(s, tmp_path)), srcs))
    compiled = [src.name for src, r in results if r is not None]
    assert "ep_kernels.cu" in compiled
    for src, r in results:
        if r is not None:
            assert r.returncode == 0, f"{src.name} failed to compile:\n{r.stderr[-3000:]}"


def test_kernels_are_plain_cuda():
    """No torch in the kernels (the binding is the only file that sees torch). The layouts
    themselves are compared by the compiler: tests/test_hw_nic_layout.py and
    tests/test_hw_efa.py (offsets against rdma-core v59), not by reading source text."""
    for name in ("ep_kernels.cu", "efa_emu.cuh", "emu_nic.h"):
        text = (EP / name).read_text()
        for bad in ("#include <torch", "#include <ATen", "#include <c10", "torch::", "at::Tensor"):
            assert bad not in text, (name, bad)


# Only the tests that run the reference need torch (the CPU build is enough); the
# compile-only tests above and the ones below that need no torch run without it.
try:
    import torch
except ImportError:  # pragma: no cover - CI images without torch
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed (the reference needs it)")

from lever.hw import reference as ref  # noqa: E402
from lever.hw.profiler import attribution, decode  # noqa: E402


def small(R=2):
    return ref.Shape(num_ranks=R, tokens=16, hidden=256, top_k=4, num_experts=8)


@needs_torch
def test_dispatch_layout_is_token_ordered_and_complete():
    s = small()
    inp = ref.make_inputs(s, seed=3)
    lays = ref.dispatch_layout(s, inp)
    total = sum(int(lay["counts"].sum()) for lay in lays)
    assert total == s.num_ranks * s.tokens * s.top_k  # every (token, expert) lands once
    for dest, lay in enumerate(lays):
        for le in range(s.experts_per_rank):
            for src in range(s.num_ranks):
                n = int(lay["counts"][le, src])
                toks = lay["src"][le, src, :n].tolist()
                assert toks == sorted(toks)
                assert all(dest * s.experts_per_rank + le in inp[src]["topk"][t].tolist() for t in toks)
                assert (lay["src"][le, src, n:] == -1).all()


@needs_torch
def test_dispatch_payload_matches_inputs():
    s = small()
    inp = ref.make_inputs(s, seed=1)
    lays = ref.dispatch_layout(s, inp)
    x, sc = ref.dispatch_payload(s, inp, lays[1])
    le, src = 2, 0
    n = int(lays[1]["counts"][le, src])
    assert n > 0
    t0 = int(lays[1]["src"][le, src, 0])
    assert torch.equal(x[le, src, 0], inp[src]["x_fp8"][t0])
    assert torch.equal(sc[le, src, 0], inp[src]["scales"][t0])
    assert not x[le, src, n:].any()


@needs_torch
def test_combine_is_float32_k_order_without_fma():
    s = small()
    inp = ref.make_inputs(s, seed=2)
    lays = ref.dispatch_layout(s, inp)
    y = ref.make_expert_outputs(s, lays, seed=5)
    out = ref.combine(s, inp, lays, y)
    # independent scalar recomputation for one token of rank 1
    r, t = 1, 7
    acc = torch.zeros(s.hidden, dtype=torch.float32)
    for k in range(s.top_k):
        ge = int(inp[r]["topk"][t, k])
        dest, le = divmod(ge, s.experts_per_rank)
        slot = lays[dest]["src"][le, r].tolist().index(t)
        acc = acc + inp[r]["topk_w"][t, k] * y[dest][le, r, slot].float()
    assert torch.equal(out[r][t], acc.to(torch.bfloat16))
    # and it can fail: a wrong slot (another token's expert output) changes the result
    bad = acc + y[0][0, 0, 0].float()
    assert not torch.equal(out[r][t], bad.to(torch.bfloat16))


@needs_torch
def test_shape_check_refuses_bad_shapes():
    with pytest.raises(ValueError, match="multiple of ranks"):
        ref.Shape(num_ranks=3).check()
    with pytest.raises(ValueError, match="top_k"):
        ref.Shape(num_ranks=2, top_k=9).check()


def _put(op, rank, warp, lock, credit, wqe, fence, db, n=1):
    total = lock + credit + wqe + fence + db
    return [1 | (op << 8) | (rank << 16) | (warp << 32), lock, credit, wqe, fence, db, n, total]


def _phase(op, rank, warp, pid, t0, t1):
    return [2 | (op << 8) | (rank << 16) | (warp << 32), pid, t0, t1, 0, 0, 0, 0]


def test_profiler_rows_to_shares():
    rows = [
        _put(0, 0, 1, lock=100, credit=300, wqe=50, fence=500, db=50),
        _put(0, 1, 2, lock=100, credit=300, wqe=50, fence=500, db=50),
        _phase(0, 0, 1, 5, 1000, 3000),   # poll_wait 2000 ns
        _phase(0, 0, 1, 3, 0, 1000),      # flush -> signal 1000 ns
        _put(1, 0, 1, lock=0, credit=0, wqe=10, fence=90, db=0),
        [7, 0, 0, 0, 0, 0, 0, 0],         # unknown kind: skipped
    ]
    dec = decode(rows)
    assert len(dec) == 5
    busy, put, n = attribution(dec, "dispatch", period=2)
    assert n == 2
    # put rows weighted x2: lock 400, credit 1200, wqe 200, fence 2000, db 200; phases 2000 + 1000
    tot = 400 + 1200 + 200 + 2000 + 200 + 2000 + 1000
    assert busy["credit_wait"] == pytest.approx(1200 / tot, abs=1e-6)
    assert busy["poll_wait"] == pytest.approx(2000 / tot, abs=1e-6)
    assert busy["signal"] == pytest.approx(1000 / tot, abs=1e-6)
    assert put["fence"] == pytest.approx(2000 / 4000, abs=1e-6)
    assert sum(busy.values()) <= 1.0 + 1e-9
    busy_c, put_c, n_c = attribution(dec, "combine", period=2)
    assert n_c == 1 and put_c["fence"] == pytest.approx(0.9)
    with pytest.raises(ValueError):
        attribution(dec, "dispatch", period=0)


def test_lazy_completion_shows_zero_credit_wait_share():
    rows = [_put(0, 0, w, lock=10, credit=0, wqe=50, fence=500, db=20) for w in range(4)]
    _busy, put, _ = attribution(decode(rows), "dispatch", period=1)
    assert put["credit_wait"] == 0.0


def _record(**over):
    from lever.hw.ep import build_record, load_scenario, scenario_overrides

    scn = load_scenario(2, False, {}, ["lazy-completion-dispatch"])
    kw = dict(rid="emu-test", path="native", ranks=2, gpus=2, levers=["lazy-completion-dispatch"],
              sets=scenario_overrides(2, False, {}), hidden=7168, scn=scn,
              lat={"dispatch": [100.0 + i for i in range(60)], "combine": [200.0 + i for i in range(60)]},
              gate={"passed": True, "checks": ["x"], "detail": ""}, attribution={"dispatch": {"wqe": 0.5, "fence": 0.5}},
              samples=10, metrics={"packets_per_iteration_count": {"median": 3.0}},
              how={"repetitions": 60, "warmup": 10}, platform_info={"gpu": "H200"}, command="lever hw ep")
    kw.update(over)
    return build_record(**kw)


def test_record_conversion_validates_and_links_the_model():
    from lever.calibration.records import parse_record

    rec = _record()
    r = parse_record(rec)
    assert r.nic == "emulated-srd"
    assert r.what.emulated_fabric["values"]["paths"] == 16
    assert r.what.emulated_fabric["file"] == "hw/emulated_nic.toml" and r.what.emulated_fabric["sq"] == "host"
    assert r.latency_us["dispatch"].median == pytest.approx(129.5)
    assert r.latency_us["dispatch"].n == 60 and len(r.latency_us["dispatch"].samples) == 60
    assert r.latency_us["dispatch"].p10 <= r.latency_us["dispatch"].median <= r.latency_us["dispatch"].p90
    # the model can load exactly what ran
    scn = r.sim.load()
    assert scn.workload.ep_ranks == 2 and scn.design.protocol == "v1-ll"


def test_records_name_the_lever_variant_the_kernels_build():
    """A lever with several readings is recorded as the one the kernels build (NAME@VARIANT),
    every such variant exists in its lever file, and the committed records say it too."""
    import json

    from lever.calibration.records import DATA_DIR
    from lever.hw.ep import HW_VARIANTS, sim_levers
    from lever.sim.levers import load_lever

    for name, variant in HW_VARIANTS.items():
        assert variant in load_lever(name).variants, (name, variant)
    assert sim_levers(["batched-doorbells", "provider-batched-tail"]) == [
        "batched-doorbells", "provider-batched-tail@signals-in-one-doorbell"]
    for p in DATA_DIR.glob("emu-*.json"):
        rec = json.loads(p.read_text())
        assert rec["sim"]["levers"] == sim_levers(rec["what"]["levers"]), p.name
        assert rec["sim"]["set"]["design.ll_combine_flags"] == "per-rank", p.name


def test_record_conversion_refuses_bad_shares():
    from lever.calibration.records import RecordError

    with pytest.raises(RecordError, match="share"):
        _record(attribution={"dispatch": {"wqe": 1.5}})


def test_kernel_flags_from_levers():
    from lever.hw.ep import EpError, kernel_flags, load_scenario

    base = kernel_flags(load_scenario(2, False, {}, []), "dispatch", "native", 0, False)
    assert base["lazy"] == 0 and base["notify_qp"] == 1 and base["imm_counting"] == 0
    f = kernel_flags(load_scenario(2, True, {}, ["qp-fanout-fix", "write-imm-counting", "batched-doorbells"]),
                     "combine", "native", 4, False)
    assert f["notify_qp"] == 0 and f["imm_counting"] == 1 and f["db_batch"] == 8 and f["prof_period"] == 4
    lz = load_scenario(2, False, {}, ["lazy-completion-combine"])
    assert kernel_flags(lz, "combine", "native", 0, False)["lazy"] == 1
    assert kernel_flags(lz, "dispatch", "native", 0, False)["lazy"] == 0
    with pytest.raises(EpError, match="unknown lever"):
        load_scenario(2, False, {}, ["no-such-lever"])


def test_cli_registers_and_imports_without_torch_or_simpy():
    code = ("import sys; sys.modules['simpy'] = None; sys.modules['torch'] = None\n"
            "import lever.hw.ep, lever.hw.profiler, lever.hw.reference\n"
            "from lever.cli import build_parser\n"
            "a = build_parser().parse_args(['hw', 'ep', '--ranks', '2', '--faults', '--out', 'x.json'])\n"
            "assert a.faults and a.ranks == 2\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_committed_emulated_records_pass_their_gate():
    from lever.calibration.records import load_record

    recs = sorted((ROOT / "calibration" / "data").glob("emu-*.json"))
    for p in recs:
        r = load_record(p)
        assert r.nic == "emulated-srd" and r.gate.passed is True, p.name
        for op in ("dispatch", "combine"):
            assert r.latency_us[op].n >= 50, p.name


def test_proxy_put_rows_attribute_ring_wait_to_proxy_queue():
    # kind 3: proxy post group (w1 0, credit, descriptor stores, fence, ring-space wait, n, total)
    hdr = 3 | (0 << 8) | (1 << 16) | (5 << 32)
    rows = decode([[hdr, 0, 100, 50, 250, 600, 1, 1000], [hdr, 0, 0, 50, 250, 700, 1, 1000]])
    assert rows[0]["kind"] == "put" and rows[0]["proxy_queue"] == 600 and "doorbell" not in rows[0]
    busy, put, n = attribution(rows, "dispatch", 2)
    assert n == 2 and put["proxy_queue"] == pytest.approx(1300 / 2000, abs=1e-6)
    assert put["credit_wait"] == pytest.approx(100 / 2000, abs=1e-6) and sum(put.values()) <= 1.0


def test_cached_dispatch_and_proxy_flags():
    from lever.hw.ep import kernel_flags, load_scenario, scenario_overrides

    c = load_scenario(2, False, {}, ["cached-dispatch"])
    assert kernel_flags(c, "dispatch", "native", 0, False)["cached"] == 1
    assert kernel_flags(c, "combine", "native", 0, False)["cached"] == 0  # combine has no layout
    p = load_scenario(2, False, {}, [], "proxy")
    assert p.design.path == "proxy" and kernel_flags(p, "dispatch", "proxy", 0, False)["proxy"] == 1
    assert scenario_overrides(2, False, {}, "proxy")["design.path"] == "proxy"
    assert p.platform.proxy.ring_depth == 32


def test_committed_records_cover_native_proxy_and_levers():
    from lever.calibration.records import load_record

    recs = {p.stem: load_record(p) for p in (ROOT / "calibration" / "data").glob("emu-ep2-*.json")}
    assert "emu-ep2-native-baseline" in recs and "emu-ep2-proxy-baseline" in recs
    levers = {r.what.levers[0] for r in recs.values() if r.what.path == "native" and r.what.levers}
    assert len(levers) >= 6
    for r in recs.values():
        assert r.gate.passed and r.attribution and r.attribution_samples


def test_a_stuck_kernel_names_rank_block_warp_and_what_it_waited_for():
    from types import SimpleNamespace

    from lever.hw.ep import EpError, Runner

    class Words:
        def __init__(self, v):
            self.v = v

        def cpu(self):
            return self

        def tolist(self):
            return self.v

    # the error words as the kernel's raise_err writes them (measured on an H200: the
    # 'stuck' step of hw/run_ep_on_device.sh gave rank 1, block 54, warp 2)
    fake = SimpleNamespace(gbufs=[{"err": Words([13, 1, 2, 0, 5, 0, 54, 2])}])
    with pytest.raises(EpError) as e:
        Runner.check_errors(fake)
    msg = str(e.value)
    assert "doorbell turn" in msg and "rank 1 (block 54, warp 2)" in msg and "expected 5" in msg
    assert "\n" not in msg


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_the_harness_reads_every_stat_word_the_kernels_write(tmp_path):
    """hw/ep.py names the kernels' stat words by position: its count and the positions of the
    lateness parts must be the kernels' own enum values (a compiled check, not a text match)."""
    from lever.hw.ep import ST_WORDS, STAT_NAMES

    assert len(STAT_NAMES) == ST_WORDS
    checks = [f"static_assert(emu::ST_NUM == {ST_WORDS}, \"ST_NUM\");"]
    for name, enum in (("nic_deliver_ns", "ST_NIC_DELIVER_NS"), ("nic_scan_ns", "ST_NIC_SCAN_NS"),
                       ("nic_copy_ns", "ST_NIC_COPY_NS"), ("nic_fence_ns", "ST_NIC_FENCE_NS"),
                       ("packets", "ST_PACKETS"), ("nic_late_ns", "ST_NIC_LATE_NS"),
                       ("host_passes", "ST_HOST_PASSES"), ("host_qp_copies", "ST_HOST_QP_COPIES"),
                       ("host_read_ns", "ST_HOST_READ_NS"), ("host_copy_ns", "ST_HOST_COPY_NS"),
                       ("host_cqe_ns", "ST_HOST_CQE_NS"), ("host_idle_ns", "ST_HOST_IDLE_NS")):
        checks.append(f"static_assert(emu::{enum} == {STAT_NAMES.index(name)}, \"{enum}\");")
    src = tmp_path / "stats_check.cu"
    src.write_text(f'#include "{EP / "efa_emu.cuh"}"\n' + "\n".join(checks) + "\n")
    r = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-c", str(src), "-o", str(tmp_path / "s.o")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
