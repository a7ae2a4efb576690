// Native DeepEP-style low-latency dispatch/combine over an emulated EFA SRD NIC.
//
// One cooperative launch per GPU and op holds two roles, so the NIC agent is
// guaranteed co-resident with the EP warps and can never deadlock them:
//   * EP blocks (ranks_per_gpu x ep_blocks_per_rank): warps build 64-byte TX
//     WQEs, store them into the send queue, fence, ring the doorbell and poll
//     CQEs with phase bits, exactly the issue-side work of EFA-GDA. They find
//     every queue through the rank's lever_efa_nic_layout tables (SQ ring,
//     doorbell, CQ ring, entry sizes, phases, keys) and build WQEs with
//     hw/efa/wqe.h, so they do not know whether the emulated NIC below or a
//     real EFA device (layouts from efadv_query_qp_wqs / efadv_query_cq) serves
//     them. Doorbells are only written, never read back: the slot-order turn
//     has its own word (QpIssuer::turn), as it must on a write-only BAR.
//   * NIC blocks (ranks_per_gpu x nics_per_rank, one block per emulated NIC):
//     the emulated device. Its warps watch the doorbells of the layouts it
//     published (hw/ep/emu_nic.h), parse and check WQEs as the v59 provider
//     writes them (phase, MBZ bits, AH, QPN, qkey, lkey, rkey), segment payloads into MTU
//     packets, schedule each packet on a path of the SRD multipath model
//     (base latency, spread, jitter, loss + retransmit), copy it into the
//     destination (NVLink peer memory or loopback) when due, and write send
//     CQEs once every packet of a WQE is acknowledged and receive CQEs with
//     the immediate for write-with-immediate.
// Every spin loop is bounded by World::timeout_ns and ends with a diagnostic
// in World::err (code, rank, expert/QP, counter seen, counter expected).
#include "efa_emu.cuh"

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include <utility>

using namespace emu;

#define MAXW 8      // warps per block at most where one kernel holds both roles (NIC warps in a
                    // NIC kernel of their own: MAXNW, efa_emu.cuh)
#define MAXG 16     // post group (doorbell batch / span) at most
// a NIC block of the one kernel (at most MAXW warps) stages two whole MTUs a warp (STAGE_V)
static_assert(stage_words(MAXW) == STAGE_V, "the shared kernel's NIC warps take whole stages");

namespace {

// ---------------------------------------------------------------- primitives
__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned int ld_acq32(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long ld_acq64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned int ld_vol32(const unsigned int* p) {
  return *reinterpret_cast<const volatile unsigned int*>(p);
}
__device__ __forceinline__ void st_relaxed32(unsigned int* p, unsigned int v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int ld_acq_gpu32(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu32(unsigned int* p, unsigned int v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release_sys32(unsigned int* p, unsigned int v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// The slot-order turn of a shared QP. Its release/acquire order one warp's doorbell store
// before the next warp's: at GPU scope when the doorbell is GPU memory (the NIC reading it
// is a GPU agent), at system scope when it is elsewhere (a NIC BAR or host memory: the
// stores of two SMs must reach the NIC in turn order). The layout says which.
__device__ __forceinline__ bool doorbell_sys(const lever_efa_nic_layout* l) {
  return l->sq_doorbell_mem != LEVER_EFA_MEM_GPU;
}
__device__ __forceinline__ unsigned turn_load(const unsigned* p, bool sys) {
  return sys ? ld_acq32(p) : ld_acq_gpu32(p);
}
__device__ __forceinline__ void turn_pass(unsigned* p, unsigned v, bool sys) {
  if (sys) st_release_sys32(p, v);
  else st_release_gpu32(p, v);
}
__device__ __forceinline__ void st_release64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_vol_v4(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ void st_vol_v4(void* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }

__device__ void raise_err(const World& w, unsigned code, int rank, int a, long long seen,
                          long long expect, int aux) {
  if (atomicCAS(&w.err[0], 0u, code) == 0u) {
    w.err[1] = (unsigned)rank;
    w.err[2] = (unsigned)a;
    w.err[3] = (unsigned)seen;
    w.err[4] = (unsigned)expect;
    w.err[5] = (unsigned)aux;
    w.err[6] = blockIdx.x;        // who was stuck: the block of the cooperative launch
    w.err[7] = threadIdx.x >> 5;  // and the warp in it
    __threadfence_system();
  }
}
__device__ __forceinline__ bool aborted(const World& w) { return ld_vol32(&w.err[0]) != 0u; }
__device__ __forceinline__ bool timed_out(const World& w, unsigned long long t0) {
  return (long long)(gtime() - t0) > w.timeout_ns || aborted(w);
}
// The same decisions taken once for the whole warp (lane 0's view): a warp whose lanes
// disagreed would leave some lanes in a full-mask shuffle or vote that the others never
// reach (a hang, not a bounded wait).
__device__ __forceinline__ bool warp_aborted(const World& w) {
  return __any_sync(0xffffffffu, aborted(w));
}
__device__ __forceinline__ bool warp_timed_out(const World& w, unsigned long long t0) {
  return __shfl_sync(0xffffffffu, (int)timed_out(w, t0), 0) != 0;
}

// counter-based hash RNG (splitmix64): deterministic per (seed, key, n)
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
struct Rng {
  unsigned long long s;
  __device__ float uni() {  // (0, 1)
    s = mix64(s);
    return ((float)(s >> 40) + 0.5f) * (1.0f / 16777216.0f);
  }
  __device__ float normal() {
    float u1 = uni(), u2 = uni();
    return sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
  }
};
__device__ float jitter_ns(const Fabric& f, Rng& r) {
  if (f.jitter_mean_ns <= 0.f) return 0.f;
  switch (f.jitter_kind) {
    case 1:
      return -f.jitter_mean_ns * logf(r.uni());
    case 2: {
      float s = f.jitter_sigma;
      float mu = logf(f.jitter_mean_ns) - 0.5f * s * s;
      return expf(mu + s * r.normal());
    }
    case 3: {  // gamma with shape k = 1/sigma^2 (Wilson-Hilferty)
      float s = fmaxf(f.jitter_sigma, 1e-3f);
      float k = 1.f / (s * s);
      float c = 1.f / (9.f * k);
      float v = 1.f - c + r.normal() * sqrtf(c);
      v = fmaxf(v, 0.f);
      return f.jitter_mean_ns * v * v * v;
    }
    default:
      return 0.f;
  }
}
__device__ float flight_ns(const Fabric& f, Rng& r) {
  int p = (int)(r.uni() * f.paths);
  if (p >= f.paths) p = f.paths - 1;
  float off = f.paths > 1 ? f.spread_ns * (2.f * (p + 0.5f) / f.paths - 1.f) : 0.f;
  return fmaxf(0.f, f.base_ns + off + jitter_ns(f, r));
}

// ------------------------------------------------------------ rank barrier
// The EP warps of one block meet here. A software barrier (arrival count + generation in
// shared memory), not bar.sync: a warp that hit an error returns early, and a hardware
// barrier would then hold the others forever; this one lets them leave once the run aborted.
__shared__ unsigned g_ep_arrive, g_ep_gen;
__device__ __forceinline__ void ep_sync(const World& w) {
  __syncwarp();
  if (lane_id() == 0) {
    const unsigned g = *reinterpret_cast<volatile unsigned*>(&g_ep_gen);
    __threadfence_block();
    if (atomicAdd(&g_ep_arrive, 1u) == (unsigned)w.ep_warps - 1u) {
      *reinterpret_cast<volatile unsigned*>(&g_ep_arrive) = 0u;
      __threadfence_block();
      atomicExch(&g_ep_gen, g + 1u);
    } else {
      while (*reinterpret_cast<volatile unsigned*>(&g_ep_gen) == g && !aborted(w)) {
      }
    }
    __threadfence_block();
  }
  __syncwarp();
}
__device__ bool rank_barrier(const World& w, const RankLocal& L, int& nbar, int rank) {
  ep_sync(w);
  ++nbar;
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(L.bar, 1u);
    unsigned target = (unsigned)(nbar * w.ep_blocks_per_rank);
    unsigned long long t0 = gtime();
    unsigned v;
    while ((v = ld_acq32(L.bar)) < target) {
      if (timed_out(w, t0)) {
        raise_err(w, ERR_TIMEOUT_BARRIER, rank, nbar, v, target, blockIdx.x);
        break;
      }
    }
  }
  ep_sync(w);
  return !warp_aborted(w);
}

// ---------------------------------------------------------------- profiler
__device__ void prof_row(const World& w, const RankLocal& L, unsigned long long w0,
                         unsigned long long a, unsigned long long b, unsigned long long c,
                         unsigned long long d, unsigned long long e, unsigned long long f,
                         unsigned long long g) {
  unsigned i = atomicAdd(L.prof_n, 1u);
  if ((int)i >= w.prof_cap) return;
  unsigned long long* r = L.prof + (size_t)i * PROF_WORDS;
  r[0] = w0; r[1] = a; r[2] = b; r[3] = c; r[4] = d; r[5] = e; r[6] = f; r[7] = g;
}
// A put row's count word: the group's WQEs in bits 31:0, the completion reads its credit
// checks made (cq_poll loop turns, or proxy-count reads) in bits 63:32.
__device__ __forceinline__ unsigned long long prof_count(int n, unsigned long long polls) {
  return (unsigned long long)(unsigned)n | ((polls & 0xffffffffull) << 32);
}
__device__ __forceinline__ unsigned long long prof_hdr(unsigned kind, int op, int rank, int warp) {
  return (unsigned long long)kind | ((unsigned long long)op << 8) |
         ((unsigned long long)rank << 16) | ((unsigned long long)warp << 32);
}
// A put row's warp word: the warp (bits 15:0) and the QP it posted on (bits 30:16), so a
// profile splits the credit reads of the data QPs from those of the notify QP.
__device__ __forceinline__ int put_warp_qp(int warp, int qp) {
  return (int)((((unsigned)qp & 0x7fffu) << 16) | ((unsigned)warp & 0xffffu));
}
struct PhaseTimer {
  unsigned long long t0;
  bool on;
  __device__ void begin(bool enabled) {
    on = enabled;
    if (on) t0 = gtime();
  }
  __device__ void end(const World& w, const RankLocal& L, unsigned phase, int op, int rank,
                      int warp) {
    if (on && lane_id() == 0)
      prof_row(w, L, prof_hdr(PK_PHASE, op, rank, warp), phase, t0, gtime(), 0, 0, 0, 0);
  }
};

// ------------------------------------------------------------ the issuer
// Native path (the EFA-GDA shape): a warp reserves SQ slots with one atomic on
// the QP's producer counter, polls the CQ for credit (unless lazy), stores its
// WQEs and fences - all in parallel with the other warps of a shared QP - and
// only the doorbell waits for its turn: doorbells ring in slot order across
// CTAs (QpIssuer::turn), so the NIC never sees a producer value that covers an
// unwritten WQE. Proxy path: the same reservation, but the warp writes 128 B
// descriptors into the QP's pinned host ring and publishes each one with its
// sequence number; host proxy threads consume the ring in order.
struct Put {
  unsigned long long laddr, raddr;
  unsigned len, imm;
  unsigned short dest, dqp;
  unsigned has_imm;
};

struct Issuer {
  int qp;
  int npend;
  int group;          // WQEs per post group
  unsigned groups;    // for sampling
  unsigned credit_ctr;
  unsigned long long pcons;  // proxy: cached consumer index of the ring
  unsigned long long n_wqe, n_db, n_fence, n_lock, n_poll, n_turnwait, n_ringpoll, n_desc;
  unsigned long long n_local;  // puts to the rank itself, copied locally
  unsigned last_slot;  // first slot of the last post group (V2 flushes track their own slots)
};

// Word wd of the WQE for put p posted as number idx on the QP of layout l: the peer
// entry of (destination rank, destination queue) gives AH, QPN, qkey and rkey.
__device__ __forceinline__ unsigned long long put_word(const World& w, const lever_efa_nic_layout* l,
                                                       const Put& p, int wd, unsigned idx) {
  const lever_efa_peer* peer =
      reinterpret_cast<const lever_efa_peer*>(l->peers) + (size_t)p.dest * w.n_rxcq + p.dqp;
  // the payload of a write the layout takes inline (128-byte WQE, v63) is read here, from
  // the local buffer in GPU memory, instead of by the NIC
  const lever_efa_write wr = {p.laddr, p.raddr, p.len, p.imm, p.has_imm,
                              reinterpret_cast<const void*>(static_cast<uintptr_t>(p.laddr))};
  return lever_efa_write_wqe_word(l, peer, &wr, idx, wd);
}
__device__ __forceinline__ const void* cqe_at(const lever_efa_nic_layout* l, unsigned ci) {
  return reinterpret_cast<const void*>(lever_efa_cq_entry_dev(l, ci));
}

// Consume available send CQEs of a shared QP (at least one poll) until
// cq_ci >= need; any warp may advance the consumer index. Warp-collective: the
// lanes read 32 consecutive CQEs at once and one CAS consumes the valid prefix.
__device__ bool cq_poll(const World& w, const RankLocal& L, int qp, unsigned need,
                        unsigned long long& polls);

// Credit from the QP's completion counter (the layout has one: EFA after rdma-core v64, or the
// emulated NIC's): its 64-bit count of completed RDMA writes is read until it reaches need
// (the model's nic.hw_counters path); a non-zero error count is an error completion. The CQ
// is not read (the device still writes it; an EFA CQ has no consumer index to overflow).
// V2's flushes count completions per SQ slot (req_id), which only CQEs carry: they keep the CQ.
__device__ __forceinline__ bool uses_counter(const RankLocal& L, const lever_efa_nic_layout* lay) {
  return lay->send_cntr_dev != 0u && L.wqe_done == nullptr;
}
__device__ bool cntr_poll(const World& w, const RankLocal& L, int qp, unsigned need,
                          unsigned long long& polls) {
  const lever_efa_nic_layout* lay = L.nic + qp;
  const unsigned long long* cnt = reinterpret_cast<const unsigned long long*>(lay->send_cntr_dev);
  const unsigned long long* bad = reinterpret_cast<const unsigned long long*>(lay->send_err_cntr_dev);
  const int lane = lane_id();
  unsigned long long t0 = gtime();
  bool ok = true;
  if (lane == 0) {
    while (true) {
      const unsigned long long v = ld_acq64(cnt);
      const unsigned long long e = ld_acq64(bad);
      ++polls;
      if (e != 0ull) {  // aux < 0: -(error count), no status to name (hw/ep.py says so)
        raise_err(w, ERR_BAD_CQE, L.rank, qp, (long long)v, (long long)need,
                  -(int)(e < 0x7fffffffull ? e : 0x7fffffffull));
        ok = false;
        break;
      }
      if ((int)((unsigned)v - need) >= 0) break;
      if (timed_out(w, t0)) {
        raise_err(w, ERR_TIMEOUT_CQ, L.rank, qp, (long long)v, need, 1);
        ok = false;
        break;
      }
    }
  }
  return __shfl_sync(0xffffffffu, ok, 0);
}

__device__ bool cq_poll(const World& w, const RankLocal& L, int qp, unsigned need,
                        unsigned long long& polls) {
  QpIssuer* Q = L.qps + qp;
  const lever_efa_nic_layout* lay = L.nic + qp;
  if (uses_counter(L, lay)) return cntr_poll(w, L, qp, need, polls);
  const int lane = lane_id();
  unsigned long long t0 = gtime();
  while (true) {
    unsigned ci = 0;
    if (lane == 0) ci = ld_vol32(&Q->cq_ci);
    ci = __shfl_sync(0xffffffffu, ci, 0);
    const unsigned k = ci + (unsigned)lane;
    uint4 v = ld_vol_v4(cqe_at(lay, k));
    if (lane == 0) ++polls;
    const bool valid = lever_efa_cqe_is_new(lay, lever_efa_cqe_flags(v.x), k) != 0;
    const unsigned vm = __ballot_sync(0xffffffffu, valid);
    const int nvalid = __ffs(~vm) - 1 < 0 ? 32 : __ffs(~vm) - 1;  // valid prefix
    const bool badst = valid && lane < nvalid && lever_efa_cqe_status(v.x) != 0u;
    const unsigned badm = __ballot_sync(0xffffffffu, badst);
    if (badm) {  // an error CQE: its status names what failed (aux), its index the WQE
      const int bl = __ffs(badm) - 1;
      const unsigned st = __shfl_sync(0xffffffffu, lever_efa_cqe_status(v.x), bl);
      if (lane == 0) raise_err(w, ERR_BAD_CQE, L.rank, qp, ci + (unsigned)bl, 0, (int)st);
      return false;
    }
    if (nvalid > 0) {
      unsigned won = 0;
      if (lane == 0) won = atomicCAS(&Q->cq_ci, ci, ci + (unsigned)nvalid) == ci;
      // V2 flushes wait for their own slots: the consumer counts each CQE's slot (req_id)
      if (L.wqe_done && __shfl_sync(0xffffffffu, won, 0) && lane < nvalid)
        atomicAdd(L.wqe_done + (size_t)qp * lay->sq_num_entries + (v.x & 0xffffu), 1u);
      continue;
    }
    if ((int)(ci - need) >= 0) return true;
    bool to = false;
    if (lane == 0) to = timed_out(w, t0);
    if (__shfl_sync(0xffffffffu, to, 0)) {
      if (lane == 0) raise_err(w, ERR_TIMEOUT_CQ, L.rank, qp, ci, need, 0);
      return false;
    }
  }
}

// proxy: completions the host proxy counted for this QP (pinned host memory)
__device__ __forceinline__ unsigned long long* proxy_done(const RankLocal& L, int qp) {
  return L.pstate + (size_t)qp * 16 + 8;
}
__device__ __forceinline__ unsigned long long* proxy_cons(const RankLocal& L, int qp) {
  return L.pstate + (size_t)qp * 16;
}
__device__ bool proxy_wait(const World& w, const RankLocal& L, const unsigned long long* p,
                           unsigned long long need, int qp, int what, unsigned long long& polls,
                           unsigned long long* seen) {
  unsigned long long t0 = gtime(), v;
  while (true) {
    v = ld_acq64(p);
    ++polls;
    if (v >= need) break;
    if (timed_out(w, t0)) {
      raise_err(w, ERR_TIMEOUT_PROXY, L.rank, qp, (long long)v, (long long)need, what);
      return false;
    }
  }
  if (seen) *seen = v;
  return true;
}

__device__ __forceinline__ void fence_all() { __threadfence_system(); }

__device__ bool post_proxy(const World& w, const RankLocal& L, const EpFlags& f, Issuer& is,
                           Put* pend, int op, int warp_global) {
  const int lane = lane_id();
  const int n = is.npend;
  bool sample = f.prof_period > 0 && (is.groups % (unsigned)f.prof_period) == 0u;
  ++is.groups;
  unsigned long long t0 = 0, tt = 0, acc_credit = 0, acc_wqe = 0, acc_fence = 0, acc_ring = 0;
  const unsigned long long polls0 = is.n_poll;
  if (sample && lane == 0) t0 = gtime();
  QpIssuer* Q = L.qps + is.qp;
  unsigned slot = 0;
  if (lane == 0) slot = atomicAdd(&Q->resv, (unsigned)n);
  slot = __shfl_sync(0xffffffffu, slot, 0);
  is.last_slot = slot;
  bool ok = true;
  const unsigned long long rd = (unsigned long long)w.ring_depth;  // descriptors per ring
  // credit: completions the proxy reported must leave room in the NIC's SQ
  if (!f.lazy) {
    if (sample && lane == 0) tt = gtime();
    if (lane == 0) {
      long long need = (long long)slot + n - w.sq_depth;
      ok = proxy_wait(w, L, proxy_done(L, is.qp), need > 0 ? (unsigned long long)need : 0ull, is.qp, 1,
                      is.n_poll, nullptr);
    }
    ok = __shfl_sync(0xffffffffu, ok, 0);
    if (sample && lane == 0) acc_credit += gtime() - tt;
    if (!ok) return false;
  }
  // ring space: the host consumer index (cached; re-read only when the ring looks full)
  if (sample && lane == 0) tt = gtime();
  if (lane == 0 && (unsigned long long)slot + n > is.pcons + rd) {
    ok = proxy_wait(w, L, proxy_cons(L, is.qp), (unsigned long long)slot + n - rd, is.qp, 2, is.n_ringpoll,
                    &is.pcons);
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  if (sample && lane == 0) acc_ring += gtime() - tt;
  if (!ok) return false;
  // descriptor stores (lanes 0..15 write 8 B words 1..15 of each 128 B descriptor)
  if (sample && lane == 0) tt = gtime();
  ProxyDesc* ring = L.pring + (size_t)is.qp * w.ring_depth;
  for (int j = 0; j < n; ++j) {
    ProxyDesc* d = ring + ((slot + j) % (unsigned)w.ring_depth);
    const Put& p = pend[j];
    unsigned long long* dw = reinterpret_cast<unsigned long long*>(d);
    if (lane >= 1 && lane < 5) {
      unsigned long long v = lane == 1 ? p.laddr : lane == 2 ? p.raddr
                           : lane == 3 ? ((unsigned long long)p.len | ((unsigned long long)p.imm << 32))
                           : ((unsigned long long)p.dest | ((unsigned long long)p.dqp << 16) |
                              ((unsigned long long)p.has_imm << 32) | ((unsigned long long)is.qp << 48));
      dw[lane] = v;
    }
  }
  __syncwarp();
  if (sample && lane == 0) { unsigned long long x = gtime(); acc_wqe += x - tt; tt = x; }
  fence_all();
  if (sample && lane == 0) { unsigned long long x = gtime(); acc_fence += x - tt; tt = x; }
  // publish: the sequence word last (the host polls it)
  if (lane < n) {
    ProxyDesc* d = ring + ((slot + lane) % (unsigned)w.ring_depth);
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(&d->seq), "l"((unsigned long long)slot + lane + 1ull)
                 : "memory");
  }
  __syncwarp();
  if (sample && lane == 0) acc_wqe += gtime() - tt;
  is.n_desc += n;
  ++is.n_fence;
  if (sample && lane == 0) {
    unsigned long long t1 = gtime();
    prof_row(w, L, prof_hdr(PK_PUT_PROXY, op, L.rank, put_warp_qp(warp_global, is.qp)), 0, acc_credit, acc_wqe, acc_fence,
             acc_ring, prof_count(n, is.n_poll - polls0), t1 - t0);
  }
  is.npend = 0;
  return true;
}

// Post the warp's pending WQEs on its QP (native): reserve slots, credit
// check (unless lazy), WQE stores, fence, doorbell turn, doorbell.
__device__ bool post_group(const World& w, const RankLocal& L, const EpFlags& f, Issuer& is,
                           Put* pend, int op, int warp_global, bool final_ring) {
  const int lane = lane_id();
  const int n = is.npend;
  if (n == 0) return true;
  if (f.proxy) return post_proxy(w, L, f, is, pend, op, warp_global);
  bool sample = f.prof_period > 0 && (is.groups % (unsigned)f.prof_period) == 0u;
  ++is.groups;
  unsigned long long t0 = 0, tt = 0, acc_lock = 0, acc_credit = 0, acc_wqe = 0, acc_fence = 0, acc_db = 0;
  const unsigned long long polls0 = is.n_poll;  // the profiler row counts this group's CQ reads
  if (sample && lane == 0) t0 = gtime();
  QpIssuer* Q = L.qps + is.qp;
  const lever_efa_nic_layout* lay = L.nic + is.qp;
  const unsigned depth = lay->sq_num_entries;
  unsigned* db = reinterpret_cast<unsigned*>(lay->sq_doorbell_dev);  // written, never read
  bool ok = true;
  unsigned slot = 0;
  if (lane == 0) slot = atomicAdd(&Q->resv, (unsigned)n);  // slot reservation: the only RMW
  slot = __shfl_sync(0xffffffffu, slot, 0);
  is.last_slot = slot;
  if (sample && lane == 0) { tt = gtime(); acc_lock += tt - t0; }
  const int ce = f.credit_every < 1 ? 1 : f.credit_every;
  if (f.span > 1) {
    // put_many: one credit check for the span, lanes write 4 WQEs per store
    if (!f.lazy) {
      if (sample && lane == 0) tt = gtime();
      ok = cq_poll(w, L, is.qp, slot + n - depth, is.n_poll);
      if (sample && lane == 0) acc_credit += gtime() - tt;
      if (!ok) return false;
    }
    if (sample && lane == 0) tt = gtime();
    __syncwarp();  // an inline payload written by another lane (a signal word) is visible
    // 8 lanes per 64-byte WQE (4 WQEs per store), 16 per 128-byte WQE (2 per store)
    const int nw = (int)lever_efa_wqe_words(lay), per = 32 / nw;
    for (int j = lane / nw; j < n; j += per) {
      unsigned idx = slot + j;
      unsigned long long* dst = reinterpret_cast<unsigned long long*>(lever_efa_sq_slot_dev(lay, idx));
      dst[lane % nw] = put_word(w, lay, pend[j], lane % nw, idx);
    }
    __syncwarp();
    if (sample && lane == 0) acc_wqe += gtime() - tt;
  } else {
    for (int i = 0; i < n; ++i) {
      if (!f.lazy && (is.credit_ctr++ % (unsigned)ce) == 0u) {
        if (sample && lane == 0) tt = gtime();
        ok = cq_poll(w, L, is.qp, slot + i + 1 - depth, is.n_poll);
        if (sample && lane == 0) acc_credit += gtime() - tt;
        if (!ok) return false;
      }
      if (sample && lane == 0) tt = gtime();
      __syncwarp();  // an inline payload written by another lane (a signal word) is visible
      if (lane < (int)lever_efa_wqe_words(lay)) {  // 8 words, 16 for a 128-byte WQE
        unsigned long long* dst =
            reinterpret_cast<unsigned long long*>(lever_efa_sq_slot_dev(lay, slot + i));
        dst[lane] = put_word(w, lay, pend[i], lane, slot + i);
      }
      __syncwarp();
      if (sample && lane == 0) acc_wqe += gtime() - tt;
    }
  }
  is.n_wqe += n;
  const bool agg = f.agg > 0;
  if (!agg) {  // the fence after the WQE stores runs in parallel across warps
    if (sample && lane == 0) tt = gtime();
    fence_all();
    ++is.n_fence;
    if (sample && lane == 0) acc_fence += gtime() - tt;
  } else {
    __threadfence();  // WQE stores before the turn hand-off (gpu scope, no system fence)
  }
  // doorbell turn: wait until every earlier slot's doorbell went out. The turn is
  // its own word (QpIssuer::turn), never the doorbell: a real EFA doorbell is a
  // write-only BAR register. Acquire here and release after the doorbell store
  // order the doorbell stores of consecutive turns, so the NIC never sees the
  // producer value go back.
  if (sample && lane == 0) tt = gtime();
  const unsigned end = slot + (unsigned)n;
  const bool dbsys = doorbell_sys(lay);
  if (lane == 0) {
    unsigned long long tw = gtime();
    unsigned v = turn_load(&Q->turn, dbsys);
    if (v != slot) ++is.n_turnwait;
    while (v != slot) {
      if (timed_out(w, tw)) {
        raise_err(w, ERR_TIMEOUT_TURN, L.rank, is.qp, v, slot, warp_global);
        ok = false;
        break;
      }
      v = turn_load(&Q->turn, dbsys);
    }
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  if (sample && lane == 0) acc_lock += gtime() - tt;
  if (!ok) return false;
  if (lane == 0 && !agg) {
    if (sample) tt = gtime();
    st_relaxed32(db, lever_efa_sq_doorbell_value(end));
    ++is.n_db;
    turn_pass(&Q->turn, end, dbsys);
    if (sample) acc_db += gtime() - tt;
  }
  if (lane == 0 && agg) {
    bool ring = true;
    if (agg) {
      unsigned last = ld_vol32(&Q->db_last);
      ring = final_ring || (int)(end - last) >= f.agg;
      if (ring) {
        if (sample) tt = gtime();
        fence_all();  // one system fence covers every warp's WQEs up to end (release chain)
        ++is.n_fence;
        if (sample) acc_fence += gtime() - tt;
      }
    }
    if (sample) tt = gtime();
    if (ring) {
      st_relaxed32(db, lever_efa_sq_doorbell_value(end));
      *reinterpret_cast<volatile unsigned*>(&Q->db_last) = end;
      ++is.n_db;
    }
    turn_pass(&Q->turn, end, dbsys);
    if (sample) acc_db += gtime() - tt;
  }
  __syncwarp();
  if (sample && lane == 0) {
    unsigned long long t1 = gtime();
    prof_row(w, L, prof_hdr(PK_PUT, op, L.rank, put_warp_qp(warp_global, is.qp)), acc_lock, acc_credit, acc_wqe, acc_fence,
             acc_db, prof_count(n, is.n_poll - polls0), t1 - t0);
  }
  is.npend = 0;
  return true;
}

// A put to the rank itself never goes on the wire: the warp copies it (as DeepEP does for
// its own rank) and, for a write-with-immediate data put, counts it in loc_cnt[dest queue]
// where the receiver adds it to the receive completions it counts. An 8-byte signal (a
// count or flag word) is one store; earlier data puts are ordered before it by the same
// barrier/flush as on the wire path.
__device__ void local_put(const World& w, const RankLocal& L, Issuer& is, const Put& p) {
  const int lane = lane_id();
  const uint8_t* src = reinterpret_cast<const uint8_t*>(p.laddr);
  uint8_t* dst = reinterpret_cast<uint8_t*>(p.raddr);
  if (((p.laddr | p.raddr | p.len) & 15ull) == 0ull) {
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    for (unsigned i = (unsigned)lane; i < (p.len >> 4); i += 32u) __stcg(d4 + i, __ldcg(s4 + i));
  } else if (((p.laddr | p.raddr | p.len) & 7ull) == 0ull) {
    const unsigned long long* s8 = reinterpret_cast<const unsigned long long*>(src);
    unsigned long long* d8 = reinterpret_cast<unsigned long long*>(dst);
    for (unsigned i = (unsigned)lane; i < (p.len >> 3); i += 32u) __stcg(d8 + i, __ldcg(s8 + i));
  } else {
    for (unsigned i = (unsigned)lane; i < p.len; i += 32u) dst[i] = __ldcg(src + i);
  }
  __syncwarp();
  __threadfence();
  if (lane == 0 && p.has_imm && (p.imm >> 31) == 0u) atomicAdd(L.loc_cnt + p.dqp, 1u);
  is.n_local += 1;
}

// Queue one put; post a full group. With deferred aggregation one put is held
// back so the warp's last group (posted with final_ring) is never empty.
__device__ __forceinline__ bool issue(const World& w, const RankLocal& L, const EpFlags& f,
                                      Issuer& is, Put* pend, const Put& p, int op, int wg) {
  if (p.dest == (unsigned short)L.rank) {  // local traffic stays local
    local_put(w, L, is, p);
    return true;
  }
  const bool hold = f.agg > 0 && !f.proxy;
  if (hold && is.npend >= is.group) {
    if (!post_group(w, L, f, is, pend, op, wg, false)) return false;
  }
  if (lane_id() == 0) pend[is.npend] = p;
  __syncwarp();
  ++is.npend;
  if (!hold && is.npend >= is.group) return post_group(w, L, f, is, pend, op, wg, false);
  return true;
}

// Every WQE of the QP rung and completed (after a rank barrier: nobody posts).
__device__ bool flush_qp(const World& w, const RankLocal& L, const EpFlags& f, int qp, Issuer& tmp) {
  QpIssuer* Q = L.qps + qp;
  bool ok = true;
  if (lane_id() == 0) {
    unsigned resv = ld_vol32(&Q->resv);
    if (f.proxy) {
      ok = proxy_wait(w, L, proxy_done(L, qp), resv, qp, 3, tmp.n_poll, nullptr);
    } else {
      unsigned long long t0 = gtime();
      unsigned v;
      const bool agg = f.agg > 0;
      while ((v = ld_acq32(&Q->turn)) != resv) {
        if (timed_out(w, t0)) { raise_err(w, ERR_TIMEOUT_TURN, L.rank, qp, v, resv, -1); ok = false; break; }
      }
      if (ok && agg && ld_vol32(&Q->db_last) != resv) {
        __threadfence_system();
        st_relaxed32(reinterpret_cast<unsigned*>(L.nic[qp].sq_doorbell_dev),
                     lever_efa_sq_doorbell_value(resv));
        *reinterpret_cast<volatile unsigned*>(&Q->db_last) = resv;
        ++tmp.n_db;
        ++tmp.n_fence;
      }
    }
    tmp.credit_ctr = resv;
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  if (!ok || f.proxy) return ok;
  const unsigned resv = __shfl_sync(0xffffffffu, tmp.credit_ctr, 0);
  return cq_poll(w, L, qp, resv, tmp.n_poll);  // warp-collective
}

// ------------------------------------------------------------ EP roles
struct EpCtx {
  int lr, rank, bi, wi, c, C;
  int nq, qbase, ndata, c_issue;
};

__device__ void setup_issuer(const World& w, const EpFlags& f, const EpCtx& e, Issuer& is,
                             bool for_signal) {
  is.npend = 0;
  is.groups = 0;
  is.credit_ctr = 0;
  is.pcons = 0;
  is.n_wqe = is.n_db = is.n_fence = is.n_lock = is.n_poll = is.n_turnwait = is.n_ringpoll = is.n_desc = 0;
  is.n_local = 0;
  if (for_signal && f.notify_qp) is.qp = 0;
  else is.qp = e.qbase + (e.c % e.ndata);
  int g = f.db_batch < 1 ? 1 : f.db_batch;
  if (f.span > g) g = f.span;
  if (f.agg > 0 && f.span <= 1) g = 1;
  if (g > MAXG) g = MAXG;
  if (!f.proxy) {  // no more WQEs per doorbell than the device takes (max_tx_batch)
    const int mb = (int)w.local[e.lr].nic[is.qp].sq_max_batch;
    if (g > mb) g = mb;
  }
  is.group = g;
}

__device__ void flush_stats(const World& w, const Issuer& is) {
  if (lane_id() != 0) return;
  if (is.n_wqe) atomicAdd(&w.stats[ST_WQES], is.n_wqe);
  if (is.n_db) atomicAdd(&w.stats[ST_DOORBELLS], is.n_db);
  if (is.n_fence) atomicAdd(&w.stats[ST_FENCES], is.n_fence);
  if (is.n_lock) atomicAdd(&w.stats[ST_LOCKS], is.n_lock);
  if (is.n_poll) atomicAdd(&w.stats[ST_CREDIT_POLLS], is.n_poll);
  if (is.n_turnwait) atomicAdd(&w.stats[ST_TURN_WAITS], is.n_turnwait);
  if (is.n_ringpoll) atomicAdd(&w.stats[ST_RING_FULL], is.n_ringpoll);
  if (is.n_desc) atomicAdd(&w.stats[ST_DESCS], is.n_desc);
  if (is.n_local) atomicAdd(&w.stats[ST_LOCAL], is.n_local);
}

// Signals: count messages (dispatch) / done flags (combine) after the data.
__device__ bool post_signals(const World& w, const RankLocal& L, const EpFlags& f, const EpCtx& e,
                             Put* pend, int op, unsigned epoch, int& nbar) {
  Issuer is;
  setup_issuer(w, f, e, is, true);
  if (f.batched_tail) {
    is.group = MAXG;
    if (!f.proxy && (int)L.nic[is.qp].sq_max_batch < is.group) is.group = (int)L.nic[is.qp].sq_max_batch;
  }
  const int wg = e.rank * 1024 + e.c;
  bool ok = true;
  if (op == 0) {
    for (int ge = e.c; ge < w.E && ok; ge += e.c_issue) {
      if (e.c >= e.c_issue) break;
      int dest = ge / w.E_local, le = ge % w.E_local;
      int cnt = L.exp_count[ge];
      unsigned long long val = ((unsigned long long)epoch << 32) | (unsigned)cnt;
      if (lane_id() == 0) L.sig_src[ge] = val;
      Put p;
      p.laddr = (unsigned long long)(L.sig_src + ge);
      p.raddr = (unsigned long long)(w.peers[dest].recv_cnt + (size_t)le * w.num_ranks + e.rank);
      p.len = 8;
      p.imm = (1u << 31) | ((unsigned)e.rank << 16) | (unsigned)cnt;
      p.dest = (unsigned short)dest;
      p.dqp = (unsigned short)le;
      p.has_imm = f.imm_counting ? 1u : 0u;
      ok = issue(w, L, f, is, pend, p, op, wg);
    }
  } else {
    for (int dest = e.c; dest < w.num_ranks && ok; dest += e.c_issue) {
      if (e.c >= e.c_issue) break;
      if (lane_id() == 0) L.sig_src[w.E + dest] = (unsigned long long)epoch;
      Put p;
      p.laddr = (unsigned long long)(L.sig_src + w.E + dest);
      p.raddr = (unsigned long long)(w.peers[dest].comb_flag + e.rank);
      p.len = 8;
      p.imm = 0;
      p.dest = (unsigned short)dest;
      p.dqp = 0;
      p.has_imm = 0;
      ok = issue(w, L, f, is, pend, p, op, wg);
    }
  }
  if (ok) ok = post_group(w, L, f, is, pend, op, wg, true);
  flush_stats(w, is);
  return ok;
}

// flush (SRD-safe signalling): every data WQE of this rank completed
__device__ bool flush_rank(const World& w, const RankLocal& L, const EpFlags& f, const EpCtx& e,
                           int& nbar) {
  if (!rank_barrier(w, L, nbar, e.rank)) return false;
  Issuer tmp;
  tmp.n_wqe = tmp.n_db = tmp.n_fence = tmp.n_lock = tmp.n_poll = tmp.n_turnwait = tmp.n_ringpoll = tmp.n_desc = 0;
  tmp.n_local = 0;
  bool ok = true;
  for (int q = e.c; q < e.nq && ok; q += e.C) ok = flush_qp(w, L, f, q, tmp);
  flush_stats(w, tmp);
  if (!ok) return false;
  return rank_barrier(w, L, nbar, e.rank);
}

__device__ void dispatch_rank(const World& w, const EpFlags& f, const EpCtx& e, Put* pend,
                              unsigned epoch) {
  const RankLocal& L = w.local[e.lr];
  const int lane = lane_id();
  const int T = w.T, K = w.K, H = w.H, R = w.num_ranks;
  const bool prof = f.prof_period > 0;
  int nbar = 0;
  PhaseTimer ph;
  const int wg = e.rank * 1024 + e.c;

  // 0. layout: per global expert, deterministic slots in token order (+ counts);
  //    cached dispatch reuses the previous call's slots (the layout handle)
  const bool cached = f.cached != 0;
  const bool imm = f.imm_counting || cached;
  ph.begin(prof);
  for (int ge = e.c; ge < w.E && !cached; ge += e.C) {
    int base = 0;
    for (int t0 = 0; t0 < T; t0 += 32) {
      int t = t0 + lane;
      int kk = -1;
      if (t < T)
        for (int k = 0; k < K; ++k)
          if (L.topk[t * K + k] == ge) kk = k;
      unsigned m = __ballot_sync(0xffffffffu, kk >= 0);
      if (kk >= 0) L.slot_tab[t * K + kk] = base + __popc(m & ((1u << lane) - 1u));
      base += __popc(m);
    }
    if (lane == 0) L.exp_count[ge] = base;
  }
  ph.end(w, L, PH_LAYOUT, 0, e.rank, wg);
  if (!cached && !rank_barrier(w, L, nbar, e.rank)) return;

  // 1. send: one RDMA write per (token, expert)
  Issuer is;
  setup_issuer(w, f, e, is, false);
  bool ok = true;
  if (e.c < e.c_issue) {
    for (int t = e.c; t < T && ok; t += e.c_issue) {
      ph.begin(prof);
      uint8_t* msg = L.send_buf + (size_t)t * DMSG;
      const uint4* src = reinterpret_cast<const uint4*>(L.x_fp8 + (size_t)t * H);
      uint4* dst = reinterpret_cast<uint4*>(msg);
      for (int i = lane; i < H / 16; i += 32) dst[i] = src[i];
      const float* sc = L.x_scales + (size_t)t * (H / 128);
      float* dsc = reinterpret_cast<float*>(msg + H);
      for (int i = lane; i < H / 128; i += 32) dsc[i] = sc[i];
      int* meta = reinterpret_cast<int*>(msg + H + (H / 128) * 4);
      if (lane < 28) {
        int v = 0;
        if (lane == 0) v = (int)epoch;
        else if (lane == 1) v = STAMP_MAGIC | e.rank;
        else if (lane == 2) v = t;
        else if (lane >= 3 && lane < 3 + K) v = L.topk[t * K + (lane - 3)];
        meta[lane] = v;
      }
      __syncwarp();
      ph.end(w, L, PH_PACK, 0, e.rank, wg);
      for (int k = 0; k < K && ok; ++k) {
        int ge = L.topk[t * K + k];
        int dest = ge / w.E_local, le = ge % w.E_local;
        int slot = L.slot_tab[t * K + k];
        Put p;
        p.laddr = (unsigned long long)msg;
        p.raddr = (unsigned long long)(w.peers[dest].recv_x +
                                       ((size_t)(le * R + e.rank) * T + slot) * DMSG);
        p.len = DMSG;
        p.imm = ((unsigned)e.rank << 16) | (unsigned)slot;
        p.dest = (unsigned short)dest;
        p.dqp = (unsigned short)le;
        p.has_imm = imm ? 1u : 0u;
        ok = issue(w, L, f, is, pend, p, 0, wg);
      }
    }
    if (ok) ok = post_group(w, L, f, is, pend, 0, wg, true);
  }
  flush_stats(w, is);
  if (!ok) return;

  // 2. signal the per-(expert, source) counts (cached: none, the receiver knows them)
  ph.begin(prof);
  if (imm) {
    // no flush: the receiver counts receive completions against the count
  } else if (f.ordered_unsafe) {
    if (!rank_barrier(w, L, nbar, e.rank)) return;
  } else {
    if (!flush_rank(w, L, f, e, nbar)) return;
  }
  ph.end(w, L, PH_FLUSH, 0, e.rank, wg);
  if (!cached) {
    ph.begin(prof);
    if (!post_signals(w, L, f, e, pend, 0, epoch, nbar)) return;
    ph.end(w, L, PH_SIGNAL, 0, e.rank, wg);
  }

  // 3. receive: per local expert, per source rank
  for (int le = e.c; le < w.E_local; le += e.C) {
    const int ge = e.rank * w.E_local + le;
    int cnt_lane = 0;  // lane s holds the count from source s
    ph.begin(prof);
    if (imm) {
      const lever_efa_nic_layout* rq = L.rx + le;
      unsigned head = L.rx_head[le];
      int got = 0, expect = -1;  // per lane (source = lane)
      if (cached && lane < R) expect = L.hcount[le * R + lane];
      unsigned long long t0 = gtime();
      while (true) {
        if (lane == e.rank) {  // own tokens were copied, not sent: local count and count word
          got = (int)ld_acq32(L.loc_cnt + le);
          if (expect < 0) {
            const unsigned long long cv = ld_acq64(w.peers[e.rank].recv_cnt + (size_t)le * R + lane);
            if ((cv >> 32) == (unsigned long long)epoch) expect = (int)(cv & 0xffffffffu);
          }
        }
        bool done = lane >= R || (expect >= 0 && got == expect);
        if (__all_sync(0xffffffffu, done)) break;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (lane == 0) v = ld_vol_v4(cqe_at(rq, head));
        unsigned fl = __shfl_sync(0xffffffffu, lever_efa_cqe_flags(v.x), 0);
        unsigned imm = __shfl_sync(0xffffffffu, v.w, 0);  // efa_io_rx_cdesc.imm: bytes 12..15
        if (lever_efa_cqe_is_new(rq, fl, head)) {
          ++head;
          int s = (imm >> 16) & 0x7fff;
          if (lane == s) {
            if (imm >> 31) expect = (int)(imm & 0xffffu);
            else ++got;
          }
        } else if (warp_timed_out(w, t0)) {
          int bad = __ffs(__ballot_sync(0xffffffffu, !done)) - 1;
          int g2 = __shfl_sync(0xffffffffu, got, bad < 0 ? 0 : bad);
          int e2 = __shfl_sync(0xffffffffu, expect, bad < 0 ? 0 : bad);
          if (lane == 0) raise_err(w, ERR_TIMEOUT_RX_CQ, e.rank, ge, g2, e2, bad);
          return;
        }
      }
      if (lane == 0) L.rx_head[le] = head;
      cnt_lane = expect;
      __threadfence();
    } else {
      if (lane < R) {
        const unsigned long long* p = w.peers[e.rank].recv_cnt + (size_t)le * R + lane;
        unsigned long long t0 = gtime();
        unsigned long long v;
        while (((v = ld_acq64(p)) >> 32) != (unsigned long long)epoch) {
          if (timed_out(w, t0)) {
            raise_err(w, ERR_TIMEOUT_RECV_COUNT, e.rank, ge, (long long)(v >> 32), epoch, lane);
            break;
          }
        }
        cnt_lane = (int)(v & 0xffffffffu);
      }
      // every lane leaves together: lanes >= R skipped the wait, and must not go on to the
      // shuffles below while the lanes that timed out return
      if (warp_aborted(w)) return;
    }
    ph.end(w, L, PH_POLL, 0, e.rank, wg);
    ph.begin(prof);
    unsigned long long bad = 0;
    for (int s = 0; s < R; ++s) {
      int cnt = __shfl_sync(0xffffffffu, cnt_lane, s);
      const uint8_t* base = w.peers[e.rank].recv_x + ((size_t)(le * R + s) * T) * DMSG;
      for (int slot = lane; slot < cnt; slot += 32) {
        const int* meta = reinterpret_cast<const int*>(base + (size_t)slot * DMSG + H + (H / 128) * 4);
        int m0 = __ldcg(meta), m1 = __ldcg(meta + 1), tok = __ldcg(meta + 2);
        bool hit = false;
        for (int k = 0; k < K; ++k) hit |= (__ldcg(meta + 3 + k) == ge);
        if (m0 != (int)epoch || m1 != (STAMP_MAGIC | s) || !hit || tok < 0 || tok >= T) ++bad;
        L.out_src[(size_t)(le * R + s) * T + slot] = tok;
      }
      if (lane == 0) {
        L.out_count[le * R + s] = cnt;
        L.hcount[le * R + s] = cnt;  // the layout handle a cached dispatch reuses
      }
    }
    for (int o = 16; o; o >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, o);
    if (lane == 0 && bad) atomicAdd(&w.stats[ST_STAMP_BAD_DISPATCH], bad);
    ph.end(w, L, PH_RECV, 0, e.rank, wg);
  }

  // 4. final drain: every WQE (data and signals) completed before exit
  ph.begin(prof);
  if (!flush_rank(w, L, f, e, nbar)) return;
  ph.end(w, L, PH_DRAIN, 0, e.rank, wg);
}

__device__ __forceinline__ float bf16_to_f(uint16_t b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ uint16_t f_to_bf16_rn(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u));
  unsigned r = 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)((u + r) >> 16);
}

__device__ void combine_rank(const World& w, const EpFlags& f, const EpCtx& e, Put* pend,
                             unsigned epoch) {
  const RankLocal& L = w.local[e.lr];
  const int lane = lane_id();
  const int T = w.T, K = w.K, H = w.H, R = w.num_ranks;
  const bool prof = f.prof_period > 0;
  int nbar = 0;
  PhaseTimer ph;
  const int wg = e.rank * 1024 + e.c;

  // 1. send every received token's expert output back to its source
  Issuer is;
  setup_issuer(w, f, e, is, false);
  bool ok = true;
  if (e.c < e.c_issue) {
    int run = 0;
    for (int pr = 0; pr < w.E_local * R && ok; ++pr) {
      const int le = pr / R, s = pr % R;
      const int cnt = L.out_count[pr];
      int first = (e.c - run) % e.c_issue;
      if (first < 0) first += e.c_issue;
      for (int slot = first; slot < cnt && ok; slot += e.c_issue) {
        const int tok = L.out_src[(size_t)pr * T + slot];
        const int ge = e.rank * w.E_local + le;
        const int* meta = reinterpret_cast<const int*>(
            w.peers[e.rank].recv_x + ((size_t)pr * T + slot) * DMSG + H + (H / 128) * 4);
        int kk = 0;
        for (int k = 0; k < K; ++k)
          if (__ldcg(meta + 3 + k) == ge) kk = k;
        uint8_t* msg = L.comb_send + ((size_t)le * R * T + (size_t)s * T + slot) * CMSG;
        if (lane < 4) {
          int v = lane == 0 ? (int)epoch : lane == 1 ? (STAMP_MAGIC | e.rank) : lane == 2 ? tok : kk;
          reinterpret_cast<int*>(msg)[lane] = v;
          reinterpret_cast<int*>(msg + CMSG - 48)[lane] = v;
        }
        __syncwarp();
        Put p;
        p.laddr = (unsigned long long)msg;
        p.raddr = (unsigned long long)(w.peers[s].comb_recv + ((size_t)tok * K + kk) * CMSG);
        p.len = CMSG;
        p.imm = ((unsigned)tok << 8) | (unsigned)kk;
        p.dest = (unsigned short)s;
        p.dqp = (unsigned short)(tok % e.C);
        p.has_imm = f.imm_counting ? 1u : 0u;
        ok = issue(w, L, f, is, pend, p, 1, wg);
      }
      run += cnt;
    }
    if (ok) ok = post_group(w, L, f, is, pend, 1, wg, true);
  }
  flush_stats(w, is);
  if (!ok) return;

  // 2. signal: one flag per destination rank after the data completed
  ph.begin(prof);
  if (!f.imm_counting) {
    if (f.ordered_unsafe) {
      if (!rank_barrier(w, L, nbar, e.rank)) return;
    } else if (!flush_rank(w, L, f, e, nbar)) {
      return;
    }
  }
  ph.end(w, L, PH_FLUSH, 1, e.rank, wg);
  if (!f.imm_counting) {
    ph.begin(prof);
    if (!post_signals(w, L, f, e, pend, 1, epoch, nbar)) return;
    ph.end(w, L, PH_SIGNAL, 1, e.rank, wg);
  }

  // 3. receive and reduce the tokens of this warp
  ph.begin(prof);
  if (f.imm_counting) {
    int ntok = 0;
    for (int t = e.c; t < T; t += e.C) ++ntok;
    const int expect = ntok * K;
    const lever_efa_nic_layout* rq = L.rx + e.c;
    unsigned head = L.rx_head[e.c];
    int got = 0;
    unsigned long long t0 = gtime();
    while (true) {
      int loc = 0;  // messages of this rank to itself (copied locally, no receive completion)
      if (lane == 0) loc = (int)ld_acq32(L.loc_cnt + e.c);
      loc = __shfl_sync(0xffffffffu, loc, 0);
      if (got + loc >= expect) break;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (lane == 0) v = ld_vol_v4(cqe_at(rq, head));
      unsigned fl = __shfl_sync(0xffffffffu, lever_efa_cqe_flags(v.x), 0);
      if (lever_efa_cqe_is_new(rq, fl, head)) {
        ++head;
        ++got;
      } else if (warp_timed_out(w, t0)) {
        if (lane == 0) raise_err(w, ERR_TIMEOUT_RX_CQ, e.rank, -1 - e.c, got, expect, 1);
        return;
      }
    }
    if (lane == 0) L.rx_head[e.c] = head;
    __threadfence();
  } else if (lane < R) {
    const unsigned long long* p = w.peers[e.rank].comb_flag + lane;
    unsigned long long t0 = gtime();
    unsigned long long v;
    while ((v = ld_acq64(p)) != (unsigned long long)epoch) {
      if (timed_out(w, t0)) {
        raise_err(w, ERR_TIMEOUT_COMB_FLAG, e.rank, lane, (long long)v, epoch, 1);
        break;
      }
    }
  }
  __syncwarp();  // lanes >= R must not read data before lanes < R saw every flag
  if (warp_aborted(w)) return;
  ph.end(w, L, PH_POLL, 1, e.rank, wg);
  ph.begin(prof);
  unsigned long long bad = 0;
  const uint8_t* rbase = w.peers[e.rank].comb_recv;
  for (int t = e.c; t < T; t += e.C) {
    float wk[MAX_TOPK];
    for (int k = 0; k < K; ++k) {
      wk[k] = L.topk_w[t * K + k];
      const int* head = reinterpret_cast<const int*>(rbase + ((size_t)t * K + k) * CMSG);
      const int* tail = reinterpret_cast<const int*>(rbase + ((size_t)t * K + k) * CMSG + CMSG - 48);
      if (lane < 4) {
        int want = lane == 0 ? (int)epoch : lane == 1 ? -1 : lane == 2 ? t : k;
        int h = __ldcg(head + lane), tl = __ldcg(tail + lane);
        bool okh = lane == 1 ? ((h & 0xffff0000) == STAMP_MAGIC) : h == want;
        bool okt = lane == 1 ? ((tl & 0xffff0000) == STAMP_MAGIC) : tl == want;
        if (!okh || !okt) ++bad;
      }
    }
    uint16_t* out = L.comb_out + (size_t)t * H;
    for (int i = lane; i < H / 8; i += 32) {
      float acc[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = 0.f;
      for (int k = 0; k < K; ++k) {
        uint4 v = __ldcg(reinterpret_cast<const uint4*>(rbase + ((size_t)t * K + k) * CMSG + 16) + i);
        const uint16_t* hv = reinterpret_cast<const uint16_t*>(&v);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], __fmul_rn(wk[k], bf16_to_f(hv[j])));
      }
      uint4 o;
      uint16_t* ov = reinterpret_cast<uint16_t*>(&o);
#pragma unroll
      for (int j = 0; j < 8; ++j) ov[j] = f_to_bf16_rn(acc[j]);
      reinterpret_cast<uint4*>(out)[i] = o;
    }
  }
  for (int o = 16; o; o >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, o);
  if (lane == 0 && bad) atomicAdd(&w.stats[ST_STAMP_BAD_COMBINE], bad);
  ph.end(w, L, PH_REDUCE, 1, e.rank, wg);

  ph.begin(prof);
  if (!flush_rank(w, L, f, e, nbar)) return;
  ph.end(w, L, PH_DRAIN, 1, e.rank, wg);
}

// ------------------------------------------------------------ NIC agent
// One block per emulated EFA device. The block shares one packet table in shared memory
// (NP entries, each a packet, a send completion or a receive completion with its due time)
// and one table of the WQEs in flight (NWQ slots: packets to land, packets to be ACKed, the
// receiver's landed bitmap, the latest ACK, the status). Only this block's warps touch a
// WQE of the QPs it serves, so that state lives in shared memory: a delivering warp's
// bookkeeping is shared-memory atomics, not a chain of global ones.
// A delivering warp claims up to Fabric::deliver_batch due entries at a time (CAS on the
// entry state), copies packets with 16-byte loads/stores, issues one fence for the batch and
// does the bookkeeping. One warp fetches new WQEs (Fabric::dedicated_fetcher; else whichever
// warp wins a try-lock between its deliveries): lanes load up to 32 WQEs of a QP at once
// (4 x 16 B each), validate them, and schedule their packets on the NIC's serialiser (line
// rate) in SQ order, each packet with its own path, jitter and losses (retransmit after the
// RTO). Where host queues exist, warp 0 is the host-facing engine (nic_mirror, host CQEs).
#define NP 512      // packet-table entries per NIC block
static_assert(NP % 128 == 0, "a lane's run of NP / 32 entries is whole 16-byte vectors");
#define NWQ 512     // WQE-table slots per NIC block: WQEs in flight at most (each has >= 1 packet)
// entries a warp delivers per batch: Fabric::deliver_batch (a packet's lateness includes its batch)
#define FETCH_MAXP 64

enum : unsigned { ES_FREE = 0, ES_PENDING = 1, ES_CLAIMED = 2 };
enum : unsigned { EK_DATA = 0, EK_SEND_CQE = 1, EK_RECV_CQE = 2 };

// 16-byte aligned: the wide claim reads its state, meta and due arrays as 16-byte vectors
struct alignas(16) NicShared {
  unsigned long long due[NP];
  unsigned long long src[NP];   // data: source address; recv CQE: time of the last packet
  unsigned long long dst[NP];
  unsigned len[NP];
  unsigned wi[NP];              // WQE index (producer count) on its QP
  unsigned imm[NP];
  unsigned meta[NP];            // kind 0-1 | has_imm 2 | pkt 3-7 | q 8-15 | dest 16-23 | dqp 24-31
  unsigned state[NP];
  unsigned long long sent[NP];  // data: when the current transmission left the NIC
  unsigned char tries[NP];      // data: retransmissions so far (lost packets and lost ACKs)
  unsigned short ws[NP];        // the entry's WQE slot (w_*)
  // per WQE in flight, by slot: packets not landed, packets not ACKed, the receiver's
  // landed-packet bitmap (duplicates discarded), the latest ACK (ns after t0), flags
  int w_land[NWQ];
  int w_ack[NWQ];
  unsigned w_bits[NWQ];
  unsigned w_ackt[NWQ];
  unsigned w_flags[NWQ];        // WF_USED | WF_ERR (a packet ran out of retries)
  unsigned q_last[NQ_MAX];      // per QP: highest (wqe, packet) landed (reorder statistics)
  unsigned long long dep[FETCH_MAXP];
  int eidx[FETCH_MAXP];
  int wsl[32];                  // fetch: the slots found for the WQEs taken
  unsigned long long nic_free, last_wqe, t0;
  int nfree, inflight, wfree;
  unsigned fetch_lock, cursor, wcursor;
};
enum : unsigned { WF_USED = 1u, WF_ERR = 2u };

__device__ __forceinline__ unsigned long long vld64(const unsigned long long* p) {
  return *reinterpret_cast<const volatile unsigned long long*>(p);
}
// 16-byte volatile vector loads (generic addresses: the packet table is in this block's shared
// memory, or its cluster's first block's): the wide claim's (nic_claim_loads = "wide")
__device__ __forceinline__ uint4 vld_v4(const unsigned* p) {
  uint4 v;
  asm volatile("ld.volatile.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
// Word i (0-3) of a 16-byte vector (i known at compile time in an unrolled loop: a register).
__device__ __forceinline__ unsigned word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ ulonglong2 vld_v2_64(const unsigned long long* p) {
  ulonglong2 v;
  asm volatile("ld.volatile.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int ldvi(const int* p) { return *reinterpret_cast<const volatile int*>(p); }
__device__ __forceinline__ unsigned vldu(const unsigned* p) {
  return *reinterpret_cast<const volatile unsigned*>(p);
}
__device__ __forceinline__ void vst64(unsigned long long* p, unsigned long long v) {
  *reinterpret_cast<volatile unsigned long long*>(p) = v;
}
__device__ __forceinline__ void vstu(unsigned* p, unsigned v) { *reinterpret_cast<volatile unsigned*>(p) = v; }
// Whether a NIC's tables are shared by a cluster of blocks (Fabric::blocks_per_nic > 1 with
// Fabric::share_table): the second block's warps reach the first block's shared memory
// (distributed shared memory), so the orderings on the tables are at cluster scope.
__host__ __device__ __forceinline__ bool tab_shared(const Fabric& fb) {
  return fb.blocks_per_nic > 1 && fb.share_table == 1;
}
// Whether a NIC's blocks split its WQEs (Fabric::share_table 2 or 3): every block sees every QP
// of the NIC and takes the WQEs of its own index mod blocks_per_nic, so each block gets a share
// of every burst (a QP's WQEs alternate between the blocks) and keeps its packets in its own
// table. With 2 the blocks share one wire in global memory under a lock; with 3 each block sends
// on a lane of its own (the line rate and the message rate divided between the lanes, no lock).
__host__ __device__ __forceinline__ bool wqes_split(const Fabric& fb) {
  return fb.blocks_per_nic > 1 && (fb.share_table == 2 || fb.share_table == 3);
}
__host__ __device__ __forceinline__ bool wire_lanes(const Fabric& fb) {
  return fb.blocks_per_nic > 1 && fb.share_table == 3;
}
// NIC blocks a rank that act as NICs of their own (each its table): a NIC's blocks when they
// split its QPs or its WQEs (Fabric::share_table 0, 2 or 3), else one a NIC (a cluster shares
// one table).
__device__ __forceinline__ int nic_units(const Fabric& fb) {
  return fb.nics_per_rank * (fb.blocks_per_nic > 1 && !tab_shared(fb) ? fb.blocks_per_nic : 1);
}
// Order this thread's writes to the NIC's tables before its later ones: block scope for a
// table only its own block touches, cluster scope for one a cluster shares.
__device__ __forceinline__ void tab_fence(const Fabric& fb) {
  if (tab_shared(fb)) asm volatile("fence.acq_rel.cluster;" ::: "memory");
  else __threadfence_block();
}

struct NicCtx {
  const RankLocal* L;
  int nic, nics, nq;  // this NIC block (of nics a rank: NICs x blocks_per_nic) and its QPs' stride
  int pnic, pnics;    // the emulated NIC it serves (of pnics a rank); sub-block 0 faces the host
  bool proxy;
  unsigned stage_v;                 // 16-byte words of each delivering warp's staging slice
  const lever_efa_nic_layout* lay;  // [nq] the QPs it serves (native or proxy), as it published them
  const lever_efa_nic_layout* flay; // [nq] where it fetches WQEs and doorbells: its device mirror of a
                                    // host-memory SQ, else the published layout
  bool sq_host, cq_host;            // published SQ / CQ in host memory (PCIe from this GPU)
  bool rx_host;                     // the receive CQs (write-with-immediate) in host memory
  unsigned long long seed;
  unsigned long long n_pkt, n_retx, n_cqe, n_rx, n_reord, n_wqe, n_late;
  unsigned long long n_drop, n_dup, n_err, n_early, n_mirror, n_claim_lag, n_deliver;
  unsigned long long n_scan, n_copy, n_fence, n_claim_load;
  // the host-facing engine's own time (lane 0 only; 0 on every other warp): doorbell-read
  // passes, the QPs they found moved (one mirror copy each, however many WQEs it carries),
  // and where its time went: the doorbell reads, the copies, CQE passes that wrote, empty ones
  unsigned long long n_hpass, n_hcopy, n_hread_ns, n_hcopy_ns, n_hcqe_ns, n_hidle_ns;
};

__device__ __forceinline__ Rng pkt_rng(const NicCtx& c, int q, unsigned wi, unsigned p) {
  Rng r;
  r.s = mix64(c.seed ^ ((unsigned long long)c.L->rank << 52) ^ ((unsigned long long)q << 44) ^
              ((unsigned long long)wi << 8) ^ (unsigned long long)p);
  return r;
}

// The draw of one wire event of packet p of WQE wi: what (1 packet dropped?, 2 ACK
// dropped?, 3 the resend's flight) and the transmission it belongs to (tries).
__device__ __forceinline__ Rng event_rng(const NicCtx& c, int q, unsigned wi, unsigned p, unsigned what,
                                         unsigned tries) {
  Rng r = pkt_rng(c, q, wi, p);
  r.s = mix64(r.s ^ ((unsigned long long)what << 56) ^ ((unsigned long long)tries << 48));
  return r;
}

// Whether bytes [from, 128) of a WQE read as raw[8] are zero: a 64-byte WQE's second half is
// not read (0), a 128-byte one's beyond its descriptor or inline payload must be (the builder
// writes the whole entry, as the provider's LLQ copy does).
__device__ __forceinline__ bool wqe_tail_zero(const uint4* raw, unsigned from) {
  const unsigned* wd = reinterpret_cast<const unsigned*>(raw);
  bool ok = true;
#pragma unroll
  for (int k = 0; k < 32; ++k) {
    const unsigned b0 = 4u * (unsigned)k;
    if (b0 + 4u <= from) continue;
    const unsigned keep = from > b0 ? (from - b0) : 0u;  // low bytes of this word in use
    const unsigned mask = keep >= 4u ? 0u : (0xffffffffu << (8u * keep));
    ok = ok && (wd[k] & mask) == 0u;
  }
  return ok;
}

// Fetch new WQEs of every QP of this NIC (one warp at a time). Returns WQEs taken, -1 on error.
__device__ int nic_fetch(const World& w, NicCtx& c, NicShared& S) {
  const int lane = lane_id();
  const Fabric& fb = w.fab;
  const RankLocal& L = *c.L;
  int taken_total = 0;
  // a lane of the wire (wire_lanes) sends at the line rate over the lanes
  const float lanes = wire_lanes(fb) ? (float)fb.blocks_per_nic : 1.f;
  const float ns_per_byte = 8.f * lanes / fb.line_rate_gbps;
  // lane j watches QP nic + j * nics: all doorbells are read at once
  unsigned my_ci = 0, my_db = 0;
  // The QPs it fetches from: its own (one block a NIC, or the NIC's QPs split between its
  // blocks), or every QP of the NIC, taking the WQEs of its block index `sub` mod `step` (WQEs
  // split: ci is then this block's next WQE, and its WQEs are `step` apart).
  const bool split = wqes_split(fb);
  const int qbase = split ? c.pnic : c.nic, qstride = split ? c.pnics : c.nics;
  const int sub = split ? c.nic / c.pnics : 0;
  const unsigned step = split ? (unsigned)fb.blocks_per_nic : 1u;
  const int my_q = qbase + lane * qstride;
  if (my_q < c.nq) {
    my_ci = split ? ld_vol32(&L.nicqp[my_q].ci_sub[sub]) + (unsigned)sub : ld_vol32(&L.nicqp[my_q].ci);
    my_db = ld_acq32(reinterpret_cast<const unsigned*>(c.flay[my_q].sq_doorbell_dev)) & 0xffffu;
  }
  // this block's WQEs in [ci, db): a signed distance (the SQ is far shallower than 2^15), so a
  // block whose next WQE is past the doorbell has none
  const int my_dist = (int)(short)(unsigned short)((my_db - my_ci) & 0xffffu);
  const unsigned my_pend = my_dist > 0 ? ((unsigned)my_dist + step - 1u) / step : 0u;
  unsigned todo = __ballot_sync(0xffffffffu, my_q < c.nq && my_pend != 0u);
  while (todo) {
    const int jq = __ffs(todo) - 1;
    todo &= todo - 1;
    const int q = qbase + jq * qstride;
    NicQp* NQ = L.nicqp + q;
    unsigned ci = __shfl_sync(0xffffffffu, my_ci, jq);
    unsigned pending = __shfl_sync(0xffffffffu, my_pend, jq);
    while (pending > 0u) {
      const int nw = pending < 32u ? (int)pending : 32;
      // lane j parses WQE ci + j (4 x 16 B loads; from host memory on the proxy path)
      unsigned long long laddr = 0, raddr = 0;
      unsigned len = 0, imm = 0, dest = 0, dqp = 0, has_imm = 0;
      int npk = 0;
      bool bad = false;
      const unsigned idx = ci + (unsigned)lane * step;
      // a 128-byte WQE (v63): 8 loads; an inline write's payload (bytes 48 on) is copied into
      // the NIC's own memory once its WQE slot is known (below), as a device takes it at fetch
      uint4 raw[8];
      bool inl = false;
      if (lane < nw) {
        const lever_efa_nic_layout* lq = c.flay + q;
        const void* slotp = reinterpret_cast<const void*>(lever_efa_sq_slot_dev(lq, idx));
        const bool big = lq->sq_entry_size == LEVER_EFA_WQE_SIZE_128;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          raw[j] = (j < 4 || big) ? ld_vol_v4(reinterpret_cast<const uint4*>(slotp) + j) : make_uint4(0, 0, 0, 0);
        efa_io_tx_wqe wq;  // meta and remote_mem sit where they sit in a 128-byte WQE
        memcpy(&wq, raw, 64);
        inl = (wq.meta.ctrl1 & META_INLINE_MSG) != 0u;
        const unsigned n = lq->sq_num_entries;
        // the device's view: its AH and QP numbers back to a rank and a receive queue
        const int dr = emu_nic::ahn_rank(wq.meta.ah, w.num_ranks);
        const int gq = emu_nic::rx_of_qpn(wq.meta.dest_qp_num, w.num_ranks, w.n_rxcq);
        len = wq.data.rdma_req.remote_mem.length;
        dest = dr < 0 ? 0xffffu : (unsigned)dr;
        dqp = gq < 0 ? 0xffffu : (unsigned)(gq - (int)dest * w.n_rxcq);
        imm = wq.meta.immediate_data;
        has_imm = (wq.meta.ctrl1 & META_HAS_IMM) ? 1u : 0u;
        laddr = ((unsigned long long)wq.data.rdma_req.local_mem[0].buf_addr_hi << 32) |
                wq.data.rdma_req.local_mem[0].buf_addr_lo;
        raddr = ((unsigned long long)wq.data.rdma_req.remote_mem.buf_addr_hi << 32) |
                wq.data.rdma_req.remote_mem.buf_addr_lo;
        // as the v59 provider writes an RDMA write (v63: inline_msg where the QP takes inline
        // writes): these bits and no others
        const unsigned ctrl1_ok = META_META_DESC | META_HAS_IMM | META_OP_TYPE_MASK |
                                  (lq->inline_write_size != 0u ? META_INLINE_MSG : 0u);
        const unsigned ctrl2_ok = META_PHASE | META_FIRST | META_LAST | META_COMP_REQ;
        bad = !(wq.meta.ctrl1 & META_META_DESC) || (wq.meta.ctrl1 & META_OP_TYPE_MASK) != EFA_IO_RDMA_WRITE ||
              (wq.meta.ctrl1 & ~ctrl1_ok) != 0u || (wq.meta.ctrl2 & ~ctrl2_ok) != 0u ||
              (wq.meta.ctrl2 & META_PHASE) != lever_efa_sq_phase(idx, n) ||
              (wq.meta.ctrl2 & (META_FIRST | META_LAST | META_COMP_REQ)) != (META_FIRST | META_LAST | META_COMP_REQ) ||
              wq.meta.req_id != lever_efa_slot(idx, n) || wq.meta.length != (inl ? len : 1u) ||
              dr < 0 || gq < 0 || gq / w.n_rxcq != dr || dqp > 255u ||
              wq.meta.qkey != emu_nic::qkey(dr) ||
              (raw[0].w >> 16) != 0u || raw[1].y != 0u || raw[1].z != 0u || raw[1].w != 0u ||  // MBZ
              (!has_imm && imm != 0u) ||
              wq.data.rdma_req.remote_mem.rkey != emu_nic::rkey(dr) ||
              (!inl && (wq.data.rdma_req.local_mem[0].lkey != emu_nic::lkey(L.rank) ||
                        wq.data.rdma_req.local_mem[0].length != len)) ||
              (inl && len > lq->inline_write_size) || !wqe_tail_zero(raw, inl ? LEVER_EFA_INLINE_WRITE_OFFSET + len : 64u) ||
              len == 0;
        npk = bad ? 0 : (int)((len + fb.mtu - 1) / fb.mtu);
        if (npk > 31) bad = true;
        if (bad) raise_err(w, ERR_BAD_WQE, L.rank, q, idx, wq.meta.ctrl2, wq.meta.req_id);
      }
      if (__any_sync(0xffffffffu, bad)) return -1;
      // inclusive prefix of packets; take the WQEs that fit the free entries
      int incl = npk;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int avail = min(ldvi(&S.nfree), FETCH_MAXP);
      const int wavail = ldvi(&S.wfree);  // free WQE slots
      const unsigned fit = __ballot_sync(0xffffffffu, lane < nw && lane < wavail && incl <= avail);
      const int take = __popc(fit) ;  // a prefix: incl is monotone
      if (take == 0) return taken_total;
      const int P = __shfl_sync(0xffffffffu, incl, take - 1);
      // serialiser (in SQ order): NIC processing, message-rate gap, line rate
      {
        unsigned long long now = __shfl_sync(0xffffffffu, gtime(), 0);
        unsigned long long nf = S.nic_free, lw = S.last_wqe;
        // a NIC whose blocks split its QPs or its WQEs on one wire (not lanes): its state in
        // global memory, taken under a lock for this WQE batch (the other block's fetcher waits
        // its turn)
        unsigned long long* wire =
            c.L->nic_wire && fb.blocks_per_nic > 1 && !tab_shared(fb) && !wire_lanes(fb) ? c.L->nic_wire + 4 * c.pnic
                                                                                        : nullptr;
        if (wire) {
          bool ok = true;
          if (lane == 0) {
            const unsigned long long t_lock = gtime();
            unsigned* lock = reinterpret_cast<unsigned*>(wire + 2);
            while (atomicCAS(lock, 0u, 1u) != 0u) {
              if ((long long)(gtime() - t_lock) > w.timeout_ns) {
                raise_err(w, ERR_TIMEOUT_NIC, L.rank, c.nic, 0, 1, 2000 + c.pnic);
                ok = false;
                break;
              }
            }
            __threadfence();
            nf = vld64(wire);
            lw = vld64(wire + 1);
          }
          if (!__shfl_sync(0xffffffffu, (int)ok, 0)) return -1;
          nf = __shfl_sync(0xffffffffu, nf, 0);
          lw = __shfl_sync(0xffffffffu, lw, 0);
        }
        int m = 0;
        for (int j = 0; j < take; ++j) {
          const unsigned lj = __shfl_sync(0xffffffffu, len, j);
          const int pj = __shfl_sync(0xffffffffu, npk, j);
          unsigned long long ready = now + (unsigned long long)(fb.wqe_process_ns + fb.dma_read_ns);
          const unsigned long long gap = lw + (unsigned long long)(fb.min_wqe_gap_ns * lanes);
          if (gap > ready) ready = gap;
          lw = ready;
          for (int p = 0; p < pj; ++p) {
            const unsigned bytes = min((unsigned)fb.mtu, lj - (unsigned)p * fb.mtu);
            const unsigned long long start = nf > ready ? nf : ready;
            nf = start + (unsigned long long)(bytes * ns_per_byte);
            if (lane == 0) S.dep[m] = nf;
            ++m;
          }
        }
        if (lane == 0) { S.nic_free = nf; S.last_wqe = lw; }
        if (wire && lane == 0) {
          vst64(wire, nf);
          vst64(wire + 1, lw);
          __threadfence();
          atomicExch(reinterpret_cast<unsigned*>(wire + 2), 0u);
        }
      }
      // find P free entries (only the fetcher allocates; deliverers only free)
      {
        int found = 0, scanned = 0;
        const unsigned cur = S.cursor;
        for (; found < P && scanned < 2 * NP; scanned += 32) {
          const unsigned e = (cur + (unsigned)scanned + (unsigned)lane) % NP;
          const bool fr = vldu(&S.state[e]) == ES_FREE;
          const unsigned m = __ballot_sync(0xffffffffu, fr);
          const int r = found + __popc(m & ((1u << lane) - 1u));
          if (fr && r < P) S.eidx[r] = (int)e;
          found += __popc(m);
        }
        if (found < P) {
          if (lane == 0) raise_err(w, ERR_NIC_TABLE, L.rank, q, found, P, c.nic);
          return -1;
        }
        __syncwarp();
        if (lane == 0) S.cursor = (cur + (unsigned)scanned) % NP;
      }
      // and a WQE slot per WQE taken (only the fetcher allocates them too)
      {
        int found = 0, scanned = 0;
        const unsigned cur = S.wcursor;
        for (; found < take && scanned < 2 * NWQ; scanned += 32) {
          const unsigned e = (cur + (unsigned)scanned + (unsigned)lane) % NWQ;
          const bool fr = (vldu(&S.w_flags[e]) & WF_USED) == 0u;
          const unsigned m = __ballot_sync(0xffffffffu, fr);
          const int r = found + __popc(m & ((1u << lane) - 1u));
          if (fr && r < take) S.wsl[r] = (int)e;
          found += __popc(m);
        }
        if (found < take) {
          if (lane == 0) raise_err(w, ERR_NIC_TABLE, L.rank, q, found, take, 1000 + c.nic);
          return -1;
        }
        __syncwarp();
        if (lane == 0) S.wcursor = (cur + (unsigned)scanned) % NWQ;
      }
      __syncwarp();
      // per WQE (read by the deliverers' shared-memory atomics): packets to land, packets to be
      // ACKed, the receiver's landed bitmap, the latest ACK, the status
      if (lane < take) {
        const int ws = S.wsl[lane];
        if (inl) {  // the payload into the NIC's memory for this WQE slot (sent from there)
          uint4* st = reinterpret_cast<uint4*>(L.nic_inl + ((size_t)c.nic * NWQ + (size_t)ws) * 128u);
#pragma unroll
          for (int j = 3; j < 8; ++j) st[j] = raw[j];
          laddr = reinterpret_cast<unsigned long long>(st) + LEVER_EFA_INLINE_WRITE_OFFSET;
          __threadfence();
        }
        S.w_land[ws] = npk;
        S.w_ack[ws] = npk;
        S.w_bits[ws] = 0u;
        S.w_ackt[ws] = 0u;
        S.w_flags[ws] = WF_USED;
      }
      // fill the entries: packet m belongs to WQE j (first lane with incl > m)
      for (int mb = 0; mb < P; mb += 32) {
        const int m = mb + lane;
        int j = take - 1;
        for (int jj = take - 1; jj >= 0; --jj) {
          const int inc = __shfl_sync(0xffffffffu, incl, jj);
          if (m < inc) j = jj;
        }
        const int jm = j;
        const unsigned long long la = __shfl_sync(0xffffffffu, laddr, jm);
        const unsigned long long ra = __shfl_sync(0xffffffffu, raddr, jm);
        const unsigned ln = __shfl_sync(0xffffffffu, len, jm);
        const unsigned im = __shfl_sync(0xffffffffu, imm, jm);
        const unsigned de = __shfl_sync(0xffffffffu, dest, jm);
        const unsigned dq = __shfl_sync(0xffffffffu, dqp, jm);
        const unsigned hi = __shfl_sync(0xffffffffu, has_imm, jm);
        const int incj = __shfl_sync(0xffffffffu, incl, jm);
        const int npj = __shfl_sync(0xffffffffu, npk, jm);
        if (m < P) {
          const unsigned p = (unsigned)(m - (incj - npj));
          const unsigned wi = ci + (unsigned)jm * step;
          Rng r = pkt_rng(c, q, wi, p);
          // arrival of the first transmission; whether the wire drops it is drawn when it
          // is due (nic_warp), and a dropped packet is resent from its departure + RTO
          const unsigned long long land = S.dep[m] + (unsigned long long)flight_ns(fb, r);
          const int e = S.eidx[m];
          S.sent[e] = S.dep[m];
          S.tries[e] = 0;
          S.due[e] = land;
          S.src[e] = la + (unsigned long long)p * fb.mtu;
          S.dst[e] = ra + (unsigned long long)p * fb.mtu;
          S.len[e] = min((unsigned)fb.mtu, ln - p * fb.mtu);
          S.wi[e] = wi;
          S.ws[e] = (unsigned short)S.wsl[jm];
          S.imm[e] = im;
          S.meta[e] = EK_DATA | (hi << 2) | (p << 3) | ((unsigned)q << 8) | (de << 16) | (dq << 24);
        }
      }
      tab_fence(fb);
      __syncwarp();
      for (int m = lane; m < P; m += 32) vstu(&S.state[S.eidx[m]], ES_PENDING);
      if (lane == 0) {
        atomicSub(&S.nfree, P);
        atomicSub(&S.wfree, take);
        atomicAdd(&S.inflight, P);
        ci += (unsigned)take * step;
        if (split) *reinterpret_cast<volatile unsigned*>(&NQ->ci_sub[sub]) = ci - (unsigned)sub;
        else *reinterpret_cast<volatile unsigned*>(&NQ->ci) = ci;
        c.n_wqe += take;
      }
      ci = __shfl_sync(0xffffffffu, ci, 0);
      pending -= (unsigned)take;
      taken_total += take;
      __syncwarp();
    }
  }
  return taken_total;
}

__device__ __forceinline__ void copy_packet(const uint8_t* src, uint8_t* dst, unsigned n, int lane) {
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | n) & 15u) == 0u) {
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    const unsigned nv = n >> 4;
    unsigned i = (unsigned)lane;
    for (; i + 32u * 15u < nv; i += 32u * 16u) {  // 8 KiB in flight per warp
      uint4 v[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) v[j] = __ldcg(s4 + i + 32 * j);
#pragma unroll
      for (int j = 0; j < 16; ++j) __stcg(d4 + i + 32 * j, v[j]);
    }
    {
      uint4 v[16];
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if (i + 32u * j < nv) v[j] = __ldcg(s4 + i + 32 * j);
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if (i + 32u * j < nv) __stcg(d4 + i + 32 * j, v[j]);
    }
  } else if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | n) & 7u) == 0u) {
    const unsigned long long* s8 = reinterpret_cast<const unsigned long long*>(src);
    unsigned long long* d8 = reinterpret_cast<unsigned long long*>(dst);
    for (unsigned i = lane; i < (n >> 3); i += 32u) __stcg(d8 + i, __ldcg(s8 + i));
  } else {
    for (unsigned i = lane; i < n; i += 32u) dst[i] = __ldcg(src + i);
  }
}

// A delivering warp's staged copies (Fabric::copy_staged): the loop above keeps 8 KiB in
// flight a warp, one packet's worth (its registers are the limit: the kernel sits at 255), so a
// batch's copies queue one round trip after another (docs/testbed.md, Bigger delivery batches:
// 2.9 us for two packets). Staged, the lanes issue cp.async of every packet that fits in the
// warp's slice of dynamic shared memory (two full MTU packets) with no register held per load,
// wait for all of them at once, then store them from shared memory: one round trip of loads
// for the batch (STAGE_V, efa_emu.cuh: the 16-byte words of a warp's slice). Measured on H100s
// (docs/testbed.md, Staged copies): a batch of two 2.6-2.8 us against 2.9-3.0, one packet 1.8
// us either way: bytes in flight were not what held the copies.
extern __shared__ __align__(16) uint4 emu_stage[];

__device__ __forceinline__ void cp_async16(uint4* smem, const uint4* gmem) {
  const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
}

// Each packet staged for the lanes of `staged`, in lane order (the order they were staged in):
// f(its entry, its first 16-byte word in the stage, its bytes). The staged and the bulk
// flushes walk a round the same way and differ only in who stores each packet.
template <typename F>
__device__ __forceinline__ void each_staged(NicShared& S, unsigned staged, int mine, F&& f) {
  unsigned off = 0;
  while (staged) {
    const int sl = __ffs(staged) - 1;
    staged &= staged - 1;
    const int e = __shfl_sync(0xffffffffu, mine, sl);
    const unsigned n = vldu(&S.len[e]);
    f(e, off, n);
    off += n >> 4;
  }
}

// Store the packets staged for the lanes of `staged` (in lane order, as they were staged).
__device__ __forceinline__ void stage_flush(NicShared& S, uint4* stage, unsigned staged, int mine, int lane) {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncwarp();
  each_staged(S, staged, mine, [&](int e, unsigned off, unsigned n) {
    uint4* d4 = reinterpret_cast<uint4*>(vld64(&S.dst[e]));
    const unsigned nv = n >> 4;
#pragma unroll 2
    for (unsigned i = (unsigned)lane; i < nv; i += 32u) __stcg(d4 + i, stage[off + i]);
  });
  __syncwarp();
}

// A delivering warp's bulk copies (Fabric::copy_staged == 2, nic_copy = "bulk"): the copy
// engine (TMA) moves the packets, not the warp's load/store instructions. One lane hands it
// each packet of the batch that fits the warp's stage (global to shared memory, counted on the
// warp's mbarrier), waits for them, then hands it the stores (shared to global) and waits for
// their completion; the other lanes issue nothing. The staged and register copies keep the
// SM's load/store pipe busy with every 16 bytes, which a claim's shared-memory loads then queue
// behind (docs/testbed.md, The fence's strength, and more SMs a NIC).
__shared__ __align__(8) unsigned long long emu_mbar[MAXNW];
__shared__ unsigned emu_mbar_phase[MAXNW];

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// The warp's mbarrier, made once a launch (lane 0), before its first bulk copy.
__device__ __forceinline__ void bulk_init(int lane) {
  const int wv = threadIdx.x >> 5;
  if (lane == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&emu_mbar[wv])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    emu_mbar_phase[wv] = 0u;
  }
  __syncwarp();
}

// Lane 0: the loads of a round are issued (each with its bytes expected on the mbarrier); wait
// for all of them, issue the stores of the packets in `staged` (lane order, as loaded), wait
// for the stores to complete, and order them (async proxy) before the generic fence after.
__device__ __forceinline__ void bulk_flush(NicShared& S, uint4* stage, unsigned staged, int mine, int lane) {
  const int wv = threadIdx.x >> 5;
  const unsigned mb = smem_u32(&emu_mbar[wv]);
  if (lane == 0) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(mb) : "memory");
    const unsigned ph = emu_mbar_phase[wv];
    asm volatile(
        "{\n .reg .pred p;\n"
        "BULK_WAIT%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra BULK_WAIT%=;\n}\n" ::"r"(mb), "r"(ph) : "memory");
    emu_mbar_phase[wv] = ph ^ 1u;
  }
  __syncwarp();
  each_staged(S, staged, mine, [&](int e, unsigned off, unsigned n) {
    if (lane == 0)
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(vld64(&S.dst[e])),
                   "r"(smem_u32(stage + off)), "r"(n) : "memory");
  });
  if (lane == 0) {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
  }
  __syncwarp();
}

// Copy the packets of the lanes in `lanes` (each lane's claimed entry `mine`) through the warp's
// stage of `sv` 16-byte words (stage_words), by the warp's own loads (cp.async, every lane) or by
// the copy engine (`bulk`: TMA, lane 0, each packet's bytes expected on the warp's mbarrier); a
// round ends when the stage is full, and a packet not 16-byte aligned or larger than the stage
// takes copy_packet.
__device__ __forceinline__ void copy_staged(NicShared& S, unsigned lanes, int mine, int lane, bool bulk,
                                            unsigned sv) {
  uint4* stage = emu_stage + (size_t)(threadIdx.x >> 5) * sv;
  const unsigned mb = smem_u32(&emu_mbar[threadIdx.x >> 5]);
  unsigned staged = 0u, used = 0u;
  auto flush = [&] {
    if (bulk) bulk_flush(S, stage, staged, mine, lane);
    else stage_flush(S, stage, staged, mine, lane);
  };
  while (lanes) {
    const int sl = __ffs(lanes) - 1;
    lanes &= lanes - 1;
    const int e = __shfl_sync(0xffffffffu, mine, sl);
    const uint8_t* src = reinterpret_cast<const uint8_t*>(vld64(&S.src[e]));
    uint8_t* dst = reinterpret_cast<uint8_t*>(vld64(&S.dst[e]));
    const unsigned n = vldu(&S.len[e]);
    if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | n) & 15u) != 0u ||
        (n >> 4) > sv) {
      copy_packet(src, dst, n, lane);
      continue;
    }
    const unsigned nv = n >> 4;
    if (used + nv > sv) {
      flush();
      staged = 0u;
      used = 0u;
    }
    if (bulk) {
      if (lane == 0) {
        asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(mb), "r"(n) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         smem_u32(stage + used)), "l"(src), "r"(n), "r"(mb) : "memory");
      }
    } else {
      const uint4* s4 = reinterpret_cast<const uint4*>(src);
#pragma unroll 2
      for (unsigned i = (unsigned)lane; i < nv; i += 32u) cp_async16(stage + used + i, s4 + i);
    }
    staged |= 1u << sl;
    used += nv;
  }
  if (staged) flush();
}

__device__ __forceinline__ void entry_free(const Fabric& fb, NicShared& S, int e) {
  vst64(&S.due[e], ~0ull);
  tab_fence(fb);
  vstu(&S.state[e], ES_FREE);
  atomicAdd(&S.nfree, 1);
  atomicSub(&S.inflight, 1);
}
__device__ __forceinline__ void entry_requeue(const Fabric& fb, NicShared& S, int e, unsigned kind,
                                              unsigned long long due) {
  S.meta[e] = (S.meta[e] & ~3u) | kind;
  vst64(&S.due[e], due);
  tab_fence(fb);
  vstu(&S.state[e], ES_PENDING);
}

// The NIC's host-facing engine (warp 0 of a NIC block whose queues sit in host memory):
// the SQ and doorbell of a host-memory QP are write-only for the issuer (a BAR on EFA),
// so the NIC pays for seeing them: one PCIe read of every doorbell it serves, then a
// copy of the new WQEs into its device mirror and the mirror's doorbell, which the
// fetcher reads as it reads a device-memory SQ. my_mdb: the lane's mirrored producer value.
// Returns whether any doorbell had moved.
__device__ bool nic_mirror(const World& w, NicCtx& c, unsigned& my_mdb) {
  const int lane = lane_id();
  const int my_q = c.pnic + lane * c.pnics;  // every QP of the NIC, whichever block fetches it
  const unsigned long long t_pass = gtime();
  unsigned my_hdb = my_mdb;
  if (my_q < c.nq) my_hdb = ld_acq32(reinterpret_cast<const unsigned*>(c.lay[my_q].sq_doorbell_dev));
  unsigned todo = __ballot_sync(0xffffffffu, my_q < c.nq && ((my_hdb - my_mdb) & 0xffffu) != 0u);
  const bool moved = todo != 0u;
  const unsigned long long t_read = gtime();
  if (lane == 0) {
    ++c.n_hpass;
    c.n_hread_ns += t_read - t_pass;
    c.n_hcopy += (unsigned long long)__popc(todo);
  }
  while (todo) {
    const int jq = __ffs(todo) - 1;
    todo &= todo - 1;
    const int q = c.pnic + jq * c.pnics;
    const unsigned from = __shfl_sync(0xffffffffu, my_mdb, jq);
    const unsigned to = __shfl_sync(0xffffffffu, my_hdb, jq);
    const unsigned n = (to - from) & 0xffffu;
    const lever_efa_nic_layout* hl = c.lay + q;
    const lever_efa_nic_layout* ml = c.flay + q;
    for (unsigned k = (unsigned)lane; k < n; k += 32u) {
      const unsigned idx = from + k;
      const uint4* hs = reinterpret_cast<const uint4*>(lever_efa_sq_slot_dev(hl, idx));
      uint4* ms = reinterpret_cast<uint4*>(lever_efa_sq_slot_dev(ml, idx));
      const int nv = (int)(hl->sq_entry_size >> 4);  // 4, or 8 for a 128-byte WQE
      for (int j0 = 0; j0 < nv; j0 += 4) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = ld_vol_v4(hs + j0 + j);
#pragma unroll
        for (int j = 0; j < 4; ++j) st_vol_v4(ms + j0 + j, v[j]);
      }
    }
    __syncwarp();
    __threadfence();  // mirrored WQEs before the mirror's doorbell
    if (lane == 0) {
      st_release_gpu32(reinterpret_cast<unsigned*>(ml->sq_doorbell_dev), to);
      c.n_mirror += n;
    }
    if (lane == jq) my_mdb = to;
  }
  if (lane == 0 && moved) c.n_hcopy_ns += gtime() - t_read;
  return moved;
}

// Write the send CQE of WQE wi on QP q (status 0, or the error when its retries ran out).
__device__ void write_send_cqe(NicCtx& c, int q, unsigned wi, bool err) {
  NicQp* NQ = c.L->nicqp + q;
  const unsigned pi = atomicAdd(&NQ->cq_pi, 1u);
  const lever_efa_nic_layout* lq = c.lay + q;
  void* cqe = reinterpret_cast<void*>(lever_efa_cq_entry_dev(lq, pi));
  const unsigned phase = lever_efa_cq_phase(pi, lq->cq_num_entries);
  const unsigned flags = phase | ((unsigned)EFA_IO_SEND_QUEUE << CDESC_Q_TYPE_SHIFT) |
                         ((unsigned)EFA_IO_RDMA_WRITE << CDESC_OP_TYPE_SHIFT);
  const unsigned status = err ? (unsigned)CQE_STATUS_UNRESP_REMOTE : 0u;
  uint4 v;  // v59 efa_io_tx_cdesc: req_id (the WQE's), status, flags, qp_num, MBZ
  v.x = lever_efa_slot(wi, lq->sq_num_entries) | (status << 16) | (flags << 24);
  v.y = lq->qp_num & 0xffffu;
  v.z = 0;
  v.w = 0;
  st_vol_v4(cqe, v);
  // a completion counter attached to the QP (EFA after rdma-core v64; here in GPU memory, as a
  // dma-buf counter is) counts the write too: its completion count, or its error count
  if (lq->send_cntr_dev != 0u) {
    __threadfence();  // the CQE (and the delivery before it) before the count that stands for it
    atomicAdd(reinterpret_cast<unsigned long long*>(err ? lq->send_err_cntr_dev : lq->send_cntr_dev), 1ull);
  }
  ++c.n_cqe;
  if (err) ++c.n_err;
}

// One more packet of WQE (q, wi) is done at the sender: its ACK arrives at ack_t (or it
// was given up: err). The last one schedules the send CQE after the latest ACK; any other
// frees its entry.
__device__ void nic_account(const World& w, NicShared& S, int e, unsigned long long ack_t, bool err) {
  const int ws = S.ws[e];
  if (err) atomicOr(&S.w_flags[ws], WF_ERR);
  atomicMax(&S.w_ackt[ws], (unsigned)(ack_t - S.t0));
  tab_fence(w.fab);  // this packet's ACK time before its count: the last one reads the max
  if (atomicSub(&S.w_ack[ws], 1) == 1) {
    const unsigned long long last = S.t0 + atomicAdd(&S.w_ackt[ws], 0u);
    entry_requeue(w.fab, S, e, EK_SEND_CQE, last + (unsigned long long)w.fab.completion_ns);
  } else {
    entry_free(w.fab, S, e);
  }
}

// The receiver has the packet (or discarded its duplicate) at time t: it sends an ACK. The
// wire may drop the ACK too; the sender then resends the packet after its RTO (a duplicate
// at the receiver), until its retries run out.
__device__ void nic_ack(const World& w, NicCtx& c, NicShared& S, int e, int q, unsigned wi,
                        unsigned p, unsigned long long t) {
  const Fabric& fb = w.fab;
  const unsigned tries = S.tries[e];
  Rng r = event_rng(c, q, wi, p, 2u, tries);
  const bool lost = fb.loss_prob > 0.f && r.uni() < fb.loss_prob;
  if (lost) {
    ++c.n_drop;
    if ((int)tries >= fb.max_retries) {  // never ACKed: the WQE completes in error
      nic_account(w, S, e, t, true);
      return;
    }
    S.tries[e] = (unsigned char)(tries + 1u);
    ++c.n_retx;
    const unsigned long long resend = S.sent[e] + (unsigned long long)fb.rto_ns;
    S.sent[e] = resend;
    entry_requeue(fb, S, e, EK_DATA, resend + (unsigned long long)flight_ns(fb, r));
    return;
  }
  nic_account(w, S, e, t + (unsigned long long)flight_ns(fb, r), false);
}

// 2. A delivering warp's pass: claim up to deliver_batch due entries, deliver them (copies,
// one fence, bookkeeping). With a host engine, the CQEs of a host-memory CQ (send, receive)
// are its alone. Returns whether it delivered anything.
__device__ bool nic_deliver(const World& w, NicCtx& c, NicShared& S, bool host_engine, bool is_host,
                            int nclaim, unsigned long long lead, bool one_gpu, unsigned& rot) {
  const Fabric& fb = w.fab;
  const int lane = lane_id();
  // claim: data packets deliver_lead_ns early (their copy and fence take about that long),
  // completions when due
  const unsigned long long now = gtime();
  int mine = -1;
  rot += 32u;
  // whether entry e is one this warp may claim now (pending, its kind this warp's, due)
  auto claimable = [&](unsigned st, unsigned meta, unsigned long long due) {
    const unsigned kind = meta & 3u;
    const bool host_kind = host_engine && ((c.cq_host && kind == EK_SEND_CQE) ||
                                           (c.rx_host && kind == EK_RECV_CQE));
    const bool for_me = is_host ? host_kind : !host_kind;
    return st == ES_PENDING && for_me && (kind == EK_DATA ? due <= now + lead : due <= now);
  };
  // the k-th of the lane's NP/32 entries this pass: every 32nd from the rotation (volatile
  // loads), or, with wide loads, the k-th of a run of NP/32 (the runs rotate with the pass)
  auto ent_strided = [&](int k) { return (int)((rot + (unsigned)(k * 32 + lane)) % NP); };
  auto ent = [&](int k) {
    return fb.claim_loads ? (int)((((rot >> 5) + (unsigned)lane) & 31u) * (NP / 32) + (unsigned)k)
                          : ent_strided(k);
  };
  unsigned long long t_loaded = now;  // the claim's loads done (mask, edf; the walk: none apart)
  if (fb.claim_mask) {
    // the lane's 16 entries loaded at once (independent loads, one latency), a due mask,
    // then claims from it until the warp holds nclaim or no lane has a candidate left. A
    // claimed entry is checked again after its CAS: another warp may have delivered and
    // requeued it (a later due) between the loads and the claim.
    unsigned cand = 0u;
    // with wide loads, the lane's earliest candidate found in the test (edf then needs no load
    // for its first pick, where it read each candidate's due again, 1.2 us a claim at e46346f)
    unsigned long long bd_w = ~0ull;
    int bk_w = -1;
    if (fb.claim_loads) {
      // wide loads (nic_claim_loads = "wide"): the lane's 16 entries are one run of the table
      // (ent below), read as 16-byte volatile vectors, 4 of states, 4 of metas, 8 of dues, all
      // issued before any is tested. Volatile keeps each pass's values fresh; the test has no
      // branch (claimable's short-circuits make one an entry, and the compiler then waits on an
      // entry's loads before issuing the next entry's: 48 loads in series, 1.1 us measured).
      const int base = ent(0);
      uint4 st4[NP / 128], mt4[NP / 128];
      ulonglong2 du2[NP / 64];
#pragma unroll
      for (int j = 0; j < NP / 128; ++j) {
        st4[j] = vld_v4(&S.state[base + 4 * j]);
        mt4[j] = vld_v4(&S.meta[base + 4 * j]);
      }
#pragma unroll
      for (int j = 0; j < NP / 64; ++j) du2[j] = vld_v2_64(&S.due[base + 2 * j]);
      const bool sq_h = host_engine && c.cq_host, rx_h = host_engine && c.rx_host;
      const unsigned long long due_data = now + lead;
#pragma unroll
      for (int k = 0; k < NP / 32; ++k) {
        const unsigned st = word_of(st4[k / 4], k & 3);
        const unsigned kind = word_of(mt4[k / 4], k & 3) & 3u;
        const unsigned long long du = (k & 1) ? du2[k / 2].y : du2[k / 2].x;
        const bool host_kind = (sq_h & (kind == EK_SEND_CQE)) | (rx_h & (kind == EK_RECV_CQE));
        const bool ok = (st == ES_PENDING) & (host_kind == is_host) & (du <= (kind == EK_DATA ? due_data : now));
        cand |= (unsigned)ok << k;
        const bool better = ok & (du < bd_w);
        bd_w = better ? du : bd_w;
        bk_w = better ? k : bk_w;
      }
    } else {
#pragma unroll
      for (int k = 0; k < NP / 32; ++k) {
        const int e = ent_strided(k);
        if (claimable(vldu(&S.state[e]), vldu(&S.meta[e]), vld64(&S.due[e]))) cand |= 1u << k;
      }
    }
    if (fb.part_timers) t_loaded = gtime();
    if (fb.claim_mask == 2) {
      // earliest due first (nic_claim = "edf"): each lane's earliest candidate, then the lanes
      // holding none claim in the order of those dues, the warp's earliest first, so a packet
      // due now is not passed over for one due a lead later. A lane whose claim failed takes
      // its next earliest.
      auto earliest = [&](unsigned m, int& bk) {
        unsigned long long bd = ~0ull;
        bk = -1;
        while (m) {
          const int k = __ffs(m) - 1;
          m &= m - 1u;
          const unsigned long long d = vld64(&S.due[ent(k)]);
          if (d < bd) {
            bd = d;
            bk = k;
          }
        }
        return bd;
      };
      int bk = bk_w;
      unsigned long long bd = fb.claim_loads ? bd_w : earliest(cand, bk);
      while (true) {
        if (__popc(__ballot_sync(0xffffffffu, mine >= 0)) >= nclaim) break;
        const unsigned long long v = (mine < 0 && bk >= 0) ? bd : ~0ull;
        unsigned long long mn = v;
#pragma unroll
        for (int o = 16; o; o >>= 1) {
          const unsigned long long x = __shfl_xor_sync(0xffffffffu, mn, o);
          mn = x < mn ? x : mn;
        }
        if (mn == ~0ull) break;
        if (lane == __ffs(__ballot_sync(0xffffffffu, v == mn)) - 1) {
          const int e = ent(bk);
          cand &= ~(1u << bk);
          if (atomicCAS(&S.state[e], ES_PENDING, ES_CLAIMED) == ES_PENDING) {
            tab_fence(fb);
            if (claimable(ES_PENDING, vldu(&S.meta[e]), vld64(&S.due[e]))) mine = e;
            else vstu(&S.state[e], ES_PENDING);
          }
          if (mine < 0) bd = earliest(cand, bk);
        }
      }
    }
    while (fb.claim_mask != 2) {
      const unsigned held = __ballot_sync(0xffffffffu, mine >= 0);
      const unsigned want = __ballot_sync(0xffffffffu, mine < 0 && cand != 0u);
      const int room = nclaim - __popc(held);
      if (room <= 0 || want == 0u) break;
      if (mine < 0 && cand != 0u && __popc(want & ((1u << lane) - 1u)) < room) {
        const int k = __ffs(cand) - 1;
        cand &= cand - 1u;
        const int e = ent(k);
        if (atomicCAS(&S.state[e], ES_PENDING, ES_CLAIMED) == ES_PENDING) {
          tab_fence(fb);
          if (claimable(ES_PENDING, vldu(&S.meta[e]), vld64(&S.due[e]))) mine = e;
          else vstu(&S.state[e], ES_PENDING);
        }
      }
    }
  } else {
    for (int k = 0; k < NP / 32; ++k) {
      const int e = ent_strided(k);
      if (mine < 0 && vldu(&S.state[e]) == ES_PENDING) {
        const unsigned meta = vldu(&S.meta[e]);
        if (claimable(ES_PENDING, meta, vld64(&S.due[e])) &&
            atomicCAS(&S.state[e], ES_PENDING, ES_CLAIMED) == ES_PENDING)
          mine = e;
      }
      if (__popc(__ballot_sync(0xffffffffu, mine >= 0)) >= nclaim) break;
    }
  }
  unsigned got = __ballot_sync(0xffffffffu, mine >= 0);
  // keep NCLAIM, release the rest
  {
    const int rank_in = __popc(got & ((1u << lane) - 1u));
    if (mine >= 0 && rank_in >= nclaim) {
      vstu(&S.state[mine], ES_PENDING);
      mine = -1;
    }
    got = __ballot_sync(0xffffffffu, mine >= 0);
  }
  if (got) {
    // the parts' timestamps (Fabric::part_timers; off: not read, the parts' counters stay 0)
    const bool parts = fb.part_timers != 0;
    const unsigned long long t_claimed = parts ? gtime() : 0ull;
    tab_fence(fb);
    // the wire: a data transmission is dropped (drawn per transmission), or reaches the
    // receiver, which discards a duplicate (its landed bitmap has the packet) and copies
    // a new packet
    int fate = 0;  // 0 not data, 1 dropped, 2 duplicate, 3 copy
    if (mine >= 0) {
      const unsigned meta = vldu(&S.meta[mine]);
      if ((meta & 3u) == EK_DATA) {
        const int q = (int)((meta >> 8) & 0xffu);
        const unsigned p = (meta >> 3) & 31u, wi = vldu(&S.wi[mine]);
        Rng r = event_rng(c, q, wi, p, 1u, (unsigned)S.tries[mine]);
        if (fb.loss_prob > 0.f && r.uni() < fb.loss_prob) {
          fate = 1;
        } else {
          const unsigned old = atomicOr(&S.w_bits[S.ws[mine]], 1u << p);
          fate = (old >> p) & 1u ? 2 : 3;
        }
      }
    }
    unsigned g2 = __ballot_sync(0xffffffffu, fate == 3);  // copies start <= deliver_lead_ns early
    if (fb.copy_staged) {
      copy_staged(S, g2, mine, lane, fb.copy_staged == 2, c.stage_v);
      g2 = 0u;
    }
    while (g2) {
      const int src_lane = __ffs(g2) - 1;
      g2 &= g2 - 1;
      const int e = __shfl_sync(0xffffffffu, mine, src_lane);
      copy_packet(reinterpret_cast<const uint8_t*>(vld64(&S.src[e])),
                  reinterpret_cast<uint8_t*>(vld64(&S.dst[e])), vldu(&S.len[e]), lane);
    }
    __syncwarp();
    const unsigned long long t_copied = parts ? gtime() : 0ull;
    // one fence: the batch's packets are visible before any completion that follows. The
    // completions are stores after it, so a release fence orders them (Fabric::fence_release);
    // fence.sc also orders later loads, which nothing here needs
    if (__any_sync(0xffffffffu, fate == 3)) {
      if (fb.fence_release) {
        if (one_gpu) asm volatile("fence.acq_rel.gpu;" ::: "memory");
        else asm volatile("fence.acq_rel.sys;" ::: "memory");
      } else if (one_gpu) {
        __threadfence();
      } else {
        __threadfence_system();
      }
    }
    const unsigned long long t_fenced = parts ? gtime() : 0ull;
    // bookkeeping: each lane its own entry (shared-memory state of its WQE)
    if (mine >= 0) {
      const int e = mine;
      const unsigned meta = vldu(&S.meta[e]);
      const unsigned kind = meta & 3u;
      const int q = (int)((meta >> 8) & 0xffu);
      const unsigned wi = vldu(&S.wi[e]);
      const unsigned p = (meta >> 3) & 31u;
      const int ws = S.ws[e];
      const unsigned long long t = gtime();
      if (kind == EK_DATA && fate == 1) {  // dropped on the wire
        ++c.n_drop;
        const unsigned tries = S.tries[e];
        if ((int)tries >= fb.max_retries) {
          nic_account(w, S, e, t, true);  // gave up: an error CQE, the data never landed
        } else {
          S.tries[e] = (unsigned char)(tries + 1u);
          ++c.n_retx;
          Rng r = event_rng(c, q, wi, p, 3u, tries + 1u);
          const unsigned long long resend = S.sent[e] + (unsigned long long)fb.rto_ns;
          S.sent[e] = resend;
          entry_requeue(fb, S, e, EK_DATA, (resend > t ? resend : t) + (unsigned long long)flight_ns(fb, r));
        }
      } else if (kind == EK_DATA && fate == 2) {  // a duplicate: discarded, ACKed again
        ++c.n_dup;
        const unsigned long long due0 = vld64(&S.due[e]);
        nic_ack(w, c, S, e, q, wi, p, t > due0 ? t : due0);
      } else if (kind == EK_DATA) {
        ++c.n_pkt;
        const unsigned long long due0 = vld64(&S.due[e]);
        // the packet arrived on the wire at its due time: a copy that made it visible earlier
        // (deliver_lead_ns) does not make its ACK or receive CQE earlier than the schedule
        const unsigned long long t_land = t > due0 ? t : due0;
        if (t > due0) c.n_late += t - due0;
        else c.n_early += due0 - t;
        // what the lateness is made of: the claim came this long after the packet could be
        // claimed (due - lead; the warps were busy), then the batch took t - now
        const unsigned long long ready = due0 > lead ? due0 - lead : 0ull;
        if (now > ready) c.n_claim_lag += now - ready;
        c.n_deliver += t - now;
        if (parts) {
          c.n_claim_load += t_loaded - now;
          c.n_scan += t_claimed - now;
          c.n_copy += t_copied - t_claimed;
          c.n_fence += t_fenced - t_copied;
        }
        const unsigned seqv = wi * 32u + p;
        const unsigned prev = atomicMax(&S.q_last[q], seqv);
        if (prev > seqv) ++c.n_reord;
        const int rem = atomicSub(&S.w_land[ws], 1);
        if (rem == 1 && (meta & 4u)) {  // write with immediate: receive completion at the target
          vst64(&S.src[e], t_land);
          entry_requeue(fb, S, e, EK_RECV_CQE, t_land + (unsigned long long)fb.recv_completion_ns);
        } else {
          nic_ack(w, c, S, e, q, wi, p, t_land);
        }
      } else if (kind == EK_RECV_CQE) {
        const int dest = (int)((meta >> 16) & 0xffu);
        const int dqp = (int)(meta >> 24);
        const RankPeer& P = w.peers[dest];
        // the write's data (copied and fenced by the warp that landed it) before its CQE
        if (one_gpu) __threadfence();
        else __threadfence_system();
        const unsigned slot = atomicAdd_system(P.rx_tail + dqp, 1u);
        const lever_efa_nic_layout* rq = P.rx + dqp;
        void* cqe = reinterpret_cast<void*>(lever_efa_cq_entry_dev(rq, slot));
        const unsigned phase = lever_efa_cq_phase(slot, rq->cq_num_entries);
        // an unsolicited RDMA-write receive (no posted receive), as v59 reports it
        const unsigned flags = phase | ((unsigned)EFA_IO_RECV_QUEUE << CDESC_Q_TYPE_SHIFT) | CDESC_HAS_IMM |
                               ((unsigned)EFA_IO_RDMA_WRITE << CDESC_OP_TYPE_SHIFT) | CDESC_UNSOLICITED;
        uint4 v;
        v.x = 0u | (flags << 24);  // req_id 0, status 0
        // qp_num: the receiving QP; length: bytes of the packet that completed the write
        v.y = (rq->qp_num & 0xffffu) | ((vldu(&S.len[e]) & 0xffffu) << 16);
        v.z = 0xffffu | ((c.lay[q].qp_num & 0xffffu) << 16);  // ah unknown (0xffff), src_qp_num
        v.w = vldu(&S.imm[e]);                                // the immediate
        st_vol_v4(cqe, v);
        ++c.n_rx;
        nic_ack(w, c, S, e, q, wi, p, vld64(&S.src[e]));  // the last packet's ACK
      } else {  // send completion (out of order across WQEs, like EFA)
        __threadfence();
        write_send_cqe(c, q, wi, (vldu(&S.w_flags[ws]) & WF_ERR) != 0u);
        vstu(&S.w_flags[ws], 0u);  // the WQE's slot is free again
        tab_fence(fb);
        atomicAdd(&S.wfree, 1);
        entry_free(fb, S, e);
      }
    }
    __syncwarp();
    if (is_host && lane == 0) c.n_hcqe_ns += gtime() - now;
    return true;
  }
  if (is_host && lane == 0) c.n_hidle_ns += gtime() - now;
  return false;
}

__device__ void nic_warp(const World& w, const EpFlags& f, int lr, int nic, int wib, NicShared& S,
                         unsigned total_ep_blocks, unsigned stage_v) {
  const RankLocal& L = w.local[lr];
  const Fabric& fb = w.fab;
  const int lane = lane_id();
  NicCtx c;
  c.L = &L;
  c.nic = nic;
  // QPs split between a NIC's blocks: each block serves the QPs of its own index (stride
  // nics x blocks); a shared table (or one block a NIC): the NIC's QPs, stride nics
  c.nics = nic_units(fb);
  c.pnic = nic % fb.nics_per_rank;
  c.pnics = fb.nics_per_rank;
  const bool faces_host = nic < fb.nics_per_rank;  // sub-block 0 of its NIC mirrors the host SQs
  c.nq = f.num_qps < NQ_MAX ? f.num_qps : NQ_MAX;
  c.proxy = f.proxy != 0;
  c.stage_v = stage_v;
  c.lay = c.proxy ? L.pnic : L.nic;
  c.flay = c.proxy ? L.fpnic : L.fnic;
  c.sq_host = c.lay[0].sq_buffer_mem != LEVER_EFA_MEM_GPU;
  c.cq_host = c.lay[0].cq_buffer_mem != LEVER_EFA_MEM_GPU;
  c.rx_host = L.rx[0].cq_buffer_mem != LEVER_EFA_MEM_GPU;  // every rank's receive CQs sit alike
  c.seed = mix64(fb.seed ^ ((unsigned long long)nic << 36));
  c.n_pkt = c.n_retx = c.n_cqe = c.n_rx = c.n_reord = c.n_wqe = c.n_late = 0;
  c.n_drop = c.n_dup = c.n_err = c.n_early = c.n_mirror = c.n_claim_lag = c.n_deliver = 0;
  c.n_scan = c.n_copy = c.n_fence = c.n_claim_load = 0;
  c.n_hpass = c.n_hcopy = c.n_hread_ns = c.n_hcopy_ns = c.n_hcqe_ns = c.n_hidle_ns = 0;
  // warp 0 faces the host when a queue is there: it mirrors host SQs and writes host CQEs
  // (send and receive), so no data warp waits on PCIe (its fences would wait for posted
  // host writes)
  const bool host_engine = (c.sq_host || c.cq_host || c.rx_host) && w.nic_warps > 1;
  const bool is_host = host_engine && wib == 0;
  // one warp only fetches (the next after the host engine), where there are warps enough
  // for a deliverer besides; else every deliverer may fetch between its batches
  const bool dedicated = fb.dedicated_fetcher != 0 && w.nic_warps >= (host_engine ? 3 : 2);
  const bool is_fetcher = dedicated && wib == (host_engine ? 1 : 0);
  unsigned my_mdb = 0;
  if (is_host && faces_host && c.sq_host && c.pnic + lane * c.pnics < c.nq)
    my_mdb = ld_acq_gpu32(reinterpret_cast<const unsigned*>(c.flay[c.pnic + lane * c.pnics].sq_doorbell_dev));
  const unsigned long long lead = (unsigned long long)fb.deliver_lead_ns;
  const int nclaim = fb.deliver_batch < 1 ? 1 : (fb.deliver_batch > 32 ? 32 : fb.deliver_batch);
  // the batch's copies visible before any completion that follows: every observer is a
  // thread of this GPU when the world has one GPU (gpu scope), else peers too (system)
  const bool one_gpu = w.num_gpus == 1;
  const unsigned long long t_start = gtime();
  if (fb.copy_staged == 2) bulk_init(lane);
  unsigned rot = (unsigned)wib * 97u;
  while (true) {
    // 0. the host-facing engine: mirror host SQs (without one, warp 0 does it between batches);
    //    a NIC's other blocks only write its host CQEs with their warp 0
    const bool mirrored = c.sq_host && faces_host && (is_host || (!host_engine && wib == 0)) &&
                          nic_mirror(w, c, my_mdb);
    // 1. fetch: the dedicated fetcher, or one warp at a time by try-lock (never the host engine)
    bool fetcher = is_fetcher;
    if (!dedicated) {
      if (lane == 0 && !is_host) fetcher = atomicCAS(&S.fetch_lock, 0u, 1u) == 0u;
      fetcher = __shfl_sync(0xffffffffu, fetcher, 0);
    }
    int fetched = 0;
    if (fetcher) {
      fetched = nic_fetch(w, c, S);
      __syncwarp();
      if (!dedicated && lane == 0) {
        tab_fence(fb);
        atomicExch(&S.fetch_lock, 0u);
      }
      if (fetched < 0) break;
    }
    // 2. deliver (every warp but the dedicated fetcher)
    if (!is_fetcher && nic_deliver(w, c, S, host_engine, is_host, nclaim, lead, one_gpu, rot)) continue;
    if (fetched > 0) continue;
    // 3. idle: exit when every EP block on this GPU is done and nothing is in flight (one
    //    decision for the whole warp)
    bool idle = false, stop = false;
    if (lane == 0) {
      idle = ld_acq32(w.ep_done) >= total_ep_blocks && ldvi(&S.inflight) == 0;
      stop = aborted(w);
      if (!idle && !stop && (long long)(gtime() - t_start) > 2 * w.timeout_ns) {
        raise_err(w, ERR_TIMEOUT_NIC, L.rank, nic, ldvi(&S.inflight), 0, wib);
        stop = true;
      }
    }
    if (__shfl_sync(0xffffffffu, (int)(idle || stop), 0)) break;
    // the host engine found no doorbell moved and nothing to write: it pauses before its next
    // PCIe reads (mirror_poll_gap_ns), sparing the issuers' fences the wait for them
    if (is_host && faces_host && c.sq_host && !mirrored && fb.mirror_poll_gap_ns > 0.f)
      __nanosleep((unsigned)fb.mirror_poll_gap_ns);
  }
  // per-lane counters (each lane handled its own entries): warp sums
  unsigned long long* cs[23] = {&c.n_pkt, &c.n_retx, &c.n_cqe, &c.n_rx, &c.n_reord, &c.n_late,
                                &c.n_drop, &c.n_dup, &c.n_err, &c.n_early, &c.n_mirror,
                                &c.n_claim_lag, &c.n_deliver, &c.n_scan, &c.n_copy, &c.n_fence,
                                &c.n_hpass, &c.n_hcopy, &c.n_hread_ns, &c.n_hcopy_ns, &c.n_hcqe_ns,
                                &c.n_hidle_ns, &c.n_claim_load};
  const int st_idx[23] = {ST_PACKETS, ST_RETRANSMITS, ST_CQES, ST_RX_CQES, ST_REORDERED, ST_NIC_LATE_NS,
                          ST_DROPS, ST_DUPS, ST_ERR_CQES, ST_NIC_EARLY_NS, ST_MIRRORED,
                          ST_NIC_CLAIM_LAG_NS, ST_NIC_DELIVER_NS, ST_NIC_SCAN_NS, ST_NIC_COPY_NS,
                          ST_NIC_FENCE_NS, ST_HOST_PASSES, ST_HOST_QP_COPIES, ST_HOST_READ_NS,
                          ST_HOST_COPY_NS, ST_HOST_CQE_NS, ST_HOST_IDLE_NS, ST_NIC_CLAIM_LOAD_NS};
#pragma unroll
  for (int i = 0; i < 23; ++i) {
    unsigned long long v = *cs[i];
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && v) atomicAdd(&w.stats[st_idx[i]], v);
  }
}

// The end of an EP block of a launch (V1's and V2's): its warps' stores made visible system
// wide, then the block counted done (the NIC blocks stop once every EP block is).
__device__ __forceinline__ void ep_block_done(const World& w) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    atomicAdd(w.ep_done, 1u);
  }
}

__device__ __forceinline__ void nic_tables_reset(NicShared& s_nic) {
  for (int i = threadIdx.x; i < NP; i += blockDim.x) {
    s_nic.state[i] = ES_FREE;
    s_nic.due[i] = ~0ull;
  }
  for (int i = threadIdx.x; i < NWQ; i += blockDim.x) s_nic.w_flags[i] = 0u;
  for (int i = threadIdx.x; i < NQ_MAX; i += blockDim.x) s_nic.q_last[i] = 0u;
  if (threadIdx.x == 0) {
    s_nic.nic_free = 0;
    s_nic.last_wqe = 0;
    s_nic.t0 = gtime();  // the WQE table's ACK times count from here
    s_nic.nfree = NP;
    s_nic.wfree = NWQ;
    s_nic.inflight = 0;
    s_nic.fetch_lock = 0;
    s_nic.cursor = 0;
    s_nic.wcursor = 0;
  }
}

// A NIC whose tables a cluster of blocks shares (Fabric::share_table): the cluster's first
// block keeps the tables in its shared memory and runs the NIC as one block does (host engine,
// fetcher, delivering warps); every warp of the others delivers from those tables through
// distributed shared memory, so a burst of one QP's packets is spread over both SMs. The
// launch made the clusters (emu_host::launch_coop); the first block's shared memory outlives the
// others' last access (the closing cluster barrier).
__device__ __forceinline__ void nic_cluster(const World& w, const EpFlags& f, NicShared& s_nic, int nb,
                                            int n_ep_blocks) {
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const int warp = threadIdx.x >> 5;
  const int sub = (int)cl.block_rank();
  const int unit = nb / w.fab.blocks_per_nic;  // the NIC, over every rank of this GPU
  const int lr = unit / w.fab.nics_per_rank;
  const int nic = unit % w.fab.nics_per_rank;
  NicShared* S = cl.map_shared_rank(&s_nic, 0);
  if (sub == 0) nic_tables_reset(s_nic);
  cl.sync();  // the tables ready (and visible cluster wide) before any warp of the cluster uses them
  if (warp < w.nic_warps && lr < w.ranks_per_gpu)
    nic_warp(w, f, lr, nic, sub * w.nic_warps + warp, *S, (unsigned)n_ep_blocks, STAGE_V);
  cl.sync();
}

// NIC block nb of a launch (V1's and V2's, or the NIC kernel's of its own): its packet table
// reset, then its warps are the emulated NIC of (local rank, NIC) until every EP block is done.
__device__ __forceinline__ void nic_block(const World& w, const EpFlags& f, NicShared& s_nic, int nb,
                                          int n_ep_blocks, unsigned stage_v) {
  const int warp = threadIdx.x >> 5;
  if (tab_shared(w.fab)) {
    nic_cluster(w, f, s_nic, nb, n_ep_blocks);
    return;
  }
  // NIC blocks a rank: NIC n's sub-block b is block n + b x nics_per_rank
  const int lr = nb / nic_units(w.fab);
  const int nic = nb % nic_units(w.fab);
  nic_tables_reset(s_nic);
  __syncthreads();
  if (warp < w.nic_warps && lr < w.ranks_per_gpu)
    nic_warp(w, f, lr, nic, warp, s_nic, (unsigned)n_ep_blocks, stage_v);
}

__global__ void __launch_bounds__(MAXW * 32, 1)
    ep_op_kernel(const __grid_constant__ World w, int op, unsigned epoch, EpFlags f) {
  __shared__ Put s_pend[MAXW][MAXG];
  __shared__ NicShared s_nic;
  const int warp = threadIdx.x >> 5;
  const int n_ep_blocks = w.ranks_per_gpu * w.ep_blocks_per_rank;
  if ((int)blockIdx.x < n_ep_blocks) {
    if (threadIdx.x == 0) {
      g_ep_arrive = 0u;
      g_ep_gen = 0u;
    }
    __syncthreads();
    EpCtx e;
    e.lr = blockIdx.x / w.ep_blocks_per_rank;
    e.bi = blockIdx.x % w.ep_blocks_per_rank;
    e.rank = w.local[e.lr].rank;
    e.wi = warp;
    e.C = w.ep_blocks_per_rank * w.ep_warps;
    e.c = e.bi * w.ep_warps + warp;
    e.nq = f.num_qps;
    e.qbase = f.notify_qp ? 1 : 0;
    e.ndata = e.nq - e.qbase;
    if (e.ndata < 1) { e.ndata = 1; e.qbase = 0; }
    e.c_issue = (f.owned && e.ndata < e.C) ? e.ndata : e.C;
    if (warp < w.ep_warps) {
      if (op == 0) dispatch_rank(w, f, e, s_pend[warp], epoch);
      else combine_rank(w, f, e, s_pend[warp], epoch);
    }
    ep_block_done(w);
  } else {
    nic_block(w, f, s_nic, (int)blockIdx.x - n_ep_blocks, n_ep_blocks, STAGE_V);
  }
}

// The NIC blocks as a kernel of their own (Fabric::own_kernel), beside the EP blocks' kernel (V1
// or V2) on another stream. The one kernel that holds both roles is compiled for the issuers'
// 255 registers a thread, so an SM holds 8 of its warps; compiled for the NIC's code alone at
// 128, a NIC block runs up to MAXNW delivering warps on its SM, sharing its tables in that SM's
// shared memory (docs/testbed.md, A NIC kernel of its own).
__global__ void __launch_bounds__(MAXNW * 32, 1)
    nic_op_kernel(const __grid_constant__ World w, EpFlags f) {
  __shared__ NicShared s_nic;
  nic_block(w, f, s_nic, (int)blockIdx.x, w.ranks_per_gpu * w.ep_blocks_per_rank,
            (unsigned)stage_words(w.nic_warps));
}

__global__ void world_barrier_kernel(const __grid_constant__ World w, unsigned long long seq) {
  if (threadIdx.x != 0) return;
  for (int lr = 0; lr < w.ranks_per_gpu; ++lr) {
    // reset per-op counters (the previous op on this stream has finished)
    RankLocal L = w.local[lr];
    L.bar[0] = 0;
    for (int i = 0; i < w.n_rxcq; ++i) L.loc_cnt[i] = 0;
  }
  *w.ep_done = 0;
  __threadfence_system();
  for (int g = 0; g < w.num_gpus; ++g) st_release64(w.wbar_peers[g] + w.gpu, seq);
  unsigned long long t0 = gtime();
  for (int g = 0; g < w.num_gpus; ++g) {
    unsigned long long v;
    while ((v = ld_acq64(w.wbar + g)) < seq) {
      if ((long long)(gtime() - t0) > w.timeout_ns) {
        raise_err(w, ERR_TIMEOUT_WORLD, -1, g, (long long)v, (long long)seq, w.gpu);
        return;
      }
    }
  }
}

}  // namespace

namespace emu_host {

// The dynamic shared memory a launch needs: the delivering warps' staging slices when the
// NIC stages its copies (Fabric::copy_staged), else none. Above 48 KiB with the static
// shared memory, the kernel must be allowed it first.
int stage_smem(const World& w, const void* kernel) {
  if (!w.fab.copy_staged) return 0;
  const int bytes = w.nic_warps * stage_words(w.nic_warps) * (int)sizeof(uint4);
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return bytes;
}

// A cooperative launch (every block co-resident: the NIC blocks and the EP blocks wait on each
// other), in clusters of a NIC's blocks where they share its tables (Fabric::share_table;
// the grid is EP blocks then NIC blocks, both counts multiples of the cluster).
int launch_coop(const void* kernel, const World& w, int grid, int threads, void** args, int smem, void* stream) {
  const int cluster = tab_shared(w.fab) ? w.fab.blocks_per_nic : 1;
  if (cluster == 1)
    return (int)cudaLaunchCooperativeKernel(kernel, dim3(grid), dim3(threads), args, smem, (cudaStream_t)stream);
  if ((w.ranks_per_gpu * w.ep_blocks_per_rank) % cluster != 0 || grid % cluster != 0) return -4;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = (cudaStream_t)stream;
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeCooperative;
  at[0].val.cooperative = 1;
  at[1].id = cudaLaunchAttributeClusterDimension;
  at[1].val.clusterDim.x = (unsigned)cluster;
  at[1].val.clusterDim.y = 1;
  at[1].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 2;
  return (int)cudaLaunchKernelExC(&cfg, kernel, args);
}

// Whether a launch's warps a block are ones its kernels take: 1 to MAXW EP warps, and NIC warps
// up to MAXW in the one kernel, MAXNW in a NIC kernel of its own (V1's launch and V2's).
bool warps_fit(const World& w) {
  const int nic_max = w.fab.own_kernel ? MAXNW : MAXW;
  return w.ep_warps >= 1 && w.ep_warps <= MAXW && w.nic_warps >= 1 && w.nic_warps <= nic_max;
}

// The NIC kernel's side stream and the events that order it, one set a device (made once).
struct NicStream {
  cudaStream_t s = nullptr;
  cudaEvent_t go = nullptr, done = nullptr;
};

// An op whose NIC blocks run in a kernel of their own (Fabric::own_kernel): the NIC kernel on
// a side stream after everything before it on `stream` (the world barrier that reset ep_done),
// the EP blocks' kernel on `stream` (cooperative: its blocks wait on each other), then `stream`
// waits for the NIC kernel, so whoever waits on `stream` waits for both. The two kernels must
// be resident together (the NIC blocks stop only once every EP block is done, the EP blocks
// wait on the NIC's deliveries): their blocks together must fit the SMs (checked by the caller,
// nic_max_blocks), and nothing else runs on the GPU.
int launch_split(const void* ep_kernel, const World& w, void** ep_args, const EpFlags& f, void* stream) {
  static NicStream side[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return -6;
  if (tab_shared(w.fab)) return -5;  // clusters of NIC blocks sharing a table: one kernel only
  NicStream& ns = side[dev];
  if (!ns.s) {
    if (cudaStreamCreateWithFlags(&ns.s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&ns.go, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&ns.done, cudaEventDisableTiming) != cudaSuccess)
      return (int)cudaGetLastError();
  }
  const cudaStream_t st = (cudaStream_t)stream;
  int rc = (int)cudaEventRecord(ns.go, st);
  if (!rc) rc = (int)cudaStreamWaitEvent(ns.s, ns.go, 0);
  if (rc) return rc;
  World wc = w;
  EpFlags fc = f;
  void* nic_args[] = {(void*)&wc, (void*)&fc};
  const int smem = stage_smem(w, (const void*)nic_op_kernel);
  rc = (int)cudaLaunchKernel((const void*)nic_op_kernel, dim3(w.nic_blocks), dim3(32 * w.nic_warps), nic_args,
                             (size_t)smem, ns.s);
  if (rc) return rc;
  rc = (int)cudaLaunchCooperativeKernel(ep_kernel, dim3(w.ranks_per_gpu * w.ep_blocks_per_rank),
                                        dim3(32 * w.ep_warps), ep_args, 0, st);
  if (!rc) rc = (int)cudaEventRecord(ns.done, ns.s);
  if (!rc) rc = (int)cudaStreamWaitEvent(st, ns.done, 0);
  return rc;
}

// Blocks of the NIC kernel of its own that fit the device at once, and its SMs (both: the
// caller checks the EP and NIC kernels' blocks together against the SMs).
std::pair<int, int> nic_max_blocks(int device, int threads, int smem) {
  int per_sm = 0, sms = 0;
  cudaSetDevice(device);
  if (smem > 0) cudaFuncSetAttribute((const void*)nic_op_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, nic_op_kernel, threads, smem) != cudaSuccess)
    return {-1, 0};
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return {per_sm * sms, sms};
}

}  // namespace emu_host

#include "v2_kernels.cuh"  // DeepEP V2 hybrid/direct: the same issuer and NIC agent

namespace emu_host {

int coop_max_blocks(int device, int threads, int smem) {
  int per_sm = 0, sms = 0;
  cudaSetDevice(device);
  if (smem > 0) cudaFuncSetAttribute((const void*)ep_op_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ep_op_kernel, threads, smem) != cudaSuccess)
    return -1;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return per_sm * sms;
}

int launch_world_barrier(const World& w, unsigned long long seq, void* stream) {
  world_barrier_kernel<<<1, 32, 0, (cudaStream_t)stream>>>(w, seq);
  return (int)cudaGetLastError();
}

int launch_op(const World& w, int op, unsigned epoch, const EpFlags& f, void* stream) {
  int grid = w.ranks_per_gpu * w.ep_blocks_per_rank + w.nic_blocks;
  if (!warps_fit(w)) return -2;
  int threads = 32 * (w.ep_warps > w.nic_warps ? w.ep_warps : w.nic_warps);  // one block shape, both roles
  World wc = w;
  EpFlags fc = f;
  void* args[] = {(void*)&wc, (void*)&op, (void*)&epoch, (void*)&fc};
  if (w.fab.own_kernel && w.nic_blocks > 0) return launch_split((const void*)ep_op_kernel, w, args, f, stream);
  const int smem = stage_smem(w, (const void*)ep_op_kernel);
  return launch_coop((const void*)ep_op_kernel, w, grid, threads, args, smem, stream);
}

int enable_peer(int dev, int peer) {
  int can = 0;
  cudaDeviceCanAccessPeer(&can, dev, peer);
  if (!can) return -1;
  cudaSetDevice(dev);
  cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return 0;
  }
  return (int)e;
}

}  // namespace emu_host

// ------------------------------------------------------------ NIC tables
namespace {
int nic_refuse(char* err, size_t len, const char* what, int i, const char* why) {
  if (err && len) snprintf(err, len, "%s %d: %s", what, i, why);
  return 1;
}
// What the kernels need of one send QP's layout beyond a usable layout (null: nothing).
const char* send_problem(const lever_efa_nic_layout& l, int num_peers) {
  if (const char* why = lever_efa_layout_problem(&l)) return why;
  if (l.sq_buffer_dev == 0u || l.sq_doorbell_dev == 0u || l.cq_buffer_dev == 0u)
    return "SQ, doorbell or CQ not mapped for the GPU (*_dev 0)";
  // 64- or 128-byte WQEs, inline writes only with 128, a counter where the GPU reads it:
  // lever_efa_layout_problem's rules, above
  if (l.cq_entry_size < 16u) return "CQ entries smaller than the 16 bytes the kernels read";
  if (l.cq_num_entries < l.sq_num_entries || l.cq_num_entries < 32u)
    return "CQ shallower than the SQ (or than a warp's 32-entry poll)";
  if (l.sq_num_entries < 32u) return "SQ shallower than 32 entries";
  if (l.lkey > LEVER_EFA_LKEY_MASK) return "lkey wider than 24 bits";
  if (l.peers == 0u || l.num_peers != (uint32_t)num_peers)
    return "peers: not the peer table (device copy) of this world";
  if (l.max_rdma_size != 0u && l.max_rdma_size < (uint32_t)CMSG) return "max_rdma_size below the largest message";
  return nullptr;
}
const char* recv_problem(const lever_efa_nic_layout& l) {
  if (l.version != LEVER_EFA_NIC_LAYOUT_VERSION) return "version";
  if (l.cq_buffer_dev == 0u || (l.cq_buffer_dev & 15u) != 0u) return "CQ not mapped for the GPU or not 16-byte aligned";
  if (l.cq_entry_size < 16u || !lever_efa_is_pow2(l.cq_num_entries) || l.cq_num_entries > LEVER_EFA_MAX_RING_ENTRIES)
    return "CQ entry size below 16 or entries not a power of two";
  if (l.cq_phase_first != LEVER_EFA_CQ_PHASE_FIRST_LAP) return "cq_phase_first: not 1";
  return nullptr;
}
// The shape of the receive QPs and of the ntables peer tables (num_peers entries each).
int shape_refused(const lever_efa_nic_layout* recv, int n_rx, const lever_efa_peer* peers, int num_peers,
                  int num_ranks, char* err, size_t err_len) {
  if (!recv || n_rx < 1 || n_rx > 256) return nic_refuse(err, err_len, "receive QPs", n_rx, "need 1..256 layouts");
  if (!peers || num_ranks < 1 || num_peers != num_ranks * n_rx)
    return nic_refuse(err, err_len, "peer table", num_peers, "need num_ranks x receive QPs entries");
  return 0;
}
int entries_refused(const lever_efa_nic_layout* recv, int n_rx, const lever_efa_peer* peers, int ntables,
                    int num_peers, char* err, size_t err_len) {
  for (int i = 0; i < n_rx; ++i)
    if (const char* why = recv_problem(recv[i])) return nic_refuse(err, err_len, "receive QP", i, why);
  for (int t = 0; t < ntables; ++t)
    for (int i = 0; i < num_peers; ++i)
      if (peers[(size_t)t * num_peers + i].remote_qkey == 0u) {
        const char* why = "qkey 0 (a QP's qkey comes from the peer, never 0 here)";
        if (ntables == 1) return nic_refuse(err, err_len, "peer", i, why);
        if (err && err_len) snprintf(err, err_len, "peer table %d: peer %d: %s", t, i, why);
        return 1;
      }
  if (err && err_len) err[0] = 0;
  return 0;
}
}  // namespace

extern "C" int lever_ep_check_nic(const lever_efa_nic_layout* send, int nq,
                                  const lever_efa_nic_layout* recv, int n_rx,
                                  const lever_efa_peer* peers, int num_peers, int num_ranks,
                                  char* err, size_t err_len) {
  if (!send || nq < 1 || nq > NQ_MAX) return nic_refuse(err, err_len, "send QPs", nq, "need 1..32 layouts");
  if (shape_refused(recv, n_rx, peers, num_peers, num_ranks, err, err_len)) return 1;
  for (int q = 0; q < nq; ++q)
    if (const char* why = send_problem(send[q], num_peers)) return nic_refuse(err, err_len, "send QP", q, why);
  return entries_refused(recv, n_rx, peers, 1, num_peers, err, err_len);
}

extern "C" int lever_ep_check_nic_rails(const lever_efa_nic_layout* send, int nq, const int* table_of,
                                        const uint64_t* tables_dev, int ntables,
                                        const lever_efa_nic_layout* recv, int n_rx,
                                        const lever_efa_peer* peers, int num_peers, int num_ranks,
                                        char* err, size_t err_len) {
  if (!send || !table_of || nq < 1 || nq > NQ_MAX)
    return nic_refuse(err, err_len, "send QPs", nq, "need 1..32 layouts, each naming its peer table");
  if (!tables_dev || ntables < 1 || ntables > NQ_MAX)
    return nic_refuse(err, err_len, "peer tables", ntables, "need 1..32 (one per EFA device)");
  if (shape_refused(recv, n_rx, peers, num_peers, num_ranks, err, err_len)) return 1;
  for (int q = 0; q < nq; ++q) {
    const int t = table_of[q];
    if (t < 0 || t >= ntables) return nic_refuse(err, err_len, "send QP", q, "names no peer table of this world");
    if (const char* why = send_problem(send[q], num_peers)) return nic_refuse(err, err_len, "send QP", q, why);
    if (send[q].peers != tables_dev[t])
      return nic_refuse(err, err_len, "send QP", q, "peers: not the device copy of its own device's peer table");
  }
  return entries_refused(recv, n_rx, peers, ntables, num_peers, err, err_len);
}
