// CUDA IPC of the V2 buffers between the processes of one node (V2 over EFA, one rank per
// process under torchrun): the calls the EP binding (hw/ep/ipc_binding.inc) and the device
// probe (hw/ep/ipc_probe.cu) share. Plain C++ over the CUDA runtime: no torch, no pybind11.
//
// What it is for: V2 hybrid's forward warps store arrived tokens into the final rank's
// buffers on the same node, and its node barrier, arrival counters and combine flags are
// stores too (hw/ep/v2_kernels.cuh: final_x, arrived, expect, part, part_flag, comb_rows,
// comb_flag, nbar of a same-node peer). In one process (the emulated runs) those are plain
// device addresses; across processes each rank exports the allocation that holds its V2
// buffers (cudaIpcGetMemHandle) and every other rank of the node maps it
// (cudaIpcOpenMemHandle): the peer's buffer is then `mapped base + (its address - its base)`.
//
// The rules this follows (CUDA runtime API, "Interprocess Communication"): a handle names
// a whole cudaMalloc allocation, so only an allocation's base is exported (lever_ipc_alloc
// makes one, zeroed); a handle is opened once per process and never in the process that
// exported it; cudaIpcMemLazyEnablePeerAccess lets the mapping be used from the importer's
// current device (its own GPU, or the same GPU when two processes share one); every opened
// mapping is closed (cudaIpcCloseMemHandle) before its exporter frees the allocation.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>

namespace lever_ipc {

constexpr int HANDLE_BYTES = 64;
static_assert(sizeof(cudaIpcMemHandle_t) == HANDLE_BYTES, "cudaIpcMemHandle_t is 64 bytes");

// A zeroed allocation of `bytes` on the current device, exportable as it is (its own base).
inline cudaError_t alloc(size_t bytes, void** out) {
  *out = nullptr;
  cudaError_t e = cudaMalloc(out, bytes);
  if (e != cudaSuccess) return e;
  e = cudaMemset(*out, 0, bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    cudaFree(*out);
    *out = nullptr;
  }
  return e;
}

inline cudaError_t free_alloc(void* p) { return p ? cudaFree(p) : cudaSuccess; }

// The handle of the allocation whose base is `base` (64 bytes into `out`).
inline cudaError_t get_handle(void* base, unsigned char* out) {
  cudaIpcMemHandle_t h;
  std::memset(&h, 0, sizeof h);
  const cudaError_t e = cudaIpcGetMemHandle(&h, base);
  if (e == cudaSuccess) std::memcpy(out, &h, sizeof h);
  return e;
}

// Map another process's allocation from its handle: *out is the allocation's base here.
inline cudaError_t open_handle(const unsigned char* in, void** out) {
  cudaIpcMemHandle_t h;
  std::memcpy(&h, in, sizeof h);
  *out = nullptr;
  return cudaIpcOpenMemHandle(out, h, cudaIpcMemLazyEnablePeerAccess);
}

// Unmap what open_handle mapped (the base it returned).
inline cudaError_t close_handle(void* mapped) { return cudaIpcCloseMemHandle(mapped); }

}  // namespace lever_ipc
