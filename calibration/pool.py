"""Independent model runs spread over local processes or a Ray cluster.

Every job the project fans out (sweep points, sensitivity samples) is a pure
function of its inputs, so the order results arrive in does not matter: each
comes back with its index. ``local`` is a process pool in the spawn context
(one worker runs in this process); ``ray`` is one Ray task per item, retried by
Ray when a worker dies. Ray is imported only when asked for.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from lever.sim.errors import UserError


class PoolError(UserError):
    """An executor that can not be used (unknown, or Ray missing): one line for the user."""


def imap_unordered(fn: Callable[[Any], Any], items: Sequence[Any], executor: str = "local",
                   workers: int | None = None, address: str | None = None,
                   max_retries: int = 3) -> Iterator[tuple[int, Any]]:
    """``(index, fn(item))`` as each finishes. ``fn`` must be a picklable module-level function."""
    if not items:
        return
    if executor == "local":
        yield from _local(fn, items, workers or os.cpu_count() or 1)
    elif executor == "ray":
        yield from _ray(fn, items, workers, address, max_retries)
    else:
        raise PoolError(f"--executor: '{executor}': expected local or ray")


def _local(fn, items, workers):
    if workers <= 1 or len(items) == 1:
        for i, it in enumerate(items):
            yield i, fn(it)
        return
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    with ProcessPoolExecutor(max_workers=min(workers, len(items)),
                             mp_context=mp.get_context("spawn")) as ex:
        pending = {ex.submit(fn, it): i for i, it in enumerate(items)}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    i = pending.pop(f)
                    yield i, f.result()
        finally:
            for f in pending:
                f.cancel()


def ray_init(workers: int | None = None, address: str | None = None):
    """Connect to ``address`` (a running cluster, shipping this repo as the working dir) or start a
    local Ray with ``workers`` CPUs. Ray is imported here only, so the project runs without it."""
    try:
        import ray
    except ImportError:
        raise PoolError("--executor ray: ray is not installed (pip install -e '.[dist]')") from None
    if not ray.is_initialized():
        root = Path(__file__).resolve().parents[1]
        checkout = (root / "pyproject.toml").is_file()  # else an installed wheel: workers import it
        if address and checkout:
            ray.init(address=address, log_to_driver=False, runtime_env={
                "working_dir": str(root),
                "excludes": [".git", "**/build", "**/*.png", "**/*.csv", "**/__pycache__"]})
        elif address:
            ray.init(address=address, log_to_driver=False)
        else:
            env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
                [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}} if checkout else {}
            ray.init(num_cpus=workers or os.cpu_count() or 1, include_dashboard=False,
                     log_to_driver=False, runtime_env=env, configure_logging=False)
    return ray


def _call(fn, item):
    """The Ray task: any picklable callable (a function, a ``functools.partial``) on one item."""
    return fn(item)


def _ray(fn, items, workers, address, max_retries):
    ray = ray_init(workers, address)
    task = ray.remote(max_retries=max_retries, num_cpus=1)(_call)
    fn_ref = ray.put(fn)
    refs = {task.remote(fn_ref, it): i for i, it in enumerate(items)}
    try:
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for r in done:
                i = refs.pop(r)
                yield i, ray.get(r)
    finally:
        for r in refs:
            ray.cancel(r, force=True)
