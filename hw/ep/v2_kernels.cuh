// DeepEP V2 dispatch/combine, hybrid and direct, over the emulated SRD NIC.
//
// Included into ep_kernels.cu's translation unit (after V1's helpers), so the V2 roles
// post every RDMA write through V1's issuer as it is (Put, issue, post_group, flush_qp,
// cq_poll: slot reservation, credit checks, WQE stores, fences, slot-ordered doorbells, or
// the proxy's descriptor rings) and the NIC blocks run V1's agent (nic_warp) unchanged: a
// change to either applies to V2 too.
//
// Hybrid (what the EFA campaign measured), per rank r = (node n, local l), C channels:
//   dispatch  1. layout: the slot of every token in every destination rank's buffer, in
//                token order, and the tokens per (channel, node) stream (skipped when cached);
//             2. notify: counts to the same-index rank of every other node (one write), to the
//                ranks of the own node over NVLink; the receiver relays remote sources' counts
//                to its node's ranks (skipped when cached: the handle's counts are reused);
//             3. scale-out warp c sends token t (t mod C = c) once per destination NODE, into
//                recv[n][c][slot] of the same-index rank there; tokens for the own node go
//                over NVLink straight to their ranks; every `interval` writes of a stream a
//                tail word (epoch, finish, tail), signalled as the design says:
//                  flush     wait for this warp's own WQEs' send completions, then the tail
//                  imm       no tails: every write carries an immediate, the forward warps
//                            count receive completions against the notified stream counts
//                  proxy     tails without flush, every write and tail a write-with-immediate;
//                            the forward warps accept a tail once every write before it arrived
//                            (GIN's receiving proxy rule, done by the forward warps here)
//                  ordered   tails right after the data (unsafe on SRD: the negative test)
//             4. forward warps poll their streams' tails (or count completions) round-robin
//                and store each accepted token into every rank of the node that hosts one of
//                its experts (NVLink peer stores; plain stores when the ranks share a GPU);
//             5. every rank waits for its tokens, drains its WQEs, closing node barrier.
//   combine   the reverse: each rank stores its row per received token to the forwarder of
//             the token's source (same-index rank; the source itself on its own node); the
//             forward warps reduce the node's rows per token (float32, node order), write one
//             row per token to the source node, flush, one signal per node (imm: counted
//             receive completions instead); the source waits for every node and reduces.
// Direct: the same layout and notify, one write per (token, destination rank) into the
//   rank's buffer (NVLink on the own node), then the barrier: flush every context, rank
//   sync, one signal per remote peer with its count, wait for every peer; combine the same
//   way back, the reduction at the source.
// Every wait is bounded by World::timeout_ns and ends with a diagnostic in World::err.
#pragma once
#include "v2.h"

namespace {
using namespace emu2;

struct V2Ctx {  // one warp of one rank in a V2 op
  int lr, rank, node, loc;  // rank index on this GPU, rank, node, local index in the node
  int bi, warp, gw, W;      // block of the rank, warp in the block, warp of the rank, warps per rank
  bool so;                  // a scale-out warp (channel c) ...
  int c;
  bool fwd;                 // ... or a forward warp (index j)
  int j;
};

__device__ __forceinline__ EpCtx v2_issuer_ctx(const EpFlags& f, const V2Ctx& x, int c, int C) {
  EpCtx e;
  e.lr = x.lr;
  e.rank = x.rank;
  e.bi = x.bi;
  e.wi = x.warp;
  e.c = c;
  e.C = C;
  e.nq = f.num_qps;
  e.qbase = f.notify_qp ? 1 : 0;
  e.ndata = e.nq - e.qbase;
  if (e.ndata < 1) {
    e.ndata = 1;
    e.qbase = 0;
  }
  e.c_issue = C;
  return e;
}

__device__ __forceinline__ const int* v2_meta(const World& w, const uint8_t* msg) {
  return reinterpret_cast<const int*>(msg + w.H + (w.H / 128) * 4);
}
__device__ __forceinline__ unsigned v2_u16(const int* m, int base, int i) {
  const unsigned x = (unsigned)__ldcg(m + base + (i >> 1));
  return (i & 1) ? (x >> 16) : (x & 0xffffu);
}
__device__ __forceinline__ unsigned long long v2_tag(unsigned epoch, unsigned v) {
  return ((unsigned long long)epoch << 32) | v;
}

// A message copy by one warp (16-byte stores; NVLink when dst is a peer GPU's memory).
__device__ __forceinline__ void v2_copy(uint8_t* dst, const uint8_t* src, int bytes) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  const int n = bytes >> 4;
  int i = lane_id();
  for (; i + 32 * 7 < n; i += 32 * 8) {
    uint4 q[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = __ldcg(s + i + 32 * k);
#pragma unroll
    for (int k = 0; k < 8; ++k) __stcg(d + i + 32 * k, q[k]);
  }
  for (; i < n; i += 32) __stcg(d + i, __ldcg(s + i));
}

// Every lane's stores before what lane 0 writes next (a flag or a counter a peer polls).
__device__ __forceinline__ void v2_publish_fence() {
  __syncwarp();
  __threadfence_system();
}

// Spin until *p >= want (acquire, system scope). False after raising `code` on a timeout.
__device__ bool v2_wait64(const World& w, const unsigned long long* p, unsigned long long want,
                          unsigned code, int rank, int a, int aux) {
  const unsigned long long t0 = gtime();
  unsigned long long v;
  while ((v = ld_acq64(p)) < want) {
    if (timed_out(w, t0)) {
      raise_err(w, code, rank, a, (long long)(v & 0xffffffffu), (long long)(want & 0xffffffffu), aux);
      return false;
    }
  }
  return true;
}
__device__ bool v2_wait32(const World& w, const unsigned* p, unsigned want, unsigned code, int rank,
                          int a, int aux) {
  const unsigned long long t0 = gtime();
  unsigned v;
  while ((int)((v = ld_acq32(p)) - want) < 0) {
    if (timed_out(w, t0)) {
      raise_err(w, code, rank, a, v, want, aux);
      return false;
    }
  }
  return true;
}

// A rank barrier of warps (not blocks): every V2 warp arrives on the rank's counter and
// spins with the timeout, so a warp that gave up on an error can never leave the others
// in a hardware barrier (V1's rank_barrier syncs the block first).
__device__ bool v2_barrier(const World& w, const RankLocal& L, int& nbar, const V2Ctx& x) {
  ++nbar;
  __syncwarp();
  bool ok = true;
  if (lane_id() == 0) {
    __threadfence();
    atomicAdd(L.bar, 1u);
    const unsigned target = (unsigned)(nbar * x.W);
    const unsigned long long t0 = gtime();
    unsigned v;
    while ((v = ld_acq32(L.bar)) < target) {
      if (timed_out(w, t0)) {
        raise_err(w, ERR_TIMEOUT_BARRIER, x.rank, nbar, v, target, x.gw);
        ok = false;
        break;
      }
    }
  }
  return __shfl_sync(0xffffffffu, ok, 0) && !aborted(w);
}
// V1's flush (every WQE of every QP rung and completed) between two V2 barriers.
__device__ bool v2_flush_rank(const World& w, const RankLocal& L, const EpFlags& f, const EpCtx& e,
                              int& nbar, const V2Ctx& x) {
  if (!v2_barrier(w, L, nbar, x)) return false;
  Issuer tmp;
  tmp.n_wqe = tmp.n_db = tmp.n_fence = tmp.n_lock = tmp.n_poll = tmp.n_turnwait = tmp.n_ringpoll = tmp.n_desc = 0;
  tmp.n_local = 0;
  bool ok = true;
  for (int q = e.c; q < e.nq && ok; q += e.C) ok = flush_qp(w, L, f, q, tmp);
  flush_stats(w, tmp);
  if (!ok) return false;
  return v2_barrier(w, L, nbar, x);
}

// ---------------------------------------------------------------- issue side
// A warp's own post groups since its last flush: flush-then-signal waits for exactly these
// (shared QPs complete other warps' WQEs in any order, so a count would not do).
struct V2Mine {
  unsigned* rs;  // first slot of each group
  int* rn;       // WQEs in it
  int nr;
};

__device__ bool v2_flush_mine(const World& w, const RankLocal& L, Issuer& is, V2Mine& mine, int rank) {
  if (mine.nr == 0) return true;
  const lever_efa_nic_layout* lay = L.nic + is.qp;
  const unsigned n = lay->sq_num_entries;
  const unsigned* done = L.wqe_done + (size_t)is.qp * n;
  const unsigned long long t0 = gtime();
  while (true) {
    bool all = true;
    for (int r = 0; r < mine.nr; ++r)
      for (int i = lane_id(); i < mine.rn[r]; i += 32) {
        const unsigned idx = mine.rs[r] + (unsigned)i;
        if (ld_acq_gpu32(done + (idx & (n - 1u))) <= idx / n) all = false;
      }
    if (__all_sync(0xffffffffu, all)) break;
    if (!cq_poll(w, L, is.qp, 0u, is.n_poll)) return false;  // consume what completed (any warp's)
    bool to = false;
    if (lane_id() == 0) to = timed_out(w, t0);
    if (__shfl_sync(0xffffffffu, to, 0)) {
      if (lane_id() == 0) raise_err(w, ERR_V2_FLUSH, rank, is.qp, mine.rs[0], mine.rn[0], mine.nr);
      return false;
    }
  }
  mine.nr = 0;
  return true;
}

__device__ __forceinline__ void v2_track(V2Mine& mine, unsigned slot, int n) {
  if (n <= 0) return;
  if (lane_id() == 0) {
    mine.rs[mine.nr] = slot;
    mine.rn[mine.nr] = n;
  }
  __syncwarp();
  ++mine.nr;
}

// post_group(final ring) that remembers the group.
__device__ bool v2_post(const World& w, const RankLocal& L, const EpFlags& f, Issuer& is, Put* pend,
                        int op, int wg, V2Mine& mine, bool track) {
  const unsigned g0 = is.groups;
  const int np0 = is.npend;
  if (!post_group(w, L, f, is, pend, op, wg, true)) return false;
  if (track && is.groups != g0) v2_track(mine, is.last_slot, np0);
  return true;
}

// issue() that remembers the warp's own groups (track: flush-then-signal needs them).
__device__ bool v2_issue(const World& w, const RankLocal& L, const EpFlags& f, Issuer& is, Put* pend,
                         const Put& p, int op, int wg, V2Mine& mine, bool track, int rank) {
  if (track && mine.nr >= V2_RNG - 1) {  // full: ring what is pending and wait for it now
    if (!v2_post(w, L, f, is, pend, op, wg, mine, true)) return false;
    if (!v2_flush_mine(w, L, is, mine, rank)) return false;
  }
  const unsigned g0 = is.groups;
  const int np0 = is.npend;
  if (!issue(w, L, f, is, pend, p, op, wg)) return false;
  if (track && is.groups != g0) v2_track(mine, is.last_slot, np0 + 1 - is.npend);
  return true;
}

// How a run makes its tails / signals safe on SRD (see the file comment).
struct V2Mode {
  bool hybrid, proxy, imm, ordered;
  bool tails;   // hybrid streams publish tails
  bool flush;   // a tail waits for the warp's own send completions
  bool counting;  // forward warps count write-with-immediate receive completions
};
__device__ __forceinline__ V2Mode v2_mode(const EpFlags& f, const V2Run& vr) {
  V2Mode m;
  m.hybrid = vr.proto == V2_HYBRID;
  m.proxy = f.proxy != 0;
  m.imm = f.imm_counting != 0 && !m.proxy;
  m.ordered = f.ordered_unsafe != 0;
  m.tails = m.hybrid && !m.imm;
  m.flush = m.tails && !m.proxy && !m.ordered;
  m.counting = m.hybrid && (m.proxy || m.imm);
  return m;
}

// ---------------------------------------------------------------- dispatch
// 1. layout: slot of every token at every destination rank (token order), tokens per
// rank and per (channel, node) stream.
__device__ void v2_layout(const World& w, const V2World& v, const V2Rank& B, const RankLocal& L,
                          const V2Ctx& x) {
  const int lane = lane_id(), T = w.T, K = w.K, R = w.num_ranks;
  for (int d = x.gw; d < R; d += x.W) {
    int base = 0;
    for (int t0 = 0; t0 < T; t0 += 32) {
      const int t = t0 + lane;
      bool hit = false;
      if (t < T)
        for (int k = 0; k < K; ++k) hit |= L.topk[t * K + k] / w.E_local == d;
      const unsigned m = __ballot_sync(0xffffffffu, hit);
      if (t < T) B.slot[t * R + d] = hit ? base + __popc(m & ((1u << lane) - 1u)) : -1;
      base += __popc(m);
    }
    if (lane == 0) B.cnt[d] = base;
  }
  for (int c = x.gw; c < v.C; c += x.W) {
    if (lane < v.N) {
      int n = 0;
      for (int t = c; t < T; t += v.C) {
        bool hit = false;
        for (int k = 0; k < K; ++k) hit |= L.topk[t * K + k] / w.E_local / v.P == lane;
        n += hit ? 1 : 0;
      }
      B.socnt[c * v.N + lane] = n;
    }
  }
}

// 2. notify. Hybrid: one write per remote node (stream counts + that node's ranks' counts,
// u32 words tagged with the epoch, valid word by word), NVLink stores on the own node, then
// the relay of each remote source's counts to this node's ranks. Direct: one 8-byte write per
// remote rank, NVLink stores on the own node.
__device__ bool v2_notify(const World& w, const V2World& v, const EpFlags& f, const V2Mode& md,
                          const V2Ctx& x, Put* pend, unsigned epoch) {
  const RankLocal& L = w.local[x.lr];
  const V2Rank& B = v.ranks[x.rank];
  const int lane = lane_id(), P = v.P, R = w.num_ranks;
  const int wg = x.rank * 1024 + x.gw;
  EpCtx e = v2_issuer_ctx(f, x, 0, v.C);
  Issuer is;
  setup_issuer(w, f, e, is, true);
  bool ok = true;
  const unsigned tag16 = (epoch & 0xffffu) << 16;
  if (md.hybrid) {
    for (int m = 0; m < v.N && ok; ++m) {
      if (m == x.node) continue;
      unsigned* src = B.notify_src + (size_t)m * v.NW;
      for (int k = lane; k < v.NW; k += 32) {
        int val = 0;
        if (k < v.C) val = B.socnt[k * v.N + m];
        else if (k < v.C + P) val = B.cnt[m * P + (k - v.C)];
        src[k] = tag16 | ((unsigned)val & 0xffffu);
      }
      __syncwarp();
      Put p;
      p.laddr = (unsigned long long)src;
      p.raddr = (unsigned long long)(v.ranks[m * P + x.loc].so_notify + (size_t)x.node * v.NW);
      p.len = (unsigned)v.NW * 4u;
      p.imm = 0;
      p.dest = (unsigned short)(m * P + x.loc);
      p.dqp = 0;
      p.has_imm = 0;
      ok = issue(w, L, f, is, pend, p, 0, wg);
    }
  } else {
    for (int d = 0; d < R && ok; ++d) {
      if (d / P == x.node) continue;
      if (lane == 0) B.sig_src[d] = v2_tag(epoch, (unsigned)B.cnt[d]);
      __syncwarp();
      Put p;
      p.laddr = (unsigned long long)(B.sig_src + d);
      p.raddr = (unsigned long long)(v.ranks[d].expect + x.rank);
      p.len = 8;
      p.imm = 0;
      p.dest = (unsigned short)d;
      p.dqp = 0;
      p.has_imm = 0;
      ok = issue(w, L, f, is, pend, p, 0, wg);
    }
  }
  if (ok) ok = post_group(w, L, f, is, pend, 0, wg, true);
  flush_stats(w, is);
  if (!ok) return false;
  if (lane < P) st_release64(v.ranks[x.node * P + lane].expect + x.rank,
                             v2_tag(epoch, (unsigned)B.cnt[x.node * P + lane]));
  if (!md.hybrid) return true;
  for (int m = 0; m < v.N; ++m) {
    if (m == x.node) continue;
    const unsigned* q = B.so_notify + (size_t)m * v.NW;
    const unsigned long long t0 = gtime();
    for (int k = lane; k < v.NW; k += 32) {
      unsigned val;
      while (((val = ld_acq32(q + k)) >> 16) != (epoch & 0xffffu)) {
        if (timed_out(w, t0)) {
          raise_err(w, ERR_V2_NOTIFY, x.rank, m, val >> 16, epoch & 0xffffu, k);
          break;
        }
      }
    }
    __syncwarp();
    if (aborted(w)) return false;
    const int s = m * P + x.loc;  // the source whose counts these are
    for (int k = lane; k < v.C; k += 32) B.h_socnt[m * v.C + k] = (int)(__ldcg(q + k) & 0xffffu);
    if (lane < P)
      st_release64(v.ranks[x.node * P + lane].expect + s, v2_tag(epoch, __ldcg(q + v.C + lane) & 0xffffu));
  }
  return true;
}

// The token message: FP8 payload, scales, then the metadata (epoch, stamp, token, top-k
// experts, the token's slot at every rank).
__device__ void v2_pack(const World& w, const V2Rank& B, const RankLocal& L, int rank, int t,
                        unsigned epoch, uint8_t* msg) {
  const int lane = lane_id(), H = w.H, K = w.K, R = w.num_ranks;
  const uint4* src = reinterpret_cast<const uint4*>(L.x_fp8 + (size_t)t * H);
  uint4* dst = reinterpret_cast<uint4*>(msg);
  for (int i = lane; i < H / 16; i += 32) dst[i] = src[i];
  const float* sc = L.x_scales + (size_t)t * (H / 128);
  float* dsc = reinterpret_cast<float*>(msg + H);
  for (int i = lane; i < H / 128; i += 32) dsc[i] = sc[i];
  int* meta = reinterpret_cast<int*>(msg + H + (H / 128) * 4);
  if (lane < M_WORDS) {
    unsigned val = 0;
    if (lane == M_EPOCH) val = epoch;
    else if (lane == M_STAMP) val = (unsigned)(STAMP_MAGIC | rank);
    else if (lane == M_TOKEN) val = (unsigned)t;
    else if (lane >= M_TOPK && lane < M_TOPK + 4) {
      const int k0 = 2 * (lane - M_TOPK);
      const unsigned a = k0 < K ? (unsigned)L.topk[t * K + k0] & 0xffffu : 0xffffu;
      const unsigned b = k0 + 1 < K ? (unsigned)L.topk[t * K + k0 + 1] & 0xffffu : 0xffffu;
      val = a | (b << 16);
    } else if (lane >= M_SLOT && lane < M_SLOT + 8) {
      const int d0 = 2 * (lane - M_SLOT);
      const int sa = d0 < R ? B.slot[t * R + d0] : -1, sb = d0 + 1 < R ? B.slot[t * R + d0 + 1] : -1;
      val = (sa < 0 ? 0xffffu : (unsigned)sa) | ((sb < 0 ? 0xffffu : (unsigned)sb) << 16);
    }
    meta[lane] = (int)val;
  }
  __syncwarp();
}

// NVLink (or same-GPU) stores of a token to the ranks in `ranks` (bit d: rank d), then one
// arrival count each.
__device__ void v2_store_tokens(const World& w, const V2World& v, const V2Rank& B, int src_rank,
                                const uint8_t* msg, unsigned ranks, int t) {
  for (unsigned m = ranks; m; m &= m - 1) {
    const int d = __ffs(m) - 1;
    const int slot = B.slot[t * w.num_ranks + d];
    v2_copy(v.ranks[d].final_x + ((size_t)src_rank * w.T + slot) * DMSG, msg, DMSG);
  }
  v2_publish_fence();
  if (lane_id() == 0)
    for (unsigned m = ranks; m; m &= m - 1) atomicAdd_system(v.ranks[__ffs(m) - 1].arrived + src_rank, 1u);
  __syncwarp();
}

// A tail of stream (this rank's node, channel c) to node m: `value` writes so far.
__device__ bool v2_tail(const World& w, const V2World& v, const EpFlags& f, const V2Mode& md,
                        const V2Ctx& x, Issuer& is, Put* pend, V2Mine& mine, int m, unsigned value,
                        bool finish, int k, unsigned epoch) {
  const RankLocal& L = w.local[x.lr];
  const V2Rank& B = v.ranks[x.rank];
  const int wg = x.rank * 1024 + x.gw;
  if (md.flush) {  // flush-then-signal: this warp's own writes completed
    if (!v2_post(w, L, f, is, pend, 0, wg, mine, true)) return false;
    if (!v2_flush_mine(w, L, is, mine, x.rank)) return false;
  }
  unsigned long long* word = B.tail_src + ((size_t)(x.c * v.N + m) * v.tails + (k < v.tails ? k : v.tails - 1));
  if (lane_id() == 0) *word = v2_tag(epoch, (finish ? 0x80000000u : 0u) | value);
  __syncwarp();
  Put p;
  p.laddr = (unsigned long long)word;
  p.raddr = (unsigned long long)(v.ranks[m * v.P + x.loc].so_tail + (size_t)x.node * v.C + x.c);
  p.len = 8;
  p.imm = 0x80000000u | ((unsigned)x.node << 16) | (value & 0xffffu);
  p.dest = (unsigned short)(m * v.P + x.loc);
  p.dqp = (unsigned short)x.c;
  p.has_imm = md.proxy ? 1u : 0u;
  if (!v2_issue(w, L, f, is, pend, p, 0, wg, mine, md.flush, x.rank)) return false;
  return v2_post(w, L, f, is, pend, 0, wg, mine, md.flush);  // a signal is rung at once
}

// 3. scale-out warp (hybrid: once per node; direct: once per rank).
__device__ bool v2_scaleout(const World& w, const V2World& v, const EpFlags& f, const V2Run& vr,
                            const V2Mode& md, const V2Ctx& x, Put* pend, V2Mine& mine, unsigned epoch) {
  const RankLocal& L = w.local[x.lr];
  const V2Rank& B = v.ranks[x.rank];
  const int lane = lane_id(), T = w.T, K = w.K, P = v.P, R = w.num_ranks;
  const int wg = x.rank * 1024 + x.gw;
  EpCtx e = v2_issuer_ctx(f, x, x.c, v.C);
  Issuer is;
  setup_issuer(w, f, e, is, false);
  unsigned sent = 0, ntail = 0;  // lane m: writes and tails to node m
  const unsigned own = ((1u << P) - 1u) << (x.node * P);  // ranks of this node
  const bool data_imm = md.proxy || md.imm;
  bool ok = true;
  for (int t = x.c; t < T && ok; t += v.C) {
    uint8_t* msg = L.send_buf + (size_t)t * DMSG;
    v2_pack(w, B, L, x.rank, t, epoch, msg);
    unsigned rbits = 0;
    if (lane < K) rbits = 1u << (L.topk[t * K + lane] / w.E_local);
    const unsigned ranks = __reduce_or_sync(0xffffffffu, rbits);  // destination ranks
    if (ranks & own) v2_store_tokens(w, v, B, x.rank, msg, ranks & own, t);
    if (md.hybrid) {
      unsigned nodes = 0;
      for (int m = 0; m < v.N; ++m)
        if (m != x.node && (ranks >> (m * P)) & ((1u << P) - 1u)) nodes |= 1u << m;
      for (unsigned nm = nodes; nm && ok; nm &= nm - 1) {
        const int m = __ffs(nm) - 1;
        const unsigned seq = __shfl_sync(0xffffffffu, sent, m);
        Put p;
        p.laddr = (unsigned long long)msg;
        p.raddr = (unsigned long long)(v.ranks[m * P + x.loc].so_recv +
                                       ((size_t)(x.node * v.C + x.c) * v.S + seq) * DMSG);
        p.len = DMSG;
        p.imm = ((unsigned)x.node << 16) | (seq & 0xffffu);
        p.dest = (unsigned short)(m * P + x.loc);
        p.dqp = (unsigned short)x.c;
        p.has_imm = data_imm ? 1u : 0u;
        ok = v2_issue(w, L, f, is, pend, p, 0, wg, mine, md.flush, x.rank);
        if (lane == m) ++sent;
        if (ok && md.tails && (seq + 1u) % (unsigned)vr.interval == 0u) {
          const int k = (int)__shfl_sync(0xffffffffu, ntail, m);
          if (lane == m) ++ntail;
          ok = v2_tail(w, v, f, md, x, is, pend, mine, m, seq + 1u, false, k, epoch);
        }
      }
    } else {
      for (unsigned rm = ranks & ~own; rm && ok; rm &= rm - 1) {
        const int d = __ffs(rm) - 1;
        Put p;
        p.laddr = (unsigned long long)msg;
        p.raddr = (unsigned long long)(v.ranks[d].final_x + ((size_t)x.rank * T + B.slot[t * R + d]) * DMSG);
        p.len = DMSG;
        p.imm = 0;
        p.dest = (unsigned short)d;
        p.dqp = (unsigned short)x.c;
        p.has_imm = 0;
        ok = issue(w, L, f, is, pend, p, 0, wg);
      }
    }
  }
  // the finish words: a final tail per remote node unless the last interval ended there
  for (int m = 0; m < v.N && ok && md.tails; ++m) {
    if (m == x.node) continue;
    const unsigned s = __shfl_sync(0xffffffffu, sent, m);
    const int k = (int)__shfl_sync(0xffffffffu, ntail, m);
    if (s % (unsigned)vr.interval != 0u || s == 0u) ok = v2_tail(w, v, f, md, x, is, pend, mine, m, s, true, k, epoch);
  }
  if (ok) ok = v2_post(w, L, f, is, pend, 0, wg, mine, md.flush);
  flush_stats(w, is);
  return ok;
}

// Forward one token of stream (ns, c), slot i, to this node's ranks that host its experts.
__device__ void v2_forward_token(const World& w, const V2World& v, const V2Ctx& x, const V2Rank& B,
                                 int ns, int c, int i, unsigned long long& bad) {
  const uint8_t* src = B.so_recv + ((size_t)(ns * v.C + c) * v.S + i) * DMSG;
  const int* m = v2_meta(w, src);
  const int s = ns * v.P + x.loc;
  unsigned hit = 0;
  const bool stamped = __ldcg(m + M_STAMP) == (STAMP_MAGIC | s);  // never landed: no routing to trust
  for (int j2 = 0; j2 < v.P && stamped; ++j2) {
    const int d = x.node * v.P + j2;
    const unsigned slot = v2_u16(m, M_SLOT, d);
    if (slot < (unsigned)w.T) {
      v2_copy(v.ranks[d].final_x + ((size_t)s * w.T + slot) * DMSG, src, DMSG);
      hit |= 1u << j2;
    }
  }
  if (hit == 0u) ++bad;  // a token on this node's stream must have a rank here
  v2_publish_fence();
  if (lane_id() == 0)
    for (unsigned h = hit; h; h &= h - 1) atomicAdd_system(v.ranks[x.node * v.P + __ffs(h) - 1].arrived + s, 1u);
  __syncwarp();
}

// 4. forward warp j: lane p holds stream p = (source node, channel c = j + F * i).
__device__ bool v2_forward(const World& w, const V2World& v, const EpFlags& f, const V2Run& vr,
                           const V2Mode& md, const V2Ctx& x, unsigned epoch) {
  const RankLocal& L = w.local[x.lr];
  const V2Rank& B = v.ranks[x.rank];
  const int lane = lane_id();
  const bool prof = f.prof_period > 0;
  const int wg = x.rank * 1024 + x.gw;
  const int nch = x.j < v.C ? (v.C - x.j + v.F - 1) / v.F : 0;  // channels of this warp
  const int npairs = (v.N - 1) * nch;
  const unsigned I = (unsigned)vr.interval;
  int ns = -1, c = -1, want = 0, done = 0, tgot = 0, twant = 0;
  unsigned tmax = 0, acc = 0;
  // counting: bit i = write i of the stream arrived. Receive completions come in any order
  // (SRD, retransmits), so only the prefix of arrived writes may be forwarded, never a count.
  unsigned long long got = 0;
  if (lane < npairs) {
    const int a = lane / nch;
    ns = a < x.node ? a : a + 1;
    c = x.j + v.F * (lane % nch);
    want = B.h_socnt[ns * v.C + c];
    twant = (int)((unsigned)want / I) + (((unsigned)want % I) != 0u || want == 0 ? 1 : 0);
  }
  unsigned head = 0;  // lane i < nch: consumer index of RX CQ (j + F * i)
  if (md.counting && lane < nch) head = L.rx_head[x.j + v.F * lane];
  unsigned long long bad = 0;
  unsigned long long t0 = gtime(), idle0 = t0;
  bool idle = false;
  while (true) {
    const bool fin = lane >= npairs || (done == want && (!md.proxy || tgot == twant));
    if (__all_sync(0xffffffffu, fin)) break;
    bool moved = false;
    int avail = done;
    if (md.counting) {
      for (int ci = 0; ci < nch; ++ci) {
        const int cc = x.j + v.F * ci;
        const lever_efa_nic_layout* rq = L.rx + cc;
        unsigned h = __shfl_sync(0xffffffffu, head, ci);
        for (int guard = 0; guard < 64; ++guard) {
          uint4 q = make_uint4(0, 0, 0, 0);
          if (lane == 0) q = ld_vol_v4(cqe_at(rq, h));
          const unsigned fl = __shfl_sync(0xffffffffu, lever_efa_cqe_flags(q.x), 0);
          const unsigned im = __shfl_sync(0xffffffffu, q.w, 0);
          if (!lever_efa_cqe_is_new(rq, fl, h)) break;
          ++h;
          moved = true;
          if (c == cc && ns == (int)((im >> 16) & 0x7fffu)) {
            if (im >> 31) {
              tmax = max(tmax, im & 0xffffu);
              ++tgot;
            } else {
              got |= 1ull << ((im & 0xffffu) & 63u);
            }
          }
        }
        if (lane == ci) head = h;
      }
      __threadfence_system();  // the counted writes' data before the loads below
      const unsigned prefix = ~got == 0ull ? 64u : (unsigned)(__ffsll((long long)~got) - 1);
      if (md.imm) acc = prefix;
      else if (prefix >= tmax) acc = tmax;  // a tail counts once every write before it arrived
      avail = (int)acc;
    } else if (lane < npairs) {
      const unsigned long long tv = ld_acq64(B.so_tail + (size_t)ns * v.C + c);
      if ((tv >> 32) == (unsigned long long)epoch) avail = (int)(tv & 0x7fffffffu);
    }
    if (avail > want) avail = want;
    unsigned prog = __ballot_sync(0xffffffffu, lane < npairs && avail > done);
    if (prog && idle && prof && lane == 0)
      prof_row(w, L, prof_hdr(PK_PHASE, 0, x.rank, wg), PH_POLL, idle0, gtime(), 0, 0, 0, 0);
    const unsigned long long tf = prog && prof ? gtime() : 0ull;
    while (prog) {
      const int p = __ffs(prog) - 1;
      prog &= prog - 1;
      const int pns = __shfl_sync(0xffffffffu, ns, p), pc = __shfl_sync(0xffffffffu, c, p);
      const int from = __shfl_sync(0xffffffffu, done, p), to = __shfl_sync(0xffffffffu, avail, p);
      for (int i = from; i < to; ++i) v2_forward_token(w, v, x, B, pns, pc, i, bad);
      if (lane == p) done = to;
      moved = true;
    }
    if (tf && lane == 0) prof_row(w, L, prof_hdr(PK_PHASE, 0, x.rank, wg), PH_FORWARD, tf, gtime(), 0, 0, 0, 0);
    if (moved) {
      t0 = gtime();
      idle = false;
      continue;
    }
    if (!idle) {
      idle = true;
      idle0 = gtime();
    }
    bool to = false;
    if (lane == 0) to = timed_out(w, t0);
    if (__shfl_sync(0xffffffffu, to, 0)) {
      const int sb = __ffs(__ballot_sync(0xffffffffu, !fin)) - 1;
      const int d2 = __shfl_sync(0xffffffffu, done, sb < 0 ? 0 : sb);
      const int w2 = __shfl_sync(0xffffffffu, want, sb < 0 ? 0 : sb);
      const int n2 = __shfl_sync(0xffffffffu, ns, sb < 0 ? 0 : sb), c2 = __shfl_sync(0xffffffffu, c, sb < 0 ? 0 : sb);
      if (lane == 0) raise_err(w, ERR_V2_TAIL, x.rank, n2 * 256 + c2, d2, w2, x.j);
      return false;
    }
  }
  if (md.counting && lane < nch) L.rx_head[x.j + v.F * lane] = head;
  for (int o = 16; o; o >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, o);
  if (lane == 0 && bad) atomicAdd(&w.stats[ST_STAMP_BAD_DISPATCH], bad);
  return true;
}

// 5. the rank's tokens: lanes = sources. Counts from the notify (or the handle), arrivals
// counted by NVLink stores (own node, forwarders) or, in direct mode from remote ranks, the
// source's barrier signal with its count.
__device__ bool v2_final_wait(const World& w, const V2World& v, const EpFlags& f, const V2Mode& md,
                              const V2Ctx& x, unsigned epoch) {
  const V2Rank& B = v.ranks[x.rank];
  const int s = lane_id();
  bool ok = true;
  if (s < w.num_ranks) {
    int cnt;
    if (f.cached) {
      cnt = B.h_expect[s];
    } else {
      ok = v2_wait64(w, B.expect + s, v2_tag(epoch, 0), ERR_V2_NOTIFY, x.rank, s, -1);
      cnt = (int)(__ldcg(B.expect + s) & 0xffffffffu);
      B.h_expect[s] = cnt;
    }
    if (ok && !md.hybrid && s / v.P != x.node) {
      ok = v2_wait64(w, B.sig + s, v2_tag(epoch, 0), ERR_V2_ARRIVE, x.rank, s, 1);
      const unsigned got = (unsigned)(__ldcg(B.sig + s) & 0xffffffffu);
      if (ok && got != (unsigned)cnt) {
        raise_err(w, ERR_V2_SIGNAL, x.rank, s, got, cnt, 0);
        ok = false;
      }
    } else if (ok) {
      const unsigned target = B.arr_base[s] + (unsigned)cnt;
      ok = v2_wait32(w, B.arrived + s, target, ERR_V2_ARRIVE, x.rank, s, 0);
      B.arr_base[s] = target;
    }
    B.out_cnt[s] = cnt;
  }
  return __all_sync(0xffffffffu, ok);
}

// The rank's outputs: token index per (source, slot), stamps checked on every message.
__device__ void v2_receive(const World& w, const V2World& v, const V2Ctx& x, unsigned epoch) {
  const V2Rank& B = v.ranks[x.rank];
  const int T = w.T;
  unsigned long long bad = 0;
  for (int s = 0; s < w.num_ranks; ++s) {
    const int cnt = B.out_cnt[s];
    for (int jj = x.gw * 32 + lane_id(); jj < cnt; jj += x.W * 32) {
      const int* m = v2_meta(w, B.final_x + ((size_t)s * T + jj) * DMSG);
      const int tok = __ldcg(m + M_TOKEN);
      if (__ldcg(m + M_EPOCH) != (int)epoch || __ldcg(m + M_STAMP) != (STAMP_MAGIC | s) || tok < 0 || tok >= T ||
          v2_u16(m, M_SLOT, x.rank) != (unsigned)jj)
        ++bad;
      B.out_src[s * T + jj] = tok >= 0 && tok < T ? tok : -1;
    }
  }
  for (int o = 16; o; o >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, o);
  if (lane_id() == 0 && bad) atomicAdd(&w.stats[ST_STAMP_BAD_DISPATCH], bad);
}

// The closing NVLink barrier among the ranks of a node.
__device__ bool v2_node_barrier(const World& w, const V2World& v, const V2Ctx& x, unsigned epoch, int op) {
  const int j = lane_id();
  const unsigned long long val = v2_tag(epoch, (unsigned)op + 1u);
  __threadfence_system();
  if (j < v.P && j != x.loc) st_release64(v.ranks[x.node * v.P + j].nbar + x.loc, val);
  bool ok = true;
  if (j < v.P && j != x.loc) ok = v2_wait64(w, v.ranks[x.rank].nbar + j, val, ERR_V2_NODE_BAR, x.rank, j, op);
  return __all_sync(0xffffffffu, ok);
}

// Signals after a flush: direct dispatch (writes per remote rank), combine (rows per remote
// source: hybrid from the forwarder to each node's same-index rank, direct to every rank).
__device__ bool v2_signals(const World& w, const V2World& v, const EpFlags& f, const V2Mode& md,
                           const V2Ctx& x, Put* pend, unsigned epoch, int op) {
  const RankLocal& L = w.local[x.lr];
  const V2Rank& B = v.ranks[x.rank];
  const int wg = x.rank * 1024 + x.gw, P = v.P;
  EpCtx e = v2_issuer_ctx(f, x, 0, v.C);
  Issuer is;
  setup_issuer(w, f, e, is, true);
  bool ok = true;
  for (int d = 0; d < w.num_ranks && ok; ++d) {
    if (d / P == x.node || (md.hybrid && d % P != x.loc)) continue;
    unsigned n = 0;
    if (op == 0) {
      n = (unsigned)B.cnt[d];
    } else if (md.hybrid) {
      for (int c = 0; c < v.C; ++c) n += (unsigned)B.h_socnt[(d / P) * v.C + c];
    } else {
      n = (unsigned)B.out_cnt[d];
    }
    unsigned long long* word = B.sig_src + w.num_ranks + d;
    if (lane_id() == 0) *word = v2_tag(epoch, n);
    __syncwarp();
    Put p;
    p.laddr = (unsigned long long)word;
    p.raddr = (unsigned long long)((op == 0 ? v.ranks[d].sig : v.ranks[d].comb_sig) + x.rank);
    p.len = 8;
    p.imm = 0;
    p.dest = (unsigned short)d;
    p.dqp = 0;
    p.has_imm = 0;
    ok = issue(w, L, f, is, pend, p, op, wg);
  }
  if (ok) ok = post_group(w, L, f, is, pend, op, wg, true);
  flush_stats(w, is);
  return ok;
}

__device__ void v2_dispatch(const World& w, const V2World& v, const EpFlags& f, const V2Run& vr,
                            const V2Ctx& x, Put* pend, V2Mine& mine, unsigned epoch) {
  const RankLocal& L = w.local[x.lr];
  const V2Rank& B = v.ranks[x.rank];
  const V2Mode md = v2_mode(f, vr);
  const bool prof = f.prof_period > 0;
  const int wg = x.rank * 1024 + x.gw;
  const EpCtx eall = v2_issuer_ctx(f, x, x.gw, x.W);
  PhaseTimer ph;
  int nbar = 0;
  if (!f.cached) {
    ph.begin(prof);
    v2_layout(w, v, B, L, x);
    ph.end(w, L, PH_LAYOUT, 0, x.rank, wg);
    if (!v2_barrier(w, L, nbar, x)) return;
    ph.begin(prof);
    if (x.gw == 0 && !v2_notify(w, v, f, md, x, pend, epoch)) return;
    ph.end(w, L, PH_SIGNAL, 0, x.rank, wg);
    if (!v2_barrier(w, L, nbar, x)) return;
  }
  bool ok = true;
  if (x.so) ok = v2_scaleout(w, v, f, vr, md, x, pend, mine, epoch);
  else if (x.fwd && md.hybrid) ok = v2_forward(w, v, f, vr, md, x, epoch);
  if (!ok) return;
  if (!md.hybrid) {  // the barrier: flush every context, rank sync, a signal per remote peer
    ph.begin(prof);
    if (md.ordered ? !v2_barrier(w, L, nbar, x) : !v2_flush_rank(w, L, f, eall, nbar, x)) return;
    ph.end(w, L, PH_FLUSH, 0, x.rank, wg);
    if (x.gw == 0 && !v2_signals(w, v, f, md, x, pend, epoch, 0)) return;
  }
  ph.begin(prof);
  if (x.gw == 0 && !v2_final_wait(w, v, f, md, x, epoch)) return;
  ph.end(w, L, PH_POLL, 0, x.rank, wg);
  if (!v2_barrier(w, L, nbar, x)) return;
  ph.begin(prof);
  v2_receive(w, v, x, epoch);
  ph.end(w, L, PH_RECV, 0, x.rank, wg);
  ph.begin(prof);
  if (!v2_flush_rank(w, L, f, eall, nbar, x)) return;
  if (md.hybrid && x.gw == 0) v2_node_barrier(w, v, x, epoch, 0);
  ph.end(w, L, PH_DRAIN, 0, x.rank, wg);
}

// ---------------------------------------------------------------- combine
__device__ __forceinline__ void v2_row_stamps(uint8_t* row, unsigned epoch, int rank, int t, int aux) {
  const int lane = lane_id();
  if (lane < 4) {
    const int val = lane == 0 ? (int)epoch : lane == 1 ? (STAMP_MAGIC | rank) : lane == 2 ? t : aux;
    reinterpret_cast<int*>(row)[lane] = val;
    reinterpret_cast<int*>(row + CMSG - 48)[lane] = val;
  }
  __syncwarp();
}
// 1 when a row's head and trailer stamps both say (epoch, sender, token).
__device__ __forceinline__ unsigned v2_row_bad(const uint8_t* row, unsigned epoch, int sender, int t) {
  const int lane = lane_id();
  bool bad = false;
  if (lane < 3) {
    const int want = lane == 0 ? (int)epoch : lane == 1 ? (STAMP_MAGIC | sender) : t;
    bad = __ldcg(reinterpret_cast<const int*>(row) + lane) != want ||
          __ldcg(reinterpret_cast<const int*>(row + CMSG - 48) + lane) != want;
  }
  return __any_sync(0xffffffffu, bad) ? 1u : 0u;
}
// Sum the BF16 rows rows[i] (n of them, in order) in float32 and round once to BF16 into out.
// Four 16-byte columns per lane at once: the loads of every row are in flight together.
__device__ void v2_reduce_rows(const World& w, const uint8_t* const* rows, int n, uint16_t* out) {
  constexpr int U = 4;
  const int nv = w.H / 8;
  for (int i0 = lane_id(); i0 < nv; i0 += 32 * U) {
    float acc[U][8];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[u][k] = 0.f;
    for (int r = 0; r < n; ++r) {
      uint4 q[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i0 + 32 * u < nv) q[u] = __ldcg(reinterpret_cast<const uint4*>(rows[r] + 16) + i0 + 32 * u);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i0 + 32 * u >= nv) continue;
        const uint16_t* hv = reinterpret_cast<const uint16_t*>(&q[u]);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[u][k] = __fadd_rn(acc[u][k], bf16_to_f(hv[k]));
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i0 + 32 * u >= nv) continue;
      uint4 o;
      uint16_t* ov = reinterpret_cast<uint16_t*>(&o);
#pragma unroll
      for (int k = 0; k < 8; ++k) ov[k] = f_to_bf16_rn(acc[u][k]);
      reinterpret_cast<uint4*>(out)[i0 + 32 * u] = o;
    }
  }
  __syncwarp();
}

// Ranks whose rows the source of token t (top-k experts `topk`) reduces: hybrid, each remote
// node's same-index rank (its forwarder) and the own node's expert ranks; direct, every
// expert rank.
__device__ __forceinline__ unsigned v2_contributors(const World& w, const V2World& v, const V2Mode& md,
                                                    const int* topk, int node, int loc) {
  unsigned b = 0;
  if (lane_id() < w.K) {
    const int d = topk[lane_id()] / w.E_local;
    b = (!md.hybrid || d / v.P == node) ? 1u << d : 1u << ((d / v.P) * v.P + loc);
  }
  return __reduce_or_sync(0xffffffffu, b);
}

// 1. expert side (scale-out warps): one row per received token, to the forwarder of its
// source (hybrid, remote source), to the source over NVLink (own node), or an RDMA write to
// the source (direct, remote source).
__device__ bool v2_comb_expert(const World& w, const V2World& v, const EpFlags& f, const V2Mode& md,
                               const V2Ctx& x, Put* pend, unsigned epoch) {
  const RankLocal& L = w.local[x.lr];
  const V2Rank& B = v.ranks[x.rank];
  const int T = w.T, R = w.num_ranks, P = v.P;
  const int wg = x.rank * 1024 + x.gw;
  EpCtx e = v2_issuer_ctx(f, x, x.c, v.C);
  Issuer is;
  setup_issuer(w, f, e, is, false);
  bool ok = true;
  for (int s = 0; s < R && ok; ++s) {
    const int cnt = B.out_cnt[s];
    const int ns = s / P;
    for (int jj = x.c; jj < cnt && ok; jj += v.C) {
      const int t = B.out_src[s * T + jj];
      if (t < 0 || t >= T) continue;  // a token the dispatch gate already counted as bad
      uint8_t* row = B.comb_in + ((size_t)s * T + jj) * CMSG;
      v2_row_stamps(row, epoch, x.rank, t, jj);
      if (ns != x.node && !md.hybrid) {
        Put p;
        p.laddr = (unsigned long long)row;
        p.raddr = (unsigned long long)(v.ranks[s].comb_rows + ((size_t)t * R + x.rank) * CMSG);
        p.len = CMSG;
        p.imm = (unsigned)t;
        p.dest = (unsigned short)s;
        p.dqp = (unsigned short)(t % v.C);
        p.has_imm = 0;
        ok = issue(w, L, f, is, pend, p, 1, wg);
        continue;
      }
      uint8_t* dst;
      unsigned long long* flag;
      if (ns != x.node) {  // hybrid: the forwarder of s on this node
        const int fr = x.node * P + s % P;
        dst = v.ranks[fr].part + (((size_t)s * T + t) * P + x.loc) * CMSG;
        flag = v.ranks[fr].part_flag + ((size_t)s * T + t) * P + x.loc;
      } else {
        dst = v.ranks[s].comb_rows + ((size_t)t * R + x.rank) * CMSG;
        flag = v.ranks[s].comb_flag + (size_t)t * R + x.rank;
      }
      v2_copy(dst, row, CMSG);
      v2_publish_fence();
      if (lane_id() == 0) st_release64(flag, v2_tag(epoch, 1));
      __syncwarp();
    }
  }
  if (ok) ok = post_group(w, L, f, is, pend, 1, wg, true);
  flush_stats(w, is);
  return ok;
}

// 2. forward warps (hybrid): per token of its dispatch streams, wait for the node's rows,
// reduce them (float32, local-rank order, one BF16 rounding) and write one row to the source.
__device__ bool v2_comb_forward(const World& w, const V2World& v, const EpFlags& f, const V2Mode& md,
                                const V2Ctx& x, Put* pend, unsigned epoch) {
  const RankLocal& L = w.local[x.lr];
  const V2Rank& B = v.ranks[x.rank];
  const int T = w.T, R = w.num_ranks, P = v.P, lane = lane_id();
  const int wg = x.rank * 1024 + x.gw;
  const bool prof = f.prof_period > 0;
  EpCtx e = v2_issuer_ctx(f, x, x.j, v.F);
  Issuer is;
  setup_issuer(w, f, e, is, false);
  bool ok = true;
  unsigned long long bad = 0;
  PhaseTimer ph;
  for (int ns = 0; ns < v.N && ok; ++ns) {
    if (ns == x.node) continue;
    const int s = ns * P + x.loc;
    for (int c = x.j; c < v.C && ok; c += v.F) {
      const int want = B.h_socnt[ns * v.C + c];
      for (int i = 0; i < want && ok; ++i) {
        const int* m = v2_meta(w, B.so_recv + ((size_t)(ns * v.C + c) * v.S + i) * DMSG);
        const int t = __ldcg(m + M_TOKEN);
        if (t < 0 || t >= T) {
          raise_err(w, ERR_V2_PART, x.rank, s, t, T, -1);
          return false;
        }
        unsigned hit = 0;
        for (int j2 = 0; j2 < P; ++j2)
          if (v2_u16(m, M_SLOT, x.node * P + j2) < (unsigned)T) hit |= 1u << j2;
        ph.begin(prof);
        bool okw = true;
        if (lane < P && ((hit >> lane) & 1u))
          okw = v2_wait64(w, B.part_flag + ((size_t)s * T + t) * P + lane, v2_tag(epoch, 1), ERR_V2_PART,
                          x.rank, s, t);
        if (!__all_sync(0xffffffffu, okw)) return false;
        __threadfence_system();
        ph.end(w, L, PH_POLL, 1, x.rank, wg);
        ph.begin(prof);
        const uint8_t* rows[V2_MAX_RANKS];
        int n = 0;
        for (int j2 = 0; j2 < P; ++j2)
          if ((hit >> j2) & 1u) {
            rows[n] = B.part + (((size_t)s * T + t) * P + j2) * CMSG;
            bad += v2_row_bad(rows[n], epoch, x.node * P + j2, t);
            ++n;
          }
        uint8_t* out = B.comb_send + ((size_t)s * T + t) * CMSG;
        v2_reduce_rows(w, rows, n, reinterpret_cast<uint16_t*>(out + 16));
        v2_row_stamps(out, epoch, x.rank, t, n);
        ph.end(w, L, PH_REDUCE, 1, x.rank, wg);
        Put p;
        p.laddr = (unsigned long long)out;
        p.raddr = (unsigned long long)(v.ranks[s].comb_rows + ((size_t)t * R + x.rank) * CMSG);
        p.len = CMSG;
        p.imm = (unsigned)t;
        p.dest = (unsigned short)s;
        p.dqp = (unsigned short)(t % v.C);
        p.has_imm = md.imm ? 1u : 0u;
        ok = issue(w, L, f, is, pend, p, 1, wg);
      }
    }
  }
  if (ok) ok = post_group(w, L, f, is, pend, 1, wg, true);
  flush_stats(w, is);
  for (int o = 16; o; o >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, o);
  if (lane == 0 && bad) atomicAdd(&w.stats[ST_STAMP_BAD_COMBINE], bad);
  return ok;
}

// 3. the source (scale-out warp c reduces tokens t = c mod C): remote rows proven by their
// signals (count checked) or counted receive completions (imm), NVLink rows by their flags.
__device__ bool v2_comb_reduce(const World& w, const V2World& v, const EpFlags& f, const V2Mode& md,
                               const V2Ctx& x, unsigned epoch) {
  const RankLocal& L = w.local[x.lr];
  const V2Rank& B = v.ranks[x.rank];
  const int T = w.T, R = w.num_ranks, K = w.K, H = w.H, lane = lane_id();
  const bool prof = f.prof_period > 0;
  const int wg = x.rank * 1024 + x.gw;
  const unsigned own = ((1u << v.P) - 1u) << (x.node * v.P);
  PhaseTimer ph;
  ph.begin(prof);
  if (md.imm) {
    int expect = 0;
    for (int t = x.c; t < T; t += v.C)
      expect += __popc(v2_contributors(w, v, md, L.topk + t * K, x.node, x.loc) & ~own);
    const lever_efa_nic_layout* rq = L.rx + x.c;
    unsigned head = L.rx_head[x.c];
    int got = 0;
    const unsigned long long t0 = gtime();
    while (got < expect) {
      uint4 q = make_uint4(0, 0, 0, 0);
      if (lane == 0) q = ld_vol_v4(cqe_at(rq, head));
      const unsigned fl = __shfl_sync(0xffffffffu, lever_efa_cqe_flags(q.x), 0);
      if (lever_efa_cqe_is_new(rq, fl, head)) {
        ++head;
        ++got;
      } else if (timed_out(w, t0)) {
        if (lane == 0) raise_err(w, ERR_V2_COMB, x.rank, -1 - x.c, got, expect, 2);
        return false;
      }
    }
    if (lane == 0) L.rx_head[x.c] = head;
    __threadfence_system();
  } else {
    // lane r: the rows rank r (remote) says it wrote to this rank; checked against the layout
    bool ok = true;
    if (lane < R && lane / v.P != x.node && (!md.hybrid || lane % v.P == x.loc)) {
      unsigned expect = 0;
      for (int t = 0; t < T; ++t) {
        bool hit = false;
        for (int k = 0; k < K; ++k) {
          const int d = L.topk[t * K + k] / w.E_local;
          hit |= md.hybrid ? d / v.P == lane / v.P : d == lane;
        }
        expect += hit ? 1u : 0u;
      }
      ok = v2_wait64(w, B.comb_sig + lane, v2_tag(epoch, 0), ERR_V2_COMB, x.rank, lane, 1);
      const unsigned got = (unsigned)(__ldcg(B.comb_sig + lane) & 0xffffffffu);
      if (ok && got != expect) {
        raise_err(w, ERR_V2_SIGNAL, x.rank, lane, got, expect, 1);
        ok = false;
      }
    }
    if (!__all_sync(0xffffffffu, ok)) return false;
  }
  ph.end(w, L, PH_POLL, 1, x.rank, wg);
  unsigned long long bad = 0;
  for (int t = x.c; t < T; t += v.C) {
    const unsigned cb = v2_contributors(w, v, md, L.topk + t * K, x.node, x.loc);
    ph.begin(prof);
    bool ok = true;
    if (lane < R && ((cb & own) >> lane) & 1u)
      ok = v2_wait64(w, B.comb_flag + (size_t)t * R + lane, v2_tag(epoch, 1), ERR_V2_COMB, x.rank, lane, t);
    if (!__all_sync(0xffffffffu, ok)) return false;
    __threadfence_system();
    ph.end(w, L, PH_POLL, 1, x.rank, wg);
    ph.begin(prof);
    const uint8_t* rows[V2_MAX_RANKS];
    int n = 0;
    for (unsigned b = cb; b; b &= b - 1) {
      const int r = __ffs(b) - 1;
      rows[n] = B.comb_rows + ((size_t)t * R + r) * CMSG;
      bad += v2_row_bad(rows[n], epoch, r, t);
      ++n;
    }
    v2_reduce_rows(w, rows, n, L.comb_out + (size_t)t * H);
    ph.end(w, L, PH_REDUCE, 1, x.rank, wg);
  }
  for (int o = 16; o; o >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, o);
  if (lane == 0 && bad) atomicAdd(&w.stats[ST_STAMP_BAD_COMBINE], bad);
  return true;
}

__device__ void v2_combine(const World& w, const V2World& v, const EpFlags& f, const V2Run& vr,
                           const V2Ctx& x, Put* pend, unsigned epoch) {
  const RankLocal& L = w.local[x.lr];
  const V2Mode md = v2_mode(f, vr);
  const bool prof = f.prof_period > 0;
  const int wg = x.rank * 1024 + x.gw;
  const EpCtx eall = v2_issuer_ctx(f, x, x.gw, x.W);
  PhaseTimer ph;
  int nbar = 0;
  bool ok = true;
  if (x.so) ok = v2_comb_expert(w, v, f, md, x, pend, epoch);
  else if (x.fwd && md.hybrid) ok = v2_comb_forward(w, v, f, md, x, pend, epoch);
  if (!ok) return;
  if (!md.imm) {  // rows proven by a signal after the flush (the negative test: no flush)
    ph.begin(prof);
    if (md.ordered ? !v2_barrier(w, L, nbar, x) : !v2_flush_rank(w, L, f, eall, nbar, x)) return;
    ph.end(w, L, PH_FLUSH, 1, x.rank, wg);
    ph.begin(prof);
    if (x.gw == 0 && !v2_signals(w, v, f, md, x, pend, epoch, 1)) return;
    ph.end(w, L, PH_SIGNAL, 1, x.rank, wg);
  }
  if (x.so && !v2_comb_reduce(w, v, f, md, x, epoch)) return;
  ph.begin(prof);
  if (!v2_flush_rank(w, L, f, eall, nbar, x)) return;
  if (md.hybrid && x.gw == 0) v2_node_barrier(w, v, x, epoch, 1);
  ph.end(w, L, PH_DRAIN, 1, x.rank, wg);
}

__global__ void __launch_bounds__(MAXW * 32, 1)
    v2_op_kernel(const __grid_constant__ World w, const __grid_constant__ V2World v, int op,
                 unsigned epoch, EpFlags f, V2Run vr) {
  __shared__ Put s_pend[MAXW][MAXG];
  __shared__ unsigned s_rs[MAXW][V2_RNG];
  __shared__ int s_rn[MAXW][V2_RNG];
  __shared__ NicShared s_nic;
  const int warp = threadIdx.x >> 5;
  const int n_ep_blocks = w.ranks_per_gpu * w.ep_blocks_per_rank;
  if ((int)blockIdx.x < n_ep_blocks) {
    V2Ctx x;
    x.lr = blockIdx.x / w.ep_blocks_per_rank;
    x.bi = blockIdx.x % w.ep_blocks_per_rank;
    x.rank = w.local[x.lr].rank;
    x.node = x.rank / v.P;
    x.loc = x.rank % v.P;
    x.warp = warp;
    x.gw = x.bi * w.ep_warps + warp;
    x.W = w.ep_blocks_per_rank * w.ep_warps;
    x.so = warp < v.so_warps;
    x.c = x.bi * v.so_warps + warp;
    x.fwd = !x.so && warp < v.so_warps + v.fwd_warps;
    x.j = x.bi * v.fwd_warps + (warp - v.so_warps);
    if (warp < w.ep_warps) {
      V2Mine mine{s_rs[warp], s_rn[warp], 0};
      if (op == 0) v2_dispatch(w, v, f, vr, x, s_pend[warp], mine, epoch);
      else v2_combine(w, v, f, vr, x, s_pend[warp], epoch);
    }
    ep_block_done(w);
  } else {
    nic_block(w, f, s_nic, (int)blockIdx.x - n_ep_blocks, n_ep_blocks, STAGE_V);
  }
}

}  // namespace

namespace emu_host {

int coop_max_blocks_v2(int device, int threads, int smem) {
  int per_sm = 0, sms = 0;
  cudaSetDevice(device);
  if (smem > 0) cudaFuncSetAttribute((const void*)v2_op_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v2_op_kernel, threads, smem) != cudaSuccess) return -1;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return per_sm * sms;
}

int launch_v2_op(const emu::World& w, const emu2::V2World& v, int op, unsigned epoch,
                 const emu::EpFlags& f, const emu2::V2Run& r, void* stream) {
  const int grid = w.ranks_per_gpu * w.ep_blocks_per_rank + w.nic_blocks;
  if (!warps_fit(w)) return -2;
  if (v.so_warps + v.fwd_warps != w.ep_warps || v.C < 1 || v.P < 1 || w.num_ranks > V2_MAX_RANKS) return -3;
  const int threads = 32 * (w.ep_warps > w.nic_warps ? w.ep_warps : w.nic_warps);
  World wc = w;
  V2World vc = v;
  EpFlags fc = f;
  V2Run rc = r;
  void* args[] = {(void*)&wc, (void*)&vc, (void*)&op, (void*)&epoch, (void*)&fc, (void*)&rc};
  if (w.fab.own_kernel && w.nic_blocks > 0) return launch_split((const void*)v2_op_kernel, w, args, f, stream);
  const int smem = stage_smem(w, (const void*)v2_op_kernel);
  return launch_coop((const void*)v2_op_kernel, w, grid, threads, args, smem, stream);
}

}  // namespace emu_host
