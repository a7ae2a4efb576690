// GPU work of the EFA extension (hw/efa/efa_kernels.cu): the cross-node start barrier of
// `lever hw ep --nic efa` and the GPU-posted primitives of `lever hw primitives --nic efa`.
//
// Why its own kernels: on EFA the ranks are processes on different nodes, so the EP
// kernels' start barrier (stores into every GPU's barrier word over NVLink) can not reach
// them. The barrier here posts one 8-byte RDMA write per peer on its own QP, through the
// same lever_efa_nic_layout / lever_efa_peer tables and WQE builder (wqe.h) as the EP
// kernels, and polls the words the peers wrote. The primitives measure what the EP
// kernels' post path is made of on a real device (a write's round trip, write-with-imm
// against a plain write, send completion latency, a CQ poll through a host pointer, the
// WQE stores + fence + doorbell MMIO, message rate per QP).
//
// Plain CUDA C++ (no torch): the pybind11 binding (binding.cpp) calls the host entries.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "nic_layout.h"

namespace efa_gpu {

// One QP as one GPU thread posts on it (barrier, primitives): producer and consumer counts.
struct QpState {
  uint32_t pc;   // WQEs posted (free-running; the doorbell takes pc & 0xffff)
  uint32_t ci;   // CQEs consumed
  uint32_t rx_ci;// receive CQEs consumed (the QP's receive CQ, primitives)
  uint32_t pad[13];
};
static_assert(sizeof(QpState) == 64, "one line per QP state");

// Error record (first wins): code, peer or iteration, value seen, value wanted / status.
enum Err : uint32_t {
  E_NONE = 0,
  E_TIMEOUT_CQ = 1,       // a send completion did not come
  E_BAD_CQE = 2,          // a send completion with an error status (aux = status)
  E_TIMEOUT_WORD = 3,     // a peer's write never landed (barrier word, ping word)
  E_WORD_SKIPPED = 4,     // a ping word jumped past the value expected
  E_TIMEOUT_RX = 5,       // no receive completion (write-with-imm)
  E_BAD_RX = 6,           // a receive completion with the wrong imm, flags or status
  E_UNEXPECTED_CQE = 7,   // a CQE appeared where none may (cq_poll family)
  E_RING = 8,             // more WQEs outstanding than the SQ holds
};
constexpr int ERR_WORDS = 4;

struct Barrier {
  const lever_efa_nic_layout* lay;  // the barrier QP (device copy)
  const lever_efa_peer* peers;      // the world's peer table [ranks][nrx] (device copy)
  QpState* st;                      // device memory
  unsigned long long* words;        // [ranks] local: peer p writes seq at [p] (in the window)
  unsigned long long* src;          // local source word (in the window)
  uint64_t words_off;               // words' offset from a window base (the same on every rank)
  int rank, ranks, nrx;
  long long timeout_ns;
  uint32_t* err;                    // [ERR_WORDS] device memory
};

// The primitives' two ranks: rank 0 initiates, rank 1 answers.
struct Prim {
  const lever_efa_nic_layout* sq;   // the send QP (device copy)
  const lever_efa_nic_layout* rx;   // the receive QP: its CQ takes write-with-imm completions
  const lever_efa_peer* peer;       // the other rank's receive QP (device copy, one entry)
  QpState* st;
  unsigned long long* ping;         // [8] local words the peer writes, one per family
  unsigned long long* src;          // [8] local source words
  uint64_t ping_remote;             // the peer's ping[0] (its virtual address)
  uint64_t scratch_remote;          // a peer scratch word for writes nobody reads
  unsigned long long* out;          // [reps * 4] samples, ns (or ns per message)
  uint32_t* err;                    // [ERR_WORDS]
  int initiator;
  int reps, inner;
  long long timeout_ns;
};

enum Family : int {
  F_WRITE_RTT = 0,   // plain 8 B write ping-pong, landing seen by polling the word
  F_IMM_RTT = 1,     // write-with-imm ping-pong, landing seen as a receive completion
  F_COMPLETION = 2,  // post -> send completion seen
  F_CQ_POLL = 3,     // one read of a CQ entry through the GPU mapping of the host CQ
  F_POST = 4,        // WQE stores, fence, doorbell store (+ fence), each timed
  F_MSG_RATE = 5,    // back-to-back 8 B writes on one QP, doorbell per max_batch
  F_NUM = 6,
};

}  // namespace efa_gpu

namespace efa_host {
// cudaError_t of the launch (0 ok).
int launch_barrier(const efa_gpu::Barrier& b, unsigned long long seq, void* stream);
int launch_prim(const efa_gpu::Prim& p, int family, void* stream);
}  // namespace efa_host
