"""hw/ipc_probe.py's whole flow with no GPU: run under torchrun by tests/test_hw_ep_ipc.py.

'GPU memory' is a /dev/shm file per rank, a CUDA IPC handle its name, opening one maps the
file into the importing process (so peers really store into each other's memory across
processes), the probe's kernels are Python over the mapped addresses, torch's view of the
window is torch.frombuffer. What it checks is the probe's Python flow (torchrun env, gloo,
hw/ep_ipc.py's exchange and tables across real processes, the steps, the teardown count, the
outcome file), not CUDA. ``LEVER_FAKE_BREAK=offset`` shifts the tables' offset (must fail)."""
import ctypes
import mmap
import os
import struct
import sys
import time

import torch
from lever.hw import ep_ipc, ipc_probe

KEEP = []


class FakeLib:
    def __init__(self):
        self.opened, self.closed = [], []
        self.n = 0

    def set_device(self, gpu):
        pass

    def _map(self, path, nbytes):
        fd = os.open(path, os.O_RDWR)
        mm = mmap.mmap(fd, nbytes)
        os.close(fd)
        c = ctypes.c_char.from_buffer(mm)
        KEEP.append((mm, c))
        return ctypes.addressof(c)

    def ipc_alloc(self, nbytes, gpu=0):
        self.n += 1
        path = f"/dev/shm/lever_probe_{os.getpid()}_{self.n}"
        with open(path, "wb") as f:
            f.truncate(nbytes)
        self.path, self.size = path, nbytes
        return self._map(path, nbytes)

    def ipc_free(self, base):
        os.unlink(self.path)
        return 0

    def ipc_handle(self, base):
        h = f"{self.path}|{self.size}".encode()
        return h + bytes(64 - len(h))

    def ipc_open(self, handle, gpu=0):
        path, size = handle.rstrip(b"\0").decode().split("|")
        a = self._map(path, int(size))
        self.opened.append(a)
        return a

    def ipc_close(self, mapped):
        self.closed.append(mapped)
        return 0

    @staticmethod
    def word(epoch, s, d, i):
        return ((epoch * 131 + s * 17 + d * 7) ^ i) & 0xFFFFFFFF

    def run(self, mode, peers, me, epoch, arrivals, timeout_ns):
        n = ipc_probe.WORDS
        out = [0, 0, 0, -1, -1, 0]

        def put():
            for d, base in enumerate(peers):
                data = struct.pack(f"{n}I", *[self.word(epoch, me, d, i) for i in range(n)])
                ctypes.memmove(base + 256 + me * n * 4, data, len(data))
                ctypes.c_uint32.from_address(base + 128 + 4 * me).value += 1
                ctypes.c_uint64.from_address(base + 8 * me).value = (epoch << 32) | me

        def check(srcs):
            own = peers[me]
            for s in srcs:
                want = (epoch << 32) | s
                t0 = time.monotonic_ns()
                while ctypes.c_uint64.from_address(own + 8 * s).value != want and time.monotonic_ns() - t0 < timeout_ns:
                    time.sleep(0.001)
                if ctypes.c_uint64.from_address(own + 8 * s).value != want:
                    out[0] += 1
                    out[3] = s if out[3] < 0 else out[3]
                    continue
                if mode == 1 and ctypes.c_uint32.from_address(own + 128 + 4 * s).value != arrivals:
                    out[1] += 1
                got = struct.unpack(f"{n}I", ctypes.string_at(own + 256 + s * n * 4, n * 4))
                out[2] += sum(g != self.word(epoch, s, me, i) for i, g in enumerate(got))
        if mode == 0:
            put()
        elif mode == 1:
            check(range(len(peers)))
        else:
            put()
            check(range(len(peers)))
        return out


class Ext(ipc_probe.CtypesIpc):
    def __init__(self, so):  # noqa: D107
        self.f = FakeLib()
        self.opened, self.closed = self.f.opened, self.f.closed

    def set_device(self, gpu):
        pass

    def ipc_alloc(self, nbytes, gpu=0):
        return self.f.ipc_alloc(nbytes)

    def ipc_free(self, base):
        return self.f.ipc_free(base)

    def ipc_handle(self, base):
        return self.f.ipc_handle(base)

    def ipc_open(self, handle, gpu=0):
        return self.f.ipc_open(handle)

    def ipc_close(self, m):
        return self.f.ipc_close(m)

    def run(self, *a):
        return self.f.run(*a)


if os.environ.get("LEVER_FAKE_BREAK") == "offset":
    real_tables = ep_ipc.rank_tables

    def shifted(entries, shape, me, mapped):
        return [{k: v + (4096 if r != me and r in mapped else 0) for k, v in t.items()}
                for r, t in enumerate(real_tables(entries, shape, me, mapped))]

    ep_ipc.rank_tables = shifted
ipc_probe.CtypesIpc = Ext
ipc_probe.build = lambda d, r: None
real_as_tensor = torch.as_tensor


def as_tensor(obj, device=None, **kw):
    if isinstance(obj, ep_ipc.CudaMemory):
        ptr, _ = obj.__cuda_array_interface__["data"]
        n = obj.__cuda_array_interface__["shape"][0]
        return torch.frombuffer((ctypes.c_uint8 * n).from_address(ptr), dtype=torch.uint8)
    return real_as_tensor(obj, device=device, **kw)


torch.as_tensor = as_tensor
torch.cuda.get_device_name = lambda g: "fake"
sys.exit(ipc_probe.main(sys.argv[1:]))
