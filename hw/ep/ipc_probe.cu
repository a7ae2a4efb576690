// The device probe of the V2-over-EFA IPC path (hw/ipc_probe.py, hw/run_v2_ipc_on_device.sh):
// the same CUDA IPC calls as the EP binding (hw/ep/ipc.h), and a kernel that does what V2's
// same-node traffic does through the mapped pointers (hw/ep/v2_kernels.cuh: v2_copy of a
// message with 16-byte stores, a system fence, atomicAdd_system on the peer's arrival
// counter, a release store of an epoch-tagged flag the peer polls with acquire loads).
// Plain CUDA C++ with a C ABI (ctypes): built with `nvcc -shared` in seconds, no torch.
//
// A rank's probe region (the allocation it exports, at its base):
//   flag[16]    u64 at 0      epoch << 32 | source, stored (release, system) by source s at [s]
//   arrived[16] u32 at 128    atomicAdd_system by source s at [s]
//   data[16][n] u32 at 256    source s's words at [s]: (epoch * 131 + s * 17 + dst * 7) ^ i
#include <cstdint>

#include "ipc.h"

namespace {

constexpr int MAXR = 16;

__device__ __forceinline__ unsigned word(unsigned epoch, int s, int d, int i) {
  return (epoch * 131u + (unsigned)s * 17u + (unsigned)d * 7u) ^ (unsigned)i;
}
__device__ __forceinline__ void st_release_sys64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ld_acquire_sys64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

struct Region {
  unsigned long long* flag;
  unsigned* arrived;
  unsigned* data;
};
__device__ __forceinline__ Region region(unsigned long long base) {
  uint8_t* b = reinterpret_cast<uint8_t*>(base);
  return {reinterpret_cast<unsigned long long*>(b), reinterpret_cast<unsigned*>(b + 128),
          reinterpret_cast<unsigned*>(b + 256)};
}

// One block per destination d (a node rank, this one included, as V2 stores to itself too):
// the words (16-byte stores), fence, arrival count, release of the epoch-tagged flag.
__global__ void put_kernel(const unsigned long long* peers, int me, int n, unsigned epoch) {
  const int d = blockIdx.x;
  Region r = region(peers[d]);
  unsigned* dst = r.data + (size_t)me * n;
  for (int i = 4 * threadIdx.x; i < n; i += 4 * blockDim.x) {
    uint4 q = make_uint4(word(epoch, me, d, i), word(epoch, me, d, i + 1), word(epoch, me, d, i + 2),
                         word(epoch, me, d, i + 3));
    *reinterpret_cast<uint4*>(dst + i) = q;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    atomicAdd_system(r.arrived + me, 1u);
    st_release_sys64(r.flag + me, ((unsigned long long)epoch << 32) | (unsigned)me);
  }
}

// This rank's own region: every source's flag (bounded acquire polls), arrival count, words.
// out[0] sources whose flag never came, out[1] wrong arrival counts, out[2] wrong words,
// out[3] first bad source (-1), out[4] its first bad word index, out[5] the value seen.
__global__ void check_kernel(unsigned long long own, int me, int P, int n, unsigned epoch, unsigned arrivals,
                             long long timeout_ns, int* out) {
  Region r = region(own);
  __shared__ int ok_flag;
  for (int s = 0; s < P; ++s) {
    if (threadIdx.x == 0) {
      const unsigned long long want = ((unsigned long long)epoch << 32) | (unsigned)s;
      const unsigned long long t0 = gtime();
      unsigned long long v;
      while ((v = ld_acquire_sys64(r.flag + s)) != want && gtime() - t0 < (unsigned long long)timeout_ns) {
      }
      ok_flag = v == want;
      if (!ok_flag) {
        atomicAdd(out + 0, 1);
        atomicCAS(out + 3, -1, s);
      } else if (atomicAdd(r.arrived + s, 0u) != arrivals) {
        atomicAdd(out + 1, 1);
        atomicCAS(out + 3, -1, s);
      }
    }
    __syncthreads();
    if (ok_flag) {
      const unsigned* src = r.data + (size_t)s * n;
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const unsigned v = *(volatile const unsigned*)(src + i);
        if (v != word(epoch, s, me, i)) {
          if (atomicAdd(out + 2, 1) == 0) {
            out[3] = s;
            out[4] = i;
            out[5] = (int)v;
          }
        }
      }
    }
    __syncthreads();
  }
}

// put then check in one kernel (both processes' kernels must run at once: on one GPU
// without MPS that is the driver's time slicing between the two contexts).
__global__ void pingpong_kernel(const unsigned long long* peers, int me, int P, int n, unsigned epoch,
                                unsigned arrivals, long long timeout_ns, int* out) {
  (void)P;
  (void)arrivals;
  const int d = blockIdx.x;
  Region r = region(peers[d]);
  if (threadIdx.x == 0) {
    for (int i = 0; i < n; ++i) r.data[(size_t)me * n + i] = word(epoch, me, d, i);
    __threadfence_system();
    atomicAdd_system(r.arrived + me, 1u);
    st_release_sys64(r.flag + me, ((unsigned long long)epoch << 32) | (unsigned)me);
    // wait for the flag of source d in this rank's own region (every pair both ways)
    Region o = region(peers[me]);
    const unsigned long long want = ((unsigned long long)epoch << 32) | (unsigned)d;
    const unsigned long long t0 = gtime();
    unsigned long long v;
    while ((v = ld_acquire_sys64(o.flag + d)) != want && gtime() - t0 < (unsigned long long)timeout_ns) {
    }
    if (v != want) {
      atomicAdd(out + 0, 1);
      atomicCAS(out + 3, -1, d);
    } else {
      for (int i = 0; i < n; ++i)
        if (o.data[(size_t)d * n + i] != word(epoch, d, me, i)) {
          atomicAdd(out + 2, 1);
          atomicCAS(out + 3, -1, d);
          break;
        }
    }
  }
}

}  // namespace

extern "C" {

int lever_ipc_probe_set_device(int gpu) { return (int)cudaSetDevice(gpu); }
const char* lever_ipc_probe_err(int e) { return cudaGetErrorString((cudaError_t)e); }
int lever_ipc_probe_alloc(unsigned long long bytes, unsigned long long* out) {
  void* p = nullptr;
  const int e = (int)lever_ipc::alloc((size_t)bytes, &p);
  *out = (unsigned long long)(uintptr_t)p;
  return e;
}
int lever_ipc_probe_free(unsigned long long base) { return (int)lever_ipc::free_alloc((void*)(uintptr_t)base); }
int lever_ipc_probe_handle(unsigned long long base, unsigned char* out64) {
  return (int)lever_ipc::get_handle((void*)(uintptr_t)base, out64);
}
int lever_ipc_probe_open(const unsigned char* in64, unsigned long long* out) {
  void* p = nullptr;
  const int e = (int)lever_ipc::open_handle(in64, &p);
  *out = (unsigned long long)(uintptr_t)p;
  return e;
}
int lever_ipc_probe_close(unsigned long long mapped) { return (int)lever_ipc::close_handle((void*)(uintptr_t)mapped); }

// mode 0: put (to every node rank through `peers`, P of them); 1: check this rank's region;
// 2: pingpong. out: 6 ints (host), filled by check/pingpong.
int lever_ipc_probe_run(int mode, const unsigned long long* peers_host, int P, int me, int n, unsigned epoch,
                        unsigned arrivals, long long timeout_ns, int* out_host) {
  if (P < 1 || P > MAXR || n % 4 || n < 4 || 256 + (size_t)MAXR * n * 4 > (1u << 21)) return (int)cudaErrorInvalidValue;
  unsigned long long* peers = nullptr;
  int* out = nullptr;
  cudaError_t e = cudaMalloc(&peers, sizeof(unsigned long long) * P);
  if (e == cudaSuccess) e = cudaMalloc(&out, sizeof(int) * 6);
  if (e == cudaSuccess) e = cudaMemcpy(peers, peers_host, sizeof(unsigned long long) * P, cudaMemcpyHostToDevice);
  const int init[6] = {0, 0, 0, -1, -1, 0};
  if (e == cudaSuccess) e = cudaMemcpy(out, init, sizeof init, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    if (mode == 0) put_kernel<<<P, 128>>>(peers, me, n, epoch);
    else if (mode == 1) check_kernel<<<1, 128>>>(peers_host[me], me, P, n, epoch, arrivals, timeout_ns, out);
    else pingpong_kernel<<<P, 32>>>(peers, me, P, n, epoch, arrivals, timeout_ns, out);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(out_host, out, sizeof(int) * 6, cudaMemcpyDeviceToHost);
  cudaFree(out);
  cudaFree(peers);
  return (int)e;
}

}  // extern "C"
