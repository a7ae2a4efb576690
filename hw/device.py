"""Access to the CUDA device, with the one-line failure the CLI promises."""

from __future__ import annotations

from lever.sim.errors import UserError


def require_cuda():
    """Return the imported ``torch`` module when a CUDA device is usable; else raise UserError."""

    try:
        import torch
    except ImportError:
        raise UserError("no CUDA device: torch is not installed (pip install -e '.[hw]')") from None
    if not torch.cuda.is_available():
        raise UserError("no CUDA device")
    return torch
