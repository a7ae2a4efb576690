"""What every ``--nic efa`` run does first: find the device, the libraries, torchrun, and
build the EFA extension.

Why a separate step: before anything touches CUDA or opens a queue, a run on EFA must
know that libibverbs and libefa are there and new enough for the direct queue queries
(rdma-core v59: efadv_query_qp_wqs / efadv_query_cq), that the kernel's ``efa`` driver
lists a device, and that the process is one rank of a torchrun world; where any of this
is missing it fails with one line naming it (exit 2 through the ``lever`` command), with
nothing written. :func:`load_efa_ext` then builds ``lever_hw_efa`` (hw/efa/binding.cpp,
host.cpp, efa_kernels.cu) against rdma-core v59's headers (hw/efa/rdma_core.py) and links
it with the very libibverbs/libefa discovery loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lever.hw.efa import device as efa_device
from lever.hw.efa import wire
from lever.sim.errors import UserError

HERE = Path(__file__).resolve().parent
EXTENSION = "lever_hw_efa"


def sources() -> list[Path]:
    """The EFA extension's sources (the headers they include are hashed with them)."""
    return [HERE / "binding.cpp", HERE / "host.cpp", HERE / "efa_kernels.cu"]


def kernel_files() -> list[Path]:
    """Every file that makes the EFA extension (for the records' kernel_sha256)."""
    return [*sources(), *sorted(HERE.glob("*.h")), HERE.parent / "efa_io_defs.h"]


def preflight(what: str, env: Mapping[str, str] | None = None, sys_root: str | os.PathLike[str] = "/sys",
              check: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Libraries, an EFA device, a torchrun world: what ``what`` needs before CUDA, else a
    one-line UserError naming what is missing. ``check`` replaces the library check (tests)."""
    libs = (check or efa_device.check_libraries)()
    devices = wire.efa_devices(sys_root)
    if not devices:
        ib = Path(sys_root) / "class" / "infiniband"
        other = sorted(d.name for d in ib.iterdir()) if ib.is_dir() else []
        raise UserError("no EFA device: no device of the efa driver under /sys/class/infiniband"
                        + (f" (found: {', '.join(other)})" if other else ""))
    try:
        trun = wire.torchrun_env(env)
    except UserError as e:
        raise UserError(f"{what}: {e}") from None
    return {"libs": libs, "devices": devices, "torchrun": trun}


def link_flags(libs: Mapping[str, Any]) -> list[str]:
    """Linker flags for the libraries discovery loaded (full paths, with an rpath)."""
    flags: list[str] = []
    for so in (efa_device.IBVERBS, efa_device.LIBEFA):
        path = (libs.get("paths") or {}).get(so)
        if path:
            flags += [path, f"-Wl,-rpath,{os.path.dirname(path)}"]
        else:
            flags.append(f"-l:{so}")
    return flags


def load_efa_ext(libs: Mapping[str, Any]) -> Any:
    """Build (or reuse) and import ``lever_hw_efa``; a missing header fetch is one line."""
    from lever.hw.build import load_extension
    from lever.hw.efa import rdma_core

    try:
        hdr = rdma_core.ensure_headers()
    except rdma_core.FetchError as e:
        raise UserError(f"rdma-core v59 headers for the EFA extension: {e} (set LEVER_PYVERBS_SDIST "
                        "to a downloaded pyverbs-59.0.tar.gz)") from None
    return load_extension(EXTENSION, sources(), extra_include_paths=[hdr.include],
                          extra_ldflags=link_flags(libs))


def mask_gpu(env: Mapping[str, int], environ: dict[str, str] | None = None) -> str:
    """Make the LOCAL_RANK-th GPU this process's only one (before CUDA starts), so every
    ``cuda:0`` of the EP harness is the rank's own GPU. Returns the GPU it kept."""
    e = os.environ if environ is None else environ
    visible = [v for v in e.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    lr = int(env["local_rank"])
    if visible:
        if lr >= len(visible):
            raise UserError(f"LOCAL_RANK {lr} but CUDA_VISIBLE_DEVICES lists {len(visible)} GPUs")
        keep = visible[lr].strip()
    else:
        keep = str(lr)
    e["CUDA_VISIBLE_DEVICES"] = keep
    return keep


def gpu_bdf(torch: Any) -> str:
    """PCI address of this process's GPU (cuda:0), for picking the nearest EFA device."""
    p = torch.cuda.get_device_properties(0)
    dom, bus, dev = (getattr(p, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if bus is not None and dev is not None:
        return f"{int(dom or 0):04x}:{int(bus):02x}:{int(dev):02x}.0"
    import subprocess

    out = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i",
                          os.environ.get("CUDA_VISIBLE_DEVICES", "0")], capture_output=True, text=True,
                         timeout=30).stdout.strip()
    if not out:
        raise UserError("can not tell this GPU's PCI address (no pci_bus_id in torch, no nvidia-smi): "
                        "pass --efa-device")
    bdf = out.splitlines()[0].strip().lower()
    return bdf[-12:] if len(bdf) > 12 else bdf  # nvidia-smi gives an 8-digit domain


class Dist:
    """torch.distributed over gloo in the form the wiring needs: object gathers, a barrier.
    Nothing of the data path goes through it (that is the EFA device's)."""

    def __init__(self, torch: Any, env: Mapping[str, int], timeout_s: float) -> None:
        import datetime

        self.dist = torch.distributed
        self.rank, self.world = int(env["rank"]), int(env["world_size"])
        if not self.dist.is_initialized():
            self.dist.init_process_group("gloo", rank=self.rank, world_size=self.world,
                                         timeout=datetime.timedelta(seconds=timeout_s))
        self.owned = True

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        if self.owned and self.dist.is_initialized():
            self.dist.destroy_process_group()
            self.owned = False
