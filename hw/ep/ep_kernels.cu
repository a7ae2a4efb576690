// Native DeepEP-style low-latency dispatch/combine over an emulated EFA SRD NIC.
//
// One cooperative launch per GPU and op holds two roles, so the NIC agent is
// guaranteed co-resident with the EP warps and can never deadlock them:
//   * EP blocks (ranks_per_gpu x ep_blocks_per_rank): warps build 64-byte TX
//     WQEs, store them into the send queue, fence, ring the doorbell and poll
//     16-byte CQEs with phase bits, exactly the issue-side work of EFA-GDA.
//   * NIC blocks (ranks_per_gpu x nics_per_rank, one block per emulated NIC):
//     warps watch the doorbells, parse WQEs, segment payloads into MTU
//     packets, schedule each packet on a path of the SRD multipath model
//     (base latency, spread, jitter, loss + retransmit), copy it into the
//     destination (NVLink peer memory or loopback) when due, and write send
//     CQEs once every packet of a WQE is acknowledged and receive CQEs with
//     the immediate for write-with-immediate.
// Every spin loop is bounded by World::timeout_ns and ends with a diagnostic
// in World::err (code, rank, expert/QP, counter seen, counter expected).
#include "efa_emu.cuh"

#include <cuda_runtime.h>
#include <stdio.h>

using namespace emu;

#define MAXW 8      // warps per block at most
#define TAB 128     // NIC in-flight entries per warp
#define MAXG 16     // post group (doorbell batch / span) at most
#define MAXQW 8     // QPs one NIC warp can own

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
    __threadfence_system();
  }
}
__device__ __forceinline__ bool aborted(const World& w) { return ld_vol32(&w.err[0]) != 0u; }
__device__ __forceinline__ bool timed_out(const World& w, unsigned long long t0) {
  return (long long)(gtime() - t0) > w.timeout_ns || aborted(w);
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
__device__ bool rank_barrier(const World& w, const RankLocal& L, int& nbar, int rank) {
  __syncthreads();
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
  __syncthreads();
  return !aborted(w);
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
__device__ __forceinline__ unsigned long long prof_hdr(unsigned kind, int op, int rank, int warp) {
  return (unsigned long long)kind | ((unsigned long long)op << 8) |
         ((unsigned long long)rank << 16) | ((unsigned long long)warp << 32);
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
struct Put {
  unsigned long long laddr, raddr;
  unsigned len, imm;
  unsigned short dest, dqp;
  unsigned has_imm;
};

struct Issuer {
  int qp;
  bool shared;
  int npend;
  int group;          // WQEs per post group
  unsigned groups;    // for sampling
  unsigned credit_ctr;
  unsigned long long n_wqe, n_db, n_fence, n_lock, n_poll;
};

__device__ __forceinline__ unsigned long long wqe_word(const Put& p, int wd, unsigned idx,
                                                       int depth, int src_rank) {
  unsigned phase = ((idx / (unsigned)depth) & 1u) ^ 1u;
  switch (wd) {
    case 0: {
      unsigned long long ctrl1 =
          (unsigned long long)(EFA_IO_RDMA_WRITE | (p.has_imm ? META_HAS_IMM : 0) | META_META_DESC);
      unsigned long long ctrl2 = (unsigned long long)(phase | META_FIRST | META_LAST | META_COMP_REQ);
      return (unsigned long long)(idx & 0xffffu) | (ctrl1 << 16) | (ctrl2 << 24) |
             ((unsigned long long)p.dqp << 32) | (1ull << 48);
    }
    case 1:
      return (unsigned long long)p.imm | ((unsigned long long)p.dest << 32);
    case 2:
      return 0ull;  // qkey, reserved2[0..3]
    case 3:
      return (unsigned long long)(idx >> 16) << 16;  // reserved2[4..5], req_id_ex
    case 4:
      return (unsigned long long)p.len | ((unsigned long long)(RKEY_BASE | p.dest) << 32);
    case 5:
      return p.raddr;
    case 6:
      return (unsigned long long)p.len | ((unsigned long long)(LKEY_BASE | (unsigned)src_rank) << 32);
    default:
      return p.laddr;
  }
}

// Consume available send CQEs of a QP (at least one poll); wait until
// cq_ci >= need. Returns false on timeout/abort. Lane 0 only.
__device__ bool drain_cq(const World& w, const RankLocal& L, int qp, unsigned& cq_ci,
                         unsigned need, unsigned long long& polls) {
  const efa_io_tx_cdesc* cq = L.cq + (size_t)qp * w.sq_depth;
  unsigned long long t0 = gtime();
  while (true) {
    unsigned slot = cq_ci % (unsigned)w.sq_depth;
    unsigned phase = ((cq_ci / (unsigned)w.sq_depth) & 1u) ^ 1u;
    uint4 v = ld_vol_v4(&cq[slot]);
    ++polls;
    unsigned flags = (v.x >> 24) & 0xffu;
    if ((flags & CDESC_PHASE) == phase) {
      unsigned status = (v.x >> 16) & 0xffu;
      if (status != 0u) {
        raise_err(w, ERR_BAD_CQE, L.rank, qp, cq_ci, status, 0);
        return false;
      }
      ++cq_ci;
      continue;
    }
    if ((int)(cq_ci - need) >= 0) return true;
    if (timed_out(w, t0)) {
      raise_err(w, ERR_TIMEOUT_CQ, L.rank, qp, cq_ci, need, 0);
      return false;
    }
  }
}

__device__ __forceinline__ void fence_all() { __threadfence_system(); }

// Post the warp's pending WQEs (s_pend) on its QP: lock (shared QPs), credit
// check (unless lazy), WQE stores, fence, doorbell; profiled when sampled.
__device__ bool post_group(const World& w, const RankLocal& L, const EpFlags& f, Issuer& is,
                           Put* pend, int op, int warp_global, bool final_ring) {
  const int lane = lane_id();
  const int n = is.npend;
  if (n == 0 && !final_ring) return true;
  bool sample = f.prof_period > 0 && (is.groups % (unsigned)f.prof_period) == 0u;
  ++is.groups;
  unsigned long long t[7] = {0, 0, 0, 0, 0, 0, 0};
  unsigned long long acc_credit = 0, acc_wqe = 0, acc_fence = 0, acc_db = 0, tt = 0;
  if (sample && lane == 0) t[0] = gtime();
  QpIssuer* Q = L.qps + is.qp;
  bool ok = true;
  if (is.shared) {
    if (lane == 0) {
      unsigned long long t0 = gtime();
      while (atomicCAS(&Q->lock, 0u, 1u) != 0u) {
        if (timed_out(w, t0)) {
          raise_err(w, ERR_TIMEOUT_LOCK, L.rank, is.qp, 0, 0, warp_global);
          ok = false;
          break;
        }
      }
      __threadfence();
      ++is.n_lock;
    }
    ok = __shfl_sync(0xffffffffu, ok, 0);
    if (!ok) return false;
  }
  if (sample && lane == 0) t[1] = gtime();
  volatile QpIssuer* VQ = Q;
  unsigned pc = VQ->pc, cq_ci = VQ->cq_ci, unrung = VQ->unrung, rung = VQ->rung;
  const unsigned depth = (unsigned)w.sq_depth;
  efa_io_tx_wqe* sq = L.sq + (size_t)is.qp * depth;
  unsigned* db = L.db + is.qp * 32;
  const bool lazy = f.lazy != 0;
  const int B = f.db_batch < 1 ? 1 : f.db_batch;
  auto ring = [&](unsigned upto) {
    if (sample && lane == 0) tt = gtime();
    fence_all();
    if (sample && lane == 0) { unsigned long long x = gtime(); acc_fence += x - tt; tt = x; }
    if (lane == 0) st_relaxed32(db, upto & 0xffffu);
    rung = upto;
    if (sample && lane == 0) acc_db += gtime() - tt;
    ++is.n_fence;
    ++is.n_db;
  };
  if (f.span > 1 && n > 0) {
    // put_many: one credit check for the span, lanes write 4 WQEs per store
    if (!lazy) {
      if (sample && lane == 0) tt = gtime();
      if (lane == 0) ok = drain_cq(w, L, is.qp, cq_ci, pc + n - depth, is.n_poll);
      ok = __shfl_sync(0xffffffffu, ok, 0);
      if (sample && lane == 0) acc_credit += gtime() - tt;
      if (!ok) return false;
    }
    if (sample && lane == 0) tt = gtime();
    for (int j = lane >> 3; j < n; j += 4) {
      unsigned idx = pc + j;
      unsigned long long* dst = reinterpret_cast<unsigned long long*>(&sq[idx % depth]);
      dst[lane & 7] = wqe_word(pend[j], lane & 7, idx, depth, L.rank);
    }
    __syncwarp();
    if (sample && lane == 0) acc_wqe += gtime() - tt;
    pc += n;
    is.n_wqe += n;
    unrung += n;
    if (f.agg > 0) {
      if ((int)unrung >= f.agg) { ring(pc); unrung = 0; }
    } else {
      ring(pc);
      unrung = 0;
    }
  } else {
    for (int i = 0; i < n; ++i) {
      if (!lazy && (is.credit_ctr++ % (unsigned)(f.credit_every < 1 ? 1 : f.credit_every)) == 0u) {
        if (sample && lane == 0) tt = gtime();
        if (lane == 0) ok = drain_cq(w, L, is.qp, cq_ci, pc + 1 - depth, is.n_poll);
        ok = __shfl_sync(0xffffffffu, ok, 0);
        if (sample && lane == 0) acc_credit += gtime() - tt;
        if (!ok) return false;
      }
      if (sample && lane == 0) tt = gtime();
      if (lane < 8) {
        unsigned long long* dst = reinterpret_cast<unsigned long long*>(&sq[pc % depth]);
        dst[lane] = wqe_word(pend[i], lane, pc, depth, L.rank);
      }
      __syncwarp();
      if (sample && lane == 0) acc_wqe += gtime() - tt;
      ++pc;
      ++is.n_wqe;
      ++unrung;
      if (f.agg > 0) {
        if ((int)unrung >= f.agg) { ring(pc); unrung = 0; }
      } else if ((int)unrung >= B) {
        ring(pc);
        unrung = 0;
      }
    }
  }
  if (final_ring && unrung > 0) { ring(pc); unrung = 0; }
  if (lane == 0) {
    VQ->pc = pc;
    VQ->cq_ci = cq_ci;
    VQ->unrung = unrung;
    VQ->rung = rung;
  }
  __syncwarp();
  if (sample && lane == 0) t[5] = gtime();
  if (is.shared && lane == 0) {
    __threadfence();
    atomicExch(&Q->lock, 0u);
  }
  if (sample && lane == 0) {
    t[6] = gtime();
    // row: lock_ns, credit_ns, wqe_ns, fence_ns, doorbell_ns, n_wqe, total_ns
    unsigned long long lock_ns = (t[1] - t[0]) + (t[6] - t[5]);
    prof_row(w, L, prof_hdr(PK_PUT, op, L.rank, warp_global), lock_ns, acc_credit, acc_wqe,
             acc_fence, acc_db, (unsigned long long)n, t[6] - t[0]);
  }
  is.npend = 0;
  return true;
}

__device__ __forceinline__ bool issue(const World& w, const RankLocal& L, const EpFlags& f,
                                      Issuer& is, Put* pend, const Put& p, int op, int wg) {
  if (lane_id() == 0) pend[is.npend] = p;
  __syncwarp();
  ++is.npend;
  if (is.npend >= is.group) return post_group(w, L, f, is, pend, op, wg, false);
  return true;
}

// ring anything un-rung and wait until every WQE of the QP completed
__device__ bool flush_qp(const World& w, const RankLocal& L, int qp, Issuer& tmp) {
  QpIssuer* Q = L.qps + qp;
  volatile QpIssuer* VQ = Q;
  bool ok = true;
  if (lane_id() == 0) {
    unsigned long long t0 = gtime();
    while (atomicCAS(&Q->lock, 0u, 1u) != 0u) {
      if (timed_out(w, t0)) { raise_err(w, ERR_TIMEOUT_LOCK, L.rank, qp, 0, 0, -1); ok = false; break; }
    }
    __threadfence();
    if (ok) {
      unsigned pc = VQ->pc, cq_ci = VQ->cq_ci;
      if (VQ->rung != pc || VQ->unrung) {
        __threadfence_system();
        st_relaxed32(L.db + qp * 32, pc & 0xffffu);
        VQ->rung = pc;
        VQ->unrung = 0;
        ++tmp.n_db;
        ++tmp.n_fence;
      }
      ok = drain_cq(w, L, qp, cq_ci, pc, tmp.n_poll);
      VQ->cq_ci = cq_ci;
      __threadfence();
      atomicExch(&Q->lock, 0u);
    }
  }
  return __shfl_sync(0xffffffffu, ok, 0);
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
  is.n_wqe = is.n_db = is.n_fence = is.n_lock = is.n_poll = 0;
  if (for_signal && f.notify_qp) {
    is.qp = 0;
    is.shared = true;
  } else {
    is.qp = e.qbase + (e.c % e.ndata);
    is.shared = !(f.owned && e.c_issue <= e.ndata);
  }
  int g = f.db_batch < 1 ? 1 : f.db_batch;
  if (f.span > g) g = f.span;
  if (f.agg > 0 && f.span <= 1) g = 1;
  if (g > MAXG) g = MAXG;
  is.group = g;
}

__device__ void flush_stats(const World& w, const Issuer& is) {
  if (lane_id() != 0) return;
  if (is.n_wqe) atomicAdd(&w.stats[ST_WQES], is.n_wqe);
  if (is.n_db) atomicAdd(&w.stats[ST_DOORBELLS], is.n_db);
  if (is.n_fence) atomicAdd(&w.stats[ST_FENCES], is.n_fence);
  if (is.n_lock) atomicAdd(&w.stats[ST_LOCKS], is.n_lock);
  if (is.n_poll) atomicAdd(&w.stats[ST_CREDIT_POLLS], is.n_poll);
}

// Signals: count messages (dispatch) / done flags (combine) after the data.
__device__ bool post_signals(const World& w, const RankLocal& L, const EpFlags& f, const EpCtx& e,
                             Put* pend, int op, unsigned epoch, int& nbar) {
  Issuer is;
  setup_issuer(w, f, e, is, true);
  if (f.batched_tail) is.group = MAXG;
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
  tmp.n_wqe = tmp.n_db = tmp.n_fence = tmp.n_lock = tmp.n_poll = 0;
  bool ok = true;
  for (int q = e.c; q < e.nq && ok; q += e.C) ok = flush_qp(w, L, q, tmp);
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

  // 0. layout: per global expert, deterministic slots in token order (+ counts)
  ph.begin(prof);
  for (int ge = e.c; ge < w.E; ge += e.C) {
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
  if (!rank_barrier(w, L, nbar, e.rank)) return;

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
        p.has_imm = f.imm_counting ? 1u : 0u;
        ok = issue(w, L, f, is, pend, p, 0, wg);
      }
    }
    if (ok) ok = post_group(w, L, f, is, pend, 0, wg, !f.agg || f.imm_counting || f.ordered_unsafe);
  }
  flush_stats(w, is);
  if (!ok) return;

  // 2. signal the per-(expert, source) counts
  ph.begin(prof);
  if (f.imm_counting) {
    // no flush: the receiver counts receive completions against the count
  } else if (f.ordered_unsafe) {
    if (!rank_barrier(w, L, nbar, e.rank)) return;
  } else {
    if (!flush_rank(w, L, f, e, nbar)) return;
  }
  ph.end(w, L, PH_FLUSH, 0, e.rank, wg);
  ph.begin(prof);
  if (!post_signals(w, L, f, e, pend, 0, epoch, nbar)) return;
  ph.end(w, L, PH_SIGNAL, 0, e.rank, wg);

  // 3. receive: per local expert, per source rank
  for (int le = e.c; le < w.E_local; le += e.C) {
    const int ge = e.rank * w.E_local + le;
    int cnt_lane = 0;  // lane s holds the count from source s
    ph.begin(prof);
    if (f.imm_counting) {
      const efa_io_rx_cdesc* cq = w.peers[e.rank].rxcq + (size_t)le * w.rx_depth;
      unsigned head = L.rx_head[le];
      int got = 0, expect = -1;  // per lane (source = lane)
      unsigned long long t0 = gtime();
      while (true) {
        bool done = lane >= R || (expect >= 0 && got == expect);
        if (__all_sync(0xffffffffu, done)) break;
        uint4 v = make_uint4(0, 0, 0, 0);
        unsigned phase = ((head / (unsigned)w.rx_depth) & 1u) ^ 1u;
        if (lane == 0) v = ld_vol_v4(&cq[head % (unsigned)w.rx_depth]);
        unsigned fl = __shfl_sync(0xffffffffu, (v.x >> 24) & 0xffu, 0);
        unsigned imm = __shfl_sync(0xffffffffu, v.w, 0);
        if ((fl & CDESC_PHASE) == phase) {
          ++head;
          int s = (imm >> 16) & 0x7fff;
          if (lane == s) {
            if (imm >> 31) expect = (int)(imm & 0xffffu);
            else ++got;
          }
        } else if (timed_out(w, t0)) {
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
      if (aborted(w)) return;
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
      if (lane == 0) L.out_count[le * R + s] = cnt;
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
    if (ok) ok = post_group(w, L, f, is, pend, 1, wg, !f.agg || f.imm_counting || f.ordered_unsafe);
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
    const efa_io_rx_cdesc* cq = w.peers[e.rank].rxcq + (size_t)e.c * w.rx_depth;
    unsigned head = L.rx_head[e.c];
    int got = 0;
    unsigned long long t0 = gtime();
    while (got < expect) {
      unsigned phase = ((head / (unsigned)w.rx_depth) & 1u) ^ 1u;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (lane == 0) v = ld_vol_v4(&cq[head % (unsigned)w.rx_depth]);
      unsigned fl = __shfl_sync(0xffffffffu, (v.x >> 24) & 0xffu, 0);
      if ((fl & CDESC_PHASE) == phase) {
        ++head;
        ++got;
      } else if (timed_out(w, t0)) {
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
  if (aborted(w)) return;
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
struct NicWarpState {
  int nq;               // QPs owned
  int qp[MAXQW];
};

__device__ void nic_warp(const World& w, int lr, int nic, int wib,
                         unsigned long long* due, unsigned long long* inf,
                         unsigned long long* aux, unsigned short* freel, int& nfree,
                         unsigned long long* nic_free, unsigned long long* last_wqe,
                         unsigned total_ep_blocks) {
  const RankLocal& L = w.local[lr];
  const Fabric& fb = w.fab;
  const int lane = lane_id();
  const int nics = fb.nics_per_rank;
  const unsigned depth = (unsigned)w.sq_depth;
  NicWarpState st;
  st.nq = 0;
  // QPs q with q % nics == nic, spread over the block's warps
  for (int q = 0, j = 0; q < NQ_MAX; ++q) {
    if (q % nics != nic) continue;
    if ((j++ % w.nic_warps) == wib && st.nq < MAXQW) st.qp[st.nq++] = q;
  }
  Rng rng;
  rng.s = mix64(fb.seed ^ ((unsigned long long)L.rank << 40) ^ ((unsigned long long)nic << 32) ^
                ((unsigned long long)wib << 24) ^ (unsigned long long)w.gpu);
  unsigned long long n_pkt = 0, n_retx = 0, n_cqe = 0, n_rx = 0, n_reord = 0;
  const unsigned long long t_start = gtime();
  const float ns_per_byte = 8.f / fb.line_rate_gbps;
  int inflight = 0;
  int rx_reserve = 0;  // entries promised to receive completions of fetched write-imm WQEs
  while (true) {
    const unsigned long long now = gtime();
    // 1. fetch new WQEs (producer counter moved)
    for (int i = 0; i < st.nq; ++i) {
      const int q = st.qp[i];
      if (q >= 64) continue;
      NicQp* NQ = L.nicqp + q;
      unsigned ci = 0, db = 0;
      if (lane == 0) {
        ci = *reinterpret_cast<volatile unsigned*>(&NQ->ci);
        db = ld_acq32(L.db + q * 32) & 0xffffu;
      }
      ci = __shfl_sync(0xffffffffu, ci, 0);
      db = __shfl_sync(0xffffffffu, db, 0);
      while (((db - ci) & 0xffffu) != 0u && nfree >= 1) {
        // parse the WQE (all lanes load the same 64 B: broadcast)
        const efa_io_tx_wqe* slotp = L.sq + (size_t)q * depth + (ci % depth);
        uint4 raw[4];
        for (int j = 0; j < 4; ++j) raw[j] = ld_vol_v4(reinterpret_cast<const uint4*>(slotp) + j);
        efa_io_tx_wqe wq;
        memcpy(&wq, raw, 64);
        unsigned phase = ((ci / depth) & 1u) ^ 1u;
        unsigned len = wq.data.rdma_req.remote_mem.length;
        unsigned dest = wq.meta.ah;
        bool bad = !(wq.meta.ctrl1 & META_META_DESC) ||
                   (wq.meta.ctrl1 & META_OP_TYPE_MASK) != EFA_IO_RDMA_WRITE ||
                   (wq.meta.ctrl2 & META_PHASE) != phase ||
                   (wq.meta.ctrl2 & (META_FIRST | META_LAST)) != (META_FIRST | META_LAST) ||
                   wq.meta.req_id != (ci & 0xffffu) || dest >= (unsigned)w.num_ranks ||
                   wq.data.rdma_req.remote_mem.rkey != (RKEY_BASE | dest) ||
                   wq.data.rdma_req.local_mem[0].lkey != (LKEY_BASE | (unsigned)L.rank) ||
                   wq.data.rdma_req.local_mem[0].length != len || len == 0;
        if (bad) {
          if (lane == 0) raise_err(w, ERR_BAD_WQE, L.rank, q, ci, wq.meta.ctrl2, wq.meta.req_id);
          return;
        }
        const int npk = (int)((len + fb.mtu - 1) / fb.mtu);
        const int need_rx = (wq.meta.ctrl1 & META_HAS_IMM) ? 1 : 0;
        if (npk + need_rx > __shfl_sync(0xffffffffu, nfree - rx_reserve, 0)) break;  // table full: WQE waits in the SQ
        if (lane == 0) rx_reserve += need_rx;
        if (lane == 0) {
          // NIC processing and message-rate ceiling, then serialisation on this NIC
          unsigned long long ready = now + (unsigned long long)(fb.wqe_process_ns + fb.dma_read_ns);
          unsigned long long gap = *last_wqe + (unsigned long long)fb.min_wqe_gap_ns;
          if (gap > ready) ready = gap;
          *last_wqe = ready;
          L.nic_rem[(size_t)q * depth + (ci % depth)] = (unsigned char)npk;
          for (int p = 0; p < npk; ++p) {
            unsigned bytes = min((unsigned)fb.mtu, len - (unsigned)p * fb.mtu);
            unsigned long long ser = (unsigned long long)(bytes * ns_per_byte);
            unsigned long long old = *nic_free, nw;
            // shared-memory CAS: warps of this NIC share one serialiser
            while (true) {
              unsigned long long start = old > ready ? old : ready;
              nw = start + ser;
              unsigned long long prev = atomicCAS(nic_free, old, nw);
              if (prev == old) break;
              old = prev;
            }
            unsigned long long land = nw + (unsigned long long)flight_ns(fb, rng);
            int tries = 0;
            while (fb.loss_prob > 0.f && rng.uni() < fb.loss_prob && tries < 8) {
              // dropped on the wire: the sender retransmits after the timeout
              land += (unsigned long long)fb.rto_ns + (unsigned long long)flight_ns(fb, rng);
              ++tries;
            }
            n_retx += tries;
            int idx = freel[--nfree];
            due[idx] = land;
            inf[idx] = (unsigned long long)(0u | ((unsigned)i << 4) | ((unsigned)p << 8)) |
                       ((unsigned long long)ci << 32);
            aux[idx] = 0;
            ++inflight;
          }
        }
        ++ci;
        nfree = __shfl_sync(0xffffffffu, nfree, 0);
        inflight = __shfl_sync(0xffffffffu, inflight, 0);
      }
      if (lane == 0) NQ->ci = ci;
      __syncwarp();
    }
    nfree = __shfl_sync(0xffffffffu, nfree, 0);
    inflight = __shfl_sync(0xffffffffu, inflight, 0);
    // 2. deliver due entries
    const unsigned long long now2 = gtime();
    for (int base = 0; base < TAB; base += 32) {
      unsigned long long d = due[base + lane];
      unsigned m = __ballot_sync(0xffffffffu, d <= now2);
      while (m) {
        const int idx = base + __ffs(m) - 1;
        m &= m - 1;
        const unsigned long long in = inf[idx];
        const unsigned kind = (unsigned)(in & 0xfu);
        const int ql = (int)((in >> 4) & 0xfu);
        const int q = st.qp[ql];
        const unsigned wi = (unsigned)(in >> 32);
        if (kind == 0) {  // data packet lands at the destination
          const int p = (int)((in >> 8) & 0xffu);
          const efa_io_tx_wqe* slotp = L.sq + (size_t)q * depth + (wi % depth);
          efa_io_tx_wqe wq;
          uint4 raw[4];
          for (int j = 0; j < 4; ++j) raw[j] = ld_vol_v4(reinterpret_cast<const uint4*>(slotp) + j);
          memcpy(&wq, raw, 64);
          const unsigned len = wq.data.rdma_req.remote_mem.length;
          const unsigned off = (unsigned)p * fb.mtu;
          const unsigned n = min((unsigned)fb.mtu, len - off);
          const uint8_t* src = reinterpret_cast<const uint8_t*>(
              ((unsigned long long)wq.data.rdma_req.local_mem[0].buf_addr_hi << 32) |
              wq.data.rdma_req.local_mem[0].buf_addr_lo) + off;
          uint8_t* dst = reinterpret_cast<uint8_t*>(
              ((unsigned long long)wq.data.rdma_req.remote_mem.buf_addr_hi << 32) |
              wq.data.rdma_req.remote_mem.buf_addr_lo) + off;
          if ((n & 15u) == 0u) {
            const uint4* s4 = reinterpret_cast<const uint4*>(src);
            uint4* d4 = reinterpret_cast<uint4*>(dst);
            const unsigned nv = n >> 4;
            unsigned i = lane;
            for (; i + 224 < nv; i += 256) {
              uint4 v8[8];
#pragma unroll
              for (int j = 0; j < 8; ++j) v8[j] = __ldcg(s4 + i + 32 * j);
#pragma unroll
              for (int j = 0; j < 8; ++j) __stcg(d4 + i + 32 * j, v8[j]);
            }
            for (; i < nv; i += 32) __stcg(d4 + i, __ldcg(s4 + i));
          } else {
            const unsigned long long* s8 = reinterpret_cast<const unsigned long long*>(src);
            unsigned long long* d8 = reinterpret_cast<unsigned long long*>(dst);
            for (unsigned i = lane; i < (n >> 3); i += 32) __stcg(d8 + i, __ldcg(s8 + i));
          }
          __syncwarp();
          if (lane == 0) {
            ++n_pkt;
            NicQp* NQ = L.nicqp + q;
            unsigned seqv = wi * 16u + (unsigned)p;
            if ((int)(seqv - NQ->last_landed) < 0) ++n_reord;
            else NQ->last_landed = seqv;
            unsigned char rem = --L.nic_rem[(size_t)q * depth + (wi % depth)];
            if (rem == 0) {
              // all packets landed: ACK flies back, then the send CQE
              unsigned long long ack = now2 + (unsigned long long)(flight_ns(fb, rng) + fb.completion_ns);
              due[idx] = ack;
              inf[idx] = (in & ~0xfull) | 1ull;
              if (wq.meta.ctrl1 & META_HAS_IMM) {
                int j2 = freel[--nfree];
                --rx_reserve;
                due[j2] = now2 + (unsigned long long)fb.recv_completion_ns;
                inf[j2] = 2ull | ((unsigned long long)ql << 4) | ((unsigned long long)wq.meta.immediate_data << 32);
                aux[j2] = (unsigned long long)wq.meta.ah | ((unsigned long long)wq.meta.dest_qp_num << 16) |
                          ((unsigned long long)(len & 0xffffu) << 32);
                ++inflight;
              }
            } else {
              due[idx] = ~0ull;
              freel[nfree++] = (unsigned short)idx;
              --inflight;
            }
          }
        } else if (kind == 1) {  // send completion at the sender
          if (lane == 0) {
            NicQp* NQ = L.nicqp + q;
            unsigned pi = NQ->cq_pi;
            efa_io_tx_cdesc* cqe = L.cq + (size_t)q * depth + (pi % depth);
            unsigned phase = ((pi / depth) & 1u) ^ 1u;
            unsigned flags = phase | ((unsigned)EFA_IO_SEND_QUEUE << CDESC_Q_TYPE_SHIFT) |
                             ((unsigned)EFA_IO_RDMA_WRITE << CDESC_OP_TYPE_SHIFT);
            uint4 v;
            v.x = (wi & 0xffffu) | (0u << 16) | (flags << 24);
            v.y = (unsigned)q | ((wi >> 16) << 16);
            v.z = 0; v.w = 0;
            __threadfence_system();  // this warp's packet stores are visible before the CQE
            st_vol_v4(cqe, v);
            NQ->cq_pi = pi + 1;
            ++n_cqe;
            due[idx] = ~0ull;
            freel[nfree++] = (unsigned short)idx;
            --inflight;
          }
        } else {  // receive completion (write with immediate) at the target
          if (lane == 0) {
            const unsigned long long ax = aux[idx];
            const int dest = (int)(ax & 0xffffu);
            const int dqp = (int)((ax >> 16) & 0xffffu);
            const RankPeer& P = w.peers[dest];
            unsigned slot = atomicAdd_system(P.rx_tail + dqp, 1u);
            efa_io_rx_cdesc* cqe = P.rxcq + (size_t)dqp * w.rx_depth + (slot % (unsigned)w.rx_depth);
            unsigned phase = ((slot / (unsigned)w.rx_depth) & 1u) ^ 1u;
            unsigned flags = phase | ((unsigned)EFA_IO_RECV_QUEUE << CDESC_Q_TYPE_SHIFT) | CDESC_HAS_IMM |
                             ((unsigned)EFA_IO_RDMA_WRITE << CDESC_OP_TYPE_SHIFT);
            uint4 v;
            v.x = 0u | (flags << 24);
            v.y = (unsigned)dqp | ((unsigned)((ax >> 32) & 0xffffu) << 16);
            v.z = 0xffffu | ((unsigned)L.rank << 16);  // ah, src_qp_num
            v.w = wi;                                   // immediate
            __threadfence_system();
            st_vol_v4(cqe, v);
            ++n_rx;
            due[idx] = ~0ull;
            freel[nfree++] = (unsigned short)idx;
            --inflight;
          }
        }
        __syncwarp();
        nfree = __shfl_sync(0xffffffffu, nfree, 0);
        inflight = __shfl_sync(0xffffffffu, inflight, 0);
      }
    }
    // 3. exit when every EP block on this GPU is done and nothing is in flight
    if (inflight == 0) {
      bool idle = true;
      if (lane == 0) {
        for (int i = 0; i < st.nq; ++i) {
          const int q = st.qp[i];
          unsigned ci = L.nicqp[q].ci;
          unsigned db = ld_acq32(L.db + q * 32) & 0xffffu;
          if (((db - ci) & 0xffffu) != 0u) idle = false;
        }
        idle = idle && ld_acq32(w.ep_done) >= total_ep_blocks;
      }
      idle = __shfl_sync(0xffffffffu, idle, 0);
      if (idle) break;
    }
    if (aborted(w)) break;
    if ((long long)(gtime() - t_start) > 2 * w.timeout_ns) {
      if (lane == 0) raise_err(w, ERR_TIMEOUT_NIC, L.rank, nic, inflight, 0, wib);
      break;
    }
  }
  if (lane == 0) {
    atomicAdd(&w.stats[ST_PACKETS], n_pkt);
    atomicAdd(&w.stats[ST_RETRANSMITS], n_retx);
    atomicAdd(&w.stats[ST_CQES], n_cqe);
    atomicAdd(&w.stats[ST_RX_CQES], n_rx);
    atomicAdd(&w.stats[ST_REORDERED], n_reord);
  }
}

__global__ void __launch_bounds__(MAXW * 32, 1)
    ep_op_kernel(const __grid_constant__ World w, int op, unsigned epoch, EpFlags f) {
  __shared__ Put s_pend[MAXW][MAXG];
  __shared__ unsigned long long s_due[MAXW][TAB];
  __shared__ unsigned long long s_inf[MAXW][TAB];
  __shared__ unsigned long long s_aux[MAXW][TAB];
  __shared__ unsigned short s_free[MAXW][TAB];
  __shared__ unsigned long long s_nic_free, s_last_wqe;
  const int warp = threadIdx.x >> 5;
  const int n_ep_blocks = w.ranks_per_gpu * w.ep_blocks_per_rank;
  if ((int)blockIdx.x < n_ep_blocks) {
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
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      atomicAdd(w.ep_done, 1u);
    }
  } else {
    const int nb = blockIdx.x - n_ep_blocks;
    const int lr = nb / w.fab.nics_per_rank;
    const int nic = nb % w.fab.nics_per_rank;
    if (threadIdx.x == 0) { s_nic_free = 0; s_last_wqe = 0; }
    if (warp < w.nic_warps) {
      for (int i = lane_id(); i < TAB; i += 32) {
        s_due[warp][i] = ~0ull;
        s_free[warp][i] = (unsigned short)(TAB - 1 - i);
      }
    }
    __syncthreads();
    if (warp < w.nic_warps && lr < w.ranks_per_gpu) {
      int nfree = TAB;
      nic_warp(w, lr, nic, warp, s_due[warp], s_inf[warp], s_aux[warp], s_free[warp], nfree,
               &s_nic_free, &s_last_wqe, (unsigned)n_ep_blocks);
    }
  }
}

__global__ void world_barrier_kernel(const __grid_constant__ World w, unsigned long long seq) {
  if (threadIdx.x != 0) return;
  for (int lr = 0; lr < w.ranks_per_gpu; ++lr) {
    // reset per-op counters (the previous op on this stream has finished)
    RankLocal L = w.local[lr];
    L.bar[0] = 0;
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

int coop_max_blocks(int device, int threads, int smem) {
  int per_sm = 0, sms = 0;
  cudaSetDevice(device);
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
  if (w.ep_warps != w.nic_warps || w.ep_warps > MAXW) return -2;  // one block shape for both roles
  int threads = 32 * w.ep_warps;
  World wc = w;
  EpFlags fc = f;
  void* args[] = {(void*)&wc, (void*)&op, (void*)&epoch, (void*)&fc};
  cudaError_t e = cudaLaunchCooperativeKernel((const void*)ep_op_kernel, dim3(grid), dim3(threads),
                                              args, 0, (cudaStream_t)stream);
  return (int)e;
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
