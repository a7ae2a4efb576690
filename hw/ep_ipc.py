"""CUDA IPC of the V2 buffers between the processes of one node (V2 over EFA; torch-free).

Why: on EFA every rank is its own process under torchrun, and V2's same-node traffic is
stores, not RDMA: hybrid's forward warps store arrived tokens into the final rank's
``final_x`` and bump its ``arrived``, the notify relays ``expect``, combine stores
``part``/``part_flag`` at the forwarder and ``comb_rows``/``comb_flag`` at the source, the
closing node barrier stores ``nbar`` (hw/ep/v2_kernels.cuh; :data:`NVLINK_BUFFERS`). The
emulated runs own every rank in one process and hand the kernels plain device addresses;
here each rank exports the one allocation holding its V2 buffers (the binding's
``ipc_alloc``/``ipc_handle``: hw/ep/ipc_binding.inc over hw/ep/ipc.h), the handles go
round over any ``all_gather`` (torch.distributed's, as hw/efa/wire.py exchanges QP/AH
addresses), every rank maps its node peers' (``ipc_open``) and builds the same per-rank
address maps ``make_v2`` takes in the emulated runs, so the V2 kernels run unchanged:

* its own rank: its own addresses;
* a peer on its node: the mapped base plus the buffer's offset in the peer's allocation;
* a rank on another node: that rank's own virtual addresses, untranslated (the kernels
  only use them as RDMA ``raddr``, valid with the peer's rkey over its registered window).

The node shape comes from torchrun (``LOCAL_RANK``/``LOCAL_WORLD_SIZE``): node ``r // P``,
local index ``r % P``, the same P on every node, the ranks of a node on one host; anything
else is refused in one line (:class:`IpcError`), before any handle is opened.

Teardown (:meth:`NodeMaps.close`): every opened mapping closed once, the last opened first,
one failing does not keep the others open; on every exit path (a handle that fails to open,
a table that fails after, the end of the run), and before the exporter frees its allocation
(the runner's ``ipc_free`` comes after a barrier that follows every rank's close).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lever.sim.errors import UserError

HANDLE_BYTES = 64
V2_MAX_RANKS = 16  # hw/ep/v2.h V2_MAX_RANKS
NVLINK_BUFFERS = ("final_x", "arrived", "expect", "part", "part_flag", "comb_rows", "comb_flag", "nbar")
"""The V2 buffers a same-node peer stores into (hw/ep/v2_kernels.cuh ``v.ranks[peer].X``
outside an RDMA ``raddr``): what must be reachable through the mapping."""


class IpcError(UserError):
    """A layout the V2 kernels can not run across processes, or a failed exchange: one line."""


@dataclass(frozen=True)
class NodeShape:
    P: int      # ranks per node
    N: int      # nodes
    node: int   # this rank's node
    local: int  # this rank's index in its node

    def node_ranks(self, node: int | None = None) -> range:
        n = self.node if node is None else node
        return range(n * self.P, (n + 1) * self.P)


def node_shape(env: Mapping[str, int]) -> NodeShape:
    """This rank's node from torchrun's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE
    (hw/efa/wire.py ``torchrun_env``), checked alone; :func:`check_world` checks every rank."""
    r, w = int(env["rank"]), int(env["world_size"])
    lr, P = int(env["local_rank"]), int(env.get("local_world_size", 1))
    if P < 1 or w % P:
        raise IpcError(f"V2 over EFA: LOCAL_WORLD_SIZE {P} does not divide the world's {w} ranks "
                       "(the kernels take the same ranks per node on every node)")
    if w > V2_MAX_RANKS:
        raise IpcError(f"V2 over EFA: {w} ranks; the V2 kernels take at most {V2_MAX_RANKS}")
    if lr != r % P:
        raise IpcError(f"V2 over EFA: rank {r} has LOCAL_RANK {lr}, not {r % P}: the V2 kernels take node "
                       f"r // P and local index r % P (torchrun's default rank order)")
    return NodeShape(P=P, N=w // P, node=r // P, local=lr)


def local_entry(shape: NodeShape, rank: int, host: str, handle: bytes, base: int, length: int,
                buffers: Mapping[str, int]) -> dict[str, Any]:
    """What a rank tells the world: its node shape, host, the handle of its V2 allocation,
    that allocation's base and length (its own addresses) and every V2 buffer's address."""
    if len(handle) != HANDLE_BYTES:
        raise IpcError(f"V2 over EFA: a CUDA IPC handle is {HANDLE_BYTES} bytes, got {len(handle)}")
    for k, a in buffers.items():
        if not base <= int(a) < base + length:
            raise IpcError(f"V2 over EFA: buffer {k} at {int(a):#x} is outside the exported allocation "
                           f"[{base:#x}, +{length:#x})")
    return {"rank": rank, "P": shape.P, "local": shape.local, "host": host, "handle": bytes(handle),
            "base": int(base), "length": int(length), "buffers": {k: int(v) for k, v in buffers.items()}}


def check_world(entries: Sequence[Mapping[str, Any]], shape: NodeShape) -> None:
    """Every rank's entry agrees with one node shape the kernels can run (one line if not)."""
    R = shape.P * shape.N
    if len(entries) != R:
        raise IpcError(f"V2 over EFA: {len(entries)} entries gathered for {R} ranks")
    names = set(entries[0]["buffers"])
    for r, e in enumerate(entries):
        if int(e["rank"]) != r:
            raise IpcError(f"V2 over EFA: the gather's entry {r} is rank {e['rank']}")
        if int(e["P"]) != shape.P:
            raise IpcError(f"V2 over EFA: ranks per node differ (LOCAL_WORLD_SIZE {shape.P} on rank "
                           f"{shape.node * shape.P + shape.local}, {e['P']} on rank {r}): the kernels take the "
                           "same on every node")
        if int(e["local"]) != r % shape.P:
            raise IpcError(f"V2 over EFA: rank {r} has LOCAL_RANK {e['local']}, not {r % shape.P}")
        if set(e["buffers"]) != names:
            raise IpcError(f"V2 over EFA: rank {r} exports other V2 buffers than rank 0")
    for n in range(shape.N):
        hosts = {entries[q]["host"] for q in shape.node_ranks(n)}
        if len(hosts) > 1:
            raise IpcError(f"V2 over EFA: node {n}'s ranks run on {len(hosts)} hosts ({', '.join(sorted(hosts))}): "
                           "CUDA IPC maps memory between processes of one host")
    missing = [k for k in NVLINK_BUFFERS if k not in names]
    if missing:
        raise IpcError(f"V2 over EFA: the exported allocation lacks {', '.join(missing)}")


class CudaMemory:
    """An address the binding allocated (``ipc_alloc``), for torch to view without a copy
    (``torch.as_tensor(CudaMemory(ptr, n), device=...)`` reads ``__cuda_array_interface__``)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (int(ptr), False),
                                         "version": 3, "strides": None}


class NodeMaps:
    """The node peers' allocations mapped into this process (``ipc_open``), closed by
    :meth:`close`: the last opened first, each once, errors counted, never raised."""

    def __init__(self, ext: Any, gpu: int = 0) -> None:
        self.ext, self.gpu = ext, gpu
        self.mapped: dict[int, int] = {}  # peer rank -> mapped base, in the order opened

    def open(self, entries: Sequence[Mapping[str, Any]], shape: NodeShape, me: int) -> None:
        """Map every other rank of this node; a failure closes what was opened and raises."""
        try:
            for p in shape.node_ranks():
                if p == me:
                    continue
                try:
                    self.mapped[p] = int(self.ext.ipc_open(bytes(entries[p]["handle"]), self.gpu))
                except RuntimeError as e:
                    raise IpcError(f"V2 over EFA: rank {me} mapping rank {p}'s V2 buffers: "
                                   f"{' '.join(str(e).split())}") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> int:
        """Close every mapping, the last opened first; the number that failed (0: all closed)."""
        bad = 0
        for p in reversed(list(self.mapped)):
            base = self.mapped.pop(p)
            try:
                rc = int(self.ext.ipc_close(base))
            except Exception:  # noqa: BLE001 - one failing must not keep the others open
                rc = -1
            bad += rc != 0
        return bad


def rank_tables(entries: Sequence[Mapping[str, Any]], shape: NodeShape, me: int,
                mapped: Mapping[int, int]) -> list[dict[str, int]]:
    """One address map per rank, in rank order, as ``make_v2`` takes them, seen from ``me``:
    its own addresses; a node peer's through its mapping (mapped base + offset in the
    peer's allocation); another node's rank's own addresses (RDMA ``raddr`` only)."""
    out: list[dict[str, int]] = []
    node = set(shape.node_ranks())
    for r, e in enumerate(entries):
        bufs = {k: int(v) for k, v in e["buffers"].items()}
        if r == me or r not in node:
            out.append(bufs)
            continue
        if r not in mapped:
            raise IpcError(f"V2 over EFA: rank {r} is on rank {me}'s node but its V2 buffers are not mapped")
        base, length = int(e["base"]), int(e["length"])
        tab = {}
        for k, a in bufs.items():
            if not base <= a < base + length:
                raise IpcError(f"V2 over EFA: rank {r}'s {k} at {a:#x} is outside its exported allocation")
            tab[k] = int(mapped[r]) + (a - base)
        out.append(tab)
    return out


def exchange(ext: Any, all_gather: Callable[[Any], list[Any]], shape: NodeShape, me: int, *, base: int,
             length: int, buffers: Mapping[str, int], host: str, gpu: int = 0
             ) -> tuple[list[dict[str, int]], NodeMaps, list[dict[str, Any]]]:
    """Export this rank's V2 allocation, gather every rank's entry, check the world, map the
    node peers', build the tables. Returns (tables, the open mappings, the entries); the
    caller closes the mappings (:meth:`NodeMaps.close`) on every later exit. Any failure
    here closes what was opened and raises a one-line :class:`IpcError`."""
    try:
        handle = bytes(ext.ipc_handle(base))
    except RuntimeError as e:
        raise IpcError(f"V2 over EFA: rank {me} exporting its V2 buffers: {' '.join(str(e).split())}") from None
    entries = list(all_gather(local_entry(shape, me, host, handle, base, length, buffers)))
    check_world(entries, shape)
    maps = NodeMaps(ext, gpu)
    maps.open(entries, shape, me)
    try:
        tables = rank_tables(entries, shape, me, maps.mapped)
    except BaseException:
        maps.close()
        raise
    return tables, maps, entries


def node_visible_devices(env: Mapping[str, int], environ: dict[str, str] | None = None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a V2 rank, before CUDA starts: its own GPU first (so
    ``cuda:0`` is the rank's GPU, as the EFA runner assumes) and the node's other GPUs after
    it, because a CUDA IPC handle opens only where the exporter's GPU is visible (the V1
    runner's hw/efa/run.py ``mask_gpu`` hides them). Returns the list it set."""
    e = os.environ if environ is None else environ
    visible = [v.strip() for v in e.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    lr, P = int(env["local_rank"]), int(env.get("local_world_size", 1))
    if not visible:
        visible = [str(i) for i in range(P)]
    if lr >= len(visible):
        raise IpcError(f"LOCAL_RANK {lr} but CUDA_VISIBLE_DEVICES lists {len(visible)} GPUs")
    order = [visible[lr], *[v for i, v in enumerate(visible) if i != lr]]
    e["CUDA_VISIBLE_DEVICES"] = ",".join(order)
    return e["CUDA_VISIBLE_DEVICES"]


def release(maps: NodeMaps | None, ext: Any, base: int, barrier: Callable[[], None] | None) -> int:
    """The end of a V2 run's IPC, in order: this rank's mappings of its peers closed, then a
    barrier (every rank closed its mappings of this rank's allocation), then the allocation
    freed. A failed barrier (a peer gone) still frees: the driver drops a dead process's
    mappings. Returns the number of mappings that failed to close, plus 1 if the free failed."""
    bad = maps.close() if maps is not None else 0
    try:
        if barrier is not None:
            barrier()
    except Exception:  # noqa: BLE001 - the free below must still happen
        pass
    if base:
        try:
            bad += int(ext.ipc_free(base)) != 0
        except Exception:  # noqa: BLE001
            bad += 1
    return bad
