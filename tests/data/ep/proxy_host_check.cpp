// Drives the CPU proxy's pass (hw/ep/proxy_host.h) over ordinary memory, without a GPU:
// descriptors become WQEs and one doorbell, completions are counted and written back, and
// an error CQE (status 13, the NIC out of retries) reaches the sink that stops the run,
// once per ring; and where the host setup puts a receive CQ. tests/test_hw_testbed.py compiles this with the host compiler and reads
// its "key value ..." lines.
#include <cstdio>
#include <cstring>
#include <vector>

#include "proxy_host.h"

static std::vector<proxy_host::ErrorCqe> g_seen;
static void record(void*, const proxy_host::ErrorCqe& e) { g_seen.push_back(e); }

// A send CQE as the emulated NIC writes it (ep_kernels.cu write_send_cqe): the slot of WQE
// wi, the status, the phase of completion number ci.
static void write_cqe(std::vector<uint8_t>& cq, const lever_efa_nic_layout& l, unsigned ci, unsigned wi,
                      unsigned status) {
  emu::efa_io_tx_cdesc d{};
  d.common.req_id = (uint16_t)lever_efa_slot(wi, l.sq_num_entries);
  d.common.status = (uint8_t)status;
  d.common.flags = (uint8_t)(lever_efa_cq_phase(ci, l.cq_num_entries) |
                             ((unsigned)emu::EFA_IO_SEND_QUEUE << emu::CDESC_Q_TYPE_SHIFT) |
                             ((unsigned)emu::EFA_IO_RDMA_WRITE << emu::CDESC_OP_TYPE_SHIFT));
  d.common.qp_num = (uint16_t)l.qp_num;
  memcpy(cq.data() + (size_t)lever_efa_slot(ci, l.cq_num_entries) * l.cq_entry_size, &d, sizeof d);
}

int main() {
  const int depth = 64, ring_depth = 8, n_rx = 2, ranks = 2;
  std::vector<uint8_t> sq((size_t)depth * emu_nic::WQE_SIZE), cq((size_t)depth * emu_nic::CQE_SIZE);
  unsigned doorbell = 0;
  std::vector<emu::ProxyDesc> ring((size_t)ring_depth);
  memset(ring.data(), 0, ring.size() * sizeof(emu::ProxyDesc));
  unsigned long long pstate[16] = {0};
  std::vector<lever_efa_peer> peers;
  for (int r = 0; r < ranks; ++r)
    for (int i = 0; i < n_rx; ++i) peers.push_back(emu_nic::peer_entry(r, i, n_rx));
  const lever_efa_nic_layout lay = emu_nic::send_qp_layout(
      0, emu_nic::PSQ_QPN_BASE + 3u, (uint64_t)(uintptr_t)sq.data(), (uint64_t)(uintptr_t)&doorbell,
      (uint64_t)(uintptr_t)cq.data(), depth, depth, true, (uint64_t)(uintptr_t)peers.data(),
      (uint32_t)peers.size());
  proxy_host::Ring r;
  r.ring = ring.data();
  r.cons = &pstate[0];
  r.done = &pstate[8];
  r.lay = lay;
  r.peers = peers.data();
  r.n_rx = n_rx;
  r.rank = 0;
  r.qp = 3;
  r.ring_depth = ring_depth;
  r.sq_depth = depth;
  r.thread = 1;
  proxy_host::Stats st;
  const proxy_host::Sink sink{record, nullptr};

  // three descriptors for rank 1's receive queue 1, published in order (seq last)
  for (int j = 0; j < 3; ++j) {
    emu::ProxyDesc& d = ring[(size_t)j];
    d.local_addr = 0x10000ull + 64ull * (unsigned)j;
    d.remote_addr = 0x90000ull + 64ull * (unsigned)j;
    d.len = 64;
    d.imm = 0;
    d.dest_rank = 1;
    d.dest_qp = 1;
    d.has_imm = 0;
    d.qp = 3;
    d.seq = (unsigned long long)j + 1ull;
  }
  const unsigned long long n = proxy_host::post(r);
  printf("posted %llu doorbell %u cons %llu\n", n, doorbell, pstate[0]);
  emu::efa_io_tx_wqe w1;
  memcpy(&w1, sq.data() + emu_nic::WQE_SIZE, sizeof w1);
  printf("wqe1 req_id %u ah %u dest_qp %u length %u remote 0x%x\n", (unsigned)w1.meta.req_id,
         (unsigned)w1.meta.ah, (unsigned)w1.meta.dest_qp_num, (unsigned)w1.data.rdma_req.remote_mem.length,
         (unsigned)w1.data.rdma_req.remote_mem.buf_addr_lo);
  printf("again %llu\n", proxy_host::post(r));  // nothing new: no doorbell, nothing taken

  // WQE 0 completes, WQE 1 completes with status 13 (retries exhausted)
  write_cqe(cq, lay, 0, 0, 0);
  write_cqe(cq, lay, 1, 1, emu::CQE_STATUS_UNRESP_REMOTE);
  const unsigned long long m = proxy_host::complete(r, st, sink);
  printf("completed %llu done %llu bad %llu sink %zu\n", m, pstate[8], st.bad.load(), g_seen.size());
  if (!g_seen.empty()) {
    const proxy_host::ErrorCqe& e = g_seen[0];
    printf("error rank %d qp %d thread %d cqe %llu status %u\n", e.rank, e.qp, e.thread, e.ci, e.status);
  }
  printf("first status %llu rank %lld qp %lld cqe %lld thread %lld\n", st.first_bad_status.load() - 1,
         st.first_rank.load(), st.first_qp.load(), st.first_ci.load(), st.first_thread.load());
  // a second error CQE on the ring: counted, the sink is not called again
  write_cqe(cq, lay, 2, 2, emu::CQE_STATUS_UNRESP_REMOTE);
  const unsigned long long m2 = proxy_host::complete(r, st, sink);
  printf("later %llu done %llu bad %llu sink %zu\n", m2, pstate[8], st.bad.load(), g_seen.size());
  // where the emulated NIC's host setup puts a receive CQ (hw/ep/emu_nic.h, --rxcq)
  printf("rxcq host %u device %u (host is %u)\n",
         emu_nic::recv_qp_layout(0, emu_nic::rx_qpn(0, 0, n_rx), 0x1000, 64, true).cq_buffer_mem,
         emu_nic::recv_qp_layout(0, emu_nic::rx_qpn(0, 0, n_rx), 0x1000, 64, false).cq_buffer_mem,
         (unsigned)LEVER_EFA_MEM_HOST);
  return 0;
}
