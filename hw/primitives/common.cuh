// Shared device/host helpers of the primitive microbenchmarks: error checks, RAII
// buffers, scoped loads/stores, bounded spins, per-launch clock calibration, and the
// EFA descriptor layouts (mirroring rdma-core providers/efa/efa_io_defs.h naming).
//
// Timing: short batches are timed with clock64() (SM cycles); every launch records a
// (clock64, %globaltimer) pair after its warm-up and at its end, and the host turns
// cycles into ns with that launch's own ratio, so a clock that changes between
// launches does not bias the numbers. Every spin is bounded (kTimeoutNs) and also
// gives up as soon as another agent reported a failure: a broken protocol ends the
// kernel with an error instead of hanging the GPU.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "prim.h"
#include "../efa_io_defs.h"
#include "../efa/wqe.h"

#define PRIM_CHECK(call)                                                                 \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_) + " (" + \
                               __FILE__ + ":" + std::to_string(__LINE__) + ")");         \
    }                                                                                    \
  } while (0)

namespace prim {

constexpr unsigned long long kTimeoutNs = 2000000000ull;  // 2 s: far above any expected wait
constexpr double kHostTimeoutS = 5.0;

// ---------------------------------------------------------------- status / errors
enum StatusCode : int { kOk = 0, kTimeout = 1, kStale = 2, kMismatch = 3, kHostFail = 4 };

struct Status {
  int code;   // first failure wins (atomicCAS)
  int where;  // caller-chosen site id
  unsigned long long expected;
  unsigned long long got;
};

__device__ inline void fail(Status* s, int code, int where, unsigned long long expected,
                            unsigned long long got) {
  if (atomicCAS(&s->code, 0, code) == 0) {
    s->where = where;
    s->expected = expected;
    s->got = got;
    __threadfence_system();
  }
}

__device__ __forceinline__ int status_code(const Status* s) {
  return *reinterpret_cast<const volatile int*>(&s->code);
}

inline std::string status_text(const Status& s) {
  const char* kind = s.code == kTimeout    ? "spin timed out"
                     : s.code == kStale    ? "stale value seen"
                     : s.code == kMismatch ? "wrong value seen"
                     : s.code == kHostFail ? "host agent failed"
                                           : "unknown failure";
  return std::string(kind) + " at site " + std::to_string(s.where) + " (expected " +
         std::to_string(s.expected) + ", got " + std::to_string(s.got) + ")";
}

inline void verify(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("verification failed: " + what);
}

// Sattolo's algorithm: one random cycle through all n lines (next[i] is the line after i),
// the pointer chase of latency.cu, host_read.cu and fence_reads.cu.
inline std::vector<uint64_t> random_cycle(size_t n, uint32_t seed) {
  std::vector<uint64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  for (size_t i = n - 1; i > 0; --i) {
    std::uniform_int_distribution<size_t> d(0, i - 1);
    std::swap(perm[i], perm[d(rng)]);
  }
  std::vector<uint64_t> next(n);
  for (size_t i = 0; i < n; ++i) next[perm[i]] = perm[(i + 1) % n];
  return next;
}

// ---------------------------------------------------------------- RAII buffers
template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    PRIM_CHECK(cudaMalloc(&p, count * sizeof(T)));
    PRIM_CHECK(cudaMemset(p, 0, count * sizeof(T)));
  }
  ~DevBuf() { if (p) cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    PRIM_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Pinned, mapped host memory; with UVA the same pointer works on the GPU.
template <class T>
struct HostBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit HostBuf(size_t count) : n(count) {
    PRIM_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&p), count * sizeof(T),
                             cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(static_cast<void*>(p), 0, count * sizeof(T));
  }
  ~HostBuf() { if (p) cudaFreeHost(p); }
  HostBuf(const HostBuf&) = delete;
  HostBuf& operator=(const HostBuf&) = delete;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { PRIM_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { if (s) cudaStreamDestroy(s); }
};

struct Event {
  cudaEvent_t e = nullptr;
  Event() { PRIM_CHECK(cudaEventCreate(&e)); }
  ~Event() { if (e) cudaEventDestroy(e); }
};

// Makes `device` current and returns its SM count: what a family's loaded runs size their
// warp counts by.
inline int use_device(int device) {
  PRIM_CHECK(cudaSetDevice(device));
  int sms = 0;
  PRIM_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// Launch check + sync + device-reported status, one call.
inline void finish(cudaStream_t s, const Status* st, const std::string& what) {
  PRIM_CHECK(cudaGetLastError());
  PRIM_CHECK(cudaStreamSynchronize(s));
  const volatile Status* v = st;
  Status copy{v->code, v->where, v->expected, v->got};
  if (copy.code != kOk) throw std::runtime_error(what + ": " + status_text(copy));
}

// ---------------------------------------------------------------- timers
__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct ClockCal {
  long long clk0, clk1;
  unsigned long long gt0, gt1;
};

__device__ __forceinline__ void cal_begin(ClockCal* c) {
  c->gt0 = gtimer();
  c->clk0 = clock64();
}
__device__ __forceinline__ void cal_end(ClockCal* c) {
  c->clk1 = clock64();
  c->gt1 = gtimer();
}

// ns per SM cycle over the measured part of one launch.
inline double ns_per_clk(const ClockCal& c, const std::string& what) {
  if (c.clk1 <= c.clk0 || c.gt1 <= c.gt0)
    throw std::runtime_error(what + ": clock calibration interval is empty");
  if (c.gt1 - c.gt0 < 20000)
    throw std::runtime_error(what + ": clock calibration interval under 20 us (too short)");
  return double(c.gt1 - c.gt0) / double(c.clk1 - c.clk0);
}

// cycles of batches of `per` operations -> ns per operation
inline std::vector<double> per_op_ns(const std::vector<long long>& cycles, double nspc, double per) {
  std::vector<double> out;
  out.reserve(cycles.size());
  for (long long c : cycles) out.push_back(double(c) * nspc / per);
  return out;
}

// ---------------------------------------------------------------- scoped memory ops
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ld_acquire_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ld_cg(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_volatile(uint64_t* p, uint64_t v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_volatile32(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_v2_relaxed_sys(uint64_t* p, uint64_t a, uint64_t b) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void ld_v2_relaxed_sys(const uint64_t* p, uint64_t& a, uint64_t& b) {
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}
__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire_sys32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_acquire_gpu32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys32(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu32(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Spin until pred() holds; false on timeout (reported into *s) or when another agent
// already failed. The clock is read only every 256 polls so the poll loop stays tight.
template <class Pred>
__device__ __forceinline__ bool spin_until(Status* s, int where, Pred pred) {
  unsigned long long t0 = 0;
  unsigned n = 0;
  while (!pred()) {
    if ((++n & 255u) == 0) {
      if (t0 == 0) t0 = gtimer();
      else if (gtimer() - t0 > kTimeoutNs) {
        fail(s, kTimeout, where, 0, 0);
        return false;
      }
      if (status_code(s) != kOk) return false;
    }
  }
  return true;
}

// A reader warp chasing a cycle of `nlines` lines (`line_words` words apart) in host memory,
// 32 lanes a step (one line each, ld.relaxed.sys): what a warp polling a CQ's lines puts on
// the GPU's read path. Runs until *stop is set or the status fails (checked every 16 steps);
// returns the steps taken and leaves the line it ended on in `idx` (the host walks the same
// cycle to verify it).
__device__ inline unsigned long long chase_lines(const uint64_t* lines, size_t nlines, int line_words,
                                                 const volatile unsigned* stop, const Status* st,
                                                 uint64_t& idx) {
  const unsigned lane = threadIdx.x & 31u;
  unsigned long long n = 0;
  bool go = true;
  idx = 0;
  while (go) {
    const uint64_t v = ld_relaxed_sys(lines + ((idx + lane) % nlines) * line_words);
    idx = __shfl_sync(0xffffffffu, v, 0);
    ++n;
    if ((n & 15u) == 0) {
      int s = 0;
      if (lane == 0) s = (*stop != 0u) || status_code(st) != kOk;
      go = !__shfl_sync(0xffffffffu, s, 0);
    }
  }
  return n;
}

// Host side of the same bound.
template <class Pred>
inline bool host_spin_until(const Status* s, Pred pred) {
  auto t0 = std::chrono::steady_clock::now();
  unsigned n = 0;
  while (!pred()) {
    if ((++n & 1023u) == 0) {
      if (*reinterpret_cast<const volatile int*>(&s->code) != kOk) return false;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >
          kHostTimeoutS)
        return false;
    }
  }
  return true;
}

inline void host_fail(Status* s, int where, unsigned long long expected, unsigned long long got) {
  if (__sync_bool_compare_and_swap(&s->code, 0, int(kHostFail))) {
    s->where = where;
    s->expected = expected;
    s->got = got;
  }
}

// ---------------------------------------------------------------- EFA layouts
// TX WQE (meta 32 B + data 32 B) and CQE layouts: hw/efa_io_defs.h, shared with hw/ep.

// The WQE of sequence number `seq` on a ring of `depth` entries (a power of two) of
// QP `qp`, as 8 little-endian words: what a GPU thread stores as 8 x 8-byte (MMIO-like)
// stores. Built by hw/efa/wqe.h, the builder the EP kernels and a real EFA post use,
// from a NIC layout and a peer entry with the values below (illustrative keys; the
// provider's conventions: first-lap phase 0, req_id the ring slot, meta.length one
// buffer, reserved bytes 0, 24-bit lkey). The phase is a bit test, not a division.
__host__ __device__ inline void make_wqe_words(uint64_t seq, uint32_t depth, uint32_t qp,
                                               uint64_t w[8]) {
  lever_efa_nic_layout l = {};
  l.sq_num_entries = depth;
  l.lkey = 0x3000u + qp;
  lever_efa_peer p = {};
  p.ahn = uint16_t(qp * 7 + 1);
  p.remote_qpn = uint16_t(qp);
  p.remote_qkey = 0x11111111u;
  p.rkey = 0x2000u + qp;
  lever_efa_write wr;
  wr.laddr = (uint64_t(uint32_t(seq >> 32)) << 32) | uint32_t(seq * 7504u + 64);
  wr.raddr = (uint64_t(uint32_t(seq >> 32) + qp) << 32) | uint32_t(seq * 7504u);
  wr.len = 7504;  // one FP8 dispatch token (DeepEP V2 message layout)
  wr.imm = uint32_t(seq);
  wr.has_imm = 1;
  wr.inline_src = nullptr;  // a 7504-byte write never goes inline
  for (int i = 0; i < 8; ++i) w[i] = lever_efa_write_wqe_word(&l, &p, &wr, uint32_t(seq), i);
}

// 16-byte completion entry (EFA CQE size, rdma-core efa_io_defs.h): word 0 carries
// efa_io_cdesc_common {req_id, status, flags (bit 0 phase), qp_num, length};
// word 1 the immediate and a check value. Writers store the entry as one 16-byte
// store (a NIC writes a whole CQE; no fence on the writer's side); pollers read it as
// one 16-byte load and must find it complete.
struct alignas(16) Cqe {
  uint64_t w0;
  uint64_t w1;
};

__host__ __device__ inline uint32_t cqe_phase(uint64_t i, uint32_t depth) {
  return lever_efa_cq_phase(uint32_t(i), depth);  // zeroed memory: first lap expects phase 1
}
__host__ __device__ inline uint64_t cqe_w0(uint64_t i, uint32_t depth) {
  uint64_t req_id = i & 0xffffu, status = 0, flags = cqe_phase(i, depth);
  uint64_t qp = 3, length = 7504;
  return req_id | (status << 16) | (flags << 24) | (qp << 32) | (length << 48);
}
__host__ __device__ inline uint64_t cqe_w1(uint64_t i) {
  return (i & 0xffffffffull) | ((i * 0x9E3779B1ull & 0xffffffffull) << 32);
}

}  // namespace prim
