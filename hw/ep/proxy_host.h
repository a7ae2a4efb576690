// The CPU proxy's work on one descriptor ring, as plain C++ (no CUDA, no pybind11): what a
// host thread of `lever hw ep --path proxy` does per pass. binding.cpp runs it in its threads
// over pinned host memory; tests/data/proxy_host_check.cpp drives it over ordinary memory
// on a machine without a GPU (tests/test_hw_testbed.py).
//
// Per pass, on one ring: take the GPU's descriptors strictly in ring order, build the
// 64-byte EFA WQE of each in the proxy QP's send queue (hw/efa/wqe.h, the same builder the
// GPU issuer uses), flush the write-combined stores, ring the doorbell once, hand the ring
// space back; then consume the QP's completions and write their count back where the GPU
// polls it. An error CQE (status != 0: the NIC gave up on a WQE) stops the run: the ring
// reports its first one to the sink once, and the sink stops the GPU's kernels with the
// error named (binding.cpp writes it into the world's error words, as the GPU issuer's own
// raise_err would), so a proxy run whose retries run out fails the way a native one does
// instead of waiting for a receiver's timeout.
#pragma once
#include <atomic>
#include <stdint.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "efa_emu.cuh"

namespace proxy_host {

// One ring of one (rank, QP), with the proxy QP's layout as the NIC published it (host
// addresses) and the host copy of the peer table.
struct Ring {
  emu::ProxyDesc* ring = nullptr;
  volatile unsigned long long* cons = nullptr;  // pstate[qp*16 + 0]: descriptors taken
  volatile unsigned long long* done = nullptr;  // pstate[qp*16 + 8]: completions seen
  lever_efa_nic_layout lay{};
  const lever_efa_peer* peers = nullptr;
  int n_rx = 0;
  int rank = 0, qp = 0, ring_depth = 0, sq_depth = 0;
  int thread = 0;              // the host thread serving it (for the error report)
  unsigned long long c = 0, posted = 0, cq_ci = 0;
  bool failed = false;         // its first error CQE was reported
};

// What every host thread counted (shared by the threads of one proxy).
struct Stats {
  std::atomic<unsigned long long> descs{0}, batches{0}, post_ns{0}, cqes{0}, bad{0};
  // the first error CQE of the run: status + 1 (0: none yet), and where it was
  std::atomic<unsigned long long> first_bad_status{0};
  std::atomic<long long> first_rank{-1}, first_qp{-1}, first_ci{-1}, first_thread{-1};
  void reset() {
    descs = 0; batches = 0; post_ns = 0; cqes = 0; bad = 0; first_bad_status = 0;
    first_rank = -1; first_qp = -1; first_ci = -1; first_thread = -1;
  }
};

// An error CQE a host thread read: which ring, which completion, its status.
struct ErrorCqe {
  int rank, qp, thread;
  unsigned long long ci;
  unsigned status;
};
// Who stops the run when a ring reads its first error CQE (null fn: nobody).
struct Sink {
  void (*fn)(void* ctx, const ErrorCqe& e) = nullptr;
  void* ctx = nullptr;
};

// Stores to write-combined memory may sit in the CPU's combining buffers and pass each
// other; an sfence drains them in order (what rdma-core's mmio_flush_writes does on x86).
inline void wc_flush() {
#if defined(__x86_64__)
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

// Descriptors -> WQEs + one doorbell. Returns the descriptors taken.
inline unsigned long long post(Ring& r) {
  unsigned long long n = 0;
  while (true) {
    volatile emu::ProxyDesc* d = r.ring + (r.c % (unsigned long long)r.ring_depth);
    if (d->seq != r.c + 1) break;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (r.posted - r.cq_ci >= (unsigned long long)r.sq_depth) break;  // NIC SQ full: wait for CQEs
    const unsigned long long laddr = d->local_addr, raddr = d->remote_addr;
    const unsigned len = d->len, imm = d->imm;
    const unsigned dest = d->dest_rank, dqp = d->dest_qp, has_imm = d->has_imm;
    const unsigned idx = (unsigned)r.posted;
    unsigned long long* wq = reinterpret_cast<unsigned long long*>(static_cast<uintptr_t>(
        r.lay.sq_buffer + (uint64_t)lever_efa_slot(idx, r.lay.sq_num_entries) * r.lay.sq_entry_size));
    const lever_efa_peer* peer = r.peers + (size_t)dest * r.n_rx + dqp;
    // a host thread can not read the GPU buffer: never inline (inline_src null); a 128-byte
    // WQE is written whole (its second half zeros), as the provider's LLQ copy does
    const lever_efa_write wr = {laddr, raddr, len, imm, has_imm, nullptr};
    const int nw = (int)lever_efa_wqe_words(&r.lay);
    for (int k = 0; k < nw; ++k) wq[k] = lever_efa_write_wqe_word(&r.lay, peer, &wr, idx, k);
    ++r.posted;
    ++r.c;
    ++n;
  }
  if (n) {
    wc_flush();  // the WQEs (write-combined, like an LLQ BAR) before the doorbell
    *reinterpret_cast<volatile unsigned*>(static_cast<uintptr_t>(r.lay.sq_doorbell)) =
        lever_efa_sq_doorbell_value((unsigned)r.posted);  // doorbell: producer counter
    wc_flush();  // and the doorbell out of the write-combining buffer now
    *r.cons = r.c;  // ring space back to the GPU
  }
  return n;
}

// Completions (the NIC's CQEs may come out of WQE order: counted). Returns CQEs consumed.
inline unsigned long long complete(Ring& r, Stats& st, const Sink& sink) {
  unsigned long long m = 0;
  while (true) {
    const unsigned ci = (unsigned)r.cq_ci;
    volatile emu::efa_io_tx_cdesc* q = reinterpret_cast<volatile emu::efa_io_tx_cdesc*>(static_cast<uintptr_t>(
        r.lay.cq_buffer + (uint64_t)lever_efa_slot(ci, r.lay.cq_num_entries) * r.lay.cq_entry_size));
    const unsigned flags = q->common.flags;
    if (!lever_efa_cqe_is_new(&r.lay, flags, ci)) break;
    std::atomic_thread_fence(std::memory_order_acquire);
    const unsigned status = q->common.status;
    if (status != 0) {  // the NIC gave up on this WQE: counted, the first one stops the run
      unsigned long long none = 0;
      if (st.first_bad_status.compare_exchange_strong(none, (unsigned long long)status + 1ull)) {
        st.first_rank = r.rank;
        st.first_qp = r.qp;
        st.first_ci = (long long)r.cq_ci;
        st.first_thread = r.thread;
      }
      st.bad += 1;
      if (!r.failed) {
        r.failed = true;
        if (sink.fn) sink.fn(sink.ctx, ErrorCqe{r.rank, r.qp, r.thread, r.cq_ci, status});
      }
    }
    ++r.cq_ci;
    ++m;
  }
  if (m) {
    std::atomic_thread_fence(std::memory_order_release);
    *r.done = r.cq_ci;
  }
  return m;
}

}  // namespace proxy_host
