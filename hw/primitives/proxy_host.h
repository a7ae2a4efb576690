// Host side of the CPU-proxy hand-off: C++ consumer threads over descriptor rings in
// pinned host memory. Plain C++ (no CUDA): it only reads and writes host memory the
// GPU also maps.
#pragma once

#include <cstdint>
#include <string>

#ifdef __CUDACC__
#define PRIM_HD __host__ __device__
#else
#define PRIM_HD
#endif

namespace prim {

// One 128-byte descriptor (the NCCL GIN proxy descriptor size): word 0 = seq + 1
// tagged with the launch's epoch, words 1..15 = payload derived from (ring, seq, word,
// epoch), so a descriptor left from an earlier launch never passes as a new one.
struct alignas(128) ProxyDesc {
  uint64_t w[16];
};

PRIM_HD inline uint64_t proxy_desc_word(uint64_t seq, uint32_t ring, uint32_t j, uint32_t epoch) {
  if (j == 0) return (seq + 1) | (uint64_t(epoch) << 48);
  return (seq * 0x9E3779B97F4A7C15ull) ^ (uint64_t(ring) << 56) ^ (uint64_t(j) << 48) ^
         (uint64_t(epoch) << 32);
}

// Producer and consumer indices on separate 128-byte lines (no false sharing).
struct alignas(128) ProxyCtl {
  uint64_t prod;  // written by the GPU (release), read by the host
  uint64_t pad0[15];
  uint64_t cons;  // written by the host (release), read by the GPU
  uint64_t pad1[15];
};

struct ProxyRingView {
  ProxyDesc* ring;
  ProxyCtl* ctl;
  uint32_t depth;
  uint32_t ring_id;
  uint32_t epoch;
  uint64_t count;  // descriptors to consume
};

// Consume `count` descriptors in order: wait for prod, check every word of each
// descriptor, publish cons after each one. Gives up after timeout_s or when *abort
// becomes non-zero. Returns "" on success, else what went wrong.
std::string proxy_consume(ProxyRingView v, const volatile int* abort, double timeout_s);

// Echo a flag: for i in 1..count wait until *gpu_flag == i (any other value but i-1
// is an error), then store *host_flag = i.
std::string flag_echo(uint64_t* gpu_flag, uint64_t* host_flag, uint64_t count,
                      const volatile int* abort, double timeout_s);

}  // namespace prim
