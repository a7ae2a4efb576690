"""Fetch rdma-core v59's headers (libibverbs + the EFA provider) into a cache directory.

Why: the offset check (hw/efa/offsets_check.cpp) and the host setup code
(hw/efa/host.cpp) must compile against the provider's own headers, and no
machine here or in CI has rdma-core 59 installed. The ``pyverbs`` 59.0 source
distribution on PyPI carries the whole rdma-core v59 tree; the archive is fetched
from the package index pip reads (``$PIP_INDEX_URL``, else PyPI's simple index) and its
hash is pinned so a changed upload can not slip in.

The cache (``$LEVER_RDMA_CORE_DIR``, else ``~/.cache/lever/rdma-core-59``) holds::

    rdma-core/    the headers of the tree: libibverbs/, providers/efa/, kernel-headers/rdma/
    include/      what ``make install`` would publish: infiniband/{verbs.h, efadv.h, ...}, rdma/
    COMPLETE      written last: version and archive hash

Standard library only, so CI can run it before anything is installed::

    python3 hw/efa/rdma_core.py [--dir DIR] [--tarball PYVERBS_SDIST]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

VERSION = "59.0"
SDIST = f"pyverbs-{VERSION}.tar.gz"
SDIST_SHA256 = "b30d56bb620b3d3b4301876f9a04c964be1c76cc6553a451e1465f1c6ac9f20e"
"""sha256 of pyverbs-59.0.tar.gz as PyPI serves it (its rdma-core tree is PACKAGE_VERSION 59.0)."""

TREE = f"pyverbs-{VERSION}/rdma-core/"
KEEP = ("libibverbs/", "providers/efa/", "kernel-headers/rdma/")
"""Folders of the tree whose headers are kept (plus CMakeLists.txt for the version)."""

PUBLISH = {
    # rdma-core's publish_headers(infiniband ...) lists, v59 (libibverbs, kernel-headers, efa)
    "infiniband": (
        "libibverbs/arch.h", "libibverbs/opcode.h", "libibverbs/sa-kern-abi.h", "libibverbs/sa.h",
        "libibverbs/verbs.h", "libibverbs/verbs_api.h", "libibverbs/tm_types.h",
        "kernel-headers/rdma/ib_user_ioctl_verbs.h", "providers/efa/efadv.h",
    ),
}


class FetchError(RuntimeError):
    """The headers could not be fetched; ``unreachable`` when PyPI could not be reached."""

    def __init__(self, msg: str, unreachable: bool = False) -> None:
        super().__init__(msg)
        self.unreachable = unreachable


@dataclass(frozen=True)
class Headers:
    """Where the unpacked v59 headers are, and the compiler flags that find them."""

    root: Path
    version: str

    @property
    def tree(self) -> Path:
        return self.root / "rdma-core"

    @property
    def include(self) -> Path:
        return self.root / "include"

    @property
    def efa_provider(self) -> Path:
        """providers/efa: efa_io_defs.h, efa.h, efadv.h as the provider builds with them."""
        return self.tree / "providers" / "efa"

    def cflags(self) -> list[str]:
        """``-I`` flags for host.cpp (``<infiniband/efadv.h>``) and the offset check
        (``<efa_io_defs.h>`` of the provider)."""
        return [f"-I{self.include}", f"-I{self.efa_provider}"]


def cache_dir(arg: str | os.PathLike[str] | None = None) -> Path:
    """The cache: ``arg``, else ``$LEVER_RDMA_CORE_DIR``, else ``~/.cache/lever/rdma-core-59``."""
    if arg:
        return Path(arg).expanduser()
    env = os.environ.get("LEVER_RDMA_CORE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "lever" / f"rdma-core-{VERSION.split('.')[0]}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One fetch at a time per cache (parallel test workers share it)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


INDEX_ENV = "PIP_INDEX_URL"
DEFAULT_INDEX = "https://pypi.org/simple"


def sdist_url(index: str, timeout: float = 60.0) -> str:
    """The archive's address on a PEP 503 simple index (the page pip itself reads), with the
    ``#sha256=`` the index gives for it."""
    page = f"{index.rstrip('/')}/pyverbs/"
    req = urllib.request.Request(page, headers={"Accept": "text/html"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        html = r.read().decode("utf-8", "replace")
    for href in re.findall(r'href="([^"]+)"', html):
        url = urllib.parse.urljoin(page, href.replace("&amp;", "&"))
        if urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1] == SDIST:
            return url
    raise FetchError(f"{page}: no {SDIST} listed")


def download(dest: Path, timeout: float = 180.0) -> Path:
    """Fetch the pyverbs sdist into ``dest`` from the package index; returns the archive's path.

    Why not ``pip download``: for an sdist pip builds its metadata first, which installs
    Cython and setuptools from source under ``--no-binary :all:`` (minutes, and it timed out
    at 180 s on CI's machine). The archive is all that is needed, and its hash is checked
    by :func:`unpack`."""
    index = os.environ.get(INDEX_ENV) or DEFAULT_INDEX
    out = dest / SDIST
    try:
        url = sdist_url(index, timeout=min(timeout, 60.0))
        with urllib.request.urlopen(url, timeout=timeout) as r, out.open("wb") as f:
            shutil.copyfileobj(r, f)
    except FetchError:
        raise
    except urllib.error.HTTPError as e:  # the index answered: not a network problem
        raise FetchError(f"{index}: {SDIST} could not be fetched: {e}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise FetchError(f"{index}: {SDIST} could not be fetched: {e}", unreachable=True) from None
    return out


def _wanted(name: str) -> str | None:
    """The path inside the tree for a member we keep, else None."""
    if not name.startswith(TREE):
        return None
    rel = name[len(TREE):]
    if ".." in Path(rel).parts:
        return None
    if rel == "CMakeLists.txt":
        return rel
    if rel.startswith(KEEP) and rel.endswith(".h"):
        return rel
    return None


def _publish(stage: Path, root: Path) -> None:
    """From the kept tree in ``stage/rdma-core``: lay out ``stage/include`` (the headers a
    build includes, as an installed rdma-core has them), then put both in ``root`` in place of
    what was there."""
    tree = stage / "rdma-core"
    for sub, files in PUBLISH.items():
        d = stage / "include" / sub
        d.mkdir(parents=True)
        for rel in files:
            shutil.copy2(tree / rel, d / Path(rel).name)
    shutil.copytree(tree / "kernel-headers" / "rdma", stage / "include" / "rdma")
    for name in ("rdma-core", "include"):
        if (root / name).exists():
            shutil.rmtree(root / name)
        (stage / name).rename(root / name)


def unpack(tarball: Path, root: Path) -> None:
    """Extract the kept headers into ``root/rdma-core`` and publish ``root/include``."""
    digest = _sha256(tarball)
    if digest != SDIST_SHA256:
        raise FetchError(f"{tarball.name}: sha256 {digest} is not the pinned {SDIST_SHA256}")
    stage = Path(tempfile.mkdtemp(prefix=".stage-", dir=root))
    try:
        tree = stage / "rdma-core"
        with tarfile.open(tarball, "r:gz") as tf:
            for m in tf.getmembers():
                rel = _wanted(m.name)
                if rel is None or not m.isfile():
                    continue
                target = tree / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tf.extractfile(m)
                assert src is not None
                with src, target.open("wb") as f:
                    shutil.copyfileobj(src, f)
        cmake = (tree / "CMakeLists.txt").read_text() if (tree / "CMakeLists.txt").exists() else ""
        if f'set(PACKAGE_VERSION "{VERSION}")' not in cmake:
            raise FetchError(f"{tarball.name}: rdma-core/CMakeLists.txt is not PACKAGE_VERSION {VERSION}")
        _publish(stage, root)
        (root / "COMPLETE").write_text(f"rdma-core {VERSION}\n{SDIST} sha256 {digest}\n")
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def ensure_headers(dest: str | os.PathLike[str] | None = None,
                   tarball: str | os.PathLike[str] | None = None) -> Headers:
    """The cached headers, fetched and unpacked first when missing.

    ``tarball`` (or ``$LEVER_PYVERBS_SDIST``) is an already-downloaded pyverbs-59.0
    sdist for machines without PyPI; it must still match the pinned hash.
    Raises :class:`FetchError` (``unreachable`` set when PyPI could not be reached).
    """
    root = cache_dir(dest)
    with _locked(root):
        if (root / "COMPLETE").exists() and (root / "include" / "infiniband" / "efadv.h").exists():
            return Headers(root, VERSION)
        tb = tarball or os.environ.get("LEVER_PYVERBS_SDIST")
        if tb:
            unpack(Path(tb), root)
        else:
            with tempfile.TemporaryDirectory(prefix=".dl-", dir=root) as tmp:
                unpack(download(Path(tmp)), root)
    return Headers(root, VERSION)


NEWER_ENV = "LEVER_RDMA_CORE_TREE"
"""An rdma-core source tree (a checkout, or an unpacked release) newer than v59, for the checks of
what v59 lacks: the 128-byte WQE (v63) and completion counters (after v64). No registry carries
such a tree (PyPI's newest pyverbs sdist is 59.0), so those checks run where one is given."""


def tree_version(tree: Path) -> int | None:
    """The release of an rdma-core tree, from its CMakeLists.txt PACKAGE_VERSION ("65.0" -> 65)."""
    try:
        text = (tree / "CMakeLists.txt").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("set(PACKAGE_VERSION "):
            v = line.split('"')[1] if '"' in line else ""
            try:
                return int(v.split(".")[0])
            except ValueError:
                return None
    return None


def headers_from_tree(tree: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Headers:
    """Headers published from an rdma-core source tree into ``dest``, laid out as
    :func:`ensure_headers` lays v59's (``rdma-core/`` with the kept headers, ``include/``).
    Nothing is pinned: the tree is whatever the caller has (``$LEVER_RDMA_CORE_TREE``)."""
    src = Path(tree).expanduser()
    version = tree_version(src)
    if version is None:
        raise FetchError(f"{src}: not an rdma-core tree (no CMakeLists.txt PACKAGE_VERSION)")
    root = Path(dest)
    with _locked(root):
        stage = Path(tempfile.mkdtemp(prefix=".stage-", dir=root))
        try:
            out = stage / "rdma-core"
            for keep in KEEP:
                for f in (src / keep).rglob("*.h"):
                    target = out / f.relative_to(src)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, target)
            shutil.copy2(src / "CMakeLists.txt", out / "CMakeLists.txt")
            _publish(stage, root)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return Headers(root, f"{version}.0")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="fetch rdma-core v59 headers (from the pyverbs sdist)")
    p.add_argument("--dir", default=None, help="cache directory (default $LEVER_RDMA_CORE_DIR or "
                   "~/.cache/lever/rdma-core-59)")
    p.add_argument("--tarball", default=None, help="use this pyverbs-59.0.tar.gz instead of PyPI")
    args = p.parse_args(argv)
    try:
        h = ensure_headers(args.dir, args.tarball)
    except FetchError as e:
        print(f"rdma_core: error: {e}", file=sys.stderr)
        return 2
    print(" ".join(h.cflags()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
