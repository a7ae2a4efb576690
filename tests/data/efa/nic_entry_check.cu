// Host-side driver of the EP kernels' NIC entry (tests/test_hw_nic_layout.py).
//
// Why: no GPU and no EFA device here, so what the kernels take is checked on the host:
// the NIC tables the emulated NIC fills (hw/ep/emu_nic.h) and tables built from a real
// device's recorded queue queries (hw/efa/device.py layout_from_query, packed to bytes
// by Python) go through the same lever_ep_check_nic (linked from hw/ep/ep_kernels.cu),
// and the WQE the kernels' builder (hw/efa/wqe.h) makes from either is read back
// through rdma-core v59's own efa_io_tx_wqe and masks (providers/efa/efa_io_defs.h).
//
//   nic_entry_check emu R NRX [WQE INLINE COUNTERS]   (the generation: 64|128, inline bytes, 0|1)
//   nic_entry_check dev SEND.bin NQ RECV.bin NRX PEERS.bin R
//   nic_entry_check rails SEND.bin NQ TABLE_OF.bin RECV.bin NRX PEERS.bin NTABLES R
// prints "check ok" or "check refused: <why>", then "wqe ok ..." or "wqe bad: <field>"
// for a put from the first send QP to the last receive queue of the last rank. rails: a
// rank over several EFA devices (lever_ep_check_nic_rails): PEERS holds NTABLES tables,
// TABLE_OF one int32 per send QP, table t's device copy is at RAILS_PEERS_DEV + t *
// RAILS_PEERS_STRIDE (the send layouts must point there); then, for every send QP, the
// WQE of a put to the last rank's last receive queue through the table its layout points
// at, as the kernels find it ("wqe Q ok ... ah A qpn N qkey K rkey R").
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "efa_emu.cuh"

#ifndef BIT
#define BIT(n) (1u << (n))
#endif
#ifndef GENMASK
#define GENMASK(h, l) (((~0u) << (l)) & (~0u >> (31 - (h))))
#endif
namespace prov {
#include <efa_io_defs.h>
}  // namespace prov

template <class T>
static std::vector<T> read_all(const char* path, size_t n) {
  std::vector<T> v(n);
  FILE* f = fopen(path, "rb");
  if (!f || fread(v.data(), sizeof(T), n, f) != n) {
    fprintf(stderr, "can not read %zu entries from %s\n", n, path);
    exit(3);
  }
  fclose(f);
  return v;
}

#define WANT(cond, what)                 \
  do {                                   \
    if (!(cond)) {                       \
      printf("wqe bad: %s\n", what);     \
      return 1;                          \
    }                                    \
  } while (0)

// The WQE for one put at producer count pc, read through the provider's struct.
static int check_wqe(const lever_efa_nic_layout& l, const lever_efa_peer& p, uint32_t pc,
                     uint32_t has_imm) {
  const lever_efa_write wr = {0x1122334455667700ull, 0x0a0b0c0d0e0f1000ull, 7504u, 0xfeedbeefu,
                              has_imm};
  uint64_t words[8];
  for (int k = 0; k < 8; ++k) words[k] = lever_efa_write_wqe_word(&l, &p, &wr, pc, k);
  prov::efa_io_tx_wqe w;
  static_assert(sizeof(w) == sizeof(words), "64-byte WQE");
  memcpy(&w, words, sizeof w);
  const prov::efa_io_tx_meta_desc& m = w.meta;
  WANT((m.ctrl1 & EFA_IO_TX_META_DESC_OP_TYPE_MASK) == prov::EFA_IO_RDMA_WRITE, "op_type");
  WANT((m.ctrl1 & EFA_IO_TX_META_DESC_META_DESC_MASK) != 0, "meta_desc");
  WANT((m.ctrl1 & (EFA_IO_TX_META_DESC_META_EXTENSION_MASK | EFA_IO_TX_META_DESC_INLINE_MSG_MASK)) == 0,
       "ctrl1 MBZ/inline");
  WANT(((m.ctrl1 & EFA_IO_TX_META_DESC_HAS_IMM_MASK) != 0) == (has_imm != 0), "has_imm");
  WANT(m.immediate_data == (has_imm ? wr.imm : 0u), "immediate_data");
  // the provider's SQ phase: efa_wq.phase starts 0 and steps when pc wraps the ring
  uint32_t phase = 0;
  for (uint32_t i = 0; i < pc; ++i)
    if (!((i + 1) & (l.sq_num_entries - 1))) ++phase;
  WANT((m.ctrl2 & EFA_IO_TX_META_DESC_PHASE_MASK) == (phase & 1u), "phase");
  const unsigned ctrl2_set = EFA_IO_TX_META_DESC_FIRST_MASK | EFA_IO_TX_META_DESC_LAST_MASK |
                             EFA_IO_TX_META_DESC_COMP_REQ_MASK;
  WANT((m.ctrl2 & ctrl2_set) == ctrl2_set, "first/last/comp_req");
  WANT((m.ctrl2 & ~(ctrl2_set | EFA_IO_TX_META_DESC_PHASE_MASK)) == 0, "ctrl2 MBZ");
  WANT(m.req_id == (pc & (l.sq_num_entries - 1)), "req_id (ring slot)");
  WANT(m.length == 1, "meta.length (one buffer)");
  WANT(m.ah == p.ahn, "ah");
  WANT(m.dest_qp_num == p.remote_qpn, "dest_qp_num");
  WANT(m.qkey == p.remote_qkey && m.qkey != 0, "qkey");
  WANT(m.reserved == 0, "meta.reserved");
  for (unsigned i = 0; i < sizeof m.reserved2; ++i) WANT(m.reserved2[i] == 0, "meta.reserved2");
  const prov::efa_io_rdma_req& r = w.data.rdma_req;
  WANT(r.remote_mem.length == wr.len && r.remote_mem.rkey == p.rkey, "remote_mem");
  WANT(((uint64_t)r.remote_mem.buf_addr_hi << 32 | r.remote_mem.buf_addr_lo) == wr.raddr, "raddr");
  WANT(r.local_mem[0].length == wr.len, "local length");
  WANT((r.local_mem[0].lkey & ~EFA_IO_TX_BUF_DESC_LKEY_MASK) == 0, "lkey 31:24 MBZ");
  WANT(r.local_mem[0].lkey == l.lkey, "lkey");
  WANT(((uint64_t)r.local_mem[0].buf_addr_hi << 32 | r.local_mem[0].buf_addr_lo) == wr.laddr, "laddr");
  return 0;
}

// A 128-byte layout (rdma-core v63): every WQE is 16 words, the second half zero unless an
// inline payload reaches it; an RDMA write of at most inline_write_size bytes carries its
// payload from byte 48 (ctrl1 inline_msg, meta.length = bytes, remote length the same), read
// back through the project's efa_io_tx_wqe_128 (hw/efa_io_defs.h, whose offsets
// hw/efa/offsets_check.cpp proves against a v63+ provider header). Prints "inline ok ..." or
// "inline none" (a 64-byte layout), or "wqe bad: <what>".
static int check_inline(const lever_efa_nic_layout& l, const lever_efa_peer& p) {
  if (l.sq_entry_size != LEVER_EFA_WQE_SIZE_128) {
    WANT(lever_efa_wqe_words(&l) == 8u, "64-byte layout: 8 words");
    WANT(l.inline_write_size == 0u, "inline writes without 128-byte WQEs");
    printf("inline none\n");
    return 0;
  }
  WANT(lever_efa_wqe_words(&l) == 16u, "128-byte layout: 16 words");
  unsigned char payload[96];
  for (int i = 0; i < 96; ++i) payload[i] = (unsigned char)(0xa0 + i);
  const uint32_t lens[] = {8u, 13u, l.inline_write_size, l.inline_write_size + 1u, 7504u};
  for (uint32_t len : lens) {
    for (int src_null = 0; src_null < 2; ++src_null) {
      lever_efa_write wr = {0x1122334455667700ull, 0x0a0b0c0d0e0f1000ull, len, 0u, 0u,
                            src_null ? nullptr : payload};
      uint64_t words[16];
      for (int k = 0; k < 16; ++k) words[k] = lever_efa_write_wqe_word(&l, &p, &wr, 3u, k);
      ::efa_io_tx_wqe_128 w;
      static_assert(sizeof(w) == sizeof(words), "128-byte WQE");
      memcpy(&w, words, sizeof w);
      const bool inl = !src_null && len != 0u && len <= l.inline_write_size;
      WANT(((w.meta.ctrl1 & EFA_IO_TX_META_DESC_INLINE_MSG_MASK) != 0) == inl, "inline_msg bit");
      WANT(w.meta.length == (inl ? len : 1u), "meta.length (inline bytes, or one buffer)");
      WANT(w.data.rdma_req.remote_mem.length == len && w.data.rdma_req.remote_mem.rkey == p.rkey, "remote_mem");
      WANT(((uint64_t)w.data.rdma_req.remote_mem.buf_addr_hi << 32 | w.data.rdma_req.remote_mem.buf_addr_lo) ==
               wr.raddr, "raddr");
      const unsigned char* b = reinterpret_cast<const unsigned char*>(&w);
      const uint32_t used = inl ? LEVER_EFA_INLINE_WRITE_OFFSET + len : 64u;
      if (inl) {
        WANT(memcmp(w.data.rdma_req.inline_data, payload, len) == 0, "inline payload");
      } else {
        WANT(w.data.rdma_req.local_mem[0].length == len && w.data.rdma_req.local_mem[0].lkey == l.lkey, "local_mem");
      }
      for (uint32_t i = used; i < 128u; ++i) WANT(b[i] == 0, "bytes past the descriptor/payload");
    }
  }
  printf("inline ok words 16 max %u payload@%u\n", l.inline_write_size, LEVER_EFA_INLINE_WRITE_OFFSET);
  return 0;
}

static int run(const lever_efa_nic_layout* send, int nq, const lever_efa_nic_layout* recv, int nrx,
               const lever_efa_peer* peers, int R) {
  char why[256];
  const int rc = lever_ep_check_nic(send, nq, recv, nrx, peers, R * nrx, R, why, sizeof why);
  if (rc) {
    printf("check refused: %s\n", why);
    return 0;
  }
  printf("check ok\n");
  const lever_efa_nic_layout& l = send[0];
  const lever_efa_peer& p = peers[(size_t)(R - 1) * nrx + (nrx - 1)];
  const uint32_t n = l.sq_num_entries;
  const uint32_t pcs[] = {0u, 1u, n - 1u, n, n + 5u, 2u * n, 3u * n - 1u, 7u * n + 3u};
  for (uint32_t pc : pcs)
    for (uint32_t imm = 0; imm < 2; ++imm)
      if (check_wqe(l, p, pc, imm)) return 0;
  printf("wqe ok first-lap-phase %u second-lap-phase %u req_id@n+5 %u ah %u qpn %u qkey 0x%x\n",
         lever_efa_sq_phase(0, n), lever_efa_sq_phase(n, n), lever_efa_slot(n + 5u, n), p.ahn,
         p.remote_qpn, p.remote_qkey);
  if (check_inline(l, p)) return 0;
  // where the kernels' credit comes from (ep_kernels.cu uses_counter): the counter, else the CQ
  printf("credit %s\n", l.send_cntr_dev ? "counter" : "cq");
  return 0;
}

static const uint64_t RAILS_PEERS_DEV = 0x7f4000000000ull, RAILS_PEERS_STRIDE = 0x100000000ull;

static int run_rails(const lever_efa_nic_layout* send, int nq, const int* table_of, int ntab,
                     const lever_efa_nic_layout* recv, int nrx, const lever_efa_peer* peers, int R) {
  std::vector<uint64_t> dev((size_t)ntab);
  for (int t = 0; t < ntab; ++t) dev[(size_t)t] = RAILS_PEERS_DEV + (uint64_t)t * RAILS_PEERS_STRIDE;
  char why[256] = "";
  if (lever_ep_check_nic_rails(send, nq, table_of, dev.data(), ntab, recv, nrx, peers, R * nrx, R, why,
                               sizeof why)) {
    printf("check refused: %s\n", why);
    return 0;
  }
  printf("check ok\n");
  for (int q = 0; q < nq; ++q) {
    const lever_efa_nic_layout& l = send[q];
    // what put_word does: the table the layout points at, [rank][receive queue]
    const uint64_t t = (l.peers - RAILS_PEERS_DEV) / RAILS_PEERS_STRIDE;
    const lever_efa_peer& p = peers[t * (uint64_t)(R * nrx) + (size_t)(R - 1) * nrx + (nrx - 1)];
    const uint32_t n = l.sq_num_entries;
    const uint32_t pcs[] = {0u, 1u, n - 1u, n, n + 5u, 2u * n};
    for (uint32_t pc : pcs)
      for (uint32_t imm = 0; imm < 2; ++imm)
        if (check_wqe(l, p, pc, imm)) return 0;
    printf("wqe %d ok table %u lkey 0x%x ah %u qpn %u qkey 0x%x rkey 0x%x\n", q, (unsigned)t, l.lkey, p.ahn,
           p.remote_qpn, p.remote_qkey, p.rkey);
  }
  return 0;
}

int main(int argc, char** argv) {
  if ((argc == 4 || argc == 7) && !strcmp(argv[1], "emu")) {
    const int R = atoi(argv[2]), nrx = atoi(argv[3]), NQ = emu::NQ_MAX;
    // the generation it plays (emu_nic.h set_generation): WQE size, inline bytes, counters
    const uint32_t wqe = argc == 7 ? (uint32_t)atoi(argv[4]) : 64u, inl = argc == 7 ? (uint32_t)atoi(argv[5]) : 0u;
    const bool cntr = argc == 7 && atoi(argv[6]) != 0;
    const uint32_t depth = 1024, rxd = 2048;
    if (const char* why = emu_nic::numbering_problem(R, NQ, nrx)) {
      printf("check refused: %s\n", why);
      return 0;
    }
    // addresses as the binding computes them from the buffers (any non-null, aligned)
    const uint64_t sq = 0x7f0000000000ull, db = 0x7f0100000000ull, cq = 0x7f0200000000ull,
                   rxcq = 0x7f0300000000ull, peers_dev = 0x7f0400000000ull;
    std::vector<lever_efa_nic_layout> send, recv;
    std::vector<lever_efa_peer> peers;
    for (int q = 0; q < NQ; ++q) {
      send.push_back(emu_nic::send_qp_layout(0, emu_nic::SQ_QPN_BASE + q, sq + q * depth * wqe,
                                             db + q * 128u, cq + q * depth * emu_nic::CQE_SIZE,
                                             depth, depth, false, peers_dev, (uint32_t)(R * nrx)));
      emu_nic::set_generation(send.back(), wqe, inl, cntr ? 0x7f0500000000ull + (uint64_t)q * 16u : 0u);
    }
    for (int i = 0; i < nrx; ++i)
      recv.push_back(emu_nic::recv_qp_layout(0, emu_nic::rx_qpn(0, i, nrx),
                                             rxcq + (uint64_t)i * rxd * emu_nic::CQE_SIZE, rxd));
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < nrx; ++i) peers.push_back(emu_nic::peer_entry(r, i, nrx));
    return run(send.data(), NQ, recv.data(), nrx, peers.data(), R);
  }
  if (argc == 8 && !strcmp(argv[1], "dev")) {
    const int nq = atoi(argv[3]), nrx = atoi(argv[5]), R = atoi(argv[7]);
    auto send = read_all<lever_efa_nic_layout>(argv[2], (size_t)nq);
    auto recv = read_all<lever_efa_nic_layout>(argv[4], (size_t)nrx);
    auto peers = read_all<lever_efa_peer>(argv[6], (size_t)R * nrx);
    return run(send.data(), nq, recv.data(), nrx, peers.data(), R);
  }
  if (argc == 10 && !strcmp(argv[1], "rails")) {
    const int nq = atoi(argv[3]), nrx = atoi(argv[6]), ntab = atoi(argv[8]), R = atoi(argv[9]);
    auto send = read_all<lever_efa_nic_layout>(argv[2], (size_t)nq);
    auto table_of = read_all<int32_t>(argv[4], (size_t)nq);
    auto recv = read_all<lever_efa_nic_layout>(argv[5], (size_t)nrx);
    auto peers = read_all<lever_efa_peer>(argv[7], (size_t)ntab * R * nrx);
    return run_rails(send.data(), nq, table_of.data(), ntab, recv.data(), nrx, peers.data(), R);
  }
  fprintf(stderr, "usage: %s emu R NRX | dev SEND NQ RECV NRX PEERS R | rails SEND NQ TABLE_OF RECV NRX PEERS NT R\n",
          argv[0]);
  return 2;
}
