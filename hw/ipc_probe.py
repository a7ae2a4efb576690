"""Device proof of V2-over-EFA's IPC path: ``torchrun --nproc-per-node P -m lever.hw.ipc_probe``.

What it proves on a real GPU (hw/run_v2_ipc_on_device.sh, one H200, in well under 90 s):
P processes, one rank each, go through the exchange the V2 EFA runner goes through
(hw/ep_ipc.py ``exchange``: the node shape from torchrun, every rank's CUDA IPC handle of
its V2 allocation gathered over torch.distributed (gloo), the node peers' allocations
mapped with cudaIpcOpenMemHandle, the per-rank address tables built by ``rank_tables``),
through the same C++ IPC calls (hw/ep/ipc.h) as the EP binding, then:

1. put: every rank stores words into every node rank's ``final_x`` through its table
   (16-byte stores as V2's ``v2_copy``), a system fence, ``atomicAdd_system`` on the
   destination's arrival counter, a release store (system scope) of an epoch-tagged flag;
2. after a host barrier, check: every rank polls its own flags (acquire, bounded), checks
   the arrival counts and every word of every source; and torch's view of the allocation
   (``torch.as_tensor`` over ``__cuda_array_interface__``, as the runner makes its window)
   reads the same words;
3. a negative control: the check for an epoch nobody wrote must report every flag missing
   (the check can fail);
4. pingpong (informational): put and wait in one kernel, both processes' kernels at once
   (on one GPU without MPS, the driver time-slices the two contexts);
5. teardown in order (``release``: mappings closed, barrier, allocation freed), counted.

Rank 0 writes the outcome JSON (``--out``). ``--ep-binding`` makes the IPC calls through the
EP extension's pybind11 ``ipc_*`` (what the runner calls; the extension is built first). Exit 0 iff steps 1-3 and 5 passed on every rank.
The probe's C++ (hw/ep/ipc_probe.cu) is built with ``nvcc -shared`` and loaded by ctypes:
seconds, not the EP extension's minutes. With one visible GPU every rank uses it (two
processes on one device: what one H200 can show); with more, rank r uses GPU r % count.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lever.hw import ep_ipc

HERE = Path(__file__).resolve().parent
WINDOW = 1 << 21
WORDS = 4096  # u32 words per (source, destination): 16 KiB


class CtypesIpc:
    """hw/ep/ipc_probe.cu through ctypes, with the EP binding's IPC names and errors
    (``ipc_alloc``/``ipc_free``/``ipc_handle``/``ipc_open``/``ipc_close``), so hw/ep_ipc.py
    drives it as it drives the extension."""

    def __init__(self, so: Path) -> None:
        lib = ctypes.CDLL(str(so))
        u64, p64 = ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_ulonglong)
        lib.lever_ipc_probe_err.restype = ctypes.c_char_p
        lib.lever_ipc_probe_alloc.argtypes = [u64, p64]
        lib.lever_ipc_probe_free.argtypes = [u64]
        lib.lever_ipc_probe_handle.argtypes = [u64, ctypes.c_char_p]
        lib.lever_ipc_probe_open.argtypes = [ctypes.c_char_p, p64]
        lib.lever_ipc_probe_close.argtypes = [u64]
        lib.lever_ipc_probe_run.argtypes = [ctypes.c_int, p64, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                            ctypes.c_uint, ctypes.c_uint, ctypes.c_longlong,
                                            ctypes.POINTER(ctypes.c_int)]
        self.lib = lib
        self.opened: list[int] = []
        self.closed: list[int] = []

    def _ok(self, call: str, rc: int) -> None:
        if rc:
            raise RuntimeError(f"{call} failed: {self.lib.lever_ipc_probe_err(rc).decode()}")

    def set_device(self, gpu: int) -> None:
        self._ok("cudaSetDevice", self.lib.lever_ipc_probe_set_device(gpu))

    def ipc_alloc(self, nbytes: int, gpu: int = 0) -> int:
        out = ctypes.c_ulonglong(0)
        self._ok("cudaMalloc (IPC window)", self.lib.lever_ipc_probe_alloc(nbytes, ctypes.byref(out)))
        return int(out.value)

    def ipc_free(self, base: int) -> int:
        return int(self.lib.lever_ipc_probe_free(base))

    def ipc_handle(self, base: int) -> bytes:
        buf = ctypes.create_string_buffer(ep_ipc.HANDLE_BYTES)
        self._ok("cudaIpcGetMemHandle", self.lib.lever_ipc_probe_handle(base, buf))
        return buf.raw

    def ipc_open(self, handle: bytes, gpu: int = 0) -> int:
        out = ctypes.c_ulonglong(0)
        self._ok("cudaIpcOpenMemHandle", self.lib.lever_ipc_probe_open(handle, ctypes.byref(out)))
        self.opened.append(int(out.value))
        return int(out.value)

    def ipc_close(self, mapped: int) -> int:
        rc = int(self.lib.lever_ipc_probe_close(mapped))
        self.closed.append(int(mapped))
        return rc

    def run(self, mode: int, peers: list[int], me: int, epoch: int, arrivals: int, timeout_ns: int) -> list[int]:
        arr = (ctypes.c_ulonglong * len(peers))(*peers)
        out = (ctypes.c_int * 6)()
        self._ok(f"probe kernel (mode {mode})", self.lib.lever_ipc_probe_run(
            mode, arr, len(peers), me, WORDS, epoch, arrivals, timeout_ns, out))
        return list(out)


class EpBindingIpc(CtypesIpc):
    """``--ep-binding``: the IPC calls through the EP extension's own ``ipc_*`` (pybind11,
    hw/ep/ipc_binding.inc: exactly what the V2 EFA runner calls), the kernels from the probe."""

    def __init__(self, so: Path, ep: Any) -> None:
        super().__init__(so)
        self.ep = ep

    def ipc_alloc(self, nbytes: int, gpu: int = 0) -> int:
        return int(self.ep.ipc_alloc(nbytes, gpu))

    def ipc_free(self, base: int) -> int:
        return int(self.ep.ipc_free(base))

    def ipc_handle(self, base: int) -> bytes:
        return bytes(self.ep.ipc_handle(base))

    def ipc_open(self, handle: bytes, gpu: int = 0) -> int:
        a = int(self.ep.ipc_open(handle, gpu))
        self.opened.append(a)
        return a

    def ipc_close(self, mapped: int) -> int:
        self.closed.append(int(mapped))
        return int(self.ep.ipc_close(mapped))


def build(out_dir: Path, rank: int) -> Path:
    nvcc = os.environ.get("NVCC") or "nvcc"
    so = out_dir / f"lever_ipc_probe_{rank}.so"
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0").split(";")[0].replace(".", "")
    r = subprocess.run([nvcc, f"-arch=sm_{arch}", "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC",
                        f"-I{HERE / 'ep'}", str(HERE / "ep" / "ipc_probe.cu"), "-o", str(so)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise SystemExit(f"lever: ipc_probe: nvcc failed: {r.stderr[-2000:]}")
    return so


def buffers_of(base: int) -> dict[str, int]:
    """The V2 buffer names the tables carry: the probe's region is ``final_x`` (offset 0),
    the others stand at their own offsets (the exchange checks and translates every one)."""
    return {k: base + (0 if k == "final_x" else (1 << 20) + 4096 * i) for i, k in enumerate(ep_ipc.NVLINK_BUFFERS)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lever.hw.ipc_probe")
    ap.add_argument("--out", default="v2_ipc_outcome.json")
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--ep-binding", action="store_true",
                    help="the IPC calls through the EP extension (built first: minutes) instead of the probe's")
    args = ap.parse_args(argv)
    t0 = time.time()
    import torch
    from lever.hw.efa import wire
    from lever.hw.efa.run import Dist

    env = wire.torchrun_env()
    shape = ep_ipc.node_shape(env)
    me = env["rank"]
    ngpu = torch.cuda.device_count()
    gpu = me % max(1, ngpu)
    build_dir = Path(os.environ.get("LEVER_BUILD_DIR", "/tmp/lever_build")) / "ipc_probe"
    build_dir.mkdir(parents=True, exist_ok=True)
    so = build(build_dir, me)
    if args.ep_binding:
        from lever.hw.ep import load_ext

        ext: CtypesIpc = EpBindingIpc(so, load_ext())
    else:
        ext = CtypesIpc(so)
    ext.set_device(gpu)
    dist = Dist(torch, env, args.timeout_s)
    res: dict[str, Any] = {"rank": me, "gpu": gpu, "host": platform.node(), "steps": {}}
    base = maps = None
    ok = False
    try:
        base = ext.ipc_alloc(WINDOW, gpu)
        tables, maps, entries = ep_ipc.exchange(ext, dist.all_gather, shape, me, base=base, length=WINDOW,
                                                buffers=buffers_of(base), host=platform.node(), gpu=gpu)
        node = list(shape.node_ranks())
        # the table entry for node peer p is p's buffer seen through the mapping here
        tab_ok = all(tables[p][k] - (maps.mapped[p] if p != me else base)
                     == entries[p]["buffers"][k] - entries[p]["base"]
                     for p in node for k in ep_ipc.NVLINK_BUFFERS)
        res["steps"]["tables"] = {"passed": tab_ok, "mapped": {str(p): hex(v) for p, v in maps.mapped.items()},
                                  "own_base": hex(base)}
        peers = [tables[p]["final_x"] for p in node]
        ns = int(5e9)
        ext.run(0, peers, shape.local, 1, 1, ns)
        dist.barrier()
        o = ext.run(1, peers, shape.local, 1, 1, ns)
        res["steps"]["put_check"] = {"passed": o[:3] == [0, 0, 0], "out": o}
        # the window as the V2 EFA runner sees it (torch over the binding's allocation, no copy):
        # the words node peer s stored here through its mapping
        win = torch.as_tensor(ep_ipc.CudaMemory(base, WINDOW), device=f"cuda:{gpu}")
        seen = win[256:256 + 4 * shape.P * WORDS].view(torch.int32).view(shape.P, WORDS).cpu().tolist()
        bad = sum(1 for s in range(shape.P) for i in range(0, WORDS, 97)
                  if seen[s][i] & 0xFFFFFFFF != ((131 + 17 * s + 7 * shape.local) ^ i) & 0xFFFFFFFF)
        res["steps"]["torch_view"] = {"passed": bad == 0, "bad": bad}
        del win
        o = ext.run(1, peers, shape.local, 3, 1, int(1e6))  # nobody wrote epoch 3
        res["steps"]["negative_control"] = {"passed": o[0] == shape.P, "out": o,
                                            "what": "a check for an epoch nobody wrote reports every flag missing"}
        dist.barrier()
        t1 = time.time()
        o = ext.run(2, peers, shape.local, 2, 2, int(10e9))
        res["steps"]["pingpong"] = {"passed": o[0] == 0 and o[2] == 0, "out": o, "s": round(time.time() - t1, 3),
                                    "informational": True}
        dist.barrier()
        ok = (tab_ok and res["steps"]["put_check"]["passed"] and res["steps"]["torch_view"]["passed"]
              and res["steps"]["negative_control"]["passed"])
    except (RuntimeError, ep_ipc.IpcError) as e:
        res["error"] = " ".join(str(e).split())
    finally:
        bad = ep_ipc.release(maps, ext, base or 0, dist.barrier)
        res["steps"]["teardown"] = {"passed": bad == 0 and sorted(ext.closed) == sorted(ext.opened),
                                    "opened": len(ext.opened), "closed": len(ext.closed), "failed": bad}
        ok = ok and res["steps"]["teardown"]["passed"]
    res["passed"] = ok
    allres = dist.all_gather(res)
    dist.close()
    if me == 0:
        outcome = {"kind": "lever-v2-ipc-probe", "passed": all(r["passed"] for r in allres),
                   "ipc_calls": "EP extension (hw/ep/ipc_binding.inc)" if args.ep_binding else
                   "probe library (hw/ep/ipc_probe.cu), the same hw/ep/ipc.h",
                   "ranks": env["world_size"], "ranks_per_node": shape.P, "nodes": shape.N,
                   "gpus_visible": ngpu, "same_gpu": len({r["gpu"] for r in allres}) < len(allres),
                   "device": torch.cuda.get_device_name(gpu), "torch": torch.__version__,
                   "cuda": torch.version.cuda, "wall_s": round(time.time() - t0, 2), "per_rank": allres}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(outcome, indent=1) + "\n")
        print(json.dumps({k: v for k, v in outcome.items() if k != "per_rank"}))
        for r in allres:
            print(f"rank {r['rank']} gpu {r['gpu']}: " + ", ".join(
                f"{k} {'ok' if v['passed'] else 'FAILED'}" for k, v in r["steps"].items()) + (
                f"; error: {r['error']}" if "error" in r else ""))
        return 0 if outcome["passed"] else 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
