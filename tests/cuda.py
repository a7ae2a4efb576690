"""Where the CUDA compiler is, for the compile-only kernel tests (CI has nvcc, no GPU)."""

from __future__ import annotations

import os
import shutil

NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
)
