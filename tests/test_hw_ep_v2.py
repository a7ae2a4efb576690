"""CPU tests of DeepEP V2 on the emulated NIC (hw/ep_v2.py, hw/ep/v2_kernels.cuh, hw/reference.py).

Why: no GPU in CI. What can be checked here is: the V2 kernels are compiled into the EP
extension's translation unit (nvcc, never skipped for want of torch), the gate's V2
reference (token-per-rank layout, its per-expert view equal to V1's, exact inputs that make
node-first combine equal V1's bit for bit, and not without them), the harness's mapping of
levers and designs to the kernels' flags and its refusals, and records whose ``sim`` block
the model loads as the V2 design on emulated nodes, including the committed ones.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cuda import NVCC

ROOT = Path(__file__).resolve().parents[1]
EP = ROOT / "hw" / "ep"
V2_RECORDS = ROOT / "calibration" / "data" / "v2"


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_v2_kernels_compile_into_the_ep_translation_unit(tmp_path):
    """ep_kernels.cu includes v2_kernels.cuh (one hook): its device code compiles for sm_90 and
    holds the V2 kernel beside V1's. Needs nvcc only, not torch. (The whole object, host side
    and ptxas included, is compiled by test_hw_ep.py's test_every_ep_source_compiles_for_sm90;
    PTX only here keeps this one at a quarter of that time.)"""
    ptx = tmp_path / "ep.ptx"
    r = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-ptx", str(EP / "ep_kernels.cu"), "-o", str(ptx)],
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    entries = [ln for ln in ptx.read_text().splitlines() if ln.startswith(".entry")]
    assert any("v2_op_kernel" in e for e in entries) and any("ep_op_kernel" in e for e in entries)


def test_v2_sources_are_plain_cuda():
    for name in ("v2.h", "v2_kernels.cuh", "v2_binding.inc"):
        text = (EP / name).read_text()
        for bad in ("#include <torch", "#include <ATen", "#include <c10", "torch::", "at::Tensor"):
            assert bad not in text, (name, bad)
    assert '#include "v2_kernels.cuh"' in (EP / "ep_kernels.cu").read_text()


try:
    import torch
except ImportError:  # pragma: no cover - CI images without torch
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed (the reference needs it)")

from lever.hw import reference as ref  # noqa: E402


def _world(exact: bool, R: int = 4):
    s = ref.Shape(num_ranks=R, tokens=16, hidden=256, top_k=4, num_experts=8)
    inp = ref.make_inputs(s, 0, exact=exact)
    lay = ref.dispatch_layout(s, inp)
    y = ref.make_expert_outputs(s, lay, 1, exact=exact)
    rl = ref.rank_layout(s, inp)
    return s, inp, lay, y, rl


@needs_torch
def test_rank_layout_holds_each_token_once_per_rank_in_token_order():
    s, inp, _lay, _y, rl = _world(True)
    for d in range(s.num_ranks):
        for src in range(s.num_ranks):
            n = int(rl[d]["counts"][src])
            toks = rl[d]["src"][src, :n].tolist()
            want = [t for t in range(s.tokens)
                    if any(int(e) // s.experts_per_rank == d for e in inp[src]["topk"][t])]
            assert toks == want and (rl[d]["src"][src, n:] == -1).all()


@needs_torch
def test_the_per_expert_view_of_v2_buffers_is_v1s_layout():
    s, inp, lay, _y, rl = _world(False)
    for d in range(s.num_ranks):
        v = ref.expert_view(s, inp, d, rl[d]["src"], rl[d]["counts"])
        assert torch.equal(v["counts"], lay[d]["counts"]) and torch.equal(v["src"], lay[d]["src"])
    # a token missing from a rank's buffer shows in the view
    src = rl[0]["src"].clone()
    cnt = rl[0]["counts"].clone()
    cnt[1] -= 1
    v = ref.expert_view(s, inp, 0, src, cnt)
    assert not torch.equal(v["counts"], lay[0]["counts"])


@needs_torch
@pytest.mark.parametrize("hybrid", [True, False])
def test_exact_inputs_make_v2_combine_equal_v1_bit_for_bit_and_only_they_do(hybrid):
    """The V2 gate compares with V1's reference: that holds because the inputs are exact
    (node partials rounded to BF16 lose nothing); with float inputs the orders differ."""
    for exact, equal in ((True, True), (False, False)):
        s, inp, lay, y, rl = _world(exact)
        rows = ref.rank_rows(s, inp, lay, y, rl)
        v1c = ref.combine(s, inp, lay, y)
        v2c = ref.combine_v2(s, inp, rows, rl, 2, hybrid)
        assert all(torch.equal(a, b) for a, b in zip(v1c, v2c, strict=True)) is equal, (exact, hybrid)


@needs_torch
def test_exact_inputs_are_what_they_claim():
    s, inp, lay, y, _rl = _world(True)
    for r in range(s.num_ranks):
        w8 = inp[r]["topk_w"] * 8
        assert torch.equal(w8, w8.round()) and w8.min() >= 1 and w8.max() <= 8
        yv = y[r].float()
        assert torch.equal(yv, yv.round()) and yv.abs().max() <= 4
    # the V1 default (records already measured) is unchanged by the new flag
    a = ref.make_inputs(s, 0)
    b = ref.make_inputs(s, 0, exact=False)
    assert all(torch.equal(x["topk_w"], z["topk_w"]) for x, z in zip(a, b, strict=True))


# ----------------------------------------------------------------- harness
def test_levers_map_to_v2_flags_and_unbuilt_ones_are_refused():
    from lever.hw import ep as v1
    from lever.hw.ep_v2 import load_scenario, run_flags

    base = load_scenario("v2-hybrid", "native", 4, 2, False, {}, [])
    assert base.design.protocol == "v2-hybrid" and base.workload.ranks_per_node == 2
    assert run_flags(base, "v2-hybrid", "native") == {"proto": 1, "interval": 6}
    si = load_scenario("v2-hybrid", "native", 4, 2, False, {}, ["scaleout-update-interval"])
    assert run_flags(si, "v2-hybrid", "native")["interval"] == 16
    imm = load_scenario("v2-hybrid", "native", 4, 2, True, {}, ["write-imm-counting", "cached-dispatch"])
    fd = v1.kernel_flags(imm, "dispatch", "native", 0, False)
    assert fd["imm_counting"] == 1 and fd["cached"] == 1
    assert imm.platform.fabric.loss_prob == 0.02
    px = load_scenario("v2-hybrid", "proxy", 4, 2, False, {}, [])
    assert px.design.path == "proxy" and v1.kernel_flags(px, "dispatch", "proxy", 0, False)["proxy"] == 1
    dp = load_scenario("v2-direct", "proxy", 4, 2, False, {}, [])
    assert dp.design.protocol == "v2-direct" and dp.design.path == "proxy"
    for proto, lever, why in (("v2-hybrid", "provider-batched-tail", "provider_batched_tail"),
                              ("v2-direct", "write-imm-counting", "imm-counting")):
        scn = load_scenario(proto, "native", 4, 2, False, {}, [lever])
        with pytest.raises(v1.EpError, match=why):
            run_flags(scn, proto, "native")
    uo = load_scenario("v2-hybrid", "native", 4, 2, False, {}, ["unordered-signals"])
    with pytest.raises(v1.EpError, match="unordered-counting"):
        v1.kernel_flags(uo, "dispatch", "native", 0, False)


def test_ranks_per_node_default_and_refusals():
    from lever.hw.ep_v2 import ranks_per_node
    from lever.sim.errors import UserError

    assert ranks_per_node(4, 0) == 2 and ranks_per_node(8, 4) == 4 and ranks_per_node(2, 1) == 1
    for ranks, rpn in ((4, 3), (32, 2)):
        with pytest.raises(UserError, match="ranks per node|ranks"):
            ranks_per_node(ranks, rpn)


def test_cli_takes_the_v2_flags():
    from lever.cli import build_parser

    a = build_parser().parse_args(["hw", "ep", "--protocol", "v2-hybrid", "--ranks", "4", "--ranks-per-node", "2",
                                   "--out", "x.json"])
    assert a.protocol == "v2-hybrid" and a.ranks_per_node == 2
    assert build_parser().parse_args(["hw", "ep", "--out", "x.json"]).protocol == "v1-ll"


class _FakeRunner:
    R, Cv, Fv, S = 4, 16, 16, 8
    run = {"proto": 1, "interval": 6}


def _v2_record():
    from lever.hw import ep as v1
    from lever.hw.ep_v2 import load_scenario, scenario_overrides, v2_record

    scn = load_scenario("v2-hybrid", "native", 4, 2, False, {}, ["lazy-completion-dispatch"])
    sets = scenario_overrides("v2-hybrid", "native", 4, 2, False, {})
    rec = v1.build_record(
        rid="emu-v2-hybrid-n2x2-native-test", path="native", ranks=4, gpus=1, levers=["lazy-completion-dispatch"],
        sets=sets, hidden=7168, scn=scn,
        lat={"dispatch": [100.0 + i for i in range(60)], "combine": [200.0 + i for i in range(60)]},
        gate={"passed": True, "checks": ["x"], "detail": ""}, attribution=None, samples=None,
        metrics={"retransmits_per_iteration_count": {"median": 0.0}}, how={"repetitions": 60, "warmup": 10, "notes": ""},
        platform_info={"gpu": "H200"}, command="lever hw ep")
    return v2_record(rec, "v2-hybrid", "native", 2, _FakeRunner(), scn, ["lazy-completion-dispatch"], sets)


def test_a_v2_record_links_the_model_to_the_v2_design_on_emulated_nodes():
    from lever.calibration.records import parse_record

    r = parse_record(_v2_record())
    assert r.what.protocol == "v2-hybrid" and r.what.workload.nodes == 2
    assert r.what.emulated_fabric["ranks_per_node"] == 2 and r.what.emulated_fabric["ranks_per_gpu"] == 4
    scn = r.sim.load()
    assert scn.design.protocol == "v2-hybrid" and scn.design.name == "v2-hybrid-native"
    assert scn.workload.ep_ranks == 4 and scn.workload.ranks_per_node == 2
    assert scn.design.lazy_completion_dispatch and scn.platform.nic_kind == "emulated-srd"


def _committed():
    from lever.calibration.records import load_record

    return {p.stem: load_record(p) for p in sorted(V2_RECORDS.glob("*.json"))}


def test_committed_v2_records_passed_their_gate_with_provenance():
    from lever.hw.ep import sim_levers
    from lever.sim.scenario import ScenarioError

    recs = _committed()
    assert recs, "the testbed's V2 records are committed under calibration/data/v2"
    for name, r in recs.items():
        assert r.nic == "emulated-srd" and r.gate.passed is True, name
        # measured on the testbed as it is (the earlier emulator's are in a subfolder)
        assert r.superseded_by is None and r.what.emulated_fabric["sq"] == "host", name
        assert r.what.protocol in ("v2-hybrid", "v2-direct"), name
        assert len(r.provenance.git_rev) == 40 and not r.provenance.dirty and r.provenance.kernel_sha256, name
        for op in ("dispatch", "combine"):
            assert r.latency_us[op].n >= 50, name
        assert "retransmits_per_iteration_count" in r.metrics, name
        if name.endswith("-faults"):
            assert r.metrics["retransmits_per_iteration_count"].median > 0, name
        assert r.sim.levers == sim_levers(r.what.levers), name  # the reading the issuer builds
        try:
            scn = r.sim.load()
        except ScenarioError as e:  # a reading the model can not run yet says so (the fit skips it)
            assert "not runnable yet" in str(e), name
            continue
        assert scn.design.protocol == r.what.protocol and scn.workload.ranks_per_node == 2, name


def test_committed_v2_records_cover_hybrid_native_proxy_faults_and_levers():
    recs = _committed()
    assert recs
    hyb = {k: r for k, r in recs.items() if r.what.protocol == "v2-hybrid"}
    assert any(r.what.path == "proxy" for r in hyb.values())
    assert any(k.endswith("-faults") and r.what.path == "native" for k, r in hyb.items())
    assert any(k.endswith("-faults") and r.what.path == "proxy" for k, r in hyb.items())
    levers = {r.what.levers[0] for r in hyb.values() if r.what.path == "native" and r.what.levers}
    assert {"write-imm-counting", "cached-dispatch", "scaleout-update-interval"} <= levers and len(levers) >= 8


def test_a_committed_v2_record_runs_in_the_model():
    """What lever calibrate / lever compare do with a record: simulate its sim block."""
    recs = _committed()
    assert recs
    from lever.sim.results import simulate

    r = next(r for k, r in recs.items() if k.endswith("native-baseline") and r.what.protocol == "v2-hybrid")
    res = simulate(r.sim.load(), seeds=1)
    assert res.ops["dispatch"].p50_us > 0 and res.ops["combine"].p50_us > 0
