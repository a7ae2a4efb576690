"""The EFA side of ``lever hw primitives --nic efa`` and ``lever hw ep --nic efa``.

Why a separate step: before anything touches CUDA, a run on EFA must know that there is
an EFA device with an rdma-core new enough for the direct queue queries (v59:
efadv_query_qp_wqs / efadv_query_cq), and fail with one line naming what is missing
when there is not (exit 2 through the ``lever`` command). That part is complete.

What is not there yet, and is said so rather than faked: opening the SRD endpoints
(hw/efa/host.cpp), exchanging them over torch.distributed, mapping the LLQ, doorbell
and CQ into the GPU and handing the resulting layouts to the kernels. The kernels
already take nothing but those layouts (hw/ep/emu_nic.h fills the same structs for
the emulated NIC, and lever_ep_check_nic accepts either), so on a machine with a
device the command stops after discovery with a one-line error that says exactly
this. Nothing has run on real EFA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from lever.hw.efa import device as efa_device
from lever.sim.errors import UserError

NOT_WIRED = ("the EFA endpoint setup (hw/efa/host.cpp: SRD QPs, AH exchange over "
             "torch.distributed, dma-buf MRs, GPU mapping of LLQ/doorbell/CQ) is not connected "
             "to the harness yet; nothing has run on real EFA")


def require_efa_run(what: str, discover: Callable[..., dict] | None = None) -> NoReturn:
    """Discover the EFA device for ``what``; always ends in a one-line UserError for now.

    Without a device (or libibverbs, or a new enough rdma-core) the error is discovery's
    own line. With one, the line names the device and the missing harness step.
    ``discover`` replaces :func:`lever.hw.efa.device.discover` (tests).
    """
    info = (discover or efa_device.discover)(probe=False)
    raise UserError(f"{what} --nic efa: EFA device {info.get('device', '?')} found "
                    f"(rdma-core {info.get('rdma_core') or '?'}), but {NOT_WIRED}")
