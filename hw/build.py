"""Build CUDA C++ extensions for ``hw/`` through ``torch.utils.cpp_extension.load``.

Why a helper: every harness needs the same things (sm_90 code, a build cache that
survives between runs so only changed sources recompile, the source directory on the
include path), and one place to change them. torch is imported lazily so importing
``hw`` stays CPU-only and cheap.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

DEFAULT_ARCH = "9.0"
"""Hopper (H100/H200): the kernels use sm_90 features (scoped loads/stores, globaltimer)."""


def build_root() -> Path:
    """The build cache: ``$LEVER_BUILD_DIR``, else ``~/.cache/lever/torch_extensions``."""
    env = os.environ.get("LEVER_BUILD_DIR")
    return Path(env) if env else Path.home() / ".cache" / "lever" / "torch_extensions"


def load_extension(
    name: str,
    sources: Sequence[str | Path],
    extra_cuda_cflags: Iterable[str] = (),
    extra_include_paths: Iterable[str | Path] = (),
    extra_ldflags: Iterable[str] = (),
) -> ModuleType:
    """Compile (or reuse from the cache) and import the extension ``name``.

    ``sources`` are .cu/.cpp files; their directories go on the include path, before
    ``extra_include_paths`` (hw/efa adds rdma-core v59's headers there). ``extra_ldflags``
    are passed to the linker (hw/efa: the machine's libibverbs/libefa). The target
    architecture is ``$TORCH_CUDA_ARCH_LIST`` when set, else sm_90. Set
    ``LEVER_BUILD_VERBOSE=1`` to see the compiler commands.
    """
    from torch.utils.cpp_extension import load

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCH)
    srcs = [str(Path(s).resolve()) for s in sources]
    includes = sorted({str(Path(s).parent) for s in srcs}) + [str(p) for p in extra_include_paths]
    build_dir = build_root() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(
        name=name,
        sources=srcs,
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", *extra_cuda_cflags],
        extra_include_paths=includes,
        extra_ldflags=list(extra_ldflags),
        build_directory=str(build_dir),
        verbose=os.environ.get("LEVER_BUILD_VERBOSE", "") not in ("", "0"),
    )
