// The emulated NIC's side of the NIC layout: how it numbers its QPs, address
// handles and keys, how it fills lever_efa_nic_layout for the queues it serves, and
// the rules every layout handed to the EP kernels must meet (whichever NIC filled it).
//
// Why: the EP kernels post through a lever_efa_nic_layout (hw/efa/nic_layout.h) and
// a peer table, never through emulator addresses or emulator numbering, so the same
// device code drives a real EFA QP (layout from efadv_query_qp_wqs / efadv_query_cq)
// and this emulator. The emulator plays the device: it hands out QP numbers, AH
// numbers and keys like a device would, fills the layouts of its queues (SQ, doorbell
// and CQ in GPU memory on the native path, in pinned host memory on the proxy path;
// 32-byte CQ entries like the v59 extended CQ), and when it parses a WQE it maps the
// AH and destination QPN back to its own rank and receive queue and checks the keys.
// (The receive CQs sit where `lever hw ep --rxcq` says: pinned host memory by default.)
//
// Plain C++ (stdint only besides nic_layout.h): binding.cpp, ep_kernels.cu (device
// side of the numbering) and the host-only tests include it.
#pragma once
#include <stdint.h>

#include "../efa/nic_layout.h"

#if defined(__CUDACC__)
#define EMU_NIC_HD __host__ __device__ constexpr
#else
#define EMU_NIC_HD constexpr
#endif

namespace emu_nic {

// ---- numbering (16-bit QPNs and AHNs as the WQE carries them) ---------------------
constexpr uint32_t AHN_BASE = 0x0100u;      // AH of rank r: AHN_BASE + r
constexpr uint32_t SQ_QPN_BASE = 0x0800u;   // native send QP q of rank r: + r * NQ + q
constexpr uint32_t PSQ_QPN_BASE = 0x2000u;  // proxy send QP q of rank r: + r * NQ + q
constexpr uint32_t RX_QPN_BASE = 0x4000u;   // receive QP i of rank r: + r * n_rx + i
constexpr uint32_t QKEY_BASE = 0x11110000u; // qkey of rank r's QPs: QKEY_BASE | r
constexpr uint32_t LKEY_BASE = 0x004c0000u; // lkey of rank r's window (24 bits): LKEY_BASE | r
constexpr uint32_t RKEY_BASE = 0x52000000u; // rkey of rank r's window: RKEY_BASE | r
constexpr uint32_t CQE_SIZE = LEVER_EFA_CQE_SIZE_V59;  // CQ entry stride, as v59 reports
constexpr uint32_t WQE_SIZE = LEVER_EFA_WQE_SIZE_V59;

EMU_NIC_HD uint32_t ahn(int rank) { return AHN_BASE + (uint32_t)rank; }
EMU_NIC_HD uint32_t qkey(int rank) { return QKEY_BASE | (uint32_t)rank; }
EMU_NIC_HD uint32_t lkey(int rank) { return LKEY_BASE | (uint32_t)rank; }
EMU_NIC_HD uint32_t rkey(int rank) { return RKEY_BASE | (uint32_t)rank; }
EMU_NIC_HD uint32_t rx_qpn(int rank, int i, int n_rx) {
  return RX_QPN_BASE + (uint32_t)(rank * n_rx + i);
}
// rank of an AH number, or -1 when it names no rank
EMU_NIC_HD int ahn_rank(uint32_t a, int num_ranks) {
  return a >= AHN_BASE && a < AHN_BASE + (uint32_t)num_ranks ? (int)(a - AHN_BASE) : -1;
}
// global receive-queue index (rank * n_rx + i) of a destination QPN, or -1
EMU_NIC_HD int rx_of_qpn(uint32_t qpn, int num_ranks, int n_rx) {
  const uint32_t n = (uint32_t)(num_ranks * n_rx);
  return qpn >= RX_QPN_BASE && qpn < RX_QPN_BASE + n ? (int)(qpn - RX_QPN_BASE) : -1;
}

// Whether the numbering fits 16-bit QPNs for this world; 0 (null) when it does.
inline const char* numbering_problem(int num_ranks, int nq, int n_rx) {
  if (num_ranks < 1 || nq < 1 || n_rx < 1) return "emulated NIC: empty world";
  if (SQ_QPN_BASE + (uint32_t)(num_ranks * nq) > PSQ_QPN_BASE ||
      PSQ_QPN_BASE + (uint32_t)(num_ranks * nq) > RX_QPN_BASE ||
      RX_QPN_BASE + (uint32_t)(num_ranks * n_rx) > 0x10000u)
    return "emulated NIC: ranks x queues do not fit its 16-bit QP numbers";
  if ((uint32_t)num_ranks > 0xffffu) return "emulated NIC: too many ranks for its key numbering";
  return 0;
}

// ---- layouts of the emulated NIC's queues -------------------------------------------
// One send QP: SQ ring (entries x 64 B), a 4-byte doorbell word, a CQ ring
// (cq_entries x 32 B), all at addresses the GPU uses directly (UVA: device memory, or
// mapped pinned host memory, where the host address is the same; the SQ and doorbell
// there are write-combined, as an LLQ BAR is mapped). sq_host/cq_host say where the SQ
// with its doorbell and the CQ are. peers: the device copy of the peer table.
inline lever_efa_nic_layout send_qp_layout_at(int rank, uint32_t qpn, uint64_t sq, uint64_t db,
                                              uint64_t cq, uint32_t sq_entries, uint32_t cq_entries,
                                              bool sq_host, bool cq_host, uint64_t peers,
                                              uint32_t num_peers) {
  lever_efa_nic_layout l{};
  const uint32_t mem = sq_host ? LEVER_EFA_MEM_HOST : LEVER_EFA_MEM_GPU;
  const uint32_t cq_mem = cq_host ? LEVER_EFA_MEM_HOST : LEVER_EFA_MEM_GPU;
  l.version = LEVER_EFA_NIC_LAYOUT_VERSION;
  l.qp_num = qpn;
  l.sq_buffer = sq;
  l.sq_buffer_dev = sq;
  l.sq_doorbell = db;
  l.sq_doorbell_dev = db;
  l.sq_entry_size = WQE_SIZE;
  l.sq_num_entries = sq_entries;
  l.sq_max_batch = sq_entries < 16u ? sq_entries : 16u;  // the kernels' MAXG
  l.sq_buffer_mem = mem;
  l.sq_doorbell_mem = mem;
  l.sq_phase_first = LEVER_EFA_SQ_PHASE_FIRST_LAP;
  l.cq_buffer = cq;
  l.cq_buffer_dev = cq;
  l.cq_doorbell = 0;
  l.cq_entry_size = CQE_SIZE;
  l.cq_num_entries = cq_entries;
  l.cq_buffer_mem = cq_mem;
  l.cq_phase_first = LEVER_EFA_CQ_PHASE_FIRST_LAP;
  l.qkey = qkey(rank);
  l.lkey = lkey(rank);
  l.local_addr = 0;  // the emulated window is the whole address space
  l.inline_buf_size = 0;
  l.max_rdma_size = 1u << 30;
  l.device_caps = 1u << 3;  // RDMA write
  l.num_peers = num_peers;
  l.peers = peers;
  l.peers_mem = LEVER_EFA_MEM_GPU;
  return l;
}
// Every queue of the QP in one place (device memory: native; host memory: the proxy's).
inline lever_efa_nic_layout send_qp_layout(int rank, uint32_t qpn, uint64_t sq, uint64_t db,
                                           uint64_t cq, uint32_t sq_entries,
                                           uint32_t cq_entries, bool host_memory,
                                           uint64_t peers, uint32_t num_peers) {
  return send_qp_layout_at(rank, qpn, sq, db, cq, sq_entries, cq_entries, host_memory, host_memory,
                           peers, num_peers);
}
// The device generation the emulated NIC plays for one send QP: its WQE size (64, or 128 as
// rdma-core v63 makes a QP with the inline-write flag), the inline-write payload it takes
// (0, or up to 80 bytes with 128-byte WQEs), and a completion counter (after v64) at cntr: two
// u64 words in GPU memory, the completion count then the error count, which the NIC bumps when
// it writes a send CQE (0: no counter, credit from the CQ).
inline void set_generation(lever_efa_nic_layout& l, uint32_t wqe_size, uint32_t inline_write, uint64_t cntr) {
  l.sq_entry_size = wqe_size;
  l.inline_write_size = inline_write;
  l.inline_buf_size = inline_write;
  // max_tx_batch is in 64-byte units on EFA: half the WQEs per doorbell at 128 bytes
  if (wqe_size == LEVER_EFA_WQE_SIZE_128 && l.sq_max_batch > 1u) l.sq_max_batch /= 2u;
  l.cntr_mem = cntr ? LEVER_EFA_MEM_GPU : LEVER_EFA_MEM_NONE;
  l.send_cntr = 0;  // GPU memory: no host address
  l.send_cntr_dev = cntr;
  l.send_err_cntr_dev = cntr ? cntr + 8u : 0u;
  l.rwrite_cntr = 0;
  l.rwrite_cntr_dev = 0;
  if (cntr) l.device_caps |= 1u << 6;  // EFADV_DEVICE_ATTR_CAPS_COMP_CNTR
}

// The NIC's own device-memory mirror of a host-memory SQ and its doorbell: what its fetcher
// reads (the NIC copies WQEs there after reading the host doorbell over PCIe). Everything
// else (CQ, keys, QPN) is the published layout's.
inline lever_efa_nic_layout mirror_layout(const lever_efa_nic_layout& pub, uint64_t msq, uint64_t mdb) {
  lever_efa_nic_layout l = pub;
  l.sq_buffer = l.sq_buffer_dev = msq;
  l.sq_doorbell = l.sq_doorbell_dev = mdb;
  l.sq_buffer_mem = l.sq_doorbell_mem = LEVER_EFA_MEM_GPU;
  return l;
}

// A receive QP: only its CQ is polled (RX completions of write-with-immediate); its
// SQ is never posted to, so the SQ fields stay 0. host_memory: the CQ is pinned host memory
// (p5/p5en: the GPU polls it through PCIe, and the NIC writes it from its host-facing side).
inline lever_efa_nic_layout recv_qp_layout(int rank, uint32_t qpn, uint64_t cq,
                                           uint32_t cq_entries, bool host_memory = false) {
  lever_efa_nic_layout l{};
  l.version = LEVER_EFA_NIC_LAYOUT_VERSION;
  l.qp_num = qpn;
  l.sq_phase_first = LEVER_EFA_SQ_PHASE_FIRST_LAP;
  l.cq_buffer = cq;
  l.cq_buffer_dev = cq;
  l.cq_entry_size = CQE_SIZE;
  l.cq_num_entries = cq_entries;
  l.cq_buffer_mem = host_memory ? LEVER_EFA_MEM_HOST : LEVER_EFA_MEM_GPU;
  l.cq_phase_first = LEVER_EFA_CQ_PHASE_FIRST_LAP;
  l.qkey = qkey(rank);
  return l;
}

inline lever_efa_peer peer_entry(int dest, int i, int n_rx) {
  lever_efa_peer p{};
  p.ahn = (uint16_t)ahn(dest);
  p.remote_qpn = (uint16_t)rx_qpn(dest, i, n_rx);
  p.remote_qkey = qkey(dest);
  p.rkey = rkey(dest);
  p.remote_addr = 0;  // the kernels address peers' buffers directly
  return p;
}

}  // namespace emu_nic
