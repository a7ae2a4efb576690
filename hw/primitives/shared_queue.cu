// Shared vs owned send queue family: W issuing warps (one per SM, W = 1..#SMs) each
// post P WQEs. A post = 64-byte EFA WQE (8 x 8 B stores) into a ring in pinned host
// memory, system fence, 4-byte doorbell of the producer counter.
//   sharedq_lock_sms{W}_post_ns   one queue for all: a device-memory spin lock
//                                 (atomicCAS, no backoff) around slot reservation, WQE,
//                                 fence and doorbell
//   sharedq_ticket_sms{W}_post_ns one queue for all, EFA-GDA style: reserve a slot with
//                                 one atomicAdd, store the WQE and fence in parallel,
//                                 then wait for this slot's turn to ring the doorbell
//                                 (doorbells in strict slot order across CTAs)
//   sharedq_owned_sms{W}_post_ns  each warp owns its queue: no lock, no turn
// A sample is one warp's wall time for its P posts / P (so it includes waiting for the
// lock); samples over all warps and launches. All warps start together (a grid-wide
// arrival barrier, bounded).
//
// Verification: every (warp, seq) WQE appears exactly once in the shared ring, each
// warp's WQEs in increasing slot order, each WQE intact; the doorbell holds W*P;
// owned queues hold exactly their warp's WQEs 0..P-1 and a doorbell of P.
#include "common.cuh"

namespace prim {
namespace {

// The WQE stored for (warp, seq): dest_qp_num carries the warp, immediate_data the seq.
// Rings are sized to hold every post of a launch (fewer than 65536), so every slot is
// on the first lap of a 65536-entry ring: phase 0, req_id = slot.
__host__ __device__ inline void post_words(uint32_t warp, uint32_t seq, uint64_t slot,
                                           uint64_t w[8]) {
  make_wqe_words(slot, 1u << 16, warp & 0xffffu, w);
  w[1] = (w[1] & ~0xffffffffull) | uint64_t(seq);  // immediate_data (bytes 8..11) := seq
}

enum QMode : int { kLock = 0, kTicket = 1, kOwned = 2 };

__global__ void post_kernel(uint64_t* rings, uint32_t* dbs, unsigned long long* prods, int* lock,
                            uint64_t* rung, unsigned* arrive, int mode, int posts,
                            uint32_t depth, unsigned long long* ns, Status* st) {
  const bool owned = mode == kOwned;
  if (threadIdx.x != 0) return;
  uint32_t w = blockIdx.x, W = gridDim.x;
  uint64_t* ring = owned ? rings + size_t(w) * depth * 8 : rings;
  uint32_t* db = owned ? dbs + w * 32 : dbs;
  unsigned long long* prod = owned ? prods + w * 16 : prods;

  atomicAdd(arrive, 1u);
  if (!spin_until(st, 40, [&] { return *reinterpret_cast<volatile unsigned*>(arrive) >= W; }))
    return;
  unsigned long long t0 = gtimer();
  for (int p = 0; p < posts; ++p) {
    unsigned long long slot;
    if (mode == kTicket) {
      slot = atomicAdd(prod, 1ull);
    } else {
      if (mode == kLock) {
        if (!spin_until(st, 41, [&] { return atomicCAS(lock, 0, 1) == 0; })) return;
        __threadfence();
      }
      slot = *reinterpret_cast<volatile unsigned long long*>(prod);
      *reinterpret_cast<volatile unsigned long long*>(prod) = slot + 1;
    }
    uint64_t words[8];
    post_words(w, p, slot, words);
    uint64_t* e = ring + slot * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) st_volatile(e + j, words[j]);
    __threadfence_system();
    if (mode == kTicket) {
      if (!spin_until(st, 42, [&] { return ld_acquire_gpu(rung) == slot; })) return;
    }
    st_volatile32(db, uint32_t(slot + 1));
    if (mode == kTicket) {
      __threadfence_system();
      st_volatile(rung, slot + 1);
    } else if (mode == kLock) {
      __threadfence();
      atomicExch(lock, 0);
    }
  }
  ns[w] = (gtimer() - t0) / posts;
}

std::vector<double> one(int W, int mode, int posts, int launches, const std::string& what) {
  const bool owned = mode == kOwned;
  uint32_t depth = owned ? uint32_t(posts) : uint32_t(W * posts);
  size_t queues = owned ? W : 1;
  HostBuf<uint64_t> rings(queues * depth * 8);
  HostBuf<uint32_t> dbs(queues * 32);
  DevBuf<unsigned long long> prods(queues * 16);
  DevBuf<int> lock(1);
  DevBuf<uint64_t> rung(16);
  DevBuf<unsigned> arrive(1);
  DevBuf<unsigned long long> ns(W);
  HostBuf<Status> st(1);
  std::vector<double> out;
  for (int l = 0; l < launches + 1; ++l) {  // launch 0 is warm-up
    std::memset(static_cast<void*>(rings.p), 0, rings.n * sizeof(uint64_t));
    std::memset(static_cast<void*>(dbs.p), 0, dbs.n * sizeof(uint32_t));
    PRIM_CHECK(cudaMemset(prods.p, 0, prods.n * sizeof(unsigned long long)));
    PRIM_CHECK(cudaMemset(arrive.p, 0, sizeof(unsigned)));
    PRIM_CHECK(cudaMemset(rung.p, 0, rung.n * sizeof(uint64_t)));
    post_kernel<<<W, 32>>>(rings.p, dbs.p, prods.p, lock.p, rung.p, arrive.p, mode, posts, depth,
                           ns.p, st.p);
    finish(0, st.p, what);
    const volatile uint64_t* r = rings.p;
    if (owned) {
      for (int w = 0; w < W; ++w) {
        verify(dbs.p[w * 32] == uint32_t(posts), what + ": owned doorbell of warp " + std::to_string(w));
        for (int p = 0; p < posts; ++p) {
          uint64_t words[8];
          post_words(w, p, p, words);
          for (int j = 0; j < 8; ++j)
            verify(r[(size_t(w) * depth + p) * 8 + j] == words[j],
                   what + ": owned queue of warp " + std::to_string(w) + " slot " + std::to_string(p));
        }
      }
    } else {
      verify(dbs.p[0] == uint32_t(W * posts), what + ": shared doorbell is not W*P");
      std::vector<int> next(W, 0);
      for (uint32_t slot = 0; slot < depth; ++slot) {
        const volatile uint64_t* e = r + size_t(slot) * 8;
        uint32_t warp = uint32_t(e[0] >> 32) & 0xffffu;  // dest_qp_num (bytes 4..5)
        uint32_t seq = uint32_t(e[1] & 0xffffffffull);   // immediate_data (bytes 8..11)
        verify(warp < uint32_t(W) && seq == uint32_t(next[warp]),
               what + ": shared slot " + std::to_string(slot) + " out of order or duplicated");
        uint64_t words[8];
        post_words(warp, seq, slot, words);
        for (int j = 0; j < 8; ++j)
          verify(e[j] == words[j], what + ": shared slot " + std::to_string(slot) + " torn");
        ++next[warp];
      }
      for (int w = 0; w < W; ++w)
        verify(next[w] == posts, what + ": warp " + std::to_string(w) + " posts missing");
    }
    if (l == 0) continue;
    for (unsigned long long v : ns.to_host()) out.push_back(double(v));
  }
  return out;
}

}  // namespace

Result run_shared_queue(int device, int reps) {
  const int sms = use_device(device);
  Result res;
  const int posts = 32;
  const int launches = std::max(3, reps / 20);
  std::vector<int> widths;
  for (int w = 1; w < sms; w *= 2) widths.push_back(w);
  widths.push_back(sms);
  for (int W : widths) {
    for (int mode : {kLock, kTicket, kOwned}) {
      const char* m = mode == kLock ? "lock" : mode == kTicket ? "ticket" : "owned";
      std::string name = std::string("sharedq_") + m + "_sms" + std::to_string(W) + "_post_ns";
      res.first[name] = one(W, mode, posts, launches, name);
    }
  }
  res.second.push_back(
      "shared (lock, ticket) and owned queues: every (warp, seq) WQE exactly once, in order, "
      "intact; doorbells final");
  return res;
}

}  // namespace prim
