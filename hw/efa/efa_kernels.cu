// The EFA extension's GPU work: the cross-node start barrier and the GPU-posted primitives
// (see efa_kernels.h for why). One thread posts on one QP here, so the producer count
// needs no atomics; WQEs are built by wqe.h from the layout and the peer entry, written as
// eight 8-byte stores into the slot (a BAR-mapped LLQ: stores only, never read back), then
// a system fence, then the 32-bit doorbell store of the producer count (the provider's and
// NCCL GIN's order). CQEs are read as 16 bytes at the layout's stride; the phase bit says
// whether the entry is new (nic_layout.h lever_efa_cq_phase).
#include <cuda_runtime.h>

#include "../efa_io_defs.h"
#include "efa_kernels.h"
#include "wqe.h"

namespace efa_gpu {
namespace {

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void st_mmio64(void* p, unsigned long long v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_mmio32(void* p, unsigned v) {
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_vol16(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long ld_sys64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ void raise(uint32_t* err, uint32_t code, uint32_t a, uint32_t b, uint32_t c) {
  if (atomicCAS(err, 0u, code) == 0u) {
    err[1] = a;
    err[2] = b;
    err[3] = c;
    __threadfence_system();
  }
}

// The WQE for write wr at producer count pc: eight stores into its slot, sixteen for a
// 128-byte WQE (no doorbell). Where the layout takes inline writes (v63) and the write fits,
// its payload goes in the WQE, read here from the local buffer (GPU memory).
__device__ void store_wqe(const lever_efa_nic_layout* l, const lever_efa_peer* p,
                          const lever_efa_write& wr, uint32_t pc) {
  unsigned long long* slot = reinterpret_cast<unsigned long long*>(lever_efa_sq_slot_dev(l, pc));
  lever_efa_write w = wr;
  w.inline_src = reinterpret_cast<const void*>(static_cast<uintptr_t>(wr.laddr));
  const int nw = (int)lever_efa_wqe_words(l);
  for (int k = 0; k < nw; ++k) st_mmio64(slot + k, lever_efa_write_wqe_word(l, p, &w, pc, k));
}
// Fence the WQE stores out, then the doorbell: the producer count after the last WQE.
__device__ void ring(const lever_efa_nic_layout* l, uint32_t pc_after) {
  __threadfence_system();
  st_mmio32(reinterpret_cast<void*>(l->sq_doorbell_dev), lever_efa_sq_doorbell_value(pc_after));
}

// The ci-th CQE of l's CQ if it is there: 1 and its first 16 bytes, else 0.
__device__ __forceinline__ int cqe(const lever_efa_nic_layout* l, uint32_t ci, uint4* v) {
  *v = ld_vol16(reinterpret_cast<const void*>(lever_efa_cq_entry_dev(l, ci)));
  return lever_efa_cqe_is_new(l, lever_efa_cqe_flags(v->x), ci);
}

// Consume send CQEs until ci == pc (every WQE posted so far completed). 0 ok, else raised.
__device__ int drain(const lever_efa_nic_layout* l, QpState* s, uint32_t* err, long long timeout,
                     uint32_t who) {
  const unsigned long long t0 = now_ns();
  while (s->ci != s->pc) {
    uint4 v;
    if (cqe(l, s->ci, &v)) {
      if (lever_efa_cqe_status(v.x) != 0u) {
        raise(err, E_BAD_CQE, who, s->ci, lever_efa_cqe_status(v.x));
        return 1;
      }
      ++s->ci;
      continue;
    }
    if ((long long)(now_ns() - t0) > timeout) {
      raise(err, E_TIMEOUT_CQ, who, s->ci, s->pc);
      return 1;
    }
  }
  return 0;
}

// One write of 8 bytes from src to raddr (with imm when has_imm), posted and rung.
__device__ int post8(const lever_efa_nic_layout* l, const lever_efa_peer* p, QpState* s,
                     const unsigned long long* src, uint64_t raddr, uint32_t imm, uint32_t has_imm,
                     uint32_t* err) {
  if (s->pc - s->ci >= l->sq_num_entries) {
    raise(err, E_RING, s->pc, s->ci, l->sq_num_entries);
    return 1;
  }
  const lever_efa_write wr = {(uint64_t)(uintptr_t)src, raddr, 8u, imm, has_imm};
  store_wqe(l, p, wr, s->pc);
  ++s->pc;
  ring(l, s->pc);
  return 0;
}

// Wait until *w >= want; a larger value than want_exact (when non-zero) is a skip.
__device__ int wait_word(const unsigned long long* w, unsigned long long want, long long timeout,
                         uint32_t* err, uint32_t who, bool exact) {
  const unsigned long long t0 = now_ns();
  unsigned long long v;
  while ((v = ld_sys64(w)) < want) {
    if ((long long)(now_ns() - t0) > timeout) {
      raise(err, E_TIMEOUT_WORD, who, (uint32_t)v, (uint32_t)want);
      return 1;
    }
  }
  if (exact && v != want) {
    raise(err, E_WORD_SKIPPED, who, (uint32_t)v, (uint32_t)want);
    return 1;
  }
  return 0;
}

// The next receive completion of p.rx's CQ: a write-with-imm carrying imm.
__device__ int wait_rx(const Prim& p, uint32_t imm, uint32_t* err) {
  const unsigned long long t0 = now_ns();
  uint4 v;
  while (!cqe(p.rx, p.st->rx_ci, &v)) {
    if ((long long)(now_ns() - t0) > p.timeout_ns) {
      raise(err, E_TIMEOUT_RX, imm, p.st->rx_ci, 0);
      return 1;
    }
  }
  const uint32_t flags = lever_efa_cqe_flags(v.x);
  // the 4th word of the 16-byte load is efa_io_rx_cdesc.imm
  if (lever_efa_cqe_status(v.x) != 0u || !(flags & EFA_IO_CDESC_COMMON_HAS_IMM) || v.w != imm) {
    raise(err, E_BAD_RX, imm, v.w, (flags << 8) | lever_efa_cqe_status(v.x));
    return 1;
  }
  ++p.st->rx_ci;
  return 0;
}

}  // namespace

__global__ void barrier_kernel(const Barrier b, unsigned long long seq) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  QpState* s = b.st;
  *b.src = seq;
  __threadfence_system();  // the NIC reads src after the doorbell
  const uint32_t mb = b.lay->sq_max_batch ? b.lay->sq_max_batch : 1u;
  uint32_t since = 0;
  for (int p = 0; p < b.ranks; ++p) {
    if (p == b.rank) continue;
    const lever_efa_peer* pe = b.peers + (size_t)p * b.nrx;  // the peer's receive slot 0
    if (s->pc - s->ci >= b.lay->sq_num_entries) {
      raise(b.err, E_RING, p, s->pc, s->ci);
      return;
    }
    const lever_efa_write wr = {(uint64_t)(uintptr_t)b.src,
                                pe->remote_addr + b.words_off + 8ull * (uint64_t)b.rank, 8u, 0u, 0u};
    store_wqe(b.lay, pe, wr, s->pc);
    ++s->pc;
    if (++since == mb) {
      ring(b.lay, s->pc);
      since = 0;
    }
  }
  if (since) ring(b.lay, s->pc);
  if (drain(b.lay, s, b.err, b.timeout_ns, 0xffffffffu)) return;
  for (int p = 0; p < b.ranks; ++p)
    if (p != b.rank && wait_word(b.words + p, seq, b.timeout_ns, b.err, (uint32_t)p, false)) return;
}

__global__ void prim_kernel(const Prim p, int family) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  QpState* s = p.st;
  uint32_t* err = p.err;
  const bool ini = p.initiator != 0;
  const long long to = p.timeout_ns;
  const uint64_t remote_word = p.ping_remote + 8ull * (uint64_t)family;
  unsigned long long* word = p.ping + family;
  unsigned long long* src = p.src + family;
  const uint32_t n = (uint32_t)p.reps * (uint32_t)p.inner;
  switch (family) {
    case F_WRITE_RTT:
    case F_IMM_RTT: {
      const bool imm = family == F_IMM_RTT;
      unsigned long long acc = 0;
      for (uint32_t it = 1; it <= n; ++it) {
        if (ini) {
          *src = it;
          const unsigned long long t0 = now_ns();
          if (post8(p.sq, p.peer, s, src, remote_word, it, imm, err)) return;
          if (imm ? wait_rx(p, it, err) : wait_word(word, it, to, err, it, true)) return;
          acc += now_ns() - t0;
          if (drain(p.sq, s, err, to, it)) return;  // src is reused: its write completed
          if (it % (uint32_t)p.inner == 0u) {
            p.out[it / (uint32_t)p.inner - 1] = acc / (2ull * (unsigned long long)p.inner);  // half RTT
            acc = 0;
          }
        } else {
          if (imm ? wait_rx(p, it, err) : wait_word(word, it, to, err, it, true)) return;
          *src = it;
          if (post8(p.sq, p.peer, s, src, remote_word, it, imm, err)) return;
          if (drain(p.sq, s, err, to, it)) return;
        }
      }
      break;
    }
    case F_COMPLETION: {
      if (!ini) break;
      for (int r = 0; r < p.reps; ++r) {
        unsigned long long acc = 0;
        for (int j = 0; j < p.inner; ++j) {
          *src = (unsigned long long)(r * p.inner + j);
          const unsigned long long t0 = now_ns();
          if (post8(p.sq, p.peer, s, src, p.scratch_remote, 0, 0, err)) return;
          if (drain(p.sq, s, err, to, (uint32_t)r)) return;
          acc += now_ns() - t0;
        }
        p.out[r] = acc / (unsigned long long)p.inner;
      }
      break;
    }
    case F_CQ_POLL: {
      if (!ini) break;
      // dependent reads of the next (empty) receive CQE: each waits for the one before
      const lever_efa_nic_layout* l = p.rx;
      for (int r = 0; r < p.reps; ++r) {
        uint32_t zero = 0;
        const unsigned long long t0 = now_ns();
        for (int j = 0; j < p.inner; ++j) {
          // the address depends on the last value read (times 0, hidden from the compiler)
          uint4 v = ld_vol16(reinterpret_cast<const void*>(lever_efa_cq_entry_dev(l, s->rx_ci + zero)));
          asm volatile("and.b32 %0, %1, 0;" : "=r"(zero) : "r"(v.x));
          if (lever_efa_cqe_is_new(l, lever_efa_cqe_flags(v.x), s->rx_ci)) {
            raise(err, E_UNEXPECTED_CQE, (uint32_t)r, s->rx_ci, v.x);
            return;
          }
        }
        p.out[r] = (now_ns() - t0) / (unsigned long long)p.inner;
      }
      break;
    }
    case F_POST: {
      if (!ini) break;
      for (int r = 0; r < p.reps; ++r) {
        *src = (unsigned long long)r;
        const lever_efa_write wr = {(uint64_t)(uintptr_t)src, p.scratch_remote, 8u, 0u, 0u};
        const unsigned long long t0 = now_ns();
        store_wqe(p.sq, p.peer, wr, s->pc);
        const unsigned long long t1 = now_ns();
        __threadfence_system();
        const unsigned long long t2 = now_ns();
        ++s->pc;
        st_mmio32(reinterpret_cast<void*>(p.sq->sq_doorbell_dev), lever_efa_sq_doorbell_value(s->pc));
        __threadfence_system();
        const unsigned long long t3 = now_ns();
        p.out[4 * r + 0] = t1 - t0;  // eight 8-byte stores into the LLQ slot
        p.out[4 * r + 1] = t2 - t1;  // the system fence after them
        p.out[4 * r + 2] = t3 - t2;  // the doorbell store and a fence behind it
        p.out[4 * r + 3] = t3 - t0;
        if (drain(p.sq, s, err, to, (uint32_t)r)) return;
      }
      break;
    }
    case F_MSG_RATE: {
      if (!ini) break;
      const uint32_t mb = p.sq->sq_max_batch ? p.sq->sq_max_batch : 1u;
      const uint32_t depth = p.sq->sq_num_entries;
      for (int r = 0; r < p.reps; ++r) {
        const unsigned long long t0 = now_ns();
        uint32_t since = 0;
        for (int j = 0; j < p.inner; ++j) {
          while (s->pc - s->ci >= depth) {  // credit: consume what completed
            uint4 v;
            const unsigned long long tw = now_ns();
            while (!cqe(p.sq, s->ci, &v))
              if ((long long)(now_ns() - tw) > to) {
                raise(err, E_TIMEOUT_CQ, (uint32_t)r, s->ci, s->pc);
                return;
              }
            if (lever_efa_cqe_status(v.x) != 0u) {
              raise(err, E_BAD_CQE, (uint32_t)r, s->ci, lever_efa_cqe_status(v.x));
              return;
            }
            ++s->ci;
          }
          const lever_efa_write wr = {(uint64_t)(uintptr_t)src, p.scratch_remote, 8u, 0u, 0u};
          store_wqe(p.sq, p.peer, wr, s->pc);
          ++s->pc;
          if (++since == mb) {
            ring(p.sq, s->pc);
            since = 0;
          }
        }
        if (since) ring(p.sq, s->pc);
        if (drain(p.sq, s, err, to, (uint32_t)r)) return;
        p.out[r] = (now_ns() - t0) * 1000ull / (unsigned long long)p.inner;  // ps per message
      }
      break;
    }
    default:
      break;
  }
}

}  // namespace efa_gpu

namespace efa_host {

int launch_barrier(const efa_gpu::Barrier& b, unsigned long long seq, void* stream) {
  efa_gpu::barrier_kernel<<<1, 32, 0, (cudaStream_t)stream>>>(b, seq);
  return (int)cudaGetLastError();
}

int launch_prim(const efa_gpu::Prim& p, int family, void* stream) {
  if (family < 0 || family >= efa_gpu::F_NUM) return (int)cudaErrorInvalidValue;
  efa_gpu::prim_kernel<<<1, 32, 0, (cudaStream_t)stream>>>(p, family);
  return (int)cudaGetLastError();
}

}  // namespace efa_host
