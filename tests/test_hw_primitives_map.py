"""The record -> platform-parameter mapping is exact on a hand-made record.

Why: calibration takes these values as priors; a wrong subtraction or a wrong path
would silently bias every prediction. Hand-made medians make every expected value
exact, and each path must exist in sim.params.Platform and pass its validation.
"""

from __future__ import annotations

import pytest
from lever.calibration.records import DATA_DIR, load_record
from lever.hw.primitives import Check, build_record
from lever.hw.primitives_map import MAPPING_NOTES, platform_params_from_record
from lever.sim.params import Platform

MEDIANS = {
    "wqe_store_host_ns": 50.0,
    "wqe_doorbell_nofence_host_ns": 60.0,
    "wqe_fence_doorbell_host_ns": 1460.0,
    "pcie_read_rtt_ns": 1200.0,
    "device_load_ns": 150.0,
    "atomic_device_ns": 148.0,
    "proxy_descriptor_store_ns": 28.0,
    "proxy_desc_rtt_ns": 4000.0,
    "nvlink_flag_rtt_ns": 1230.0,
    "nvlink_copy_gbytes_per_s": 390.0,
    "store_posted_host_ns": 8.0,  # measured but mapped to nothing
}
EXPECTED = {
    "gpu.wqe_store_ns": 50.0,
    "gpu.doorbell_ns": 10.0,
    "gpu.fence_ns": 1400.0,
    "gpu.pcie_read_ns": 1200.0,
    "gpu.device_load_ns": 150.0,
    "gpu.atomic_ns": 148.0,
    "proxy.descriptor_store_ns": 28.0,
    "proxy.host_to_gpu_ns": 1200.0,
    "proxy.gpu_to_host_ns": 2800.0,
    "nvlink.flag_latency_ns": 615.0,
    "nvlink.gbytes_per_s": 390.0,
}


def _rec(medians, passed=True):
    # three samples around each median: the median is exact
    samples = {k: [v * 0.9, v, v * 1.1] for k, v in medians.items()}
    return build_record(
        samples,
        [Check("all", passed, "hand-made")],
        gpus=1,
        reps=3,
        platform={"gpu": "test"},
        provenance={"source": "test"},
    )


def _set(platform: Platform, path: str, value: float) -> None:
    section, field = path.split(".")
    setattr(getattr(platform, section), field, value)  # validate_assignment checks range


def test_mapping_is_exact():
    assert platform_params_from_record(_rec(MEDIANS)) == EXPECTED


def test_every_path_is_a_platform_parameter_and_documented():
    p = Platform()
    for path, v in EXPECTED.items():
        _set(p, path, v)
        assert getattr(getattr(p, path.split(".")[0]), path.split(".")[1]) == v
    assert set(MAPPING_NOTES) == set(EXPECTED)


def test_differences_clamp_at_zero():
    m = dict(MEDIANS, wqe_doorbell_nofence_host_ns=40.0, proxy_desc_rtt_ns=1000.0)
    out = platform_params_from_record(_rec(m))
    assert out["gpu.doorbell_ns"] == 0.0 and out["proxy.gpu_to_host_ns"] == 0.0
    assert out["gpu.fence_ns"] == 1420.0


def test_partial_record_maps_only_what_it_measured():
    out = platform_params_from_record(_rec({"nvlink_flag_rtt_ns": 1000.0}))
    assert out == {"nvlink.flag_latency_ns": 500.0}


def test_failed_gate_or_other_design_is_refused():
    with pytest.raises(ValueError, match="gate"):
        platform_params_from_record(_rec(MEDIANS, passed=False))
    rec = _rec(MEDIANS).model_copy(deep=True)
    rec.what.design = "v2-hybrid native"
    with pytest.raises(ValueError, match="primitives"):
        platform_params_from_record(rec)


def test_committed_records_map_to_every_parameter():
    out = {}
    for name in ("h200-primitives-1gpu.json", "h200-primitives-2gpu.json"):
        out.update(platform_params_from_record(load_record(DATA_DIR / name)))
    assert set(out) == set(EXPECTED)
    p = Platform()
    for path, v in out.items():
        _set(p, path, v)
